// The GEMM families' cost part: launch + max(FLOPs / compute, bytes / bandwidth) for the kernel
// the code generator will choose (wgmma, cp.async, the norm in shared memory), the epilogue's
// share, the dual GEMM split before sm_90, a deferred norm's statistics.
#include "Gemm.h"
#include "fpat/codegen/Codegen.h"
#include "fpat/cost/Family.h"

#include <algorithm>
#include <cmath>

namespace fpat::families {

namespace {
using cost::Calibration;
using cost::tensorBytes;

/// An activation's cost in a GEMM's epilogue at K = 768, ps per element of the result, beyond
/// epiloguePerNode's share: BERT's 2048 x 3072 x 768 (session 48, H100) took gemm_bias 0.0273
/// ms, gemm_bias_gelu 0.032 (0.75 ps an element), gemm_bias_gelu_erf 0.0529 (4.1 ps: erf's
/// polynomial, a long dependent chain); at 333 rows the same ran at about twice those, where a
/// GeLU kernel apart took 5 us. The others are guesses by their bodies: silu, quick_gelu and
/// sigmoid one exp and one division as GeLU's tanh form, relu one max; an activation of the
/// user's as GeLU's.
double activationPs(const std::string& fn) {
  if (fn == "relu" || fn == "leaky_relu")
    return 0.05;
  if (fn == "gelu_erf" || fn == "erf")
    return 4.1;
  return 0.75;
}

class GemmCost final : public cost::FamilyCost {
public:
  explicit GemmCost(ir::Family id) : kind_(gemm::kindOf(id)) {}

  double ms(const ir::Graph& g, ir::Vertex v, const Calibration& c) const override {
    const ir::Op& op = g.op(v);
    const std::vector<ir::Vertex> ins = g.operands(v);
    if (ins.empty() || op.type.rank() != 2)
      return c.launchUs * 1e-3;
    const double m = static_cast<double>(op.type.shape[0]),
                 n = static_cast<double>(op.type.shape[1]);
    const ir::TensorDesc& a = g.op(ins[0]).type;
    const double k = static_cast<double>(a.shape.back());
    const double elt = static_cast<double>(ir::dtypeSize(op.type.dtype));
    const bool dual = kind_.gemms == 2;
    const bool split = dual && c.arch < 90; // match::lowerForArch: two kernels, one GEMM each
    const double cols = dual && !split ? 2 * n : n;
    // Bytes every form moves: A, B (both of the dual's), the epilogue's operands and C.
    double bytes = m * k * elt + (dual ? 2 : 1) * k * n * elt + m * n * elt;
    const size_t main = op.kind == ir::OpKind::Fused ? ir::mainOperandCount(op) : 2;
    for (size_t i = main; i < ins.size(); ++i)
      bytes += tensorBytes(g.op(ins[i]).type);
    const bool deferred = codegen::defersNorm(g, v);
    const bool smemNorm = kind_.normalisesA && !deferred;
    const codegen::GemmProblem p = codegen::gemmProblemOf(g, v);
    const bool wgmma = c.arch >= 90 && p.tma && !smemNorm;
    const double tflops =
        smemNorm ? (ir::normKindOf(op) == ir::NormKind::LayerNorm ? c.normSmemTflops * 182.0 / 224.0
                                                                  : c.normSmemTflops)
        : wgmma  ? c.gemmTflops
                 : c.slowTflops;
    const double bandwidth = wgmma ? c.weightTBs : c.streamTBs;
    const double flops = 2 * m * cols * k;
    double core = std::max(flops / (tflops * 1e12), bytes / (bandwidth * 1e12)) * 1e3;
    const size_t epilogueOps =
        std::count_if(op.fused.epilogue.nodes.begin(), op.fused.epilogue.nodes.end(),
                      [](const ir::EpilogueNode& e) {
                        return e.kind != ir::EpiKind::Acc && e.kind != ir::EpiKind::Operand;
                      });
    // Activations cost per element of the result beyond that share, as measured at K = 768;
    // a longer main loop hides more of them (the next tile's loads and products run while the
    // helper warps apply this tile's: at 4096^3 GeLU's whole cost was 2-5%).
    double activationMs = 0;
    for (const ir::EpilogueNode& e : op.fused.epilogue.nodes)
      if (e.kind == ir::EpiKind::Activation)
        activationMs += activationPs(e.fn) * 1e-9 * m * n * std::min(1.0, 768.0 / k);
    if (smemNorm) // each CTA walks its k-tiles one after another, normalising each: at small
                  // shapes that chain, not the throughput, is the time
      core = std::max(core, (c.rowLatencyUs + std::ceil(k / 32) * c.normSmemStepUs) * 1e-3);
    double ms = c.launchUs * 1e-3 +
                core * (1 + c.epiloguePerNode * static_cast<double>(epilogueOps)) + activationMs;
    if (split) // the second GEMM as a kernel of its own, its result read back by the first
      ms += c.launchUs * 1e-3 + core + 2 * m * n * elt / (c.streamTBs * 1e12) * 1e3;
    if (deferred) { // the row statistics read x once more, beside the main loop by the GEMM's
                    // own warps or in a launch of their own before it (the loop form priced as
                    // one): its bytes at the streaming rate, which matches the grid form's cost
                    // over the plain GEMM at M 512-4096 (+2-11 us measured, session 46)
      const bool grid = wgmma && codegen::expectedNormStats(g, v) == codegen::NormStats::Grid;
      ms += (grid ? 0.0 : c.statsLaunchUs * 1e-3) + m * k * elt / (c.streamTBs * 1e12) * 1e3;
      if (ir::normKindOf(op) == ir::NormKind::LayerNorm)
        ms += c.lnColumnPs * 1e-9 * m * n;
    }
    return ms;
  }

  std::string note(const ir::Graph& g, ir::Vertex v, int arch) const override {
    const bool deferred = codegen::defersNorm(g, v);
    if (kind_.normalisesA && !deferred)
      return "norm in shared memory (gamma or W not a weight): cp.async kernel";
    if (kind_.gemms == 2 && arch < 90)
      return "split into two GEMMs (no dual kernel before sm_90)";
    const bool wgmma = arch >= 90 && codegen::gemmProblemOf(g, v).tma;
    if (!deferred)
      return std::string(wgmma ? "wgmma" : "cp.async") + " GEMM";
    if (!wgmma) // the cp.async kernels normalise A as they load it (Generator.cpp)
      return "cp.async GEMM normalising A, statistics in a launch before it";
    return std::string("wgmma GEMM, norm deferred") +
           (codegen::expectedNormStats(g, v) == codegen::NormStats::Grid
                ? " (statistics read by its own warps)"
                : " (statistics in a launch before it)");
  }

private:
  const gemm::Kind kind_;
};

} // namespace

const cost::FamilyCost& gemmCost(ir::Family id) {
  return gemm::partFor<GemmCost>(id);
}

} // namespace fpat::families
