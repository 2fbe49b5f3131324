#include "fpat/runtime/Pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

namespace fpat::runtime {

BuildResult buildKernels(const ir::Graph& fused, dsl::Activations defs, const BuildOptions& o) {
  BuildResult r;
  r.graph.graph = fused;
  codegen::CodegenOptions copts;
  copts.arch = o.arch;
  copts.sms = o.sms;
  copts.tile = o.tile;
  copts.sources = o.patternSources;
  copts.appendInDecode = o.appendInDecode;
  try {
    for (ir::Vertex v : fused.vertices()) {
      auto it = o.tiles.find(v);
      copts.tile = it != o.tiles.end() ? &it->second : o.tile;
      auto f = o.flash.find(v);
      copts.flash = f != o.flash.end() ? &f->second : nullptr;
      r.graph.units.push_back(codegen::generate(fused, v, defs, copts));
    }
  } catch (const codegen::CodegenError& e) {
    r.error = e.what();
    return r;
  }
  NvccOptions n;
  n.arch = o.arch;
  n.cacheDir = o.cacheDir;
  n.jobs = o.jobs;
  n.ptx = o.ptx;
  n.extraFlags = o.nvccFlags;
  auto t0 = std::chrono::steady_clock::now();
  try {
    r.kernels = compileAll(r.graph.units, n);
  } catch (const std::runtime_error& e) {
    r.error = e.what();
    return r;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::set<std::string> counted; // one entry per op; ops sharing a kernel share one nvcc run
  for (const CompiledKernel& k : r.kernels) {
    if (!counted.insert(k.name).second)
      continue;
    if (!k.warning.empty() &&
        std::find(r.warnings.begin(), r.warnings.end(), k.warning) == r.warnings.end())
      r.warnings.push_back(k.warning);
    if (!k.error.empty()) {
      r.error += k.error;
      continue;
    }
    (k.cached ? r.cached : r.compiled) += 1;
    r.graph.cubins[k.name] = k.cubinPath;
  }
  return r;
}

// The tolerance: the reference keeps f16 storage between unfused ops while fused kernels keep
// f32 inside, so results differ by a few f16 ulps (2^-11 = 4.9e-4 relative each), and f32
// accumulation in a different order adds ~sqrt(K) * 6e-8. 1e-2 leaves room for both; a wrong
// element (missed tile, wrong operand, stale buffer) is off by about the values themselves.
// Relative errors are taken against max(|ref|, rms(ref), smallest normal number) so that
// elements near zero do not turn rounding noise into large ratios.
double relTolerance(ir::DType t) {
  return t == ir::DType::BF16 ? 8 * kRelTolerance : kRelTolerance;
}

Agreement compareToReference(const ir::Tensor& got, const ir::Tensor& want, double tolerance) {
  if (tolerance < 0)
    tolerance = relTolerance(want.desc.dtype);
  Agreement a;
  if (got.data.size() != want.data.size()) {
    a.nonFinite = want.data.size();
    return a;
  }
  double sq = 0;
  size_t n = 0;
  for (float w : want.data)
    if (std::isfinite(w)) {
      sq += double(w) * w;
      ++n;
    }
  // The scale never goes below the smallest normal number of the output's type: below it f16
  // values are subnormal, spaced 2^-24 apart, and one rounding more or less (fused kernels
  // round once, the unfused reference after every op) is a relative error of O(1) there.
  // Found by the fusion fuzzer: outputs of about 1e-7 differing by one subnormal step.
  const double floor = want.desc.dtype == ir::DType::F16 ? 0x1p-14 : 0x1p-126; // bf16: f32's
  const double rms = std::max(n ? std::sqrt(sq / static_cast<double>(n)) : 0.0, floor);
  for (size_t i = 0; i < want.data.size(); ++i) {
    const double g = got.data[i], w = want.data[i];
    if (!std::isfinite(g) || !std::isfinite(w)) {
      ++a.nonFinite; // NaN never passes, on either side
      continue;
    }
    const double d = std::fabs(g - w);
    a.maxAbs = std::max(a.maxAbs, d);
    a.maxRel = std::max(a.maxRel, d / std::max(std::fabs(w), rms));
  }
  a.pass = a.nonFinite == 0 && a.maxRel <= tolerance;
  return a;
}

} // namespace fpat::runtime
