#include "fpat/dsl/Library.h"

#include "fpat/dsl/Family.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

namespace fpat::dsl {

const ActivationDef* findActivation(Activations defs, std::string_view name) {
  for (const ActivationDef& a : defs)
    if (a.name == name)
      return &a;
  return nullptr;
}

const ActivationDef* PatternLibrary::findActivation(const std::string& n) const {
  return dsl::findActivation(activations, n);
}

ir::ActivationSet PatternLibrary::activationSet() const {
  ir::ActivationSet s = ir::ActivationSet::builtin();
  for (const ActivationDef& a : activations)
    s.add(a.name, a.paramNames); // a .fpat body replaces a built-in's parameters too
  return s;
}

ir::ActivationLibrary PatternLibrary::referenceActivations() const {
  return dsl::referenceActivations(activations);
}

ir::ActivationLibrary referenceActivations(Activations defs) {
  ir::ActivationLibrary lib = ir::ActivationLibrary::builtin();
  for (const ActivationDef& a : defs) {
    // The .fpat body replaces a built-in of the same name: the reference then checks exactly
    // what the generator lowers. Built-ins are tested against these bodies separately.
    lib.add(a.name, [a](double x, const std::map<std::string, double>& given) {
      std::vector<double> p = a.paramDefaults;
      for (size_t i = 0; i < p.size(); ++i)
        if (auto it = given.find(a.paramNames[i]); it != given.end())
          p[i] = it->second;
      return a.compiled.eval(x, p.data());
    });
  }
  return lib;
}

// --- expression bodies ---------------------------------------------------------------------

namespace {

struct Intrinsic {
  const char* name;
  int arity;
  CompiledExpr::Op op;
};

const std::vector<Intrinsic>& intrinsics() {
  static const std::vector<Intrinsic> t = {
      {"exp", 1, CompiledExpr::Exp},   {"log", 1, CompiledExpr::Log},
      {"tanh", 1, CompiledExpr::Tanh}, {"erf", 1, CompiledExpr::Erf},
      {"sqrt", 1, CompiledExpr::Sqrt}, {"rsqrt", 1, CompiledExpr::Rsqrt},
      {"abs", 1, CompiledExpr::Abs},   {"min", 2, CompiledExpr::Min},
      {"max", 2, CompiledExpr::Max},   {"pow", 2, CompiledExpr::Pow},
  };
  return t;
}

const Intrinsic* findIntrinsic(const std::string& n) {
  for (const Intrinsic& i : intrinsics())
    if (n == i.name)
      return &i;
  return nullptr;
}

/// Resolves names and compiles a body; reports unknown names and intrinsics.
class BodyCompiler {
public:
  BodyCompiler(DiagEngine& d, const ActivationDef& a) : diags(d), act(a) {}

  bool compile(const Expr& body, CompiledExpr& out) {
    for (size_t i = 0; i < body.lets.size(); ++i) {
      const std::string& n = body.lets[i].first;
      if (locals.count(n) || n == "x" ||
          std::count(act.paramNames.begin(), act.paramNames.end(), n)) {
        diags.error(body.letLocs[i], "'" + n + "' is already defined in this body");
        ok = false;
      }
      emit(*body.lets[i].second, out);
      int slot = static_cast<int>(locals.size());
      out.code.push_back({CompiledExpr::Store, slot, 0});
      locals[n] = slot;
    }
    emit(*body.kids[0], out);
    out.numLocals = static_cast<int>(locals.size());
    return ok;
  }

private:
  void emit(const Expr& e, CompiledExpr& out) {
    using C = CompiledExpr;
    switch (e.kind) {
    case Expr::Int:
      out.code.push_back({C::Const, 0, static_cast<double>(e.i)});
      return;
    case Expr::Float:
      out.code.push_back({C::Const, 0, e.f});
      return;
    case Expr::Name: {
      if (e.s == "x") {
        out.code.push_back({C::X, 0, 0});
        return;
      }
      if (auto it = locals.find(e.s); it != locals.end()) {
        out.code.push_back({C::Local, it->second, 0});
        return;
      }
      for (size_t i = 0; i < act.paramNames.size(); ++i)
        if (act.paramNames[i] == e.s) {
          out.code.push_back({C::Param, static_cast<int>(i), 0});
          return;
        }
      if (auto it = namedConstants().find(e.s); it != namedConstants().end()) {
        out.code.push_back({C::Const, 0, it->second});
        return;
      }
      diags.error(e.loc, "unknown name '" + e.s + "' in the body of '" + act.name +
                             "'; bodies see x, their params, local lets, defvars, pi and e");
      ok = false;
      return;
    }
    case Expr::Unary:
      emit(*e.kids[0], out);
      out.code.push_back({C::Neg, 0, 0});
      return;
    case Expr::Binary: {
      emit(*e.kids[0], out);
      emit(*e.kids[1], out);
      static const std::map<std::string, C::Op> ops = {
          {"+", C::Add}, {"-", C::Sub}, {"*", C::Mul}, {"/", C::Div}, {"<", C::Lt},
          {"<=", C::Le}, {">", C::Gt},  {">=", C::Ge}, {"==", C::Eq}, {"!=", C::Ne}};
      out.code.push_back({ops.at(e.s), 0, 0});
      return;
    }
    case Expr::Select:
      for (const ExprPtr& k : e.kids)
        emit(*k, out);
      out.code.push_back({C::Select, 0, 0});
      return;
    case Expr::Call: {
      const Intrinsic* in = findIntrinsic(e.s);
      if (!in) {
        std::string known;
        for (const Intrinsic& i : intrinsics())
          known += std::string(known.empty() ? "" : ", ") + i.name;
        diags.error(e.loc, "unknown intrinsic '" + e.s + "'");
        diags.note(e.loc, "intrinsics are: " + known);
        ok = false;
        return;
      }
      if (static_cast<int>(e.kids.size()) != in->arity) {
        diags.error(e.loc, "'" + e.s + "' takes " + std::to_string(in->arity) + " argument" +
                               (in->arity == 1 ? "" : "s") + " but is given " +
                               std::to_string(e.kids.size()));
        ok = false;
        return;
      }
      for (const ExprPtr& k : e.kids)
        emit(*k, out);
      out.code.push_back({in->op, 0, 0});
      return;
    }
    default:
      diags.error(e.loc, "unexpected value in an expression body");
      ok = false;
    }
  }

  DiagEngine& diags;
  const ActivationDef& act;
  std::map<std::string, int> locals;
  bool ok = true;
};

} // namespace

std::vector<std::string> intrinsicNames() {
  std::vector<std::string> out;
  for (const Intrinsic& i : intrinsics())
    out.push_back(i.name);
  return out;
}

double CompiledExpr::eval(double x, const double* params) const {
  double stack[64];
  double localVals[64];
  int sp = 0;
  for (const Instr& in : code) {
    switch (in.op) {
    case Const:
      stack[sp++] = in.value;
      break;
    case X:
      stack[sp++] = x;
      break;
    case Param:
      stack[sp++] = params[in.index];
      break;
    case Local:
      stack[sp++] = localVals[in.index];
      break;
    case Store:
      localVals[in.index] = stack[--sp];
      break;
    case Neg:
      stack[sp - 1] = -stack[sp - 1];
      break;
    case Select: {
      double b = stack[--sp], a = stack[--sp], c = stack[--sp];
      stack[sp++] = c != 0.0 ? a : b;
      break;
    }
    case Exp:
      stack[sp - 1] = std::exp(stack[sp - 1]);
      break;
    case Log:
      stack[sp - 1] = std::log(stack[sp - 1]);
      break;
    case Tanh:
      stack[sp - 1] = std::tanh(stack[sp - 1]);
      break;
    case Erf:
      stack[sp - 1] = std::erf(stack[sp - 1]);
      break;
    case Sqrt:
      stack[sp - 1] = std::sqrt(stack[sp - 1]);
      break;
    case Rsqrt:
      stack[sp - 1] = 1.0 / std::sqrt(stack[sp - 1]);
      break;
    case Abs:
      stack[sp - 1] = std::fabs(stack[sp - 1]);
      break;
    default: {
      double b = stack[--sp], a = stack[sp - 1];
      double r = 0;
      switch (in.op) {
      case Add:
        r = a + b;
        break;
      case Sub:
        r = a - b;
        break;
      case Mul:
        r = a * b;
        break;
      case Div:
        r = a / b;
        break;
      case Lt:
        r = a < b;
        break;
      case Le:
        r = a <= b;
        break;
      case Gt:
        r = a > b;
        break;
      case Ge:
        r = a >= b;
        break;
      case Eq:
        r = a == b;
        break;
      case Ne:
        r = a != b;
        break;
      case Min:
        r = std::fmin(a, b);
        break;
      case Max:
        r = std::fmax(a, b);
        break;
      case Pow:
        r = std::pow(a, b);
        break;
      default:
        break;
      }
      stack[sp - 1] = r;
    }
    }
  }
  return stack[0];
}

// --- the vocabulary --------------------------------------------------------------------------

namespace {

class LibraryBuilder {
public:
  LibraryBuilder(const RecordKeeper& rk, DiagEngine& d, PatternLibrary& out, bool anyFamily)
      : rk(rk), diags(d), lib(out), anyFamily_(anyFamily) {}

  bool run() {
    for (const Record* r : rk.defsOf("Op"))
      op(*r);
    for (const Record* r : rk.defsOf("Activation"))
      activation(*r);
    for (const Record* r : rk.defsOf("Pattern"))
      pattern(*r);
    for (const Record* r : rk.defsOf("Raise"))
      raise(*r, false);
    for (const Record* r : rk.defsOf("Rewrite"))
      raise(*r, true);
    return ok;
  }

private:
  void fail(SourceLoc loc, const std::string& msg) {
    diags.error(loc, msg);
    ok = false;
  }

  static int64_t intField(const Record& r, const char* n, int64_t dflt) {
    const Field* f = r.field(n);
    return f && (f->value->kind == Value::Int || f->value->kind == Value::Bit) ? f->value->i : dflt;
  }

  void op(const Record& r) {
    auto kind = ir::parseOpKind(r.name);
    if (!kind || *kind == ir::OpKind::Input || *kind == ir::OpKind::Fused ||
        *kind == ir::OpKind::Activation || *kind == ir::OpKind::Constant) {
      fail(r.loc, "op '" + r.name +
                      "' is not an op of the IR; matchable ops are gemm, bias_add, add, mul, sub, "
                      "div, pow, reduce_mean, softmax, layernorm, rmsnorm, attn_qk, attn_pv, "
                      "attention (activations are matched by their Activation def, constants by "
                      "numbers)");
      return;
    }
    const ir::OpKindInfo& info = ir::opKindInfo(*kind);
    int n = static_cast<int>(intField(r, "operands", -1));
    if (n != info.minOperands || n != info.maxOperands) {
      fail(r.loc, "op '" + r.name + "' declares " + std::to_string(n) + " operands but the IR's " +
                      r.name + " takes " + std::to_string(info.minOperands));
      return;
    }
    lib.ops.push_back({r.name, *kind, n, intField(r, "commutative", 0) != 0, r.loc});
  }

  void activation(const Record& r) {
    ActivationDef a;
    a.name = r.name;
    a.loc = r.loc;
    if (r.loc.file >= 0)
      a.where =
          displayPath(diags.sources().file(r.loc.file).name) + ":" + std::to_string(r.loc.line);
    const Field* body = r.field("body");
    if (!body || body->value->kind != Value::Body) {
      fail(r.loc, "activation '" + r.name + "' has no body; write let body = expr { ... };");
      return;
    }
    a.body = body->value->body;
    if (const Field* ps = r.field("params"); ps && ps->value->kind == Value::List) {
      for (const ValuePtr& p : ps->value->items) {
        if (p->kind != Value::Rec)
          continue;
        const Field* n = p->rec->field("name");
        const Field* d = p->rec->field("default");
        if (!n || n->value->kind != Value::String || !d ||
            (d->value->kind != Value::Float && d->value->kind != Value::Int)) {
          fail(p->loc.valid() ? p->loc : r.loc, "a Param needs a name and a default value");
          continue;
        }
        if (std::count(a.paramNames.begin(), a.paramNames.end(), n->value->s)) {
          fail(p->loc, "parameter '" + n->value->s + "' is declared twice");
          continue;
        }
        if (n->value->s == "x") { // the body's `x` would be the input, never the parameter
          fail(p->loc.valid() ? p->loc : r.loc,
               "parameter 'x' is the name of the activation's input; give it another name");
          continue;
        }
        a.paramNames.push_back(n->value->s);
        a.paramDefaults.push_back(
            d->value->kind == Value::Float ? d->value->f : static_cast<double>(d->value->i));
      }
    }
    BodyCompiler bc(diags, a);
    if (!bc.compile(*a.body, a.compiled)) {
      ok = false;
      return;
    }
    lib.activations.push_back(std::move(a));
  }

  const OpDef* findOp(const std::string& n) const {
    for (const OpDef& o : lib.ops)
      if (o.name == n)
        return &o;
    return nullptr;
  }

  bool matchTree(const Value& dag, MatchNode& node, PatternDef& p,
                 std::map<std::string, std::string>& bound, bool literals = false) {
    const Record* opRec = dag.items[0]->rec;
    node.loc = dag.items[0]->loc.valid() ? dag.items[0]->loc : dag.loc;
    int arity;
    if (opRec->isA("Op")) {
      const OpDef* o = findOp(opRec->name);
      if (!o)
        return false; // the op's own definition was reported
      node.kind = o->kind;
      node.commutative = o->commutative;
      arity = o->operands;
    } else if (opRec->isA("Activation")) {
      node.kind = ir::OpKind::Activation;
      node.fn = opRec->name;
      arity = 1;
    } else {
      fail(node.loc, "unknown op '" + opRec->name + "' in the match of '" + p.name +
                         "': it is neither an Op nor an Activation");
      diags.note(opRec->loc, "'" + opRec->name + "' is defined here");
      return false;
    }
    ++p.numOps;
    const int given = static_cast<int>(dag.items.size()) - 1;
    if (given != arity) {
      fail(node.loc, "'" + opRec->name + "' takes " + std::to_string(arity) + " operand" +
                         (arity == 1 ? "" : "s") + " but the match gives it " +
                         std::to_string(given));
      return false;
    }
    if (!dag.dagName.empty()) {
      node.binding = dag.dagName;
      if (!bound.emplace(dag.dagName, "op").second) {
        fail(dag.loc, "binding '$" + dag.dagName + "' is used twice; an op node can be named once");
        return false;
      }
    }
    bool good = true;
    for (int i = 1; i <= given; ++i) {
      const Value& arg = *dag.items[static_cast<size_t>(i)];
      MatchNode child;
      if (arg.kind == Value::Binding) {
        child.leaf = true;
        child.binding = arg.s;
        child.loc = arg.loc;
        auto [it, fresh] = bound.emplace(arg.s, "leaf");
        if (fresh)
          p.inputs.push_back(arg.s);
        else if (it->second != "leaf") {
          fail(arg.loc, "binding '$" + arg.s + "' names an op node and a leaf");
          good = false;
        }
      } else if (arg.kind == Value::Dag) {
        good = matchTree(arg, child, p, bound, literals) && good;
      } else if ((arg.kind == Value::Float || arg.kind == Value::Int) && literals) {
        child.leaf = child.constant = true;
        child.value = arg.kind == Value::Float ? arg.f : static_cast<double>(arg.i);
        child.loc = arg.loc;
      } else {
        fail(arg.loc.valid() ? arg.loc : node.loc,
             std::string("operands in a match are $bindings or (op ...) trees") +
                 (literals ? " or numbers" : "") + ", not " + arg.str());
        if (arg.kind == Value::Float || arg.kind == Value::Int)
          diags.note(p.loc, "numbers match constants of the graph in Raise and Rewrite patterns "
                            "only; a fused kernel's epilogue reads tensors");
        good = false;
      }
      node.operands.push_back(std::move(child));
    }
    return good;
  }

  /// Matching, the matcher table and the kernel's epilogue all walk the tree as written: a dag
  /// built from defvars used twice doubles at every level. Real patterns have tens of nodes.
  bool smallEnough(const Value& tree, const std::string& what) {
    constexpr size_t kMaxPatternNodes = 256;
    if (tree.nodes <= kMaxPatternNodes)
      return true;
    fail(tree.loc, what + " has " + std::to_string(tree.nodes) + " nodes; at most " +
                       std::to_string(kMaxPatternNodes) + " are allowed");
    return false;
  }

  void pattern(const Record& r) {
    PatternDef p;
    p.name = r.name;
    p.loc = r.loc;
    p.order = r.order;
    const Field* m = r.field("match");
    if (!m || m->value->kind != Value::Dag) {
      fail(r.loc, "pattern '" + r.name + "' has no match tree");
      return;
    }
    if (!smallEnough(*m->value, "the match of pattern '" + r.name + "'"))
      return;
    std::map<std::string, std::string> bound;
    if (!matchTree(*m->value, p.root, p, bound))
      return;
    auto requireLeaf = [&](const Value& v, const std::string& what) -> bool {
      if (v.kind != Value::Binding) {
        fail(v.loc.valid() ? v.loc : r.loc, what + " takes a $binding, not " + v.str());
        return false;
      }
      if (!bound.count(v.s)) {
        fail(v.loc, "unbound binding '$" + v.s + "' in " + what + " of '" + r.name +
                        "': it does not appear in the match");
        diags.note(m->value->loc.valid() ? m->value->loc : r.loc, "the match is here");
        return false;
      }
      return true;
    };
    if (const Field* e = r.field("epilogue"); e && e->value->kind == Value::List) {
      for (const ValuePtr& step : e->value->items) {
        const Record* op = step->items[0]->rec;
        SourceLoc at = step->items[0]->loc.valid() ? step->items[0]->loc : r.loc;
        if (!op->isA("EpilogueOp")) {
          fail(at,
               "'" + op->name + "' is not an epilogue step (bias, activation, residual, scale)");
          continue;
        }
        if (step->items.size() != 2) {
          fail(at, "epilogue step '" + op->name + "' takes one argument");
          continue;
        }
        EpilogueStepDef s;
        s.kind = op->name;
        s.loc = at;
        const Value& arg = *step->items[1];
        if (s.kind == "activation") {
          if (arg.kind != Value::Rec || !arg.rec->isA("Activation")) {
            fail(arg.loc.valid() ? arg.loc : at,
                 "(activation ...) takes an Activation, not " + arg.str());
            continue;
          }
          s.fn = arg.rec->name;
        } else if (s.kind == "bias" || s.kind == "residual" || s.kind == "scale") {
          if (!requireLeaf(arg, "(" + s.kind + " ...)"))
            continue;
          s.binding = arg.s;
        } else {
          fail(at, "epilogue step '" + s.kind + "' is not understood by the kernel families");
          continue;
        }
        p.epilogue.push_back(s);
      }
    }
    if (!constraints(r, bound, p))
      return;
    const Field* fam = r.field("family");
    p.family = fam && fam->value->kind == Value::String ? fam->value->s : "gemm";
    if (!anyFamily_ && !ir::isKernelFamily(p.family)) {
      fail(fam && fam->value->loc.valid() ? fam->value->loc : r.loc,
           "unknown kernel family \"" + p.family + "\" (fpat has " + ir::kernelFamilyList() + ")" +
               ir::familyDidYouMean(p.family));
      return;
    }
    int64_t benefit = intField(r, "benefit", -1);
    if (benefit < -1 || benefit > 1000000) {
      fail(r.field("benefit")->value->loc, "benefit must be -1 (automatic) or 0 to 1000000");
      return;
    }
    p.benefit = benefit == -1 ? p.numOps : static_cast<int>(benefit);
    p.singleUse = intField(r, "single_use", 1) != 0;
    if (!anyFamily_ && (!familyCanImplement(p) || !epilogueListAgrees(p, r)))
      return;
    lib.patterns.push_back(std::move(p));
  }

  /// A Raise pattern (or, with `rewrite`, a Rewrite): a match tree (numbers in it match
  /// constants of the graph) and the tree of IR ops it becomes. Raises turn an exporter's
  /// decompositions into IR ops before fusion; rewrites run after them, and where their
  /// constraints ask for weights, the ops of their results that read weights alone are
  /// computed once per set of weights (ir::weightOnly).
  void raise(const Record& r, bool rewrite) {
    const std::string what = rewrite ? "rewrite" : "raise";
    PatternDef p;
    p.name = r.name;
    p.loc = r.loc;
    p.order = r.order;
    const Field* m = r.field("match");
    if (!m || m->value->kind != Value::Dag) {
      fail(r.loc, what + " '" + r.name + "' has no match tree");
      return;
    }
    if (!smallEnough(*m->value, "the match of " + what + " '" + r.name + "'"))
      return;
    std::map<std::string, std::string> bound;
    if (!matchTree(*m->value, p.root, p, bound, /*literals=*/true) || !constraints(r, bound, p))
      return;
    const Field* res = r.field("result");
    if (!res || res->value->kind != Value::Dag) {
      fail(r.loc, what + " '" + r.name + "' has no result tree");
      return;
    }
    if (!smallEnough(*res->value, "the result of " + what + " '" + r.name + "'") ||
        !resultTree(*res->value, p.result, p, bound))
      return;
    const int64_t benefit = intField(r, "benefit", -1);
    if (benefit < -1 || benefit > 1000000) {
      fail(r.field("benefit")->value->loc, "benefit must be -1 (automatic) or 0 to 1000000");
      return;
    }
    p.benefit = benefit == -1 ? p.numOps : static_cast<int>(benefit);
    p.singleUse = intField(r, "single_use", 1) != 0;
    (rewrite ? lib.rewrites : lib.raises).push_back(std::move(p));
  }

  /// A raise's result: IR ops over the match's bindings; after an op's operands come its
  /// attributes (a norm's eps, an activation's parameters), as numbers or bound constants.
  bool resultTree(const Value& dag, MatchNode& node, const PatternDef& p,
                  const std::map<std::string, std::string>& bound) {
    const Record* opRec = dag.items[0]->rec;
    node.loc = dag.items[0]->loc.valid() ? dag.items[0]->loc : dag.loc;
    std::vector<std::string> attrNames;
    int arity = 1;
    if (opRec->isA("Op")) {
      const OpDef* o = findOp(opRec->name);
      if (!o)
        return false;
      node.kind = o->kind;
      arity = o->operands;
      if (isNorm(o->kind))
        attrNames = {"eps"};
      else if (o->kind == ir::OpKind::Gemm)
        attrNames = {"transpose_b"}; // 1: B is stored [N, K]
      else if (o->kind == ir::OpKind::Rope)
        attrNames = {"interleaved"}; // 1: pairs rotate (GPT-J), not halves
    } else if (opRec->isA("Activation")) {
      node.kind = ir::OpKind::Activation;
      node.fn = opRec->name;
      if (const ActivationDef* a = lib.findActivation(opRec->name))
        attrNames = a->paramNames;
    } else {
      fail(node.loc, "unknown op '" + opRec->name + "' in the result of '" + p.name +
                         "': it is neither an Op nor an Activation");
      return false;
    }
    if (!dag.dagName.empty()) {
      fail(dag.loc, "nodes of a result cannot be named; the result's root takes the matched "
                    "root's name");
      return false;
    }
    const int given = static_cast<int>(dag.items.size()) - 1;
    const int most = arity + static_cast<int>(attrNames.size());
    if (given < arity || given > most) {
      std::string attrs;
      for (const std::string& a : attrNames)
        attrs += (attrs.empty() ? "" : ", ") + a;
      fail(node.loc, "'" + opRec->name + "' takes " + std::to_string(arity) + " operand" +
                         (arity == 1 ? "" : "s") +
                         (attrs.empty() ? "" : " and then at most its attributes (" + attrs + ")") +
                         " but the result gives it " + std::to_string(given));
      return false;
    }
    bool good = true;
    for (int i = 1; i <= given; ++i) {
      const Value& arg = *dag.items[static_cast<size_t>(i)];
      const bool operand = i <= arity;
      MatchNode child;
      child.loc = arg.loc.valid() ? arg.loc : node.loc;
      if (arg.kind == Value::Binding) {
        if (!bound.count(arg.s)) {
          fail(child.loc, "unbound binding '$" + arg.s + "' in the result of '" + p.name +
                              "': it does not appear in the match");
          good = false;
        }
        child.leaf = true;
        child.binding = arg.s;
      } else if (arg.kind == Value::Dag && operand) {
        good = resultTree(arg, child, p, bound) && good;
      } else if (arg.kind == Value::Float || arg.kind == Value::Int) {
        // An attribute's value, or an operand that is a scalar constant (e.g. attention's
        // bias 0 where the match has no mask).
        child.leaf = child.constant = true;
        child.value = arg.kind == Value::Float ? arg.f : static_cast<double>(arg.i);
      } else {
        fail(child.loc, std::string(operand ? "operands of a result are $bindings, numbers or "
                                              "(op ...) trees"
                                            : "attributes of a result are numbers or $bindings "
                                              "of constants") +
                            ", not " + arg.str());
        good = false;
      }
      (operand ? node.operands : node.attrs).push_back(std::move(child));
    }
    return good;
  }

  /// The `constraints` list of a Pattern or Raise; false after an error.
  bool constraints(const Record& r, const std::map<std::string, std::string>& bound,
                   PatternDef& p) {
    const int before = diags.errorCount();
    if (const Field* c = r.field("constraints"); c && c->value->kind == Value::List) {
      for (const ValuePtr& dag : c->value->items) {
        const Record* op = dag->items[0]->rec;
        SourceLoc at = dag->items[0]->loc.valid() ? dag->items[0]->loc : r.loc;
        Constraint k;
        k.loc = at;
        if (!op->isA("Predicate") ||
            (op->name != "dtype" && op->name != "divisible" && op->name != "rank" &&
             op->name != "half_slice" && op->name != "weight" && op->name != "b_layout" &&
             op->name != "rope_pairs")) {
          fail(at, "'" + op->name +
                       "' is not a predicate (dtype, divisible, rank, half_slice, weight, "
                       "b_layout, rope_pairs)");
          continue;
        }
        const size_t want = op->name == "divisible" ? 4 : op->name == "weight" ? 2 : 3;
        if (dag->items.size() != want) {
          fail(at, "'" + op->name + "' takes " + std::to_string(want - 1) + " argument" +
                       (want == 2 ? "" : "s"));
          continue;
        }
        if (!requireLeafOrNode(*dag->items[1], bound, "(" + op->name + " ...)", r))
          continue;
        k.binding = dag->items[1]->s;
        if (op->name == "weight") {
          k.kind = Constraint::Weight;
        } else if (op->name == "b_layout") {
          k.kind = Constraint::Layout;
          const MatchNode* n = findNode(p.root, k.binding);
          if (!n || n->leaf || n->kind != ir::OpKind::Gemm) {
            fail(dag->items[1]->loc.valid() ? dag->items[1]->loc : at,
                 "(b_layout $g, ...) needs a gemm of the match, named as (gemm ...):$" + k.binding);
            continue;
          }
          const Value& l = *dag->items[2];
          if (l.kind != Value::String || (l.s != "kn" && l.s != "nk")) {
            fail(l.loc.valid() ? l.loc : at,
                 "b_layout must be \"kn\" (B stored [K, N]) or \"nk\" (B stored [N, K]), not " +
                     l.str());
            continue;
          }
          k.dim = l.s == "nk";
        } else if (op->name == "dtype") {
          k.kind = Constraint::Dtype;
          auto dt = dag->items[2]->kind == Value::String ? ir::parseDType(dag->items[2]->s)
                                                         : std::nullopt;
          if (!dt) {
            fail(dag->items[2]->loc.valid() ? dag->items[2]->loc : at,
                 "dtype must be \"f16\", \"bf16\" or \"f32\", not " + dag->items[2]->str());
            continue;
          }
          k.dtype = *dt;
        } else if (op->name == "rope_pairs") {
          k.kind = Constraint::Pairs;
          const MatchNode* n = findNode(p.root, k.binding);
          if (!n || n->leaf || n->kind != ir::OpKind::Rope) {
            fail(dag->items[1]->loc.valid() ? dag->items[1]->loc : at,
                 "(rope_pairs $r, p) needs a rope of the match, named as (rope ...):$" + k.binding);
            continue;
          }
          const Value& h = *dag->items[2];
          if (h.kind != Value::Int || h.i < 0 || h.i > 1) {
            fail(at, "(rope_pairs $r, p) needs p 1 (pairs, interleaved) or 0 (halves)");
            continue;
          }
          k.dim = static_cast<int>(h.i);
        } else if (op->name == "half_slice") {
          k.kind = Constraint::Half;
          const Value& h = *dag->items[2];
          if (h.kind != Value::Int || h.i < 0 || h.i > 1) {
            fail(at, "(half_slice $s, h) needs h 0 (the first half) or 1 (the second)");
            continue;
          }
          k.dim = static_cast<int>(h.i);
        } else if (op->name == "rank") {
          k.kind = Constraint::Rank;
          const Value& d = *dag->items[2];
          if (d.kind != Value::Int || d.i < 0 || d.i > 2) {
            fail(at, "(rank $v, r) needs r from 0 to 2");
            continue;
          }
          k.dim = static_cast<int>(d.i);
        } else {
          k.kind = Constraint::Divisible;
          const Value &d = *dag->items[2], &q = *dag->items[3];
          if (d.kind != Value::Int || d.i < 0 || d.i > 1 || q.kind != Value::Int || q.i < 1 ||
              q.i > (int64_t{1} << 30)) {
            fail(at, "(divisible $v, dim, k) needs dim 0 or 1 and k from 1 to 2^30");
            continue;
          }
          k.dim = static_cast<int>(d.i);
          k.divisor = q.i;
        }
        p.constraints.push_back(k);
      }
    }
    return diags.errorCount() == before;
  }

  static bool isNorm(ir::OpKind k) {
    return k == ir::OpKind::LayerNorm || k == ir::OpKind::RmsNorm;
  }
  static bool hasGemm(const MatchNode& n) {
    if (n.leaf)
      return false;
    if (n.kind == ir::OpKind::Gemm)
      return true;
    for (const MatchNode& c : n.operands)
      if (hasGemm(c))
        return true;
    return false;
  }

  /// Legality: the family's own part decides which matches its kernel implements.
  bool familyCanImplement(const PatternDef& p) {
    const ir::KernelFamily* family = ir::findFamily(p.family);
    if (!family)
      return true;
    struct Checker final : PatternChecker {
      explicit Checker(LibraryBuilder& b) : b(b) {}
      void error(SourceLoc at, const std::string& message) override { b.fail(at, message); }
      void note(SourceLoc at, const std::string& message) override { b.diags.note(at, message); }
      LibraryBuilder& b;
    } checker(*this);
    return familyLegality(family->family).canImplement(p, checker);
  }

  /// The optional `epilogue` list must say what the match computes: the epilogue is derived
  /// from the match, and a list that disagrees is a mistake in one of the two.
  bool epilogueListAgrees(const PatternDef& p, const Record& r) {
    if (p.epilogue.empty())
      return true;
    std::vector<std::string> derived; // bottom-up, as the list is written
    const MatchNode* n = &p.root;
    bool chain = true;
    while (chain && !n->leaf && n->kind != ir::OpKind::Gemm) {
      if (n->kind == ir::OpKind::Activation) {
        derived.insert(derived.begin(), "(activation " + n->fn + ")");
        n = &n->operands[0];
        continue;
      }
      if (n->operands.size() != 2) {
        chain = false;
        break;
      }
      const bool left = hasGemm(n->operands[0]);
      const MatchNode& other = n->operands[left ? 1 : 0];
      if ((!left && n->kind == ir::OpKind::BiasAdd) || !other.leaf || hasGemm(other)) {
        chain = false;
        break;
      }
      const char* step = n->kind == ir::OpKind::BiasAdd ? "bias"
                         : n->kind == ir::OpKind::Add   ? "residual"
                                                        : "scale";
      derived.insert(derived.begin(), "(" + std::string(step) + " $" + other.binding + ")");
      n = &n->operands[left ? 0 : 1];
    }
    const Field* e = r.field("epilogue");
    const SourceLoc at = e && e->value->loc.valid() ? e->value->loc : p.loc;
    if (!chain) {
      fail(at, "the epilogue list of '" + p.name +
                   "' cannot describe its match (not a chain of bias, activation, residual and "
                   "scale steps); leave the list out: the epilogue is derived from the match");
      return false;
    }
    std::vector<std::string> given;
    for (const EpilogueStepDef& s : p.epilogue)
      given.push_back("(" + s.kind + " " + (s.kind == "activation" ? s.fn : "$" + s.binding) + ")");
    if (given == derived)
      return true;
    auto join = [](const std::vector<std::string>& v) {
      std::string o;
      for (const std::string& x : v)
        o += (o.empty() ? "" : ", ") + x;
      return o.empty() ? std::string("nothing") : o;
    };
    fail(at, "the epilogue list of '" + p.name + "' says " + join(given) +
                 ", but the match computes " + join(derived));
    diags.note(p.root.loc, "the epilogue is derived from this match; the list can be left out");
    return false;
  }

  /// The node of `n`'s tree bound to `binding`, or null.
  static const MatchNode* findNode(const MatchNode& n, const std::string& binding) {
    if (n.binding == binding)
      return &n;
    for (const MatchNode& c : n.operands)
      if (const MatchNode* f = findNode(c, binding))
        return f;
    return nullptr;
  }

  bool requireLeafOrNode(const Value& v, const std::map<std::string, std::string>& bound,
                         const std::string& what, const Record& r) {
    if (v.kind != Value::Binding) {
      fail(v.loc.valid() ? v.loc : r.loc, what + " takes a $binding, not " + v.str());
      return false;
    }
    if (!bound.count(v.s)) {
      fail(v.loc, "unbound binding '$" + v.s + "' in " + what + " of '" + r.name +
                      "': it does not appear in the match");
      return false;
    }
    return true;
  }

  const RecordKeeper& rk;
  DiagEngine& diags;
  PatternLibrary& lib;
  bool anyFamily_;
  bool ok = true;
};

} // namespace

const std::map<std::string, double>& namedConstants() {
  static const std::map<std::string, double> c = {{"pi", M_PI}, {"e", M_E}};
  return c;
}

bool buildLibrary(const RecordKeeper& rk, DiagEngine& diags, PatternLibrary& out, bool anyFamily) {
  return LibraryBuilder(rk, diags, out, anyFamily).run();
}

std::optional<Compilation> compileFpat(int fileId, SourceManager& sm, DiagEngine& diags,
                                       const CompileOptions& opts) {
  Compilation c;
  const int before = diags.errorCount();
  c.records = buildRecords(fileId, sm, diags, opts, &c.dependencies);
  if (diags.errorCount() > before)
    return std::nullopt;
  buildLibrary(*c.records, diags, c.library, opts.anyFamily);
  if (diags.errorCount() > before)
    return std::nullopt;
  return c;
}

std::optional<Compilation> compileBuiltinPatterns(SourceManager& sm, DiagEngine& diags) {
  const std::string_view* all = embeddedPattern("all.fpat");
  if (!all) {
    diags.error({}, "the built-in patterns are missing from this binary");
    return std::nullopt;
  }
  CompileOptions opts;
  opts.mainIsEmbedded = true;
  return compileFpat(sm.addBuffer(std::string(kEmbeddedPrefix) + "all.fpat", std::string(*all)), sm,
                     diags, opts);
}

} // namespace fpat::dsl
