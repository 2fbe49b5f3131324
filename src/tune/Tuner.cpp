#include "fpat/tune/Tuner.h"

#include "fpat/codegen/Family.h"
#include "fpat/ir/Reference.h"
#include "fpat/runtime/Executor.h"
#include "fpat/runtime/Pipeline.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <stdexcept>

namespace fpat::tune {
using codegen::TileConfig;

bool tunable(const ir::Graph& g, ir::Vertex v, int arch) {
  const codegen::FamilyGenerator* family = codegen::generatorOf(g.op(v));
  return (family && family->tuning(g, v).has_value()) ||
         codegen::flashTuning(g, v, arch).has_value();
}

namespace {

/// What the op's family tunes it by (what the kernel computes, its problem).
codegen::TuningProblem tuningOf(const ir::Graph& g, ir::Vertex v) {
  const codegen::FamilyGenerator* family = codegen::generatorOf(g.op(v));
  std::optional<codegen::TuningProblem> t = family ? family->tuning(g, v) : std::nullopt;
  if (!t)
    throw std::logic_error("tuning key for %" + g.op(v).name +
                           ", whose kernel has no configurations");
  return *t;
}

Choice fromCache(const Entry& e) {
  Choice c;
  c.config = e.config;
  c.flash = e.flash;
  c.source = "cache";
  c.ms = e.ms;
  c.heuristicMs = e.heuristicMs;
  return c;
}

} // namespace

Key keyFor(const ir::Graph& g, ir::Vertex v, dsl::Activations defs, int arch,
           const std::string& nvccVersion) {
  (void)defs;
  Key k;
  if (const std::optional<codegen::FlashTuning> f = codegen::flashTuning(g, v, arch)) {
    k.m = f->m;
    k.n = f->n;
    k.k = f->k;
    k.signature = f->signature;
  } else {
    const codegen::TuningProblem t = tuningOf(g, v);
    k.m = t.m;
    k.n = t.n;
    k.k = t.k;
    k.signature = t.signature;
  }
  k.arch = arch;
  k.templateVersion = codegen::kernelHeadersHash().substr(0, 16);
  k.nvccVersion = nvccVersion;
  return k;
}

Choice choose(const ir::Graph& g, ir::Vertex v, dsl::Activations defs, TuningCache& cache, int arch,
              int sms, const std::string& nvccVersion, bool retune) {
  Choice c;
  const std::optional<codegen::FlashTuning> flash = codegen::flashTuning(g, v, arch);
  if (!retune && !retuneFromEnvironment() && !(flash && flash->forced))
    if (auto e = cache.lookup(keyFor(g, v, defs, arch, nvccVersion)); e && !e->flash == !flash)
      return fromCache(*e);
  // The code generator's own default for the op (its family's heuristic).
  if (flash)
    c.flash = flash->candidates.at(0);
  else
    c.config = codegen::defaultTile(tuningOf(g, v).problem, arch, sms);
  c.source = "heuristic";
  return c;
}

namespace {

/// Op `v` alone: one input per operand (named after the operand), the op, its output. With
/// `rows`, operands that run along the output's rows (A and residual/scale tensors) keep only
/// those rows, for a cheap CPU reference of some output rows.
ir::Graph isolate(const ir::Graph& g, ir::Vertex v, int64_t rows = 0) {
  const ir::Op& op = g.op(v);
  std::set<int> rowWise = {0};
  const std::vector<ir::Vertex> all = g.operands(v);
  for (int i : op.fused.epilogue.operands())
    if (g.op(all[static_cast<size_t>(i)]).type.rank() == 2)
      rowWise.insert(i);
  ir::Graph sub(g.name() + "." + op.name);
  std::vector<ir::Vertex> ins;
  std::vector<ir::Vertex> operands = g.operands(v);
  for (size_t i = 0; i < operands.size(); ++i) {
    ir::Op in;
    in.kind = ir::OpKind::Input;
    in.name = "in" + std::to_string(i);
    in.type = g.op(operands[i]).type;
    // Its values are the same on every run: a weight B may be prepared.
    in.weight = ir::isWeightOnly(g, operands[i]);
    if (rows && rowWise.count(static_cast<int>(i)))
      in.type.shape[0] = rows;
    ins.push_back(sub.addOp(in, {}));
  }
  ir::Op copy = op;
  if (rows)
    copy.type.shape[0] = rows;
  sub.addOutput(sub.addOp(copy, ins));
  return sub;
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

/// The inputs as the kernels read them (f16 or bf16), converted once.
std::map<std::string, std::vector<uint16_t>>
inputBits(const std::map<std::string, ir::Tensor>& inputs) {
  std::map<std::string, std::vector<uint16_t>> bits;
  for (auto& [name, t] : inputs) {
    auto& b = bits[name];
    b.resize(t.data.size());
    for (size_t i = 0; i < b.size(); ++i)
      b[i] = ir::toBits(t.data[i], t.desc.dtype);
  }
  return bits;
}

/// 16 evenly spaced rows of `m` (all of them when m <= 16), the first and last included.
std::vector<int64_t> sampleRows(int64_t m) {
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < std::min<int64_t>(m, 16); ++r)
    rows.push_back(m <= 16 ? r : r * (m - 1) / 15);
  return rows;
}

/// What the inputs and the reference are for every candidate of one op.
struct Trial {
  const ir::Graph& sub; // the op alone
  ir::Vertex op;
  std::map<std::string, std::vector<uint16_t>> bits;
  std::vector<int64_t> rows; // output rows checked
  int64_t width = 0;         // elements of an output row
  ir::Tensor want;           // those rows of the reference
};

/// One candidate kernel of `t.op` run alone: its median time, or "" and why it is rejected
/// (`registers(regs, localBytes)` says why its registers rule it out, or "").
std::pair<double, std::string> runCandidate(cuda::Driver& drv, const Trial& t,
                                            const codegen::KernelUnit& unit,
                                            const runtime::CompiledKernel& compiled,
                                            const std::function<std::string(int, int)>& registers,
                                            const TuneOptions& o, const DeviceLimits& lim) {
  if (!compiled.error.empty())
    return {0, "nvcc failed"};
  runtime::CompiledGraph cg{t.sub, {}, {}};
  for (ir::Vertex u : t.sub.vertices())
    cg.units.push_back(u == t.op ? unit : codegen::KernelUnit{});
  cg.cubins[unit.name] = compiled.cubinPath;
  try {
    runtime::Executor ex(drv, cg);
    auto [regs, local] = ex.registersAndLocalBytes();
    if (std::string why = registers(regs, local); !why.empty())
      return {0, why};
    runtime::RunResult r = ex.runBits(t.bits, /*poison=*/true);
    ir::Tensor got{t.want.desc, {}};
    for (int64_t row : t.rows)
      got.data.insert(got.data.end(), r.outputs[0].data.begin() + row * t.width,
                      r.outputs[0].data.begin() + (row + 1) * t.width);
    runtime::Agreement a = runtime::compareToReference(got, t.want);
    if (!a.pass)
      return {0, "wrong results (max rel err " + std::to_string(a.maxRel) + ", " +
                     std::to_string(a.nonFinite) + " non-finite)"};
    return {median(ex.time(o.warmup, o.reps, 2 * static_cast<size_t>(lim.l2Bytes))), ""};
  } catch (const cuda::CudaError& e) {
    return {0, e.what()};
  }
}

/// Attention op `v` alone: its constants and weights with values kept as they are (the flash
/// kernel reads a causal mask and a positive scale from their values), other operands inputs.
ir::Graph isolateAttention(const ir::Graph& g, ir::Vertex v) {
  ir::Graph sub(g.name() + "." + g.op(v).name);
  std::vector<ir::Vertex> ins;
  for (ir::Vertex w : g.operands(v)) {
    const ir::Op& from = g.op(w);
    ir::Op in;
    if (from.kind == ir::OpKind::Constant ||
        (from.kind == ir::OpKind::Input && from.weight && from.data)) {
      in = from;
    } else {
      in.kind = ir::OpKind::Input;
      in.type = from.type;
      in.mask = from.kind == ir::OpKind::Input && from.mask;
    }
    in.name = "in" + std::to_string(ins.size());
    ins.push_back(sub.addOp(in, {}));
  }
  sub.addOutput(sub.addOp(g.op(v), ins));
  return sub;
}

/// tune() for an attention op on the flash kernel: its candidates compiled together, each
/// checked on 16 sampled query rows against the reference and timed; the fastest kept.
Choice tuneFlash(cuda::Driver& drv, const ir::Graph& g, ir::Vertex v, dsl::Activations defs,
                 const codegen::FlashTuning& ft, const DeviceLimits& lim, const Key& key,
                 TuningCache& cache, const TuneOptions& o) {
  const ir::Graph sub = isolateAttention(g, v);
  Trial trial{sub, sub.outputs()[0], {}, sampleRows(ft.m), ft.n, {}};
  const auto inputs = ir::randomInputs(sub, 17);
  trial.bits = inputBits(inputs);
  std::vector<ir::Tensor> operands;
  for (ir::Vertex w : sub.operands(trial.op)) {
    const ir::Op& op = sub.op(w);
    operands.push_back(
        op.kind == ir::OpKind::Constant
            ? ir::Tensor{op.type, std::vector<float>(
                                      static_cast<size_t>(op.type.numel()),
                                      static_cast<float>(ir::roundTo(op.value, op.type.dtype)))}
            : inputs.at(op.name));
  }
  std::vector<const ir::Tensor*> ptrs;
  for (const ir::Tensor& t : operands)
    ptrs.push_back(&t);
  trial.want = ir::attentionRows(sub.op(trial.op), ptrs, trial.rows);

  std::vector<codegen::KernelUnit> units;
  codegen::CodegenOptions base;
  base.arch = lim.arch;
  base.sms = lim.sms;
  for (const codegen::FlashConfig& f : ft.candidates) {
    codegen::CodegenOptions c = base;
    c.flash = &f;
    units.push_back(codegen::generate(sub, trial.op, defs, c));
  }
  runtime::NvccOptions n;
  n.arch = lim.arch;
  n.cacheDir = o.cacheDir;
  n.jobs = o.jobs;
  n.extraFlags = o.nvccFlags;
  const std::vector<runtime::CompiledKernel> compiled = runtime::compileAll(units, n);
  auto spills = [](int, int local) {
    return local > kMaxSpillBytes
               ? "spills (" + std::to_string(local) + " bytes of local memory per thread)"
               : std::string();
  };

  Choice best;
  best.source = "tuned";
  best.ms = INFINITY;
  std::string firstReject;
  for (size_t i = 0; i < ft.candidates.size(); ++i) {
    const std::string name = ft.candidates[i].str();
    ++best.tried;
    auto [ms, why] = runCandidate(drv, trial, units[i], compiled[i], spills, o, lim);
    if (o.log)
      *o.log << "    " << i + 1 << "/" << ft.candidates.size() << " " << name << ": ";
    if (!why.empty()) {
      ++best.rejected;
      if (firstReject.empty())
        firstReject = name + ": " + why;
      if (o.log)
        *o.log << "rejected: " << why << "\n";
      continue;
    }
    if (i == 0)
      best.heuristicMs = ms; // the heuristic's configuration comes first
    if (ms < best.ms) {
      best.ms = ms;
      best.flash = ft.candidates[i];
    }
    if (o.log)
      *o.log << ms << " ms (best so far " << best.flash->str() << ", " << best.ms << " ms)\n";
  }
  if (!best.flash)
    throw std::runtime_error("no configuration of %" + g.op(v).name + " ran correctly: all " +
                             std::to_string(ft.candidates.size()) + " rejected (first, " +
                             firstReject + ")");
  Entry e;
  e.flash = best.flash;
  e.ms = best.ms;
  e.heuristicMs = best.heuristicMs;
  e.candidates = best.tried;
  cache.store(key, e);
  return best;
}

} // namespace

Choice tune(cuda::Driver& drv, const ir::Graph& g, ir::Vertex v, dsl::Activations defs,
            TuningCache& cache, const TuneOptions& o) {
  const DeviceLimits lim = DeviceLimits::from(drv.device());
  const std::string nvcc = runtime::nvccIdentity(runtime::findNvcc({}), o.nvccFlags);
  const Key key = keyFor(g, v, defs, lim.arch, nvcc);
  const std::optional<codegen::FlashTuning> flash = codegen::flashTuning(g, v, lim.arch);
  if (!o.retune && !retuneFromEnvironment() && o.configs.empty())
    if (auto e = cache.lookup(key); e && !e->flash == !flash)
      return fromCache(*e);
  if (flash)
    return tuneFlash(drv, g, v, defs, *flash, lim, key, cache, o);
  const ir::Op& op = g.op(v);
  ir::Graph sub = isolate(g, v);
  const ir::Vertex subOp = sub.outputs()[0];
  codegen::CodegenOptions base;
  base.arch = lim.arch;
  base.sms = lim.sms;
  const codegen::KernelUnit probe = codegen::generate(sub, subOp, defs, base);
  const codegen::GemmProblem problem = tuningOf(sub, subOp).problem;
  std::vector<TileConfig> candidates;
  if (o.configs.empty())
    candidates = searchSpace(lim, probe.transB, problem, o.maxCandidates);
  else // the heuristic first, as in the search space, so that it is always reported
    candidates = {probe.tile};
  for (const TileConfig& t : o.configs)
    if (std::find(candidates.begin(), candidates.end(), t) != candidates.end())
      continue;
    else if (staticReject(t, probe.transB, lim).empty())
      candidates.push_back(t);
    else if (o.log)
      *o.log << "  " << t.str() << ": " << staticReject(t, probe.transB, lim) << "\n";
  if (candidates.empty())
    throw std::runtime_error("no candidate configuration fits the device");

  // Inputs (converted to f16 or bf16 once) and the CPU reference of 16 sampled output rows.
  const auto inputs = ir::randomInputs(sub, 17);
  const std::vector<int64_t> rows = sampleRows(probe.M);
  ir::Graph sampled = isolate(g, v, static_cast<int64_t>(rows.size()));
  std::map<std::string, ir::Tensor> sampledInputs;
  for (ir::Vertex in : sampled.vertices()) {
    const ir::Op& iop = sampled.op(in);
    if (iop.kind != ir::OpKind::Input)
      continue;
    const ir::Tensor& full = inputs.at(iop.name);
    if (iop.type == full.desc) {
      sampledInputs[iop.name] = full;
      continue;
    }
    ir::Tensor t{iop.type, {}};
    const int64_t cols = full.desc.shape[1];
    for (int64_t r : rows)
      t.data.insert(t.data.end(), full.data.begin() + r * cols, full.data.begin() + (r + 1) * cols);
    sampledInputs[iop.name] = std::move(t);
  }
  const Trial trial{
      sub,
      subOp,
      inputBits(inputs),
      rows,
      probe.N,
      ir::evaluate(sampled, sampledInputs, dsl::referenceActivations(defs))[sampled.outputs()[0]]};

  // A batch of candidates' kernels, compiled together.
  runtime::NvccOptions n;
  n.arch = lim.arch;
  n.cacheDir = o.cacheDir;
  n.jobs = o.jobs;
  n.extraFlags = o.nvccFlags;
  auto compileBatch = [&](const std::vector<TileConfig>& batch,
                          std::vector<codegen::KernelUnit>& units) {
    units.clear();
    for (const TileConfig& t : batch) {
      codegen::CodegenOptions c = base;
      c.tile = &t;
      units.push_back(codegen::generate(sub, subOp, defs, c));
    }
    return runtime::compileAll(units, n);
  };

  Choice best;
  best.source = "tuned";
  best.ms = INFINITY;
  std::string firstReject;
  size_t offered = candidates.size(); // for the log: "i/offered"
  std::vector<codegen::KernelUnit> units;
  std::vector<runtime::CompiledKernel> compiled = compileBatch(candidates, units);
  for (size_t i = 0;; ++i) {
    if (i == candidates.size()) {
      // Every candidate so far rejected (e.g. a heuristic that spills with this epilogue): the
      // next ones of the whole search space, a batch at a time, so that an op that some
      // configuration can run always gets one. Hand-picked lists are experiments: not extended.
      if (std::isfinite(best.ms) || !o.configs.empty())
        break;
      const std::vector<TileConfig> more = nextCandidates(
          searchSpace(lim, probe.transB, problem, std::numeric_limits<size_t>::max()), candidates,
          o.maxCandidates);
      if (more.empty())
        break;
      if (o.log)
        *o.log << "    all " << candidates.size() << " rejected: " << more.size() << " more\n";
      std::vector<codegen::KernelUnit> moreUnits;
      std::vector<runtime::CompiledKernel> moreCompiled = compileBatch(more, moreUnits);
      candidates.insert(candidates.end(), more.begin(), more.end());
      units.insert(units.end(), moreUnits.begin(), moreUnits.end());
      compiled.insert(compiled.end(), moreCompiled.begin(), moreCompiled.end());
      offered = candidates.size();
    }
    const TileConfig& t = candidates[i];
    ++best.tried;
    auto reject = [&](const std::string& why) {
      ++best.rejected;
      if (firstReject.empty())
        firstReject = t.str() + ": " + why;
      if (o.log)
        *o.log << "    " << i + 1 << "/" << offered << " " << t.str() << ": rejected: " << why
               << "\n";
    };
    if (!(units[i].tile == t) && compiled[i].error.empty()) { // e.g. wgmma where TMA cannot run
      reject("runs as " + units[i].tile.str() + " for this shape");
      continue;
    }
    auto [ms, why] = runCandidate(
        drv, trial, units[i], compiled[i],
        [&](int regs, int local) { return compiledReject(t, regs, local, lim); }, o, lim);
    if (!why.empty()) {
      reject(why);
      continue;
    }
    if (i == 0)
      best.heuristicMs = ms; // candidates[0] is the heuristic's choice
    if (ms < best.ms) {
      best.ms = ms;
      best.config = t;
    }
    if (o.log)
      *o.log << "    " << i + 1 << "/" << offered << " " << t.str() << ": " << ms
             << " ms (best so far " << best.config.str() << ", " << best.ms << " ms)\n";
  }
  if (!std::isfinite(best.ms))
    throw std::runtime_error("no configuration of %" + op.name + " ran correctly: all " +
                             std::to_string(candidates.size()) + " rejected (first, " +
                             firstReject + ")");
  if (o.configs.empty()) // a hand-picked list is an experiment, not a tuning result
    cache.store(key, Entry{best.config, best.ms, best.heuristicMs, best.tried, {}});
  return best;
}

} // namespace fpat::tune
