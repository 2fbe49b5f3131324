// The record model of .fpat (TableGen's: classes, defs, typed fields, values) and the sema
// that builds it from the AST.
#pragma once

#include "fpat/dsl/AST.h"

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fpat::dsl {

struct Record;

struct Type {
  enum Kind { Int, Float, String, Bit, Dag, Expr, List, Class } kind = Int;
  std::shared_ptr<Type> elem;  // List
  const Record* cls = nullptr; // Class
  std::string str() const;
};

struct Value;
using ValuePtr = std::shared_ptr<const Value>;

struct Value {
  enum Kind { Unset, Int, Float, String, Bit, List, Rec, Dag, Binding, Body } kind = Unset;
  int64_t i = 0;
  double f = 0;
  std::string s;                         // String text, Binding name
  std::vector<ValuePtr> items;           // List items; Dag: items[0] is the operator, then the args
  const Record* rec = nullptr;           // Rec
  std::string dagName;                   // Dag: `(...):$name`
  std::shared_ptr<const dsl::Expr> body; // Body: names of template args already substituted
  SourceLoc loc;
  // The nodes of this value written out as a tree (shared items counted each time they occur),
  // at most kMaxNodes + 1: what printing it, or a pattern made of it, would walk.
  size_t nodes = 1;
  static constexpr size_t kMaxNodes = 65536;

  std::string str() const;
};

struct Field {
  std::string name;
  Type type;
  ValuePtr value;
  SourceLoc loc;
};

struct Record {
  std::string name;
  SourceLoc loc;
  bool isClass = false;
  bool anonymous = false;
  int order = 0; // definition order
  std::vector<Field> fields;
  std::vector<const Record*> supers; // every superclass, in the order first reached
  const Stmt* decl = nullptr;        // class only

  const Field* field(const std::string& n) const;
  Field* field(const std::string& n);
  bool isA(const std::string& className) const;
  bool isA(const Record* cls) const;
};

/// Every class and def of a compilation, plus the ASTs they came from.
class RecordKeeper {
public:
  const Record* findClass(const std::string& n) const;
  const Record* findDef(const std::string& n) const;
  /// Defs in definition order (anonymous instances excluded).
  const std::vector<const Record*>& defs() const { return defOrder_; }
  const std::vector<const Record*>& classes() const { return classOrder_; }
  /// Defs deriving from `className`, in definition order.
  std::vector<const Record*> defsOf(const std::string& className) const;

private:
  friend class Sema;
  std::map<std::string, std::unique_ptr<Record>> classes_, defs_;
  std::vector<std::unique_ptr<Record>> anonymous_;
  std::vector<const Record*> defOrder_, classOrder_;
  std::vector<std::unique_ptr<File>> files_;
};

/// The built-in pattern files (patterns/*.fpat), embedded at build time: name -> text.
const std::vector<std::pair<std::string_view, std::string_view>>& embeddedPatterns();
/// The text of the embedded built-in file `name` (e.g. "activations.fpat"), or null.
const std::string_view* embeddedPattern(std::string_view name);
/// Built-in files show up in diagnostics and generated code as "patterns/NAME".
inline constexpr std::string_view kEmbeddedPrefix = "patterns/";

struct CompileOptions {
  std::vector<std::string> includeDirs;
  /// Includes found neither next to the including file nor in includeDirs come from the
  /// embedded built-in files (so user files can include "fpat.fpat" with no source tree).
  bool builtinIncludes = true;
  /// The main file is an embedded built-in one: its includes come only from the embedded files.
  bool mainIsEmbedded = false;
  /// Accept kernel families fpat has no kernel for (matcher tests of patterns ahead of their
  /// kernels); fpat-tblgen and fpatc never set it.
  bool anyFamily = false;
  /// Names defined for the preprocessor (fpat-tblgen -D NAME), as by `#define NAME`.
  std::vector<std::string> defines;
};

/// Parses `fileId` (and its includes, read through `diags.sources()`) and builds the records.
/// Every problem is reported to `diags`; the result is usable only without errors.
/// `dependencies` receives every file read, the main one first.
std::unique_ptr<RecordKeeper> buildRecords(int fileId, SourceManager& sm, DiagEngine& diags,
                                           const CompileOptions& opts,
                                           std::vector<std::string>* dependencies = nullptr);

/// TableGen-style dump of all classes and defs.
std::string printRecords(const RecordKeeper& rk);

/// Expression printing with the fewest parentheses, shared by printers and generators.
std::string printExpr(const Expr& e);

} // namespace fpat::dsl
