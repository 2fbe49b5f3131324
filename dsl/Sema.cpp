// .fpat sema: includes, classes, defs, let, multiclass/defm, defvar; type checking of every
// value, with errors located and related places noted.
#include "fpat/dsl/Records.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <sstream>

namespace fpat::dsl {

const std::string_view* embeddedPattern(std::string_view name) {
  for (const auto& [n, text] : embeddedPatterns())
    if (n == name)
      return &text;
  return nullptr;
}

// --- records -------------------------------------------------------------------------------

const Field* Record::field(const std::string& n) const {
  for (const Field& f : fields)
    if (f.name == n)
      return &f;
  return nullptr;
}

Field* Record::field(const std::string& n) {
  for (Field& f : fields)
    if (f.name == n)
      return &f;
  return nullptr;
}

bool Record::isA(const Record* cls) const {
  return this == cls || std::find(supers.begin(), supers.end(), cls) != supers.end();
}

bool Record::isA(const std::string& className) const {
  if (isClass && name == className)
    return true;
  for (const Record* s : supers)
    if (s->name == className)
      return true;
  return false;
}

const Record* RecordKeeper::findClass(const std::string& n) const {
  auto it = classes_.find(n);
  return it == classes_.end() ? nullptr : it->second.get();
}

const Record* RecordKeeper::findDef(const std::string& n) const {
  auto it = defs_.find(n);
  return it == defs_.end() ? nullptr : it->second.get();
}

std::vector<const Record*> RecordKeeper::defsOf(const std::string& className) const {
  std::vector<const Record*> out;
  for (const Record* r : defOrder_)
    if (r->isA(className))
      out.push_back(r);
  return out;
}

std::string Type::str() const {
  switch (kind) {
  case Int:
    return "int";
  case Float:
    return "float";
  case String:
    return "string";
  case Bit:
    return "bit";
  case Dag:
    return "dag";
  case Expr:
    return "expr";
  case List:
    return "list<" + elem->str() + ">";
  case Class:
    return cls->name;
  }
  return "?";
}

namespace {

/// What a literal too large for its kind is told (the parser marks it "overflow").
std::string outOfRange(double parsed) {
  return std::isfinite(parsed) ? "integer literal is out of range"
                               : "number is out of range (the largest is about 1.8e308)";
}

int precedence(const Expr& e) {
  if (e.kind == Expr::Select)
    return 1;
  if (e.kind == Expr::Binary) {
    const std::string& o = e.s;
    if (o == "*" || o == "/")
      return 4;
    if (o == "+" || o == "-")
      return 3;
    return 2;
  }
  if (e.kind == Expr::Unary)
    return 5;
  return 6;
}

std::string quote(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o + "\"";
}

} // namespace

std::string printExpr(const Expr& e) {
  auto sub = [&](const Expr& k, int minPrec) {
    std::string s = printExpr(k);
    return precedence(k) < minPrec ? "(" + s + ")" : s;
  };
  switch (e.kind) {
  case Expr::Int:
    return std::to_string(e.i);
  case Expr::Float:
    return formatDouble(e.f);
  case Expr::Name:
    return e.s;
  case Expr::Unary: {
    std::string operand = sub(*e.kids[0], 5);
    return operand[0] == '-' ? "-(" + operand + ")" : "-" + operand;
  }
  case Expr::Binary: {
    int p = precedence(e);
    // Left-associative: the right operand needs parentheses at equal precedence.
    return sub(*e.kids[0], p) + " " + e.s + " " + sub(*e.kids[1], p + 1);
  }
  case Expr::Select:
    return sub(*e.kids[0], 2) + " ? " + sub(*e.kids[1], 2) + " : " + sub(*e.kids[2], 1);
  case Expr::Call: {
    std::string s = e.s + "(";
    for (size_t i = 0; i < e.kids.size(); ++i)
      s += (i ? ", " : "") + printExpr(*e.kids[i]);
    return s + ")";
  }
  case Expr::Body: {
    std::string s = "expr { ";
    for (auto& [n, v] : e.lets)
      s += "let " + n + " = " + printExpr(*v) + "; ";
    return s + printExpr(*e.kids[0]) + " }";
  }
  default:
    return "<value>";
  }
}

std::string Value::str() const {
  switch (kind) {
  case Unset:
    return "?";
  case Int:
    return std::to_string(i);
  case Float:
    return formatDouble(f);
  case String:
    return quote(s);
  case Bit:
    return i ? "true" : "false";
  case List: {
    std::string o = "[";
    for (size_t k = 0; k < items.size(); ++k)
      o += (k ? ", " : "") + items[k]->str();
    return o + "]";
  }
  case Rec:
    return rec->anonymous ? rec->name + " /* anonymous */" : rec->name;
  case Dag: {
    std::string o = "(" + items[0]->str();
    for (size_t k = 1; k < items.size(); ++k)
      o += (k == 1 ? " " : ", ") + items[k]->str();
    o += ")";
    if (!dagName.empty())
      o += ":$" + dagName;
    return o;
  }
  case Binding:
    return "$" + s;
  case Body:
    return printExpr(*body);
  }
  return "?";
}

// --- sema ------------------------------------------------------------------------------------

namespace {

/// Names visible while evaluating a value: template arguments, NAME, multiclass defvars.
struct Env {
  std::map<std::string, ValuePtr> vars;
  const Env* parent = nullptr;
  const Record* current = nullptr; // record under construction (its fields are visible)

  ValuePtr lookup(const std::string& n) const {
    for (const Env* e = this; e; e = e->parent)
      if (auto it = e->vars.find(n); it != e->vars.end())
        return it->second;
    return nullptr;
  }
};

ValuePtr mkValue(Value v) {
  v.nodes = 1; // a dag's operator is part of its node
  for (size_t k = v.kind == Value::Dag ? 1 : 0; k < v.items.size(); ++k)
    v.nodes = std::min(v.nodes + v.items[k]->nodes, Value::kMaxNodes + 1);
  return std::make_shared<const Value>(std::move(v));
}

constexpr int kMaxDepth = 200;           // class chains, defm nesting and include depth
constexpr size_t kMaxExpansions = 25000; // multiclass instantiations per compilation
// Work bounds: a class listing the same class twice (or a diamond) instantiates it twice, so
// a chain of such classes doubles at every level; multiclasses multiply their defs likewise.
// The bounds are far above real pattern libraries (hundreds of records) and keep the worst
// input of a few KB under a second.
constexpr size_t kMaxInstantiations = 250000; // class instantiations per compilation
constexpr size_t kMaxDefs = 50000;            // records (defs, anonymous instances)

} // namespace

class Sema {
public:
  Sema(SourceManager& sm, DiagEngine& diags, const CompileOptions& opts)
      : sm_(sm), diags_(diags), opts_(opts), rk_(std::make_unique<RecordKeeper>()),
        macros_(opts.defines.begin(), opts.defines.end()) {}

  std::unique_ptr<RecordKeeper> run(int fileId, std::vector<std::string>* deps) {
    deps_ = deps;
    namespace fs = std::filesystem;
    std::error_code ec;
    std::string canon = opts_.mainIsEmbedded
                            ? embeddedCanon(fs::path(sm_.file(fileId).name).filename().string())
                            : fs::weakly_canonical(sm_.file(fileId).name, ec).string();
    included_.insert(canon);
    if (deps_)
      deps_->push_back(sm_.file(fileId).name);
    processFile(fileId, canon);
    return std::move(rk_);
  }

private:
  struct LetOverride {
    std::string name;
    ValuePtr value;
    SourceLoc loc;
  };

  // ---- files and includes ----

  void processFile(int fileId, const std::string& canon) {
    std::unique_ptr<File> file = parseFile(fileId, diags_, &macros_);
    if (!file)
      return;
    includeStack_.push_back({canon, fileId});
    Env global;
    for (const StmtPtr& s : file->stmts) {
      if (diags_.limitReached())
        break;
      stmt(*s, global, nullptr);
    }
    includeStack_.pop_back();
    rk_->files_.push_back(std::move(file));
  }

  void include(const Stmt& s) {
    namespace fs = std::filesystem;
    if (includeStack_.size() > static_cast<size_t>(kMaxDepth)) {
      diags_.error(s.loc, "includes nested deeper than " + std::to_string(kMaxDepth) + " files");
      return;
    }
    const std::string& from = sm_.file(s.loc.file).name;
    std::vector<fs::path> candidates;
    fs::path p(s.name);
    // An embedded file includes only embedded ones; others look on disk first.
    const bool embeddedParent = isEmbeddedCanon(includeStack_.back().canon);
    const bool fromEmbedded = embeddedParent || opts_.builtinIncludes;
    if (embeddedParent) {
    } else if (p.is_absolute()) {
      candidates.push_back(p);
    } else {
      candidates.push_back(fs::path(from).parent_path() / p);
      for (const std::string& d : opts_.includeDirs)
        candidates.push_back(fs::path(d) / p);
    }
    std::error_code ec;
    for (const fs::path& c : candidates) {
      if (!fs::is_regular_file(c, ec))
        continue;
      std::string canon = fs::weakly_canonical(c, ec).string();
      for (size_t i = 0; i < includeStack_.size(); ++i)
        if (includeStack_[i].canon == canon) {
          diags_.error(s.loc, "include cycle: '" + s.name + "' is already being included");
          for (size_t k = i + 1; k < includeStack_.size(); ++k)
            diags_.note(includeLocs_[k - 1],
                        "'" + sm_.file(includeStack_[k].fileId).name + "' included from here");
          diags_.note(s.loc, "which includes '" + c.lexically_normal().string() + "' again here");
          return;
        }
      if (!included_.insert(canon).second)
        return; // each file once
      std::string text;
      if (!readFile(c.string(), text)) {
        diags_.error(s.loc, "cannot read include file '" + c.string() + "'");
        return;
      }
      int id = sm_.addBuffer(c.lexically_normal().string(), std::move(text));
      if (deps_)
        deps_->push_back(sm_.file(id).name);
      includeLocs_.push_back(s.loc);
      processFile(id, canon);
      includeLocs_.pop_back();
      return;
    }
    if (const std::string_view* text = fromEmbedded ? embeddedPattern(s.name) : nullptr) {
      const std::string canon = embeddedCanon(s.name);
      for (size_t i = 0; i < includeStack_.size(); ++i)
        if (includeStack_[i].canon == canon) {
          diags_.error(s.loc, "include cycle: '" + s.name + "' is already being included");
          return;
        }
      if (!included_.insert(canon).second)
        return;
      int id = sm_.addBuffer(std::string(kEmbeddedPrefix) + s.name, std::string(*text));
      if (deps_)
        deps_->push_back(sm_.file(id).name);
      includeLocs_.push_back(s.loc);
      processFile(id, canon);
      includeLocs_.pop_back();
      return;
    }
    for (const fs::path& c : candidates)
      if (fs::is_directory(c, ec)) {
        diags_.error(s.loc, "include file '" + s.name + "' is a directory ('" +
                                c.lexically_normal().string() + "'), not a .fpat file");
        return;
      }
    diags_.error(s.loc, "include file '" + s.name + "' not found");
    const std::string dir = fs::path(from).parent_path().string();
    std::string where = "searched: " + (dir.empty() ? std::string(".") : dir);
    for (const std::string& d : opts_.includeDirs)
      where += ", " + d;
    if (fromEmbedded)
      where += ", the built-in patterns";
    diags_.note(s.loc, where);
  }

  static std::string embeddedCanon(const std::string& name) { return "embedded:" + name; }
  static bool isEmbeddedCanon(const std::string& canon) { return canon.rfind("embedded:", 0) == 0; }

  // ---- statements ----

  void stmt(const Stmt& s, Env& env, const std::vector<LetOverride>* outer) {
    switch (s.kind) {
    case Stmt::Include:
      include(s);
      return;
    case Stmt::Class:
      classDecl(s);
      return;
    case Stmt::Def:
      def(s, env, outer, "");
      return;
    case Stmt::Defm:
      defm(s, env, outer, "", 0);
      return;
    case Stmt::Multiclass:
      if (auto it = multiclasses_.find(s.name); it != multiclasses_.end()) {
        diags_.error(s.loc, "duplicate definition of multiclass '" + s.name + "'");
        diags_.note(it->second->loc, "previous definition is here");
        return;
      }
      for (const StmtPtr& k : s.stmts)
        if (k->kind != Stmt::Def && k->kind != Stmt::Defm && k->kind != Stmt::Let &&
            k->kind != Stmt::Defvar)
          diags_.error(k->loc, "only def, defm, let and defvar may appear in a multiclass");
      multiclasses_[s.name] = &s;
      return;
    case Stmt::Let: {
      std::vector<LetOverride> lets = outer ? *outer : std::vector<LetOverride>{};
      for (size_t i = 0; i < s.lets.size(); ++i)
        if (ValuePtr v = eval(*s.lets[i].second, env))
          lets.push_back({s.lets[i].first, v, s.letLocs[i]});
      for (const StmtPtr& k : s.stmts)
        stmt(*k, env, &lets);
      return;
    }
    case Stmt::Defvar: {
      // Top-level defvars are global: every file after this one sees them.
      if (auto it = defvars_.find(s.name); it != defvars_.end()) {
        diags_.error(s.loc, "duplicate defvar '" + s.name + "'");
        diags_.note(it->second->loc, "previous definition is here");
        return;
      }
      if (ValuePtr v = eval(*s.value, env))
        defvars_[s.name] = v;
      else
        failedDefvars_.insert(s.name);
      return;
    }
    }
  }

  void classDecl(const Stmt& s) {
    if (const Record* prev = rk_->findClass(s.name)) {
      diags_.error(s.loc, "duplicate definition of class '" + s.name + "'");
      diags_.note(prev->loc, "previous definition is here");
      return;
    }
    auto rec = std::make_unique<Record>();
    rec->name = s.name;
    rec->loc = s.loc;
    rec->isClass = true;
    rec->decl = &s;
    rec->order = nextOrder_++;
    // Template argument and field types must name known types now, not at first use.
    for (const TemplateArg& t : s.targs)
      resolveType(t.type);
    for (const BodyItem& b : s.body)
      if (!b.isLet)
        resolveType(b.type);
    for (const ParentRef& p : s.parents)
      if (!rk_->findClass(p.name))
        unknownClass(p.name, p.loc);
    Record* raw = rec.get();
    rk_->classes_[s.name] = std::move(rec);
    rk_->classOrder_.push_back(raw);
    // Fields as seen with every template argument unset, for --print-records.
    DiagEngine scratch(sm_);
    DiagEngine* saved = active_;
    active_ = &scratch;
    Record shape;
    shape.name = s.name;
    // Arguments without defaults are unset; trailing ones with defaults take them.
    std::vector<ValuePtr> unset;
    for (const TemplateArg& t : s.targs)
      if (!t.defaultValue)
        unset.push_back(mkValue(Value{}));
    instantiate(*raw, unset, s.loc, shape, 0, /*checkArgs=*/false);
    active_ = saved;
    raw->fields = shape.fields;
    raw->supers = shape.supers;
    raw->supers.erase(std::remove(raw->supers.begin(), raw->supers.end(), raw), raw->supers.end());
  }

  void def(const Stmt& s, Env& env, const std::vector<LetOverride>* outer,
           const std::string& prefixName) {
    if (!countRecord(s.loc))
      return;
    auto rec = std::make_unique<Record>();
    rec->loc = s.loc;
    rec->order = nextOrder_++;
    if (s.hasName) {
      rec->name = defName(s, env, prefixName);
    } else {
      rec->name = "anonymous_" + std::to_string(anonCount_++);
      rec->anonymous = true;
    }
    Env local;
    local.parent = &env;
    local.current = rec.get();
    local.vars["NAME"] = stringValue(rec->name, s.loc);
    bool ok = true;
    for (const ParentRef& p : s.parents)
      ok = addParent(*rec, p, local) && ok;
    if (outer)
      for (const LetOverride& l : *outer)
        ok = override(*rec, l.name, l.value, l.loc) && ok;
    ok = body(*rec, s.body, local) && ok;
    if (rec->anonymous)
      return; // a def without a name is checked but not kept
    if (const Record* prev = rk_->findDef(rec->name)) {
      diags().error(s.loc, "duplicate definition of '" + rec->name + "'");
      // A def in a multiclass is defined by the defm that instantiates it: name that too.
      for (auto e = expanding_.rbegin(); e != expanding_.rend(); ++e)
        diags().note(e->second, "in multiclass '" + e->first + "', instantiated here");
      diags().note(prev->loc, "previous definition is here");
      return;
    }
    Record* raw = rec.get();
    rk_->defs_[rec->name] = std::move(rec);
    rk_->defOrder_.push_back(raw);
  }

  /// Multiclasses instantiating multiclasses multiply their defs: the records stop at kMaxDefs.
  bool countRecord(SourceLoc loc) {
    if (++records_ <= kMaxDefs)
      return true;
    if (records_ == kMaxDefs + 1)
      diags().error(loc,
                    "more than " + std::to_string(kMaxDefs) + " records in all; stopping here");
    return false;
  }

  std::string defName(const Stmt& s, const Env& env, const std::string& prefixName) {
    std::string name;
    bool usesName = false;
    for (const NamePiece& p : s.defName) {
      if (p.isString) {
        name += p.text;
        continue;
      }
      if (p.text == "NAME" && !prefixName.empty()) {
        name += prefixName;
        usesName = true;
        continue;
      }
      // A template argument or defvar holding a string pastes its text.
      if (ValuePtr v = env.lookup(p.text); v && v->kind == Value::String && p.text != "NAME") {
        name += v->s;
        continue;
      }
      name += p.text;
    }
    if (!prefixName.empty() && !usesName)
      name = prefixName + name; // TableGen: defm name prepended unless NAME is used
    return name;
  }

  /// `defm name : M<args>, ...`: instantiates every def of the multiclasses.
  void defm(const Stmt& s, Env& env, const std::vector<LetOverride>* outer,
            const std::string& prefixName, int depth) {
    if (diags_.limitReached())
      return; // every instantiation would only repeat errors nobody sees
    if (depth > kMaxDepth) {
      diags().error(s.loc, "defm nested deeper than " + std::to_string(kMaxDepth) + " levels");
      return;
    }
    std::string name =
        s.hasName ? defName(s, env, prefixName) : "anonymous_" + std::to_string(anonCount_++);
    for (const ParentRef& p : s.parents) {
      auto it = multiclasses_.find(p.name);
      if (it == multiclasses_.end()) {
        if (rk_->findClass(p.name))
          diags().error(p.loc, "'" + p.name + "' is a class; defm needs a multiclass");
        else if (unknownReported_.insert({p.loc.file, p.loc.line, p.loc.col})
                     .second) { // once, not per instantiation
          std::vector<std::string> names;
          for (const auto& m : multiclasses_)
            names.push_back(m.first);
          diags().error(p.loc, "unknown multiclass '" + p.name + "'" + didYouMean(p.name, names));
        }
        continue;
      }
      const Stmt& mc = *it->second;
      // A multiclass that (through defm, at any depth) instantiates itself never ends; and
      // multiclasses that each instantiate the next several times grow exponentially.
      if (auto self = std::find_if(expanding_.begin(), expanding_.end(),
                                   [&](const auto& e) { return e.first == p.name; });
          self != expanding_.end()) {
        diags().error(p.loc, "multiclass '" + p.name + "' instantiates itself");
        diags().note(self->second, "while instantiating '" + p.name + "' here");
        continue;
      }
      if (records_ > kMaxDefs)
        return; // reported at the def that passed the limit
      if (++expansions_ > kMaxExpansions) {
        if (expansions_ == kMaxExpansions + 1)
          diags().error(p.loc, "defm instantiates more than " + std::to_string(kMaxExpansions) +
                                   " multiclasses in all; stopping here");
        continue;
      }
      Env menv;
      menv.parent = nullptr;
      // Template args are evaluated where defm is written, then bound in the multiclass.
      std::vector<ValuePtr> args;
      bool ok = true;
      for (const ExprPtr& a : p.args) {
        ValuePtr v = eval(*a, env);
        ok = ok && v;
        args.push_back(v);
      }
      if (!ok)
        continue;
      if (!bindTemplateArgs(mc.targs, args, p.loc, "multiclass '" + mc.name + "'", mc.loc, menv,
                            true))
        continue;
      menv.vars["NAME"] = stringValue(name, s.loc);
      expanding_.emplace_back(p.name, p.loc);
      for (const StmtPtr& k : mc.stmts)
        multiclassStmt(*k, menv, outer, name, depth);
      expanding_.pop_back();
    }
  }

  void multiclassStmt(const Stmt& k, Env& menv, const std::vector<LetOverride>* outer,
                      const std::string& name, int depth) {
    switch (k.kind) {
    case Stmt::Def: {
      def(k, menv, outer, name);
      return;
    }
    case Stmt::Defm:
      defm(k, menv, outer, name, depth + 1);
      return;
    case Stmt::Let: {
      std::vector<LetOverride> lets = outer ? *outer : std::vector<LetOverride>{};
      for (size_t i = 0; i < k.lets.size(); ++i)
        if (ValuePtr v = eval(*k.lets[i].second, menv))
          lets.push_back({k.lets[i].first, v, k.letLocs[i]});
      for (const StmtPtr& c : k.stmts)
        multiclassStmt(*c, menv, &lets, name, depth);
      return;
    }
    case Stmt::Defvar:
      if (ValuePtr v = eval(*k.value, menv))
        menv.vars[k.name] = v;
      else
        failedDefvars_.insert(k.name);
      return;
    default:
      return; // reported when the multiclass was declared
    }
  }

  bool addParent(Record& rec, const ParentRef& p, const Env& env) {
    const Record* cls = rk_->findClass(p.name);
    if (!cls) {
      if (multiclasses_.count(p.name))
        diags().error(p.loc, "'" + p.name + "' is a multiclass; use defm to instantiate it");
      else
        unknownClass(p.name, p.loc);
      return false;
    }
    std::vector<ValuePtr> args;
    for (const ExprPtr& a : p.args) {
      ValuePtr v = eval(*a, env);
      if (!v)
        return false;
      args.push_back(v);
    }
    return instantiate(*cls, args, p.loc, rec, 0, true);
  }

  bool bindTemplateArgs(const std::vector<TemplateArg>& targs, const std::vector<ValuePtr>& args,
                        SourceLoc useLoc, const std::string& what, SourceLoc declLoc, Env& out,
                        bool checkArgs) {
    if (args.size() > targs.size()) {
      diags().error(useLoc, what + " takes " + std::to_string(targs.size()) + " template argument" +
                                (targs.size() == 1 ? "" : "s") + " but " +
                                std::to_string(args.size()) + " were given");
      diags().note(declLoc, "declared here");
      return false;
    }
    for (size_t i = 0; i < targs.size(); ++i) {
      const TemplateArg& t = targs[i];
      ValuePtr v;
      if (i < args.size()) {
        v = args[i];
      } else if (t.defaultValue) {
        v = eval(*t.defaultValue, out);
        if (!v)
          return false;
      } else {
        diags().error(useLoc, what + " needs a value for template argument '" + t.name + "' (" +
                                  std::to_string(targs.size()) + " expected, " +
                                  std::to_string(args.size()) + " given)");
        diags().note(t.loc, "'" + t.name + "' declared here");
        return false;
      }
      auto type = resolveType(t.type);
      if (!type)
        return false;
      if (checkArgs) {
        ValuePtr conv = convert(*type, v);
        if (!conv) {
          diags().error(i < args.size() ? v->loc : useLoc,
                        "template argument '" + t.name + "' of " + what + " has type " +
                            type->str() + " but is given " + describe(*v));
          diags().note(t.loc, "'" + t.name + "' declared here");
          return false;
        }
        v = conv;
      }
      out.vars[t.name] = v;
    }
    return true;
  }

  /// Adds class `cls` instantiated with `args` (and its superclasses) to `target`.
  bool instantiate(const Record& cls, const std::vector<ValuePtr>& args, SourceLoc useLoc,
                   Record& target, int depth, bool checkArgs) {
    if (depth == 0)
      outermostUse_ = useLoc;
    if (++instantiations_ > kMaxInstantiations) {
      // Into the real engine: a class declaration's own instantiation reports into a scratch one.
      if (instantiations_ == kMaxInstantiations + 1)
        diags_.error(outermostUse_, "more than " + std::to_string(kMaxInstantiations) +
                                        " class instantiations in all (a class reached through two "
                                        "parents is instantiated twice); stopping here");
      return false;
    }
    if (depth > kMaxDepth) {
      diags().error(useLoc, "class hierarchy deeper than " + std::to_string(kMaxDepth) + " levels");
      return false;
    }
    const Stmt& decl = *cls.decl;
    Env env;
    env.current = &target;
    if (!bindTemplateArgs(decl.targs, args, useLoc, "class '" + cls.name + "'", cls.loc, env,
                          checkArgs))
      return false;
    env.vars["NAME"] = stringValue(target.name, useLoc);
    bool ok = true;
    for (const ParentRef& p : decl.parents) {
      const Record* parent = rk_->findClass(p.name);
      if (!parent)
        return false; // reported at the class declaration
      std::vector<ValuePtr> pargs;
      for (const ExprPtr& a : p.args) {
        ValuePtr v = eval(*a, env);
        if (!v)
          return false;
        pargs.push_back(v);
      }
      ok = instantiate(*parent, pargs, p.loc, target, depth + 1, checkArgs) && ok;
    }
    if (std::find(target.supers.begin(), target.supers.end(), &cls) == target.supers.end())
      target.supers.push_back(&cls);
    return body(target, decl.body, env) && ok;
  }

  bool body(Record& rec, const std::vector<BodyItem>& items, const Env& env) {
    bool ok = true;
    for (const BodyItem& b : items) {
      if (b.isLet) {
        ValuePtr v = eval(*b.value, env);
        ok = v && override(rec, b.name, v, b.loc) && ok;
        continue;
      }
      auto type = resolveType(b.type);
      if (!type) {
        ok = false;
        continue;
      }
      if (Field* prev = rec.field(b.name)) {
        if (prev->loc.file == b.loc.file && prev->loc.line == b.loc.line &&
            prev->loc.col == b.loc.col)
          continue; // the same class reached twice through two parents
        diags().error(b.loc, "field '" + b.name + "' is already defined in '" + rec.name + "'");
        diags().note(prev->loc, "previous definition is here");
        ok = false;
        continue;
      }
      ValuePtr v = mkValue(Value{});
      if (b.value) {
        ValuePtr raw = eval(*b.value, env);
        if (!raw) {
          ok = false;
          continue;
        }
        v = convert(*type, raw);
        if (!v) {
          diags().error(raw->loc.valid() ? raw->loc : b.loc, "field '" + b.name + "' has type " +
                                                                 type->str() + " but is given " +
                                                                 describe(*raw));
          ok = false;
          continue;
        }
      }
      rec.fields.push_back({b.name, *type, v, b.loc});
    }
    return ok;
  }

  bool override(Record& rec, const std::string& name, const ValuePtr& v, SourceLoc loc) {
    Field* f = rec.field(name);
    if (!f) {
      std::vector<std::string> names;
      for (const Field& field : rec.fields)
        names.push_back(field.name);
      diags().error(loc, "'" + rec.name + "' has no field '" + name + "' to set with let" +
                             didYouMean(name, names));
      return false;
    }
    ValuePtr conv = convert(f->type, v);
    if (!conv) {
      diags().error(v->loc.valid() ? v->loc : loc, "type mismatch in let: field '" + name +
                                                       "' has type " + f->type.str() +
                                                       " but is given " + describe(*v));
      diags().note(f->loc, "'" + name + "' declared here");
      return false;
    }
    f->value = conv;
    return true;
  }

  // ---- types and values ----

  std::optional<Type> resolveType(const TypeRef& t) {
    Type out;
    const std::string& n = t.name;
    if (n == "int")
      out.kind = Type::Int;
    else if (n == "float")
      out.kind = Type::Float;
    else if (n == "string")
      out.kind = Type::String;
    else if (n == "bit")
      out.kind = Type::Bit;
    else if (n == "dag")
      out.kind = Type::Dag;
    else if (n == "expr")
      out.kind = Type::Expr;
    else if (n == "list") {
      auto e = resolveType(*t.elem);
      if (!e)
        return std::nullopt;
      out.kind = Type::List;
      out.elem = std::make_shared<Type>(*e);
    } else if (const Record* c = rk_->findClass(n)) {
      out.kind = Type::Class;
      out.cls = c;
    } else {
      diags().error(t.loc, "unknown type '" + n + "'");
      return std::nullopt;
    }
    return out;
  }

  static std::string describe(const Value& v) {
    switch (v.kind) {
    case Value::Unset:
      return "?";
    case Value::Int:
      return "int " + v.str();
    case Value::Float:
      return "float " + v.str();
    case Value::String:
      return "string " + v.str();
    case Value::Bit:
      return "bit " + v.str();
    case Value::List:
      return "a list";
    case Value::Rec:
      return "record '" + v.rec->name + "'" +
             (v.rec->supers.empty() ? "" : " (a " + v.rec->supers.back()->name + ")");
    case Value::Dag:
      return "a dag";
    case Value::Binding:
      return "binding $" + v.s;
    case Value::Body:
      return "an expression body";
    }
    return "a value";
  }

  /// `v` converted to type `t`, or null when it does not fit.
  ValuePtr convert(const Type& t, const ValuePtr& v) {
    if (v->kind == Value::Unset)
      return v;
    switch (t.kind) {
    case Type::Int:
      return v->kind == Value::Int ? v : nullptr;
    case Type::Float:
      if (v->kind == Value::Float)
        return v;
      if (v->kind == Value::Int) {
        Value f = *v;
        f.kind = Value::Float;
        f.f = static_cast<double>(v->i);
        return mkValue(f);
      }
      return nullptr;
    case Type::Bit:
      if (v->kind == Value::Bit)
        return v;
      if (v->kind == Value::Int && (v->i == 0 || v->i == 1)) {
        Value b = *v;
        b.kind = Value::Bit;
        return mkValue(b);
      }
      return nullptr;
    case Type::String:
      return v->kind == Value::String ? v : nullptr;
    case Type::Dag:
      return v->kind == Value::Dag ? v : nullptr;
    case Type::Expr:
      return v->kind == Value::Body ? v : nullptr;
    case Type::Class:
      return v->kind == Value::Rec && v->rec->isA(t.cls) ? v : nullptr;
    case Type::List: {
      if (v->kind != Value::List)
        return nullptr;
      Value l = *v;
      for (ValuePtr& item : l.items) {
        ValuePtr c = convert(*t.elem, item);
        if (!c)
          return nullptr;
        item = c;
      }
      return mkValue(l);
    }
    }
    return nullptr;
  }

  ValuePtr stringValue(const std::string& s, SourceLoc loc) {
    Value v;
    v.kind = Value::String;
    v.s = s;
    v.loc = loc;
    return mkValue(v);
  }

  ValuePtr eval(const Expr& e, const Env& env) {
    Value v;
    v.loc = e.loc;
    switch (e.kind) {
    case Expr::Int:
      v.kind = Value::Int;
      v.i = e.i;
      return mkValue(v);
    case Expr::Float:
      if (e.s == "overflow") {
        diags().error(e.loc, outOfRange(e.f));
        return nullptr;
      }
      v.kind = Value::Float;
      v.f = e.f;
      return mkValue(v);
    case Expr::String:
      v.kind = Value::String;
      v.s = e.s;
      return mkValue(v);
    case Expr::Bool:
      v.kind = Value::Bit;
      v.i = e.i;
      return mkValue(v);
    case Expr::Unset:
      return mkValue(v);
    case Expr::Binding:
      v.kind = Value::Binding;
      v.s = e.s;
      return mkValue(v);
    case Expr::List:
      v.kind = Value::List;
      for (const ExprPtr& k : e.kids) {
        ValuePtr item = eval(*k, env);
        if (!item)
          return nullptr;
        v.items.push_back(item);
      }
      return sized(mkValue(v), e.loc);
    case Expr::Name:
      return lookupName(e.s, e.loc, env);
    case Expr::Instance:
      return anonymousInstance(e, env);
    case Expr::Dag: {
      v.kind = Value::Dag;
      v.dagName = e.dagName;
      for (const ExprPtr& k : e.kids) {
        ValuePtr item = eval(*k, env);
        if (!item)
          return nullptr;
        v.items.push_back(item);
      }
      if (v.items[0]->kind != Value::Rec) {
        diags().error(e.kids[0]->loc,
                      "the operator of a dag must be a record, not " + describe(*v.items[0]));
        return nullptr;
      }
      return sized(mkValue(v), e.loc);
    }
    case Expr::Body: {
      v.kind = Value::Body;
      v.body = substitute(e, env);
      return v.body ? mkValue(v) : nullptr;
    }
    default:
      diags().error(e.loc, "expression syntax is only allowed inside expr { ... }");
      return nullptr;
    }
  }

  /// Shared values (defvars used twice) make trees that double at every level.
  ValuePtr sized(ValuePtr v, SourceLoc loc) {
    if (v->nodes <= Value::kMaxNodes)
      return v;
    diags().error(loc, std::string(v->kind == Value::Dag ? "dag" : "list") + " of more than " +
                           std::to_string(Value::kMaxNodes) +
                           " nodes once the values it repeats are written out");
    return nullptr;
  }

  ValuePtr lookupName(const std::string& n, SourceLoc loc, const Env& env) {
    if (ValuePtr v = env.lookup(n))
      return v;
    for (const Env* e = &env; e; e = e->parent)
      if (e->current)
        if (const Field* f = e->current->field(n))
          return f->value;
    if (auto it = defvars_.find(n); it != defvars_.end())
      return it->second;
    if (const Record* r = rk_->findDef(n)) {
      Value v;
      v.kind = Value::Rec;
      v.rec = r;
      v.loc = loc;
      return mkValue(v);
    }
    if (failedDefvars_.count(n))
      return nullptr; // its defvar's error was reported
    if (rk_->findClass(n))
      diags().error(loc, "'" + n + "' is a class; a value needs a def (or " + n + "<...>)");
    else {
      // Did-you-mean over the defs, defvars and names in scope.
      std::vector<std::string> known;
      for (const auto& [name, rec] : rk_->defs_)
        known.push_back(name);
      for (const auto& [name, value] : defvars_)
        known.push_back(name);
      for (const Env* e = &env; e; e = e->parent)
        for (const auto& [name, value] : e->vars)
          known.push_back(name);
      diags().error(loc, "unknown record or value '" + n + "'" + didYouMean(n, known));
      // A built-in def of a file not included (a pattern over gelu with only fpat.fpat).
      for (const auto& [file, text] : embeddedPatterns()) {
        const std::string def = "def " + n;
        for (size_t at = text.find(def); at != std::string_view::npos;
             at = text.find(def, at + 1)) {
          const size_t end = at + def.size();
          if ((at == 0 || text[at - 1] == '\n') && end < text.size() &&
              (text[end] == ' ' || text[end] == ':')) {
            diags().note(loc, "'" + n + "' is defined in the built-in '" + std::string(file) +
                                  "': add `include \"" + std::string(file) + "\"`");
            return nullptr;
          }
        }
      }
    }
    return nullptr;
  }

  ValuePtr anonymousInstance(const Expr& e, const Env& env) {
    const Record* cls = rk_->findClass(e.s);
    if (!cls) {
      unknownClass(e.s, e.loc);
      return nullptr;
    }
    if (!countRecord(e.loc))
      return nullptr;
    auto rec = std::make_unique<Record>();
    rec->name = e.s + "<...>";
    rec->anonymous = true;
    rec->loc = e.loc;
    std::vector<ValuePtr> args;
    for (const ExprPtr& k : e.kids) {
      ValuePtr v = eval(*k, env);
      if (!v)
        return nullptr;
      args.push_back(v);
    }
    if (!instantiate(*cls, args, e.loc, *rec, 0, true))
      return nullptr;
    std::string n = e.s + "<";
    for (size_t i = 0; i < args.size(); ++i)
      n += (i ? ", " : "") + args[i]->str();
    rec->name = n + ">";
    Value v;
    v.kind = Value::Rec;
    v.rec = rec.get();
    v.loc = e.loc;
    rk_->anonymous_.push_back(std::move(rec));
    return mkValue(v);
  }

  /// Copies an expression body, replacing names bound to numbers (template arguments,
  /// defvars) by their values. Other names (x, parameters, locals, constants) stay.
  std::shared_ptr<Expr> substitute(const Expr& e, const Env& env) {
    std::set<std::string> locals;
    bool ok = true;
    std::function<ExprPtr(const Expr&)> copy = [&](const Expr& n) -> ExprPtr {
      auto c = std::make_unique<Expr>();
      c->kind = n.kind;
      c->loc = n.loc;
      c->i = n.i;
      c->f = n.f;
      c->s = n.s;
      if (n.kind == Expr::Float && n.s == "overflow") {
        diags().error(n.loc, outOfRange(n.f));
        ok = false;
      }
      if (n.kind == Expr::Name && !locals.count(n.s) && n.s != "x") {
        ValuePtr v = env.lookup(n.s);
        if (!v)
          if (auto it = defvars_.find(n.s); it != defvars_.end())
            v = it->second;
        if (v && (v->kind == Value::Int || v->kind == Value::Float)) {
          c->kind = Expr::Float;
          c->f = v->kind == Value::Int ? static_cast<double>(v->i) : v->f;
          c->s.clear();
        } else if (v && v->kind != Value::Unset) {
          diags().error(n.loc,
                        "'" + n.s + "' is " + describe(*v) + "; expression bodies need numbers");
          ok = false;
        }
      }
      for (const ExprPtr& k : n.kids)
        c->kids.push_back(copy(*k));
      return c;
    };
    auto out = std::make_shared<Expr>();
    out->kind = Expr::Body;
    out->loc = e.loc;
    for (size_t i = 0; i < e.lets.size(); ++i) {
      out->lets.emplace_back(e.lets[i].first, copy(*e.lets[i].second));
      out->letLocs.push_back(e.letLocs[i]);
      locals.insert(e.lets[i].first);
    }
    out->kids.push_back(copy(*e.kids[0]));
    return ok ? out : nullptr;
  }

  void unknownClass(const std::string& n, SourceLoc loc) {
    if (rk_->findDef(n))
      diags().error(loc, "'" + n + "' is a def, not a class");
    else {
      std::vector<std::string> names;
      for (const Record* c : rk_->classes())
        names.push_back(c->name);
      diags().error(loc, "unknown class '" + n + "'" + didYouMean(n, names));
    }
  }

  DiagEngine& diags() { return *active_; }

  struct IncludeFrame {
    std::string canon;
    int fileId;
  };

  SourceManager& sm_;
  DiagEngine& diags_;
  DiagEngine* active_ = &diags_;
  const CompileOptions& opts_;
  std::unique_ptr<RecordKeeper> rk_;
  std::set<std::string> macros_; // the preprocessor's defined names, across includes
  std::vector<std::pair<std::string, SourceLoc>> expanding_; // multiclasses being instantiated
  size_t expansions_ = 0;                                    // multiclass instantiations so far
  size_t instantiations_ = 0;                                // class instantiations so far
  SourceLoc outermostUse_; // of the class instantiation under way: a def, a class's own shape
  size_t records_ = 0;     // defs and anonymous instances
  std::set<std::array<int, 3>> unknownReported_; // unknown multiclass names reported
  std::map<std::string, const Stmt*> multiclasses_;
  std::map<std::string, ValuePtr> defvars_;
  std::set<std::string> failedDefvars_; // defvars whose value was an error: uses stay quiet
  std::set<std::string> included_;
  std::vector<IncludeFrame> includeStack_;
  std::vector<SourceLoc> includeLocs_;
  std::vector<std::string>* deps_ = nullptr;
  int nextOrder_ = 0;
  int anonCount_ = 0;
};

std::unique_ptr<RecordKeeper> buildRecords(int fileId, SourceManager& sm, DiagEngine& diags,
                                           const CompileOptions& opts,
                                           std::vector<std::string>* dependencies) {
  Sema sema(sm, diags, opts);
  return sema.run(fileId, dependencies);
}

// --- printing ------------------------------------------------------------------------------

std::string printRecords(const RecordKeeper& rk) {
  std::ostringstream os;
  os << "------------- Classes -----------------\n";
  for (const Record* c : rk.classes()) {
    os << "class " << c->name;
    const Stmt& d = *c->decl;
    if (!d.targs.empty()) {
      os << "<";
      for (size_t i = 0; i < d.targs.size(); ++i) {
        const TemplateArg& t = d.targs[i];
        os << (i ? ", " : "") << t.type.name;
        if (t.type.elem)
          os << "<" << t.type.elem->name << ">";
        os << " " << t.name;
      }
      os << ">";
    }
    os << " {";
    for (size_t i = 0; i < c->supers.size(); ++i)
      os << (i ? " " : "\t// ") << c->supers[i]->name;
    os << "\n";
    for (const Field& f : c->fields)
      os << "  " << f.type.str() << " " << f.name << " = " << f.value->str() << ";\n";
    os << "}\n";
  }
  os << "------------- Defs -----------------\n";
  for (const Record* r : rk.defs()) {
    os << "def " << r->name << " {";
    for (size_t i = 0; i < r->supers.size(); ++i)
      os << (i ? " " : "\t// ") << r->supers[i]->name;
    os << "\n";
    for (const Field& f : r->fields)
      os << "  " << f.type.str() << " " << f.name << " = " << f.value->str() << ";\n";
    os << "}\n";
  }
  return os.str();
}

} // namespace fpat::dsl
