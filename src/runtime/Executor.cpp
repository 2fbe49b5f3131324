#include "fpat/runtime/Executor.h"

#include "fpat/support/Diagnostics.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <tuple>

namespace fpat::runtime {

namespace {
size_t roundUp(size_t b) {
  return (b + 255) / 256 * 256;
}
size_t bytesOf(const ir::Op& op) {
  return static_cast<size_t>(op.type.numel()) * 2;
}
} // namespace

BufferPlan planBuffers(const ir::Graph& g, const std::vector<std::vector<ir::Vertex>>& extraIns) {
  BufferPlan p;
  // Readers beyond the graph's edges (codegen::KernelUnit::extraIns), by the value read.
  std::vector<std::vector<ir::Vertex>> extraUsers(g.size());
  for (size_t u = 0; u < extraIns.size() && u < g.size(); ++u)
    for (ir::Vertex w : extraIns[u])
      extraUsers.at(w).push_back(static_cast<ir::Vertex>(u));
  p.slotOf.assign(g.size(), -1);
  p.offsetOf.assign(g.size(), 0);
  auto order = ir::stableOrder(g);
  if (!order)
    throw std::invalid_argument("graph " + g.name() + " has a cycle");
  std::vector<size_t> pos(g.size());
  for (size_t i = 0; i < order->size(); ++i)
    pos[(*order)[i]] = i;
  // Values computed from weights alone are computed when the weights are prepared and read
  // by every run after: they keep their buffers, as inputs do.
  const std::vector<bool> fixed = ir::weightOnly(g);
  auto pinned = [&](ir::Vertex v) {
    return g.op(v).kind == ir::OpKind::Input || g.op(v).kind == ir::OpKind::Constant ||
           g.isOutput(v) || fixed[v];
  };
  // Views (ir::isView: heads, merge_heads; ir::isColumnView: columns of a wider buffer, at an
  // offset) take their operand's buffer: a group of values over one buffer, named by the value
  // that owns it, lives until the last use of any of them and is pinned if any of them is.
  std::vector<ir::Vertex> owner(g.size());
  std::vector<size_t> groupLast(g.size(), 0);
  std::vector<bool> groupPinned(g.size(), false);
  for (ir::Vertex v : *order) {
    const bool columns = ir::isColumnView(g, v);
    if (ir::isView(g.op(v).kind) || columns) {
      const ir::Vertex of = g.operands(v).at(0);
      owner[v] = owner[of];
      p.offsetOf[v] = p.offsetOf[of] + (columns ? static_cast<size_t>(g.op(v).begin) * 2 : 0);
    } else {
      owner[v] = v;
    }
    size_t last = pos[v];
    for (ir::Vertex u : g.users(v))
      last = std::max(last, pos[u]);
    for (ir::Vertex u : extraUsers[v])
      last = std::max(last, pos[u]);
    groupLast[owner[v]] = std::max(groupLast[owner[v]], last);
    groupPinned[owner[v]] = groupPinned[owner[v]] || pinned(v);
  }
  std::multiset<std::pair<size_t, int>> free; // (bytes, slot), best fit by size
  for (size_t i = 0; i < order->size(); ++i) {
    const ir::Vertex v = (*order)[i];
    if (owner[v] != v) {
      p.slotOf[v] = p.slotOf[owner[v]];
    } else {
      const size_t need = roundUp(bytesOf(g.op(v)));
      p.naiveBytes += need;
      auto it = groupPinned[v] ? free.end() : free.lower_bound({need, -1});
      if (it != free.end()) {
        p.slotOf[v] = it->second;
        free.erase(it);
      } else {
        p.slotOf[v] = static_cast<int>(p.slotBytes.size());
        p.slotBytes.push_back(need);
      }
    }
    // Buffers whose last use is this op go back (after its own was chosen: an op never writes
    // the buffer it reads); so does one nobody reads, at once.
    std::set<ir::Vertex> groups;
    for (ir::Vertex u : g.operands(v))
      groups.insert(owner[u]);
    if (v < extraIns.size())
      for (ir::Vertex u : extraIns[v])
        groups.insert(owner[u]);
    groups.insert(owner[v]);
    for (ir::Vertex o : groups)
      if (groupLast[o] == i && !groupPinned[o])
        free.insert({p.slotBytes[static_cast<size_t>(p.slotOf[o])], p.slotOf[o]});
  }
  for (size_t b : p.slotBytes)
    p.plannedBytes += b;
  return p;
}

Executor::Executor(cuda::Driver& drv, const CompiledGraph& cg) : drv_(drv), cg_(cg) {
  const ir::Graph& g = cg_.graph;
  std::vector<std::vector<ir::Vertex>> extraIns(g.size());
  for (ir::Vertex v = 0; v < g.size() && v < cg_.units.size(); ++v)
    extraIns[v] = cg_.units[v].extraIns;
  plan_ = planBuffers(g, extraIns);
  computedWeights_ = ir::weightOnly(g);
  // Say so before allocating: a graph larger than the GPU fails clearly, not halfway through.
  if (const size_t free = drv_.freeMemory(); free > 0 && plan_.plannedBytes > free)
    throw cuda::CudaError("the graph needs " + std::to_string(plan_.plannedBytes >> 20) +
                          " MiB of device memory (buffers planned by liveness); the GPU has " +
                          std::to_string(free >> 20) + " MiB free");
  slotSets_.emplace_back();
  for (size_t b : plan_.slotBytes)
    slotSets_[0].push_back(drv_.alloc(b));
  const std::vector<cuda::CUdeviceptr>& slots0 = slotSets_[0];
  std::map<std::string, cuda::CUmodule> loaded;
  auto order = *ir::stableOrder(g);
  // The last wave split in k (fpat_wgmma.cuh): cooperative wgmma kernels without clusters take a
  // workspace of one BM x BN f32 tile per SM and a zeroed flag per consumer warpgroup and SM (the
  // kernels leave them zero). Launches run one after another, so every op shares the largest.
  // FPAT_SPLIT_LAST_WAVE=0 withholds it, and the kernels then keep every tile whole.
  const char* skEnv = std::getenv("FPAT_SPLIT_LAST_WAVE");
  const bool split = !(skEnv && std::string(skEnv) == "0");
  auto takesSplit = [&](const codegen::KernelUnit& u) { return split && u.splitLastWave; };
  size_t skBytes = 0;
  const size_t sms = static_cast<size_t>(std::max(1, drv_.device().sms));
  for (ir::Vertex v : order)
    if (takesSplit(cg_.units[v]))
      skBytes = std::max(skBytes, sms * static_cast<size_t>(cg_.units[v].tile.bm) *
                                      static_cast<size_t>(cg_.units[v].tile.bn) * sizeof(float));
  cuda::CUdeviceptr skWork = 0, skFlags = 0;
  if (skBytes > 0) {
    skWork = drv_.alloc(skBytes);
    skFlags = drv_.alloc(sms * 2 * sizeof(uint32_t));
    drv_.fill16(skFlags, 0, sms * 4);
    scratch_.push_back(skWork);
    scratch_.push_back(skFlags);
  }
  // wgmma kernels with K % 8 != 0 read A (and B [N, K]) from padded copies that their first
  // launch writes; launches run one after another, so every op shares the largest two.
  auto pads = [](const codegen::KernelUnit& u) {
    return std::any_of(u.launches.begin(), u.launches.end(), [](const codegen::Launch& l) {
      return l.grid == codegen::Launch::PaddedRows;
    });
  };
  size_t padBytes[2] = {0, 0};
  for (ir::Vertex v : order) {
    const codegen::KernelUnit& u = cg_.units[v];
    if (!pads(u))
      continue;
    const size_t row = static_cast<size_t>(codegen::paddedK(u.K)) * 2;
    padBytes[0] = std::max(padBytes[0], static_cast<size_t>(u.M) * row);
    if (u.transB && !u.preparedB)
      padBytes[1] = std::max(padBytes[1], static_cast<size_t>(u.N) * row);
  }
  cuda::CUdeviceptr padded[2] = {0, 0};
  for (int i = 0; i < 2; ++i)
    if (padBytes[i] > 0) {
      padded[i] = drv_.alloc(padBytes[i]);
      scratch_.push_back(padded[i]);
    }
  // Weights B that wgmma kernels read from a prepared copy: one copy per weight (and rotation),
  // shared by every op that reads it in the same layout (a weight read as B [K, N] by one op and
  // as B [N, K] by another needs two different copies), written when the weight is uploaded
  // (prepareWeights).
  // A deferred norm's copy holds gamma (and beta's column terms) too, a dual GEMM's both of its
  // weights: its key names them.
  using PrepKey = std::tuple<ir::Vertex, bool, ir::Vertex, ir::Vertex, ir::Vertex>;
  std::map<PrepKey, int> prepOf;
  auto prepKey = [&](ir::Vertex v, const codegen::KernelUnit& u) {
    const std::vector<ir::Vertex> ins = g.operands(v);
    const ir::Vertex none = static_cast<ir::Vertex>(-1);
    const bool norm = u.deferredNorm != ir::NormKind::None;
    const bool layer = u.deferredNorm == ir::NormKind::LayerNorm;
    const size_t b = ir::gemmBIndex(g.op(v));
    return PrepKey{ins.at(b), u.transB, norm ? ins.at(1) : none, layer ? ins.at(2) : none,
                   u.dual ? ins.at(b + 1) : none};
  };
  prepared_.emplace_back();
  for (ir::Vertex v : order) {
    const codegen::KernelUnit& u = cg_.units[v];
    if (!u.preparedB)
      continue;
    const auto w = prepKey(v, u);
    if (prepOf.count(w))
      continue;
    prepOf[w] = static_cast<int>(preparedBytes_.size());
    preparedBytes_.push_back(codegen::preparedBBytes(u));
    prepared_[0].push_back(drv_.alloc(preparedBytes_.back()));
  }
  // The first op reading a weight prepares it for all (each of its preparing entries once).
  std::set<std::pair<int, codegen::Launch::Grid>> prepLaunched;
  for (ir::Vertex v : order) {
    const codegen::KernelUnit& u = cg_.units[v];
    if (u.launches.empty())
      continue;
    auto it = loaded.find(u.name);
    if (it == loaded.end()) {
      auto path = cg_.cubins.find(u.name);
      std::string image;
      if (path == cg_.cubins.end() || !readFile(path->second, image))
        throw cuda::CudaError("no cubin for kernel " + u.name);
      it = loaded.emplace(u.name, drv_.loadModule(image)).first;
      modules_.push_back(it->second);
    }
    FpatKernelArgs a;
    std::memset(&a, 0, sizeof a);
    a.out = reinterpret_cast<void*>(slots0[static_cast<size_t>(plan_.slotOf[v])]);
    std::vector<ir::Vertex> ins = g.operands(v);
    ins.insert(ins.end(), u.extraIns.begin(), u.extraIns.end());
    if (ins.size() > FPAT_MAX_INPUTS)
      throw cuda::CudaError("%" + g.op(v).name + "'s kernel reads more than " +
                            std::to_string(FPAT_MAX_INPUTS) + " buffers");
    for (size_t i = 0; i < ins.size(); ++i)
      a.in[i] = reinterpret_cast<void*>(slots0[static_cast<size_t>(plan_.slotOf[ins[i]])] +
                                        plan_.offsetOf[ins[i]]);
    a.M = u.M;
    a.N = u.N;
    a.K = u.K;
    a.eps = u.eps;
    for (size_t i = 0; i < u.params.size() && i < FPAT_MAX_PARAMS; ++i)
      a.params[i] = u.params[i];
    if (u.needsRowStats) {
      for (int s = 0; s < 2; ++s) {
        scratch_.push_back(drv_.alloc(static_cast<size_t>(u.M) * sizeof(float)));
        a.scratch[s] = reinterpret_cast<void*>(scratch_.back());
      }
    }
    if (u.scratchBytes > 0) {
      scratch_.push_back(drv_.alloc(u.scratchBytes));
      drv_.fill16(scratch_.back(), 0, (u.scratchBytes + 1) / 2); // counters start at zero
      a.scratch[0] = reinterpret_cast<void*>(scratch_.back());
    }
    if (u.normStats == codegen::NormStats::Launch || u.normStats == codegen::NormStats::Grid)
      for (int s = 0; s < 2; ++s) {
        scratch_.push_back(drv_.alloc(static_cast<size_t>(u.M) * sizeof(float)));
        a.rowStats[s] = reinterpret_cast<void*>(scratch_.back());
      }
    if (!u.needsRowStats && takesSplit(u)) {
      a.scratch[0] = reinterpret_cast<void*>(skWork);
      a.scratch[1] = reinterpret_cast<void*>(skFlags);
    }
    if (pads(u))
      for (int i = 0; i < 2; ++i)
        a.padded[i] = reinterpret_cast<void*>(padded[i]);
    const int prep = u.preparedB ? prepOf.at(prepKey(v, u)) : -1;
    for (const codegen::Launch& l : u.launches) {
      if (l.preparesWeights() && !prepLaunched.insert({prep, l.grid}).second)
        continue;
      cuda::CUfunction f = drv_.function(it->second, l.entry);
      if (l.smemBytes > drv_.device().smemOptin)
        throw cuda::CudaError(l.entry + " needs " + std::to_string(l.smemBytes) +
                              " bytes of shared memory; the device allows " +
                              std::to_string(drv_.device().smemOptin));
      if (l.smemBytes > 48 * 1024)
        drv_.setMaxDynamicSmem(f, l.smemBytes);
      std::vector<int> inSlots;
      std::vector<size_t> inOffsets;
      for (ir::Vertex in : ins) {
        inSlots.push_back(plan_.slotOf[in]);
        inOffsets.push_back(plan_.offsetOf[in]);
      }
      if (!l.tma.empty() && !drv_.hasTensorMaps())
        throw cuda::CudaError(l.entry + " reads through TMA, which this CUDA driver cannot set up");
      // A persistent grid larger than what is resident at once would leave clusters waiting
      // for others to finish their whole share.
      const int resident =
          l.grid == codegen::Launch::Persistent && u.tile.cluster > 1
              ? drv_.maxActiveClusters(f, static_cast<unsigned>(u.tile.cluster),
                                       static_cast<unsigned>(l.threads), l.smemBytes)
              : 0;
      launches_.push_back({v, f, l, a, plan_.slotOf[v], inSlots, inOffsets, prep, {}, resident});
    }
  }
}

Executor::~Executor() {
  // Errors while tearing down cannot be reported; the context dies with the process anyway.
  try {
    for (const auto& set : slotSets_)
      for (cuda::CUdeviceptr p : set)
        drv_.free(p);
    for (cuda::CUdeviceptr p : scratch_)
      drv_.free(p);
    for (const auto& set : prepared_)
      for (cuda::CUdeviceptr p : set)
        drv_.free(p);
    for (cuda::CUmodule m : modules_)
      drv_.unloadModule(m);
  } catch (...) {
  }
}

void Executor::launchAll(bool poison, size_t set) {
  launch(false, poison, set);
}

void Executor::prepareWeights(size_t set) {
  launch(true, false, set);
}

void Executor::launch(bool weights, bool poison, size_t set) {
  const int sms = std::max(1, drv_.device().sms);
  const std::vector<cuda::CUdeviceptr>& slots = slotSets_.at(set);
  ir::Vertex poisoned = static_cast<ir::Vertex>(-1);
  ir::Vertex external = static_cast<ir::Vertex>(-1);
  for (Bound& b : launches_) {
    // A replaced op (the benches' cuBLAS) runs in the pass of its value, with none of its
    // own launches: with the weights where it reads weights alone, else on every run.
    const bool replaced = replaced_.count(b.v) != 0;
    if ((computedWeights_[b.v] || (!replaced && b.launch.preparesWeights())) != weights)
      continue;
    if (marks_ && (marks_->empty() || marks_->back().first != b.v)) {
      marks_->emplace_back(b.v, drv_.createEvent());
      drv_.record(marks_->back().second);
    }
    if (replaced) {
      if (external != b.v)
        replacement_(b.v, set);
      external = b.v;
      continue;
    }
    const codegen::KernelUnit& u = cg_.units[b.v];
    FpatKernelArgs args = b.args;
    args.out = reinterpret_cast<void*>(slots[static_cast<size_t>(b.outSlot)]);
    for (size_t i = 0; i < b.inSlots.size(); ++i)
      args.in[i] =
          reinterpret_cast<void*>(slots[static_cast<size_t>(b.inSlots[i])] + b.inOffsets[i]);
    if (b.prep >= 0)
      args.padded[1] = reinterpret_cast<void*>(prepared_.at(set)[static_cast<size_t>(b.prep)]);
    if (poison && poisoned != b.v) {
      drv_.fill16(reinterpret_cast<cuda::CUdeviceptr>(args.out), 0x7fff,
                  static_cast<size_t>(cg_.graph.op(b.v).type.numel()));
      // Operands it writes, whole buffers (an operand may be a column view of one).
      for (int i : u.writesOperands) {
        const int slot = b.inSlots.at(static_cast<size_t>(i));
        drv_.fill16(slots[static_cast<size_t>(slot)], 0x7fff,
                    plan_.slotBytes[static_cast<size_t>(slot)] / 2);
      }
      poisoned = b.v;
    }
    unsigned gx = 1, gy = 1, gz = 1;
    codegen::LastWaveSplit splitPlan; // Persistent kernels given the workspace: their plan
    switch (b.launch.grid) {
    case codegen::Launch::Persistent: {
      // Whole clusters, each taking units of `cluster` M-tiles (fpat_wgmma.cuh).
      const int64_t c = u.tile.cluster;
      const int64_t unitsM = ((u.M + u.tile.bm - 1) / u.tile.bm + c - 1) / c;
      const int64_t units = ((u.gemmColumns() + u.tile.bn - 1) / u.tile.bn) * unitsM;
      const int64_t clusters = b.residentClusters > 0 ? b.residentClusters : sms / c;
      // A kernel that may split its tiles in k gets every SM, also where there are fewer tiles.
      const bool split = u.splitLastWave && args.scratch[0] != nullptr;
      gx = static_cast<unsigned>(
          c * std::max<int64_t>(1, split ? clusters : std::min<int64_t>(clusters, units)));
      if (split) // the kernel takes its pieces as planned here, for this grid
        splitPlan =
            codegen::lastWaveSplit(units, static_cast<int>(gx), (u.K + u.tile.bk - 1) / u.tile.bk);
      break;
    }
    case codegen::Launch::GemmTiles:
      gx = static_cast<unsigned>((u.N + u.tile.bn - 1) / u.tile.bn);
      gy = static_cast<unsigned>((u.M + u.tile.bm - 1) / u.tile.bm);
      break;
    case codegen::Launch::Rows:
      gx = static_cast<unsigned>((u.M + 7) / 8);
      break;
    case codegen::Launch::PaddedRows: {
      const int64_t rows = u.M + (u.transB && !u.preparedB ? u.N : 0);
      gx = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(rows, sms * 8)));
      break;
    }
    case codegen::Launch::PreparedWeight: {
      const int64_t tiles = (u.gemmColumns() + 63) / 64 * ((codegen::paddedK(u.K) + 63) / 64);
      gx = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(tiles, sms * 8)));
      break;
    }
    case codegen::Launch::PreparedColumns: {
      const int64_t columns = codegen::normColumnsPitch(u.N); // a warp each, 8 a block
      gx = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(columns / 8, sms * 8)));
      break;
    }
    case codegen::Launch::Fixed:
      gx = static_cast<unsigned>(b.launch.blocks[0]);
      gy = static_cast<unsigned>(b.launch.blocks[1]);
      gz = static_cast<unsigned>(b.launch.blocks[2]);
      break;
    case codegen::Launch::Elements: {
      int64_t chunks = (u.M * u.N + 7) / 8;
      gx = static_cast<unsigned>(std::max<int64_t>(
          1, std::min<int64_t>((chunks + b.launch.threads - 1) / b.launch.threads, sms * 32)));
      break;
    }
    }
    if (gx == 0 || gy == 0 || gz == 0)
      throw cuda::CudaError("%" + cg_.graph.op(b.v).name + ": empty launch grid");
    if (!b.launch.tma.empty()) {
      if (b.tmaArgs.size() <= set)
        b.tmaArgs.resize(set + 1);
      if (!b.tmaArgs[set]) {
        auto t = std::make_unique<FpatTmaArgs>();
        std::memset(t.get(), 0, sizeof *t);
        t->k = args;
        t->splitTiles = static_cast<int32_t>(splitPlan.tiles);
        t->splitPieces = splitPlan.pieces;
        FpatTensorMap* maps[4] = {&t->a, &t->b, &t->c, &t->d};
        for (size_t i = 0; i < b.launch.tma.size() && i < 4; ++i) {
          const codegen::TmaMap& m = b.launch.tma[i];
          if (m.operand == codegen::TmaMap::kUnused)
            continue;
          const void* base = m.copy >= 0                             ? args.padded[m.copy]
                             : m.operand == codegen::TmaMap::kOutput ? args.out
                                                                     : args.in[m.operand];
          const int64_t pitch = m.copy >= 0   ? codegen::paddedK(m.inner)
                                : m.pitch > 0 ? m.pitch
                                              : m.inner;
          drv_.encodeTensorMap(maps[i]->opaque, reinterpret_cast<cuda::CUdeviceptr>(base),
                               static_cast<uint64_t>(m.inner), static_cast<uint64_t>(m.outer),
                               static_cast<uint64_t>(pitch) * 2, static_cast<unsigned>(m.boxInner),
                               static_cast<unsigned>(m.boxOuter));
        }
        b.tmaArgs[set] = std::move(t);
      }
      if (b.launch.overlapsPrevious)
        drv_.launchOverlapping(b.fn, gx, gy, gz, static_cast<unsigned>(b.launch.threads),
                               b.launch.smemBytes, b.tmaArgs[set].get());
      else
        drv_.launch(b.fn, gx, gy, gz, static_cast<unsigned>(b.launch.threads), b.launch.smemBytes,
                    b.tmaArgs[set].get(), sizeof(FpatTmaArgs));
      continue;
    }
    if (b.launch.overlapsPrevious)
      drv_.launchOverlapping(b.fn, gx, gy, gz, static_cast<unsigned>(b.launch.threads),
                             b.launch.smemBytes, &args);
    else
      drv_.launch(b.fn, gx, gy, gz, static_cast<unsigned>(b.launch.threads), b.launch.smemBytes,
                  &args, sizeof args);
  }
}

RunResult Executor::run(const std::map<std::string, ir::Tensor>& inputs, bool poison) {
  std::map<std::string, std::vector<uint16_t>> bits;
  for (ir::Vertex v : cg_.graph.vertices()) {
    const ir::Op& op = cg_.graph.op(v);
    if (op.kind != ir::OpKind::Input)
      continue;
    auto it = inputs.find(op.name);
    if (it == inputs.end() || it->second.desc != op.type)
      throw cuda::CudaError("no " + op.type.str() + " value given for input %" + op.name);
    std::vector<uint16_t>& b = bits[op.name];
    b.resize(it->second.data.size());
    for (size_t i = 0; i < b.size(); ++i)
      b[i] = ir::toBits(it->second.data[i], op.type.dtype);
  }
  return runBits(bits, poison);
}

RunResult Executor::runBits(const std::map<std::string, std::vector<uint16_t>>& inputs,
                            bool poison) {
  const ir::Graph& g = cg_.graph;
  RunResult r;
  r.deviceBytes = plan_.plannedBytes;
  r.naiveBytes = plan_.naiveBytes;
  for (ir::Vertex v : g.vertices()) {
    const ir::Op& op = g.op(v);
    if (op.kind != ir::OpKind::Input)
      continue;
    auto it = inputs.find(op.name);
    if (it == inputs.end() || it->second.size() != static_cast<size_t>(op.type.numel()))
      throw cuda::CudaError("no " + op.type.str() + " value given for input %" + op.name);
    drv_.copyToDevice(slotSets_[0][static_cast<size_t>(plan_.slotOf[v])], it->second.data(),
                      it->second.size() * 2);
  }
  // Constants are part of the graph: uploaded with the inputs (they are pinned, never reused).
  for (ir::Vertex v : g.vertices()) {
    const ir::Op& op = g.op(v);
    if (op.kind != ir::OpKind::Constant)
      continue;
    const std::vector<uint16_t> fill(static_cast<size_t>(op.type.numel()),
                                     ir::toBits(op.value, op.type.dtype));
    drv_.copyToDevice(slotSets_[0][static_cast<size_t>(plan_.slotOf[v])], fill.data(),
                      fill.size() * 2);
  }
  // Values computed from weights alone, and weights read from prepared copies: made now, as
  // the new values arrive (not timed).
  prepareWeights(0);
  std::vector<uint16_t> bits;
  cuda::CUevent start = drv_.createEvent(), stop = drv_.createEvent();
  drv_.record(start);
  launchAll(poison);
  drv_.record(stop);
  drv_.synchronize();
  r.milliseconds = drv_.elapsedMs(start, stop);
  drv_.destroyEvent(start);
  drv_.destroyEvent(stop);
  // The launches of a run: not those made once per set of weights (prepareWeights).
  r.launches =
      static_cast<int>(std::count_if(launches_.begin(), launches_.end(), [&](const Bound& b) {
        return !computedWeights_[b.v] && (replaced_.count(b.v) != 0 || !b.launch.preparesWeights());
      }));
  for (ir::Vertex v : g.outputs()) {
    const ir::Op& op = g.op(v);
    ir::Tensor t{op.type, std::vector<float>(static_cast<size_t>(op.type.numel()))};
    bits.resize(t.data.size());
    drv_.copyToHost(bits.data(), slotSets_[0][static_cast<size_t>(plan_.slotOf[v])],
                    bits.size() * 2);
    for (size_t i = 0; i < bits.size(); ++i)
      t.data[i] = ir::fromBits(bits[i], op.type.dtype);
    r.outputs.push_back(std::move(t));
  }
  return r;
}

size_t Executor::rotationsFor(size_t minWorkingSet) const {
  const size_t perSet = std::max<size_t>(plan_.plannedBytes, 1);
  return std::max<size_t>(1, std::min<size_t>(32, (minWorkingSet + perSet - 1) / perSet));
}

void Executor::ensureRotations(size_t n) {
  while (slotSets_.size() < n) {
    std::vector<cuda::CUdeviceptr> set;
    for (size_t s = 0; s < plan_.slotBytes.size(); ++s) {
      set.push_back(drv_.alloc(plan_.slotBytes[s]));
      drv_.copyOnDevice(set.back(), slotSets_[0][s], plan_.slotBytes[s]);
    }
    slotSets_.push_back(std::move(set));
    std::vector<cuda::CUdeviceptr> prep;
    for (size_t i = 0; i < preparedBytes_.size(); ++i) {
      prep.push_back(drv_.alloc(preparedBytes_[i]));
      drv_.copyOnDevice(prep.back(), prepared_[0][i], preparedBytes_[i]);
    }
    prepared_.push_back(std::move(prep));
  }
}

std::vector<float> Executor::time(int warmup, int reps, size_t minWorkingSet) {
  ensureRotations(rotationsFor(minWorkingSet));
  for (int i = 0; i < warmup; ++i)
    launchAll(false, static_cast<size_t>(i) % slotSets_.size());
  std::vector<cuda::CUevent> ev;
  for (int i = 0; i <= reps; ++i)
    ev.push_back(drv_.createEvent());
  drv_.record(ev[0]);
  for (int i = 0; i < reps; ++i) {
    launchAll(false, static_cast<size_t>(i + warmup) % slotSets_.size());
    drv_.record(ev[static_cast<size_t>(i) + 1]);
  }
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i)
    ms.push_back(drv_.elapsedMs(ev[static_cast<size_t>(i)], ev[static_cast<size_t>(i) + 1]));
  for (cuda::CUevent e : ev)
    drv_.destroyEvent(e);
  return ms;
}

std::vector<std::pair<ir::Vertex, double>> Executor::timeOps(int warmup, int reps,
                                                             size_t minWorkingSet) {
  ensureRotations(rotationsFor(minWorkingSet));
  for (int i = 0; i < warmup; ++i)
    launchAll(false, static_cast<size_t>(i) % slotSets_.size());
  std::vector<ir::Vertex> order;
  std::map<ir::Vertex, std::vector<double>> runs;
  for (int i = 0; i < reps; ++i) {
    std::vector<std::pair<ir::Vertex, cuda::CUevent>> marks;
    marks_ = &marks;
    try {
      launchAll(false, static_cast<size_t>(i + warmup) % slotSets_.size());
    } catch (...) {
      marks_ = nullptr;
      for (auto& m : marks)
        drv_.destroyEvent(m.second);
      throw;
    }
    marks_ = nullptr;
    marks.emplace_back(static_cast<ir::Vertex>(-1), drv_.createEvent());
    drv_.record(marks.back().second);
    for (size_t k = 0; k + 1 < marks.size(); ++k) {
      if (i == 0)
        order.push_back(marks[k].first);
      runs[marks[k].first].push_back(drv_.elapsedMs(marks[k].second, marks[k + 1].second));
    }
    for (auto& m : marks)
      drv_.destroyEvent(m.second);
  }
  std::vector<std::pair<ir::Vertex, double>> out;
  for (ir::Vertex v : order) {
    std::vector<double>& t = runs[v];
    std::sort(t.begin(), t.end());
    out.emplace_back(v, t.empty() ? 0.0 : t[t.size() / 2]);
  }
  return out;
}

void Executor::replace(std::set<ir::Vertex> ops, std::function<void(ir::Vertex, size_t)> run) {
  replaced_ = std::move(ops);
  replacement_ = std::move(run);
}

std::pair<int, int> Executor::registersAndLocalBytes() {
  int regs = 0, local = 0;
  for (const Bound& b : launches_) {
    regs = std::max(regs, drv_.funcAttribute(b.fn, cuda::Driver::kFuncNumRegs));
    local = std::max(local, drv_.funcAttribute(b.fn, cuda::Driver::kFuncLocalBytes));
  }
  return {regs, local};
}

cuda::CUdeviceptr Executor::devicePointer(ir::Vertex v, size_t set) const {
  int slot = plan_.slotOf.at(v);
  if (slot < 0)
    throw cuda::CudaError("%" + cg_.graph.op(v).name + " has no buffer");
  return slotSets_.at(set)[static_cast<size_t>(slot)] + plan_.offsetOf.at(v);
}

} // namespace fpat::runtime
