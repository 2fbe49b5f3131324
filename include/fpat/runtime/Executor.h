// Running a fused graph on the GPU: modules loaded from cubins, buffers planned by liveness,
// kernels launched in topological order, outputs copied back.
#pragma once

#include "fpat/codegen/Codegen.h"
#include "fpat/codegen/kernels/fpat_abi.h"
#include "fpat/ir/Reference.h"
#include "fpat/runtime/Cuda.h"
#include "fpat/runtime/Nvcc.h"

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace fpat::runtime {

/// A graph with a generated and compiled kernel for each of its ops.
struct CompiledGraph {
  ir::Graph graph;                           // the (fused) graph
  std::vector<codegen::KernelUnit> units;    // by vertex; inputs have no launches
  std::map<std::string, std::string> cubins; // unit name -> cubin path
};

struct BufferPlan {
  std::vector<int> slotOf;       // by vertex: buffer slot, -1 for none
  std::vector<size_t> offsetOf;  // by vertex: bytes into its slot (a column view's columns)
  std::vector<size_t> slotBytes; // by slot
  size_t plannedBytes = 0;       // sum of slot sizes
  size_t naiveBytes = 0;         // one buffer per value
};

/// Liveness-based plan: a value's buffer returns to the pool after its last user; inputs and
/// graph outputs keep theirs. Sizes are rounded to 256 bytes (the alignment of every slot).
/// `extraIns[v]`: values op v's kernel reads beyond its operands (codegen::KernelUnit::extraIns).
BufferPlan planBuffers(const ir::Graph& g,
                       const std::vector<std::vector<ir::Vertex>>& extraIns = {});

struct RunResult {
  std::vector<ir::Tensor> outputs; // in graph output order
  float milliseconds = 0;          // GPU time of all launches (CUDA events)
  int launches = 0;                // kernels of a run (not those made once per set of weights)
  size_t deviceBytes = 0;
  size_t naiveBytes = 0;
};

class Executor {
public:
  Executor(cuda::Driver& drv, const CompiledGraph& cg);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  /// Uploads the inputs, runs every kernel, downloads the outputs. With `poison`, every buffer
  /// is filled with f16 NaN before the kernel that writes it, so an unwritten element shows.
  RunResult run(const std::map<std::string, ir::Tensor>& inputs, bool poison = true);
  /// The same with inputs already in f16 bits (converting large tensors once saves time when
  /// the same inputs feed many executors, as in tuning).
  RunResult runBits(const std::map<std::string, std::vector<uint16_t>>& inputs, bool poison = true);

  /// The largest register count per thread and local memory (spill) bytes of its kernels.
  std::pair<int, int> registersAndLocalBytes();

  /// Times the whole graph: `warmup` untimed runs, then `reps` runs timed one by one with CUDA
  /// events (milliseconds each). Inputs are rotated over enough copies of all buffers that the
  /// data touched in a row of runs exceeds `minWorkingSet` bytes (pass twice the L2 size), so
  /// no run finds its inputs in cache from the run before. Call after run().
  std::vector<float> time(int warmup, int reps, size_t minWorkingSet);

  /// Each op's own time: `reps` runs as time() makes them, with an event before each op's
  /// first launch and after the last one; per op, the median over the runs (ms), in launch
  /// order. The events add little (one stream, nothing waits on them until the run ends).
  std::vector<std::pair<ir::Vertex, double>> timeOps(int warmup, int reps, size_t minWorkingSet);

  /// Device address of op `v`'s buffer (rotation 0), for code outside fpat that produces an
  /// input or consumes an output in place (the cuBLAS reference of the benchmarks).
  cuda::CUdeviceptr devicePointer(ir::Vertex v, size_t set = 0) const;

  /// Launches every kernel once on rotation `set` without synchronising.
  void launchAll(bool poison, size_t set = 0);
  /// Computes the values computed from weights alone (ir::weightOnly) and writes the prepared
  /// copies of weights (codegen::preparesWeightB) on rotation `set` from their buffers. run() does
  /// it after uploading the inputs; code that writes a weight through devicePointer() calls it
  /// before launchAll().
  void prepareWeights(size_t set = 0);

  /// Ops in `ops` are computed by `run(v, set)` instead of their kernels, in their place in the
  /// launch order (the benchmarks put cuBLAS there), by prepareWeights() where they read weights
  /// alone. `run` reads and writes devicePointer().
  void replace(std::set<ir::Vertex> ops, std::function<void(ir::Vertex, size_t)> run);
  /// Makes at least `n` rotations: copies of every buffer, initialised from rotation 0.
  void ensureRotations(size_t n);
  /// Rotations needed for `minWorkingSet` bytes (at most 32).
  size_t rotationsFor(size_t minWorkingSet) const;
  size_t rotations() const { return slotSets_.size(); }

private:
  // Launches the weight preparations (`weights`) or every other kernel.
  void launch(bool weights, bool poison, size_t set);

  struct Bound {
    ir::Vertex v;
    cuda::CUfunction fn;
    codegen::Launch launch;
    FpatKernelArgs args;
    int outSlot;
    std::vector<int> inSlots;
    std::vector<size_t> inOffsets; // bytes into each operand's slot (ir::isColumnView)
    int prep = -1;                 // the prepared weight copy it reads (prepared_), -1: none
    // The wgmma backend's parameter block per buffer rotation, tensor maps encoded on first use
    // (they hold the global addresses). Empty for other kernels.
    std::vector<std::unique_ptr<FpatTmaArgs>> tmaArgs;
    // Persistent kernels in clusters: how many clusters fit on the GPU at once (0: unknown).
    int residentClusters = 0;
  };

  cuda::Driver& drv_;
  CompiledGraph cg_; // a copy: callers need not keep theirs alive
  BufferPlan plan_;
  std::vector<cuda::CUmodule> modules_;
  std::vector<std::vector<cuda::CUdeviceptr>> slotSets_; // [rotation][slot]
  std::vector<cuda::CUdeviceptr> scratch_;
  std::vector<size_t> preparedBytes_;                    // by prepared weight
  std::vector<std::vector<cuda::CUdeviceptr>> prepared_; // [rotation][prepared weight]
  std::vector<Bound> launches_;
  std::vector<bool> computedWeights_; // by vertex: launched by prepareWeights, not every run
  std::set<ir::Vertex> replaced_;
  // timeOps: launch() records an event where the op being launched changes, and at the end.
  std::vector<std::pair<ir::Vertex, cuda::CUevent>>* marks_ = nullptr;
  std::function<void(ir::Vertex, size_t)> replacement_;
};

} // namespace fpat::runtime
