// The .fpat syntax tree, produced by the parser and consumed by sema. No ANTLR types here.
#pragma once

#include "fpat/support/Diagnostics.h"

#include <memory>
#include <set>
#include <string>
#include <vector>

namespace fpat::dsl {

/// One node type serves both record values (`[1, 2]`, `Foo<3>`, `(gemm $a, $w)`) and expression
/// bodies (`0.5 * x`), since both are trees of the same few shapes.
struct Expr {
  enum Kind {
    Int,
    Float,
    String,
    Bool,
    Unset,
    List,
    Instance,
    Name,
    Binding,
    Dag,
    Body, // values
    Unary,
    Binary,
    Select,
    Call // expressions
  } kind;
  SourceLoc loc;
  int64_t i = 0; // Int, Bool
  double f = 0;  // Float
  std::string s; // String text, Name/Instance/Call name, Binding name, operator
  std::vector<std::unique_ptr<Expr>> kids; // list items, instance args, dag op + args, operands
  std::string dagName;                     // `(...):$name`
  // Body: `lets` are local bindings evaluated in order, kids[0] is the result.
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> lets;
  std::vector<SourceLoc> letLocs;
};
using ExprPtr = std::unique_ptr<Expr>;

struct TypeRef {
  std::string name;              // int, float, string, bit, dag, expr, list, or a class name
  std::unique_ptr<TypeRef> elem; // for list
  SourceLoc loc;
};

struct TemplateArg {
  TypeRef type;
  std::string name;
  ExprPtr defaultValue;
  SourceLoc loc;
};

struct ParentRef {
  std::string name;
  std::vector<ExprPtr> args;
  SourceLoc loc;
};

struct BodyItem {
  bool isLet = false;
  TypeRef type; // field declarations only
  std::string name;
  ExprPtr value; // may be null for a declaration without initialiser
  SourceLoc loc;
};

/// A def name: pieces pasted with `#`; a piece is an identifier (possibly NAME or a template
/// argument) or a string literal.
struct NamePiece {
  bool isString = false;
  std::string text;
  SourceLoc loc;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;

struct Stmt {
  enum Kind { Include, Class, Def, Defm, Multiclass, Let, Defvar } kind;
  SourceLoc loc;
  std::string name;               // class / multiclass / defvar name, include path
  std::vector<NamePiece> defName; // def / defm
  bool hasName = false;           // def / defm written with a name
  std::vector<TemplateArg> targs; // class / multiclass
  std::vector<ParentRef> parents; // class / def / defm
  std::vector<BodyItem> body;     // class / def
  std::vector<StmtPtr> stmts;     // multiclass / let bodies
  std::vector<std::pair<std::string, ExprPtr>> lets; // let ... in
  std::vector<SourceLoc> letLocs;
  ExprPtr value; // defvar
};

struct File {
  int fileId = -1;
  std::vector<StmtPtr> stmts;
};

/// Parses buffer `fileId`; syntax errors go to `diags`. Returns null when there were any.
/// `macros` are the names defined so far (-D, and `#define` in earlier files); the file's
/// `#define`, `#ifdef`, `#ifndef`, `#else` and `#endif` lines are applied to them (TableGen's
/// preprocessor). Null: the file has no preprocessor.
std::unique_ptr<File> parseFile(int fileId, DiagEngine& diags,
                                std::set<std::string>* macros = nullptr);

/// Applies the preprocessor lines of `text` (file `fileId`) to `macros`, returning the text with
/// directive lines and inactive regions blanked (newlines kept, so locations do not move).
/// Errors (unbalanced `#endif`, a missing name, ...) go to `diags`.
std::string preprocess(const std::string& text, int fileId, DiagEngine& diags,
                       std::set<std::string>& macros);

} // namespace fpat::dsl
