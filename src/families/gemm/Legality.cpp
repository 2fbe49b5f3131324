// The GEMM families' legality part: families gemm and norm_gemm compute one GEMM whose operands
// come from memory (norm_gemm: A normalised on load) and apply a tree of elementwise ops to its
// result; the dual families two GEMMs on one A (the same leaf, or the same norm of leaves).
// Anything else would be a kernel that silently computes less than the match.
#include "Gemm.h"
#include "fpat/dsl/Family.h"

#include <algorithm>
#include <functional>

namespace fpat::families {

namespace {
using dsl::MatchNode;
using dsl::matchText;
using dsl::PatternDef;

bool elementwise(ir::OpKind k) {
  return k == ir::OpKind::BiasAdd || k == ir::OpKind::Add || k == ir::OpKind::Mul ||
         k == ir::OpKind::Activation;
}
bool isNorm(ir::OpKind k) {
  return k == ir::OpKind::LayerNorm || k == ir::OpKind::RmsNorm;
}

class GemmLegality final : public dsl::FamilyLegality {
public:
  explicit GemmLegality(ir::Family id) : kind_(gemm::kindOf(id)) {}

  bool canImplement(const PatternDef& p, dsl::PatternChecker& check) const override {
    const bool normFamily = kind_.normalisesA;
    std::vector<const MatchNode*> gemms;
    std::vector<std::string> distinct;
    bool good = true;
    std::function<void(const MatchNode&, bool)> walk = [&](const MatchNode& n, bool normA) {
      if (n.leaf)
        return;
      if (n.kind == ir::OpKind::Gemm) {
        gemms.push_back(&n);
        if (std::find(distinct.begin(), distinct.end(), matchText(n)) == distinct.end())
          distinct.push_back(matchText(n));
        for (size_t i = 0; i < n.operands.size(); ++i) {
          const MatchNode& o = n.operands[i];
          if (o.leaf)
            continue;
          if (normFamily && i == 0 && isNorm(o.kind)) {
            walk(o, true);
            continue;
          }
          check.error(o.loc,
                      "family " + p.family + " cannot compute " + matchText(o) +
                          " inside the kernel: " +
                          (normFamily ? "it normalises A (layernorm or rmsnorm of inputs) and "
                                        "loads B from memory"
                                      : "it loads the GEMM's operands from memory"));
          if (!normFamily && i == 0 && isNorm(o.kind)) {
            const std::string normed = kind_.gemms == 2 ? "norm_dual_gemm" : "norm_gemm";
            check.note(p.loc, "family " + normed + " normalises A as it loads it: add " +
                                  "`let family = \"" + normed + "\";` to '" + p.name + "'");
          }
          good = false;
        }
        return;
      }
      if (isNorm(n.kind) && normA) {
        for (const MatchNode& o : n.operands)
          if (!o.leaf) {
            check.error(o.loc, "family " + p.family + " normalises inputs; it cannot compute " +
                                   matchText(o) + " before the norm");
            good = false;
          }
        return;
      }
      if (!elementwise(n.kind)) {
        check.error(n.loc,
                    "family " + p.family + " cannot compute " + ir::opKindName(n.kind) +
                        " in its epilogue: the epilogue applies elementwise ops (bias_add, add, "
                        "mul, activations) to the GEMM's result");
        good = false;
        return;
      }
      for (const MatchNode& o : n.operands)
        walk(o, false);
    };
    walk(p.root, false);
    if (!good)
      return false;
    const size_t want = static_cast<size_t>(kind_.gemms);
    if (distinct.size() != want) {
      check.error(distinct.empty() ? p.root.loc : gemms.back()->loc,
                  distinct.empty()
                      ? "family " + p.family + " implements a GEMM, but the match of '" + p.name +
                            "' has none"
                      : "family " + p.family + " computes " +
                            (want == 1 ? "one GEMM" : "two GEMMs") + " per kernel; the match of '" +
                            p.name + "' has " + std::to_string(distinct.size()));
      const MatchNode* second = nullptr;
      for (const MatchNode* g : gemms)
        if (matchText(*g) != matchText(*gemms.front()))
          second = g;
      if (distinct.size() == 2 && want == 1 &&
          matchText(second->operands[0]) == matchText(gemms.front()->operands[0]))
        check.note(gemms.front()->loc,
                   "two GEMMs sharing A (SwiGLU's gate and up projections) are family dual_gemm "
                   "(norm_dual_gemm with the norm in front): add `let family = \"" +
                       std::string(normFamily ? "norm_dual_gemm" : "dual_gemm") + "\";` to '" +
                       p.name + "'");
      else if (distinct.size() > 1)
        check.note(gemms.front()->loc,
                   "a kernel computes one GEMM, or two on the same A (family dual_gemm); match "
                   "each GEMM in a pattern of its own");
      return false;
    }
    if (want == 2) {
      // One A for both GEMMs: the kernel reads it once and multiplies it by both weights.
      const MatchNode* other = nullptr;
      for (const MatchNode* g : gemms)
        if (matchText(*g) != matchText(*gemms[0]))
          other = g;
      if (other && matchText(other->operands[0]) != matchText(gemms[0]->operands[0])) {
        check.error(other->operands[0].loc,
                    "family " + p.family + " computes two GEMMs on one A, but this GEMM's A is " +
                        matchText(other->operands[0]) + " and the other's " +
                        matchText(gemms[0]->operands[0]));
        check.note(gemms[0]->operands[0].loc, "the other GEMM's A");
        return false;
      }
    }
    if (normFamily && (gemms[0]->operands[0].leaf || !isNorm(gemms[0]->operands[0].kind))) {
      check.error(gemms[0]->loc,
                  "family " + p.family + " needs the GEMM's A operand to be " +
                      (want == 2 ? std::string("(rmsnorm ...) of inputs")
                                 : std::string("(layernorm ...) or (rmsnorm ...) of inputs")));
      return false;
    }
    if (normFamily && want == 2 && gemms[0]->operands[0].kind != ir::OpKind::RmsNorm) {
      // A LayerNorm's deferred correction needs colsum and beta terms of both weights.
      check.error(gemms[0]->operands[0].loc, "family " + p.family +
                                                 " normalises A with rmsnorm only, not " +
                                                 ir::opKindName(gemms[0]->operands[0].kind));
      return false;
    }
    return true;
  }

private:
  const gemm::Kind kind_;
};

} // namespace

const dsl::FamilyLegality& gemmLegality(ir::Family id) {
  return gemm::partFor<GemmLegality>(id);
}

} // namespace fpat::families
