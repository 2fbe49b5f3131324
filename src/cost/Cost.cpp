#include "fpat/cost/Cost.h"

#include "fpat/codegen/Codegen.h"
#include "fpat/cost/Family.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace fpat::cost {

namespace {

// Each number names the measurement it comes from (bench/RESULTS.md, on the H200 at 1980 MHz).
const Calibration kH200{
    "H200 (sm_90), fpat's kernels as measured in bench/RESULTS.md",
    90,
    3.0, // launchUs: a kernel more in the FFN block at M = 1 (session 27-28: 3 launches
         // against 7) and the norm statistics launch at M = 512 (session 26: ~4 us with
         // its drain)
    // statsLaunchUs: GPT-2-XL's MLP at T = 1 and 7 (session 48, H100, fpatc --time):
    // layernorm_gemm_bias_gelu with its statistics launch 0.0328-0.0336 ms, against
    // layernorm_gemm_bias (statistics read by its own warps) and the GeLU apart 0.0357-0.0375:
    // the launch costs ~3 us less than another kernel's
    0.3,
    3.3,   // streamTBs: the norm statistics kernel, one pass of 16-byte loads (session 26)
    743.0, // gemmTflops: the wgmma GEMM at 4096^3 in 0.185 ms (session 26)
    3.2,   // weightTBs: the FFN block at M = 1-16 reads its weights at 3.16-3.49 TB/s
    353.0, // slowTflops: the cp.async / mma.sync kernels at 2048x4096x4096 in 0.389 ms
           // (software-pipelined kernels, before the Hopper backend)
    224.0, // normSmemTflops: rmsnorm_gemm normalising A in shared memory, 0.614 ms at 4096^3
           // (layernorm_gemm 0.755 ms: 182; session 26's "before")
    0.02,  // epiloguePerNode: gemm_bias_gelu against gemm, +2-5% at 4096^3 (sessions 18-22)
    // lnColumnPs: deferred LayerNorm's column terms, layernorm_gemm 0.208 ms against
    // rmsnorm_gemm 0.200 at 4096^3 (session 26: 8 us over 16.8M outputs, 0.48 ps each); their
    // share grows as K shrinks (GPT-2-XL's 4096x6400x1600: ~0.65 ps, session 30)
    0.5,
    // rowLatencyUs: a norm kernel apart, beyond its launch and bytes (session 30's fpatc
    // --time: layernorm [1, 768] 0.0079-0.0086 ms against 0.0034-0.0048 for an elementwise
    // kernel as small; in whole graphs a LayerNorm apart cost 1.2-5.8 us more than deferring
    // it at T = 1-333, GPT-2 and GPT-2-XL MLPs)
    4.0,
    // normSmemStepUs: rmsnorm_gemm normalising A in shared memory at 100x768x512 took
    // 0.0223 ms (session 30's fpatc --time, examples/transformer_mlp: 16 k-tiles of 32 one
    // after another), where a wgmma GEMM as large took 0.008
    0.95,
    // flashTflops: fpat-bench-attn, d 128, S 2048-16384: 544-633 TFLOP/s non-causal, 431-622
    // causal; d 64 367-405 (session 34); the lower figures, as graphs are short
    430.0,
    // attnCudaTflops: not measured (a guess): the CUDA-core kernels compute a dot product per
    // thread or per warp from global memory, about 5% of the SMs' 67 TFLOP/s of f32 FMA
    3.0,
    true,
};

// Below sm_90 there is no wgmma backend and no measurement on such a GPU: an A100's data
// sheet (2.0 TB/s, 312 TFLOP/s f16) with the H200's efficiencies of the same kernels.
const Calibration kAmpereGuess{
    "sm_80 guess (A100 data sheet scaled by the H200's measured efficiencies)",
    80,
    3.0,
    3.0, // the cp.async kernels' statistics launch: not measured, priced as any launch
    1.4,
    110.0,
    1.4,
    110.0,
    70.0,
    0.02,
    0.5,
    4.0,
    0.95,
    0.0, // no flash kernel below sm_90
    1.5,
    false,
};

// Ops no GEMM absorbed that run as codegen's row-wise kernels (a row reduced, then written).
bool rowwiseKernel(const ir::Op& op) {
  return op.kind == ir::OpKind::LayerNorm || op.kind == ir::OpKind::RmsNorm ||
         op.kind == ir::OpKind::ReduceMean || op.kind == ir::OpKind::Softmax;
}

/// Attention's ops: their products' FLOPs at the kernels' rate, or their bytes at the
/// streaming rate where those bound them (decode reads its KV cache); nullopt for other ops.
std::optional<double> attentionMs(const ir::Graph& g, ir::Vertex v, const Calibration& c) {
  const ir::Op& op = g.op(v);
  if (op.kind != ir::OpKind::Attention && op.kind != ir::OpKind::AttnQk &&
      op.kind != ir::OpKind::AttnPv)
    return std::nullopt;
  std::string why;
  const std::optional<ir::AttnShape> s = ir::attnShape(g, v, why);
  if (!s)
    return std::nullopt;
  const double products = op.kind == ir::OpKind::Attention ? 2.0 : 1.0;
  const double flops = 2.0 * products * static_cast<double>(s->batch * s->heads * s->sq) *
                       static_cast<double>(s->sk * s->headDim);
  const bool flash = op.kind == ir::OpKind::Attention && c.flashTflops > 0 &&
                     (s->headDim == 64 || s->headDim == 128);
  double bytes = tensorBytes(op.type);
  for (ir::Vertex u : g.operands(v))
    bytes += tensorBytes(g.op(u).type);
  return c.launchUs * 1e-3 + std::max(flops / ((flash ? c.flashTflops : c.attnCudaTflops) * 1e12),
                                      bytes / (c.streamTBs * 1e12)) *
                                 1e3;
}

/// Whether `v` reads weights and constants alone: then it runs once per set of weights
/// (Executor::prepareWeights), not on every run. A search of v's operands that stops at the
/// first value given at run time (ir::weightOnly would order the whole graph for each op).
bool computedOnce(const ir::Graph& g, ir::Vertex v) {
  if (g.op(v).kind == ir::OpKind::Input)
    return false; // an upload, priced as 0 anyway
  std::vector<ir::Vertex> todo = g.operands(v);
  std::vector<bool> seen(g.size(), false);
  if (todo.empty())
    return g.op(v).kind == ir::OpKind::Constant;
  while (!todo.empty()) {
    const ir::Vertex u = todo.back();
    todo.pop_back();
    if (seen[u])
      continue;
    seen[u] = true;
    const ir::Op& op = g.op(u);
    if (op.kind == ir::OpKind::Input ? !op.weight : op.kind != ir::OpKind::Constant) {
      const std::vector<ir::Vertex> ins = g.operands(u);
      if (ins.empty())
        return false;
      todo.insert(todo.end(), ins.begin(), ins.end());
    }
  }
  return true;
}

} // namespace

const Calibration& calibrationFor(int arch) {
  return arch >= 90 ? kH200 : kAmpereGuess;
}

double opMs(const ir::Graph& g, ir::Vertex v, const Calibration& c) {
  const ir::Op& op = g.op(v);
  if (op.kind == ir::OpKind::Input || ir::isView(op.kind) || ir::isColumnView(g, v) ||
      computedOnce(g, v))
    return 0; // uploaded, its operand's buffer seen with another shape (or its columns read in
              // place), or computed when the weights are prepared
  if (const ir::KernelFamily* family = ir::familyOf(op))
    return familyCost(family->family).ms(g, v, c);
  if (const std::optional<double> t = attentionMs(g, v, c))
    return *t;
  // Elementwise and row-wise kernels stream their operands and their result; a row-wise one
  // reads a whole row before it writes any of it.
  double bytes = tensorBytes(op.type);
  for (ir::Vertex u : g.operands(v))
    bytes += tensorBytes(g.op(u).type);
  return (c.launchUs + (rowwiseKernel(op) ? c.rowLatencyUs : 0.0)) * 1e-3 +
         bytes / (c.streamTBs * 1e12) * 1e3;
}

std::string kernelNote(const ir::Graph& g, ir::Vertex v, int arch) {
  const ir::Op& op = g.op(v);
  if (computedOnce(g, v))
    return "computed once per set of weights";
  if (const ir::KernelFamily* family = ir::familyOf(op))
    return familyCost(family->family).note(g, v, arch);
  if (ir::isView(op.kind))
    return "no kernel (its operand's buffer)";
  if (ir::isColumnView(g, v))
    return "no kernel (attention reads these columns of its operand in place)";
  if (op.kind == ir::OpKind::Attention || op.kind == ir::OpKind::AttnQk ||
      op.kind == ir::OpKind::AttnPv)
    return arch >= 90 && op.kind == ir::OpKind::Attention && (op.headDim == 64 || op.headDim == 128)
               ? "flash attention kernel"
               : "attention's CUDA-core kernel";
  return rowwiseKernel(op) ? "row-wise kernel" : "elementwise kernel";
}

/// A candidate's estimated times: its fused op (built alone, as the rewriter would) against
/// the ops it replaces, each as fpat runs it unfused.
match::CandidateCost candidateCost(const ir::Graph& g, const dsl::MatcherTable& table,
                                   const match::Match& m, const Calibration& c, int arch,
                                   const MeasuredFn& measured) {
  auto time = [&](const ir::Graph& graph, ir::Vertex v, bool& tuned) {
    std::optional<double> t = measured ? measured(graph, v) : std::nullopt;
    tuned = t.has_value();
    return t ? *t : opMs(graph, v, c);
  };
  match::CandidateCost out;
  ir::Vertex fusedOp = 0;
  const ir::Graph alone = match::fuseAlone(g, table, m, fusedOp);
  bool fusedTuned = false;
  out.fused = time(alone, fusedOp, fusedTuned);
  std::ostringstream detail;
  detail.setf(std::ios::fixed);
  for (ir::Vertex v : match::replacedNodes(g, table, m)) {
    bool tuned = false;
    const double t = time(g, v, tuned);
    out.parts += t;
    const ir::Op& op = g.op(v);
    detail.precision(t < 0.01 ? 5 : 4);
    detail << (v == m.slots[0] ? "" : " + ")
           << (op.kind == ir::OpKind::Activation ? op.fn : ir::opKindName(op.kind)) << " " << t
           << (tuned ? " tuned" : "");
  }
  detail << "; fused: " << kernelNote(alone, fusedOp, arch)
         << (fusedTuned ? ", its time measured by the tuner" : "");
  out.detail = detail.str();
  return out;
}

} // namespace fpat::cost
