// The cost model: an estimate of each op's GPU time, fused or not, from its shapes and the
// kernel fpat runs for it, so that fusion can decline what would be slower than its parts.
// A roofline of bytes and FLOPs with efficiencies measured per kernel kind on one GPU; the
// numbers are data (Calibration), each with the measurement it came from.
#pragma once

#include "fpat/ir/Graph.h"
#include "fpat/match/Match.h"

#include <functional>
#include <optional>
#include <string>

namespace fpat::cost {

/// Measured throughputs of fpat's kernels on one GPU. Times are estimated as
/// launch + max(FLOPs / compute, bytes / bandwidth) per kernel, plus the terms below.
struct Calibration {
  const char* name;       // the GPU and where its numbers come from
  int arch;               // sm_XX it stands for (the nearest below is used)
  double launchUs;        // the gap one more kernel adds in a stream of launches
  double statsLaunchUs;   // a deferred norm's statistics launch, the GEMM's own unit's first
  double streamTBs;       // elementwise and row-wise kernels: bytes moved per second
  double gemmTflops;      // the wgmma GEMM at large shapes
  double weightTBs;       // the same kernel where reading B bounds it (decode shapes)
  double slowTflops;      // the cp.async / mma.sync GEMM (no TMA path)
  double normSmemTflops;  // rmsnorm_gemm normalising A in shared memory (weights not constant)
  double epiloguePerNode; // each epilogue op adds this share of the GEMM's time
  double lnColumnPs;      // a deferred LayerNorm's column terms: ps per output element
  double rowLatencyUs;    // a row-wise kernel's own chain: read the row, reduce, then write
  double normSmemStepUs;  // norm_gemm in shared memory: each k-tile's latency (small shapes)
  double flashTflops;     // the flash-attention kernel (sm_90, head dimension 64 or 128)
  double attnCudaTflops;  // attention's CUDA-core kernels (attn_qk, attn_pv, other attention)
  bool measured;          // false: a guess scaled from another GPU (said in --explain)
};

/// The calibration for sm_`arch`: the H200's for 90 and above, a scaled guess below.
const Calibration& calibrationFor(int arch);

/// The estimated time of op `v` of `g` in milliseconds when it runs as one kernel: an input 0;
/// a fused op as its family's kernel; any other op as fpat runs it unfused.
double opMs(const ir::Graph& g, ir::Vertex v, const Calibration& c);

/// What opMs assumed about `v`'s kernel, for --explain: "wgmma GEMM", "norm in shared memory".
std::string kernelNote(const ir::Graph& g, ir::Vertex v, int arch);

/// A candidate's estimated times: its fused op (built alone, as the rewriter would) against
/// the ops it replaces, each as fpat runs it unfused; the detail names the parts and the
/// fused kernel, for --explain.
/// Where a kernel's time was measured (the tuning cache): that time in ms, else nullopt.
using MeasuredFn = std::function<std::optional<double>(const ir::Graph&, ir::Vertex)>;

/// Measured times, where `measured` has them, stand in for the estimates (marked "tuned").
match::CandidateCost candidateCost(const ir::Graph& g, const dsl::MatcherTable& table,
                                   const match::Match& m, const Calibration& c, int arch,
                                   const MeasuredFn& measured = {});

} // namespace fpat::cost
