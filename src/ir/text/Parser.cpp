// Turns the ANTLR parse tree of a .fgraph file into IR. ANTLR types stay in this file.
#include "FGraphBaseVisitor.h"
#include "FGraphLexer.h"
#include "FGraphParser.h"
#include "fpat/ir/text/Text.h"
#include "fpat/support/antlr/AntlrDiagnostics.h"

#include <cctype>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

namespace fpat::ir {
namespace {

using namespace fpat_fgraph;

using antlr::tokenLoc;

/// The attributes an op of this kind takes, for did-you-mean notes.
std::vector<std::string> attributeNames(const Op& op) {
  switch (op.kind) {
  case OpKind::Input:
    return op.weight ? std::vector<std::string>{} : std::vector<std::string>{"mask"};
  case OpKind::Gemm:
    return {"transpose_b"};
  case OpKind::Activation:
    return {"fn"};
  case OpKind::LayerNorm:
  case OpKind::RmsNorm:
    return {"eps"};
  case OpKind::Fused:
    return {"pattern", "family", "norm", "epilogue", "transpose_b", "eps"};
  case OpKind::Constant:
    return {"value"};
  case OpKind::Slice:
    return {"begin", "end"};
  case OpKind::Rope:
    return {"interleaved"};
  case OpKind::AttnQk:
  case OpKind::AttnPv:
  case OpKind::Attention:
  case OpKind::Heads:
    return {"batch", "head_dim"};
  case OpKind::BatchFirst:
  case OpKind::SeqFirst:
  case OpKind::KvAppend:
    return {"batch"};
  default:
    return {};
  }
}

bool subtreeHasErrors(antlr4::tree::ParseTree* t) {
  if (dynamic_cast<antlr4::tree::ErrorNode*>(t))
    return true;
  if (auto* ctx = dynamic_cast<antlr4::ParserRuleContext*>(t))
    if (ctx->exception)
      return true;
  for (auto* c : t->children)
    if (subtreeHasErrors(c))
      return true;
  return false;
}

/// The one visitor that builds the IR: name resolution, attributes and type inference, with
/// every problem reported at its token.
class IrBuilder : public FGraphBaseVisitor {
public:
  IrBuilder(int fileId, DiagEngine& diags, const ActivationSet& acts,
            const std::map<std::string, int64_t>& dims)
      : fileId_(fileId), diags_(diags), acts_(acts), dims_(dims) {}

  Graph graph;

  antlrcpp::Any visitGraphDecl(FGraphParser::GraphDeclContext* ctx) override {
    if (ctx->name)
      graph.setName(ctx->name->getText());
    for (auto* s : ctx->stmt()) {
      if (diags_.limitReached())
        break;
      if (subtreeHasErrors(s)) {
        // Values defined by a broken statement are known but untyped: no cascades.
        if (auto* d = s->defStmt(); d && d->VALUE())
          poisoned_.insert(valueName(d->VALUE()));
        continue;
      }
      visit(s);
    }
    // A missing output is likely inside a broken statement: say nothing then.
    if (graph.outputs().empty() && !sawOutput_ && !subtreeHasErrors(ctx))
      diags_.error(tokenLoc(fileId_, ctx->name ? ctx->name : ctx->getStart()),
                   "graph '" + graph.name() + "' has no outputs; add 'output %value'");
    return nullptr;
  }

  antlrcpp::Any visitDefStmt(FGraphParser::DefStmtContext* ctx) override {
    const std::string name = valueName(ctx->VALUE());
    const SourceLoc nameLoc = tokenLoc(fileId_, ctx->VALUE()->getSymbol());
    const SourceLoc opLoc = tokenLoc(fileId_, ctx->op);
    bool ok = true;
    if (auto it = defs_.find(name); it != defs_.end()) {
      diags_.error(nameLoc, "redefinition of value '%" + name + "'");
      diags_.note(graph.op(it->second).loc, "previous definition is here");
      return nullptr; // keep the first definition
    }
    Op op;
    op.name = name;
    op.loc = nameLoc;
    // `weight` declares an input that is part of the model (values from --inputs or random).
    const bool weight = ctx->op->getText() == "weight";
    auto kind = weight ? std::optional<OpKind>(OpKind::Input) : parseOpKind(ctx->op->getText());
    if (!kind) {
      std::vector<std::string> names{"weight"};
      for (const OpKindInfo& k : opKinds())
        names.push_back(k.name);
      diags_.error(opLoc, "unknown op '" + ctx->op->getText() + "'" +
                              didYouMean(ctx->op->getText(), names));
      poisoned_.insert(name);
      return nullptr;
    }
    op.kind = *kind;
    op.weight = weight;

    std::vector<Vertex> operands;
    std::vector<OperandInfo> infos;
    std::vector<SourceLoc> operandLocs;
    if (auto* list = ctx->operandList()) {
      for (auto* tok : list->VALUE()) {
        std::string u = valueName(tok);
        operandLocs.push_back(tokenLoc(fileId_, tok->getSymbol()));
        auto it = defs_.find(u);
        if (it == defs_.end()) {
          if (!poisoned_.count(u)) {
            diags_.error(operandLocs.back(), "use of undefined value '%" + u + "'");
            if (u == name)
              diags_.note(nameLoc, "a value cannot be used in its own definition");
          }
          ok = false;
          continue;
        }
        operands.push_back(it->second);
        infos.push_back({u, graph.op(it->second).type});
      }
    }

    if (auto* attrs = ctx->attrDict())
      ok = applyAttrs(op, attrs) && ok;

    std::optional<TensorDesc> annotated;
    if (auto* tt = ctx->tensorType()) {
      annotated = parseTensorType(tt);
      if (!annotated)
        ok = false;
    }
    // Inputs and fused ops carry their type; everything else has it inferred.
    if (op.kind == OpKind::Input || op.kind == OpKind::Fused || op.kind == OpKind::Constant) {
      if (!ctx->tensorType()) {
        const std::string what = weight ? "weight" : opKindName(op.kind);
        diags_.error(opLoc, what + " '%" + name + "' needs a type, e.g. '%" + name + " = " + what +
                                (op.kind == OpKind::Fused      ? " ... : f16[1024, 4096]'"
                                 : op.kind == OpKind::Constant ? " {value = 0.5} : f16[]'"
                                                               : " : f16[1024, 4096]'"));
        ok = false;
      } else if (annotated) {
        op.type = *annotated;
      }
    }
    if (op.kind == OpKind::Constant && !(ctx->attrDict() && hasAttr(ctx->attrDict(), "value"))) {
      diags_.error(opLoc, "constant '%" + name + "' needs a value: {value = 0.5}");
      ok = false;
    }
    if (op.kind == OpKind::Activation && op.fn.empty()) {
      diags_.error(opLoc, "activation '%" + name + "' needs a function: {fn = gelu}");
      ok = false;
    }
    if (!ok) {
      poisoned_.insert(name);
      return nullptr;
    }

    TypeError err;
    auto type = inferType(op, infos, err, acts_);
    if (!type) {
      SourceLoc at = err.operand >= 0 && static_cast<size_t>(err.operand) < operandLocs.size()
                         ? operandLocs[static_cast<size_t>(err.operand)]
                         : opLoc;
      diags_.error(at, err.message);
      if (err.operand >= 0 && static_cast<size_t>(err.operand) < operands.size())
        diags_.note(graph.op(operands[static_cast<size_t>(err.operand)]).loc,
                    "'%" + infos[static_cast<size_t>(err.operand)].name + "' is defined here");
      poisoned_.insert(name);
      return nullptr;
    }
    if (annotated && *annotated != *type) {
      diags_.error(tokenLoc(fileId_, ctx->tensorType()->dtype),
                   "type annotation " + annotated->str() + " does not match the inferred type " +
                       type->str() + " of '%" + name + "'");
      poisoned_.insert(name);
      return nullptr;
    }
    op.type = *type;
    defs_[name] = graph.addOp(std::move(op), operands);
    return nullptr;
  }

  antlrcpp::Any visitOutputStmt(FGraphParser::OutputStmtContext* ctx) override {
    sawOutput_ = true;
    for (auto* tok : ctx->VALUE()) {
      std::string u = valueName(tok);
      auto it = defs_.find(u);
      if (it == defs_.end()) {
        if (!poisoned_.count(u))
          diags_.error(tokenLoc(fileId_, tok->getSymbol()), "use of undefined value '%" + u + "'");
        continue;
      }
      if (graph.isOutput(it->second)) {
        diags_.warning(tokenLoc(fileId_, tok->getSymbol()),
                       "value '%" + u + "' is already an output");
        continue;
      }
      graph.addOutput(it->second);
    }
    return nullptr;
  }

private:
  static std::string valueName(antlr4::tree::TerminalNode* n) { return n->getText().substr(1); }

  static bool hasAttr(FGraphParser::AttrDictContext* dict, const std::string& key) {
    for (auto* a : dict->attr())
      if (a->key->getText() == key)
        return true;
    return false;
  }

  std::optional<TensorDesc> parseTensorType(FGraphParser::TensorTypeContext* tt) {
    TensorDesc t;
    auto dt = parseDType(tt->dtype->getText());
    if (!dt) {
      diags_.error(tokenLoc(fileId_, tt->dtype),
                   "unknown dtype '" + tt->dtype->getText() + "'; expected f16, bf16 or f32");
      return std::nullopt;
    }
    t.dtype = *dt;
    for (auto* d : tt->dim()) {
      if (d->IDENT()) {
        // A named dimension: its size comes from the reader (fpatc --dim NAME=SIZE).
        const std::string name = d->IDENT()->getText();
        auto it = dims_.find(name);
        if (it == dims_.end()) {
          diags_.error(tokenLoc(fileId_, d->IDENT()->getSymbol()),
                       "dimension '" + name + "' has no size; give it, e.g. --dim " + name +
                           "=128");
          return std::nullopt;
        }
        if (it->second < 1 || it->second > (int64_t{1} << 40)) {
          diags_.error(tokenLoc(fileId_, d->IDENT()->getSymbol()),
                       "dimension '" + name + "' is " + std::to_string(it->second) +
                           ", out of range (1 to 2^40)");
          return std::nullopt;
        }
        t.shape.push_back(it->second);
        continue;
      }
      if (!d->INT())
        return std::nullopt; // a dimension the parser's recovery made up: already reported
      const std::string s = d->INT()->getText();
      // 2^40 elements per dimension is far beyond any device; it also keeps numel() exact.
      if (s.size() > 12 || std::stoll(s) > (int64_t{1} << 40) || std::stoll(s) < 1) {
        diags_.error(tokenLoc(fileId_, d->INT()->getSymbol()),
                     "dimension " + s + " is out of range (1 to 2^40)");
        return std::nullopt;
      }
      t.shape.push_back(std::stoll(s));
    }
    if (t.rank() > kMaxRank) {
      diags_.error(tokenLoc(fileId_, tt->dim(kMaxRank)->getStart()),
                   "tensors have rank 4 at most; this type has rank " + std::to_string(t.rank()));
      return std::nullopt;
    }
    // The product is checked too: each dimension fits, their product need not (2^40 x 2^40
    // wraps to 0 in 64 bits). 2^40 elements is far beyond any device and keeps byte counts
    // exact in 64 bits.
    int64_t elements = 1;
    for (int64_t d : t.shape) {
      if (elements > (int64_t{1} << 40) / d) {
        std::string dims;
        for (int64_t e : t.shape)
          dims += (dims.empty() ? "" : " x ") + std::to_string(e);
        diags_.error(tokenLoc(fileId_, tt->dtype),
                     "tensor " + t.str() + " has more than 2^40 elements (" + dims + ")");
        return std::nullopt;
      }
      elements *= d;
    }
    return t;
  }

  struct AttrVal {
    enum Kind { Number, Ident, String, Bool, None } kind = None;
    double num = 0;
    std::string str;
    bool b = false;
  };

  AttrVal attrValue(FGraphParser::AttrContext* a) {
    AttrVal v;
    auto* av = a->attrValue();
    if (!av)
      return v;
    if (auto* n = av->number()) {
      v.kind = AttrVal::Number;
      std::string s = n->getText();
      v.num = std::strtod(s.c_str(), nullptr);
      // 1e999 would become inf, which prints back as text that does not parse.
      if (!std::isfinite(v.num))
        diags_.error(tokenLoc(fileId_, n->getStop()),
                     "number " + s + " is out of range (the largest is about 1.8e308)");
    } else if (av->IDENT()) {
      v.kind = AttrVal::Ident;
      v.str = av->IDENT()->getText();
    } else if (av->STRING()) {
      v.kind = AttrVal::String;
      std::string s = av->STRING()->getText();
      v.str = s.substr(1, s.size() - 2);
    } else {
      v.kind = AttrVal::Bool;
      v.b = av->getText() == "true";
    }
    return v;
  }

  bool applyAttrs(Op& op, FGraphParser::AttrDictContext* dict) {
    bool ok = true;
    std::map<std::string, SourceLoc> seen;
    std::map<std::string, SourceLoc> paramLocs; // activation parameters, checked at the end
    SourceLoc fnLoc;                            // the activation name, for its errors
    for (auto* a : dict->attr()) {
      const std::string key = a->key->getText();
      const SourceLoc loc = tokenLoc(fileId_, a->key);
      if (auto it = seen.find(key); it != seen.end()) {
        diags_.error(loc, "attribute '" + key + "' is given twice");
        diags_.note(it->second, "first given here");
        ok = false;
        continue;
      }
      seen[key] = loc;
      AttrVal v = attrValue(a);
      auto expect = [&](AttrVal::Kind k, const char* what) {
        bool match = v.kind == k || (k == AttrVal::Ident && v.kind == AttrVal::String) ||
                     (k == AttrVal::Bool && v.kind == AttrVal::None);
        if (!match) {
          diags_.error(loc, "attribute '" + key + "' of " + opKindName(op.kind) + " takes " + what);
          ok = false;
        }
        return match;
      };
      switch (op.kind) {
      case OpKind::Input:
        // A run-time mask of 0s and 1s (an ONNX model's integer or bool attention mask).
        if (key == "mask" && !op.weight) {
          if (expect(AttrVal::Bool, "true or false"))
            op.mask = v.kind == AttrVal::None || v.b;
          continue;
        }
        if (key == "mask") {
          diags_.error(loc, "a weight cannot be a mask: its values are the model's; 'mask' "
                            "marks a run-time input of 0s and 1s");
          ok = false;
          continue;
        }
        break;
      case OpKind::Gemm:
        if (key == "transpose_b") {
          if (expect(AttrVal::Bool, "true or false"))
            op.transposeB = v.kind == AttrVal::None || v.b;
          continue;
        }
        break;
      case OpKind::Rope:
        if (key == "interleaved") {
          if (expect(AttrVal::Bool, "true or false"))
            op.interleaved = v.kind == AttrVal::None || v.b;
          continue;
        }
        break;
      case OpKind::Activation:
        if (key == "fn") {
          if (expect(AttrVal::Ident, "an activation name")) {
            op.fn = v.str;
            fnLoc = a->attrValue() ? tokenLoc(fileId_, a->attrValue()->getStart()) : loc;
          }
          continue;
        }
        // Any other attribute is a parameter of the function, a number; a name or string
        // there is most likely a misspelt `fn`.
        if (v.kind != AttrVal::Number) {
          diags_.error(loc, "unknown attribute '" + key + "' for activation" +
                                didYouMean(key, {"fn"}) +
                                "; its other attributes are the function's parameters, numbers");
          ok = false;
          continue;
        }
        op.params[key] = v.num;
        paramLocs[key] = loc;
        continue;
      case OpKind::Constant:
        if (key == "value") {
          if (expect(AttrVal::Number, "a number"))
            op.value = v.num;
          continue;
        }
        break;
      case OpKind::LayerNorm:
      case OpKind::RmsNorm:
        if (key == "eps") {
          if (expect(AttrVal::Number, "a number"))
            op.eps = v.num;
          continue;
        }
        break;
      case OpKind::Slice:
      case OpKind::AttnQk:
      case OpKind::AttnPv:
      case OpKind::Attention:
      case OpKind::Heads:
      case OpKind::BatchFirst:
      case OpKind::SeqFirst:
      case OpKind::KvAppend: {
        const bool slice = op.kind == OpKind::Slice;
        const bool batchOnly = op.kind == OpKind::BatchFirst || op.kind == OpKind::SeqFirst ||
                               op.kind == OpKind::KvAppend;
        int64_t* field = slice ? (key == "begin" ? &op.begin
                                  : key == "end" ? &op.end
                                                 : nullptr)
                               : (key == "batch"                    ? &op.batch
                                  : key == "head_dim" && !batchOnly ? &op.headDim
                                                                    : nullptr);
        if (!field)
          break;
        if (expect(AttrVal::Number, "a whole number")) {
          if (v.num != std::floor(v.num) || v.num < 0 || v.num > double(int64_t{1} << 40)) {
            diags_.error(loc, "attribute '" + key + "' of " + opKindName(op.kind) +
                                  " takes a whole number from 0 to 2^40");
            ok = false;
          } else {
            *field = static_cast<int64_t>(v.num);
          }
        }
        continue;
      }
      case OpKind::Fused:
        if (key == "family" && v.kind != AttrVal::Number && !isKernelFamily(v.str)) {
          diags_.error(loc, "unknown kernel family '" + v.str + "' (fpat has " +
                                kernelFamilyList() + ")" + familyDidYouMean(v.str));
          ok = false;
          continue;
        }
        if (key == "pattern" || key == "family" || key == "norm") {
          if (expect(AttrVal::Ident, "a name"))
            (key == "pattern"  ? op.fused.pattern
             : key == "family" ? op.fused.family
                               : op.fused.norm) = v.str;
          continue;
        }
        if (key == "epilogue") {
          if (expect(AttrVal::String, "a string such as \"gelu(bias_add(acc, $2))\"")) {
            std::string why;
            size_t col = 0;
            if (!parseEpilogue(v.str, op.fused.epilogue, why, col)) {
              // Point into the string (the token starts with its quote; no escapes exist).
              SourceLoc at = a->attrValue() ? tokenLoc(fileId_, a->attrValue()->getStart()) : loc;
              at.col += 1 + static_cast<int>(col);
              at.len = 1;
              diags_.error(at, "malformed epilogue: " + why +
                                   " (the form is e.g. \"gelu(bias_add(acc, $2))\")");
              ok = false;
            }
          }
          continue;
        }
        if (key == "transpose_b") {
          if (expect(AttrVal::Bool, "true or false"))
            op.transposeB = v.kind == AttrVal::None || v.b;
          continue;
        }
        if (key == "eps") {
          if (expect(AttrVal::Number, "a number"))
            op.eps = v.num;
          continue;
        }
        if (v.kind == AttrVal::Number) {
          diags_.error(loc, "unknown attribute '" + key +
                                "' for fused; activation parameters go inside the epilogue, "
                                "e.g. epilogue = \"leaky_relu(acc, " +
                                key + " = 0.5)\"");
          ok = false;
          continue;
        }
        break;
      default:
        break;
      }
      diags_.error(loc, "unknown attribute '" + key + "' for " + opKindName(op.kind) +
                            didYouMean(key, attributeNames(op)));
      ok = false;
    }
    // Parameters must belong to the activation: a misspelt one would otherwise be ignored and
    // the default used silently. (Those inside a fused op's epilogue are checked by inferType.)
    std::vector<std::string> fns;
    if (op.kind == OpKind::Activation && acts_.contains(op.fn))
      fns.push_back(op.fn);
    if (op.kind == OpKind::Activation && !op.fn.empty() && !acts_.contains(op.fn)) {
      // Said here, at the name, with where activations come from (inferType would point at
      // the op and stop there).
      diags_.error(fnLoc, "unknown activation '" + op.fn + "'" + didYouMean(op.fn, acts_.names()));
      diags_.note(fnLoc, "activations are the built-in ones (patterns/activations.fpat) and "
                         "those a --patterns FILE.fpat defines");
      return false;
    }
    if (op.kind == OpKind::Activation && !acts_.contains(op.fn))
      return ok; // inferType reports the missing fn
    for (const auto& [key, loc] : paramLocs) {
      std::vector<std::string> known;
      for (const std::string& fn : fns)
        for (const std::string& p : acts_.params(fn))
          if (std::find(known.begin(), known.end(), p) == known.end())
            known.push_back(p);
      if (std::find(known.begin(), known.end(), key) != known.end())
        continue;
      std::string what =
          op.kind == OpKind::Activation ? "activation '" + op.fn + "'" : "the fused op's epilogue";
      std::string list;
      for (const std::string& p : known)
        list += (list.empty() ? "" : ", ") + p;
      diags_.error(loc, "unknown parameter '" + key + "' for " + what +
                            (known.empty() ? " (it takes none)" : " (it takes: " + list + ")"));
      ok = false;
    }
    return ok;
  }

  int fileId_;
  DiagEngine& diags_;
  const ActivationSet& acts_;
  const std::map<std::string, int64_t>& dims_;
  std::map<std::string, Vertex> defs_;
  std::set<std::string> poisoned_;
  bool sawOutput_ = false;
};

} // namespace

std::optional<Graph> parseGraph(int fileId, DiagEngine& diags, const ActivationSet& acts,
                                const std::map<std::string, int64_t>& dims) {
  const SourceFile& src = diags.sources().file(fileId);
  const int errorsBefore = diags.errorCount();
  size_t bad = 0;
  if (!validateUtf8(src.text, &bad)) {
    diags.error(diags.sources().locForOffset(fileId, bad),
                "invalid UTF-8 byte; .fgraph files are UTF-8 text");
    return std::nullopt;
  }
  antlr4::ANTLRInputStream input(src.text);
  FGraphLexer lexer(&input);
  antlr::ErrorListener listener(fileId, diags, FGraphLexer::BAD_CHAR,
                                {{"VALUE", "a %value"},
                                 {"IDENT", "a name"},
                                 {"INT", "an integer"},
                                 {"FLOAT", "a number"},
                                 {"STRING", "a string"}});
  lexer.removeErrorListeners();
  lexer.addErrorListener(&listener);
  antlr4::CommonTokenStream tokens(&lexer);
  FGraphParser parser(&tokens);
  parser.removeErrorListeners();
  parser.addErrorListener(&listener);
  FGraphParser::FileContext* tree = parser.file();
  IrBuilder builder(fileId, diags, acts, dims);
  if (tree->graphDecl() && !diags.limitReached())
    builder.visitGraphDecl(tree->graphDecl());
  if (diags.errorCount() > errorsBefore)
    return std::nullopt;
  // The builder checked each op; this catches anything a later change might let through.
  auto problems = validate(builder.graph, acts);
  for (const std::string& p : problems)
    diags.error(SourceLoc{fileId, 1, 1, 1}, "internal: " + p);
  if (!problems.empty())
    return std::nullopt;
  return std::move(builder.graph);
}

} // namespace fpat::ir
