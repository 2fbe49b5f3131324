// The GEMM families' matcher part: the main operands of a match in kernel order (A, or the
// norm's x, gamma[, beta]; then B, or Bg and Bu), the GEMMs as the epilogue's accumulators, the
// dual GEMM's graph-only conditions, and the dual op split into two GEMMs before sm_90.
#include "Gemm.h"
#include "fpat/match/Family.h"

#include <algorithm>

namespace fpat::families {

namespace {
using dsl::PatternMeta;
using dsl::SlotInfo;
using ir::Graph;
using ir::Vertex;
using match::Match;

class GemmMatcher final : public match::FamilyMatcher {
public:
  explicit GemmMatcher(ir::Family id) : kind_(gemm::kindOf(id)) {}

  /// The distinct GEMMs of a match, in slot order (the dual families' first is acc's).
  std::vector<Vertex> accumulators(const Graph& g, const Match& m,
                                   const PatternMeta& meta) const override {
    std::vector<Vertex> gemms;
    for (size_t k = 0; k < m.slots.size(); ++k)
      if (meta.slots[k].role != SlotInfo::Input && g.op(m.slots[k]).kind == ir::OpKind::Gemm &&
          std::find(gemms.begin(), gemms.end(), m.slots[k]) == gemms.end())
        gemms.push_back(m.slots[k]);
    return gemms;
  }

  std::vector<Vertex> mainOperands(const Graph& g, const Match& m, const PatternMeta& meta,
                                   ir::FusedAttrs& fused) const override {
    const std::vector<Vertex> gemms = accumulators(g, m, meta);
    if (gemms.size() != static_cast<size_t>(kind_.gemms))
      return {};
    std::vector<Vertex> ab = g.operands(gemms[0]);
    const ir::Op& a = g.op(ab[0]);
    bool absorbedA = false; // is the gemm's A operand computed inside the match?
    for (size_t k = 0; k < m.slots.size(); ++k)
      absorbedA = absorbedA || (m.slots[k] == ab[0] && meta.slots[k].role != SlotInfo::Input);
    std::vector<Vertex> out;
    if (kind_.normalisesA && absorbedA &&
        (a.kind == ir::OpKind::LayerNorm || a.kind == ir::OpKind::RmsNorm)) {
      fused.norm = a.kind == ir::OpKind::LayerNorm ? "layernorm" : "rmsnorm";
      out = g.operands(ab[0]);
    } else if (!kind_.normalisesA && !absorbedA) {
      out = {ab[0]};
    } else {
      return {};
    }
    for (Vertex gemm : gemms)
      out.push_back(g.operands(gemm)[1]);
    return out;
  }

  /// Sema rejects patterns whose shape the family cannot implement; this catches a pattern
  /// naming two structurally equal GEMMs that are different ops in the graph, and the dual
  /// GEMM's conditions on its weights.
  std::string rejects(const Graph& g, const Match& m, const PatternMeta& meta) const override {
    const std::vector<Vertex> gemms = accumulators(g, m, meta);
    if (gemms.size() != static_cast<size_t>(kind_.gemms))
      return "the match holds " + std::to_string(gemms.size()) + " different GEMMs; family " +
             meta.family + " computes " + (kind_.gemms == 1 ? "one" : "two");
    return kind_.gemms == 2 ? dualRejects(g, gemms, meta.family) : "";
  }

  std::optional<Vertex>
  lowerFor(int arch, const ir::Op& op, const std::vector<Vertex>& ins, Graph& out,
           const std::function<std::string(const std::string&)>& fresh) const override {
    if (kind_.gemms != 2 || arch == 90)
      return std::nullopt;
    return splitDual(op, ins, out, fresh);
  }

private:
  std::string dualRejects(const Graph& g, const std::vector<Vertex>& gemms,
                          const std::string& family) const {
    // The dual GEMM reads one A and a copy of both weights interleaved when they are uploaded.
    const Vertex a0 = g.operands(gemms[0])[0], a1 = g.operands(gemms[1])[0];
    if (a0 != a1)
      return "%" + g.op(gemms[0]).name + " and %" + g.op(gemms[1]).name +
             " read different values as A; family " + family + " multiplies one A by two B";
    if (g.op(gemms[0]).transposeB != g.op(gemms[1]).transposeB)
      return "one GEMM reads B as [K, N] and the other as [N, K]; family " + family +
             " needs one layout";
    for (Vertex gemm : gemms) {
      const ir::Op& b = g.op(g.operands(gemm)[1]);
      if (!ir::isWeightOnly(g, g.operands(gemm)[1]))
        return "%" + b.name + " is not a weight; family " + family +
               " interleaves both B once, when weights are uploaded";
    }
    if (g.op(gemms[0]).type != g.op(gemms[1]).type)
      return "%" + g.op(gemms[0]).name + " is " + g.op(gemms[0]).type.str() + " and %" +
             g.op(gemms[1]).name + " " + g.op(gemms[1]).type.str() + "; family " + family +
             " needs two results of one shape";
    if (kind_.normalisesA) {
      const ir::Op& n = g.op(a0);
      if (n.kind == ir::OpKind::LayerNorm)
        return "family " + family +
               " defers RMSNorm only (a deferred LayerNorm's column "
               "terms over two interleaved weights are not implemented)";
      if (n.kind == ir::OpKind::RmsNorm) {
        const ir::Op& gamma = g.op(g.operands(a0)[1]);
        if (!ir::isWeightOnly(g, g.operands(a0)[1]))
          return "%" + gamma.name + " is not a weight; family " + family +
                 " folds gamma into the weights when they are uploaded";
      }
    }
    return "";
  }

  /// The dual op as its norm (norm_dual_gemm), the second GEMM as a plain gemm (`%<name>_up`),
  /// and a fused op of family gemm whose epilogue reads that GEMM's result where it read acc2:
  /// the kernels gemm_silu_mul runs on.
  Vertex splitDual(const ir::Op& op, const std::vector<Vertex>& ins, Graph& out,
                   const std::function<std::string(const std::string&)>& fresh) const {
    const size_t bIdx = ir::gemmBIndex(op), mains = ir::mainOperandCount(op);
    Vertex a = ins.at(0);
    if (kind_.normalisesA) {
      ir::Op n;
      n.kind = ir::normKindOf(op) == ir::NormKind::LayerNorm ? ir::OpKind::LayerNorm
                                                             : ir::OpKind::RmsNorm;
      n.name = fresh(op.name + "_norm");
      n.eps = op.eps;
      n.loc = op.loc;
      n.type = out.op(a).type;
      a = out.addOp(std::move(n), std::vector<Vertex>(ins.begin(), ins.begin() + bIdx));
    }
    ir::Op up;
    up.kind = ir::OpKind::Gemm;
    up.name = fresh(op.name + "_up");
    up.transposeB = op.transposeB;
    up.loc = op.loc;
    up.type = op.type;
    const Vertex upV = out.addOp(std::move(up), {a, ins.at(bIdx + 1)});
    // The rest: A, Bg, the epilogue's operands (renumbered), then the second GEMM's result.
    ir::Op f = op;
    f.fused.family = ir::kernelFamily(ir::Family::Gemm).name;
    f.fused.norm.clear();
    std::vector<Vertex> fins{a, ins.at(bIdx)};
    fins.insert(fins.end(), ins.begin() + static_cast<std::ptrdiff_t>(mains), ins.end());
    const int upOperand = static_cast<int>(fins.size());
    fins.push_back(upV);
    for (ir::EpilogueNode& n : f.fused.epilogue.nodes) {
      if (n.kind == ir::EpiKind::Operand)
        n.operand = n.operand - static_cast<int>(mains) + 2;
      else if (n.kind == ir::EpiKind::Acc && n.operand == 1)
        n = ir::EpilogueNode{ir::EpiKind::Operand, -1, -1, upOperand, {}, {}};
    }
    return out.addOp(std::move(f), fins);
  }

  const gemm::Kind kind_;
};

} // namespace

const match::FamilyMatcher& gemmMatcher(ir::Family id) {
  return gemm::partFor<GemmMatcher>(id);
}

} // namespace fpat::families
