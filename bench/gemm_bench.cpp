// The GEMM benchmark: every built-in pattern at the seed's and LLM FFN shapes, timed as
//   fpat   the tuned fused kernel (and the heuristic default, for comparison),
//   cuBLAS the same computation unfused: cuBLAS GEMM, then fpat's separate epilogue kernels,
//   Lt     cuBLASLt with its fused epilogue where one exists (BIAS, RELU_BIAS, GELU_BIAS),
// plus plain cuBLAS GEMM as the throughput yardstick, all in one process on the same inputs,
// each checked against the CPU reference on sampled rows. Then the SwiGLU FFN block end to end.
// Writes a markdown table (stdout), a CSV and an SVG plot. The table's last column is what the
// epilogue costs: each fused kernel's time over fpat's plain gemm at the same shape and run
// (where the run times `gemm` at that shape too). --models replaces the shape list with the
// patterns at the shapes where transformer models use them.
//
//   fpat-bench-gemm [--quick] [--only PATTERN[,PATTERN]...] [--no-ffn] [--ffn MxH,...]
//                   [--shape MxNxK]... [--models] [--csv F] [--svg F] [--candidates N] [--configs
//                   LIST]
//                   [--reps N] [--rounds N] [--b-input]
// Every result names the GPU, its driver, nvcc and the commit the benchmark was built from.
#include "../tests/common/TestGraphs.h"
#include "BenchUtil.h"
#include "FpatCommit.h"
#include "fpat/ir/Reference.h"
#include "fpat/runtime/Nvcc.h"
#include "fpat/runtime/Pipeline.h"
#include "fpat/support/CliError.h"
#include "fpat/tune/Tuner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <set>
#include <sstream>

using namespace fpat;
using namespace fpat::testing;
using namespace fpat::bench;

namespace {

/// --models: a pattern at a shape where a model uses it, M being the tokens of one batch (of
/// prompts, or of decode steps). The layouts stay the benchmark's: B [K, N], [N, K] for gemm_bt.
struct ModelCase {
  const char* model;
  const char* pattern;
  Shape s;
};
const ModelCase kModelCases[] = {
    {"GPT-2 MLP up", "gemm_bias_gelu", {4096, 3072, 768}},
    {"GPT-2 MLP down", "gemm_bias_residual", {4096, 768, 3072}},
    {"BERT-large MLP up", "gemm_bias_gelu", {3000, 4096, 1024}},
    {"BERT-large MLP down", "gemm_bias_residual", {3000, 1024, 4096}},
    {"Llama-3-8B QKV", "gemm_bt", {2048, 6144, 4096}},
    {"Llama-3-8B QKV, 16 decode steps", "gemm_bt", {16, 6144, 4096}},
    {"Llama-3-8B gate, one decode step", "gemm_bt", {1, 14336, 4096}},
    {"Llama-3-8B gate and up", "gemm_silu_mul", {2048, 14336, 4096}},
    {"Llama-3-8B down", "gemm_residual", {2048, 4096, 14336}},
    {"Llama-3-70B gate and up", "gemm_silu_mul", {1024, 28672, 8192}},
    {"Llama-3-70B down", "gemm_residual", {1024, 8192, 28672}},
    {"Llama-2-13B down", "gemm_residual", {777, 5120, 13824}},
    {"Qwen2-7B gate and up", "gemm_silu_mul", {512, 18944, 3584}},
    {"Qwen2-7B down", "gemm_residual", {512, 3584, 18944}},
    {"Phi-3-mini gate and up", "gemm_silu_mul", {2000, 8192, 3072}},
    {"Phi-3-mini down", "gemm_residual", {2000, 3072, 8192}},
    {"Gemma-7B gate", "gemm_gelu", {1024, 24576, 3072}},
};

std::vector<uint16_t> toBits(const ir::Tensor& t) {
  std::vector<uint16_t> b(t.data.size());
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = ir::doubleToHalfBits(t.data[i]);
  return b;
}

/// Device copies of a host tensor, one per rotation.
struct Rotated {
  std::vector<void*> ptr;
  size_t bytes = 0;
  Rotated(const std::vector<uint16_t>& bits, size_t copies) : bytes(bits.size() * 2) {
    for (size_t i = 0; i < copies; ++i) {
      void* p = nullptr;
      CK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
      CK(cudaMemcpy(p, bits.data(), bytes, cudaMemcpyHostToDevice));
      ptr.push_back(p);
    }
  }
  explicit Rotated(size_t b, size_t copies) : bytes(b) {
    for (size_t i = 0; i < copies; ++i) {
      void* p = nullptr;
      CK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
      ptr.push_back(p);
    }
  }
  ~Rotated() {
    for (void* p : ptr)
      cudaFree(p);
  }
  Rotated(const Rotated&) = delete;
  Rotated& operator=(const Rotated&) = delete;
};

/// Times `body(i)` for warm-up + reps iterations with CUDA events; returns each run's ms.
template <class F> std::vector<float> timeRuns(int warmup, int reps, F body) {
  for (int i = 0; i < warmup; ++i)
    body(i);
  std::vector<cudaEvent_t> ev(static_cast<size_t>(reps) + 1);
  for (auto& e : ev)
    CK(cudaEventCreate(&e));
  CK(cudaEventRecord(ev[0]));
  for (int i = 0; i < reps; ++i) {
    body(warmup + i);
    CK(cudaEventRecord(ev[static_cast<size_t>(i) + 1]));
  }
  CK(cudaEventSynchronize(ev.back()));
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    float t = 0;
    CK(cudaEventElapsedTime(&t, ev[static_cast<size_t>(i)], ev[static_cast<size_t>(i) + 1]));
    ms.push_back(t);
  }
  for (auto& e : ev)
    cudaEventDestroy(e);
  return ms;
}

void append(std::vector<float>& to, const std::vector<float>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

/// Row-major C[M,N] = A[M,K] * B through column-major cuBLAS: C^T = B^T A^T. B is [K, N]
/// row-major (cuBLAS "N, N"), or [N, K] with `transB` (nn.Linear's layout, cuBLAS "T, N"), the
/// same layouts fpat's kernel reads.
void cublasGemm(cublasHandle_t h, const void* A, const void* B, void* C, int64_t M, int64_t N,
                int64_t K, bool transB = false) {
  const float one = 1.0f, zero = 0.0f;
  CK(cublasGemmEx(h, transB ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(N),
                  static_cast<int>(M), static_cast<int>(K), &one, B, CUDA_R_16F,
                  static_cast<int>(transB ? K : N), A, CUDA_R_16F, static_cast<int>(K), &zero, C,
                  CUDA_R_16F, static_cast<int>(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/// cuBLASLt GEMM with a fused epilogue (bias over the output's columns).
struct LtGemm {
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t desc{};
  cublasLtMatrixLayout_t la{}, lb{}, lc{};
  cublasLtMatmulHeuristicResult_t algo{};
  void* workspace = nullptr;
  size_t wsBytes = 32 << 20;
  bool ok = false;
  LtGemm(cublasLtHandle_t h, int64_t M, int64_t N, int64_t K, cublasLtEpilogue_t epi) : lt(h) {
    CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    // Column-major view: D (N x M) = B^T-view (N x K) * A^T-view (K x M).
    CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16F, N, K, N));
    CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16F, K, M, K));
    CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16F, N, M, N));
    CK(cudaMalloc(&workspace, wsBytes));
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &wsBytes, sizeof wsBytes));
    int found = 0;
    ok = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &algo, &found) == 0 &&
         found > 0;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  void run(const void* A, const void* B, const void* bias, void* C) {
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    const float one = 1.0f, zero = 0.0f;
    CK(cublasLtMatmul(lt, desc, &one, B, la, A, lb, &zero, C, lc, C, lc, &algo.algo, workspace,
                      wsBytes, nullptr));
  }
  ~LtGemm() {
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(workspace);
  }
};

/// `rows` evenly spaced output rows and the CPU reference of the unfused graph on them.
struct SampledReference {
  std::vector<int64_t> rows;
  ir::Tensor want;
};

SampledReference sampledReference(const std::string& pattern, Shape s,
                                  const std::map<std::string, ir::Tensor>& inputs) {
  SampledReference r;
  const int64_t n = std::min<int64_t>(s.m, 16);
  for (int64_t i = 0; i < n; ++i)
    r.rows.push_back(s.m <= 16 ? i : i * (s.m - 1) / 15);
  ir::Graph small = caseGraph(pattern, {n, s.n, s.k});
  std::map<std::string, ir::Tensor> in;
  for (auto& [name, t] : inputs) {
    // Row-wise inputs (x, a residual, a gate) are those whose shape shrinks with M.
    const std::optional<ir::Vertex> v = small.find(name);
    if (v && small.op(*v).type.shape != t.desc.shape) {
      ir::Tensor sub{{{n, t.desc.shape[1]}, t.desc.dtype}, {}};
      for (int64_t row : r.rows)
        sub.data.insert(sub.data.end(), t.data.begin() + row * t.desc.shape[1],
                        t.data.begin() + (row + 1) * t.desc.shape[1]);
      in[name] = std::move(sub);
    } else {
      in[name] = t;
    }
  }
  r.want = ir::evaluate(small, in, builtinLibrary().referenceActivations())[small.outputs()[0]];
  return r;
}

/// Max relative error of device output rows against the sampled reference.
double checkRows(const void* dev, const SampledReference& ref, int64_t n) {
  ir::Tensor got{ref.want.desc, {}};
  std::vector<uint16_t> row(static_cast<size_t>(n));
  for (int64_t r : ref.rows) {
    CK(cudaMemcpy(row.data(), static_cast<const uint16_t*>(dev) + r * n, row.size() * 2,
                  cudaMemcpyDeviceToHost));
    for (uint16_t b : row)
      got.data.push_back(ir::halfBitsToFloat(b));
  }
  runtime::Agreement a = runtime::compareToReference(got, ref.want);
  return a.nonFinite ? INFINITY : a.maxRel;
}

/// The unfused graph split around its GEMM: ops before it (norm) and after it (epilogue), each
/// run by fpat's fallback kernels, the GEMM by cuBLAS.
struct UnfusedParts {
  std::optional<ir::Graph> before; // output: the GEMM's A
  std::optional<ir::Graph> after;  // input "h": the GEMM's result
};

UnfusedParts unfusedParts(const std::string& p, Shape s) {
  UnfusedParts u;
  ir::ActivationSet acts = builtinLibrary().activationSet();
  if (p == "layernorm_gemm" || p == "rmsnorm_gemm" || p == "layernorm_gemm_bias_gelu") {
    ir::GraphBuilder b("before", acts);
    auto x = b.input("x", {s.m, s.k});
    auto g = b.input("g", {s.k});
    b.output(p != "rmsnorm_gemm" ? b.layernorm(x, g, b.input("be", {s.k}), 1e-5, "n")
                                 : b.rmsnorm(x, g, 1e-6, "n"));
    u.before = b.build();
    if (p != "layernorm_gemm_bias_gelu")
      return u;
  }
  if (p == "gemm" || p == "gemm_bt")
    return u;
  ir::GraphBuilder b("after", acts);
  auto h = b.input("h", {s.m, s.n});
  auto bias = [&] { return b.input("b", {s.n}); };
  if (p == "gemm_gelu" || p == "gemm_silu")
    b.output(b.activation(h, p.substr(5), "y"));
  else if (p == "gemm_bias")
    b.output(b.bias(h, bias(), "y"));
  else if (p == "gemm_bias_residual")
    b.output(b.add(b.input("r", {s.m, s.n}), b.bias(h, bias()), "y"));
  else if (p == "gemm_residual")
    b.output(b.add(h, b.input("r", {s.m, s.n}), "y"));
  else if (p == "gemm_silu_mul")
    b.output(b.mul(b.input("up", {s.m, s.n}), b.activation(h, "silu"), "y"));
  else if (p == "layernorm_gemm_bias_gelu")
    b.output(b.activation(b.bias(h, bias()), "gelu", "y"));
  else
    b.output(b.activation(b.bias(h, bias()), p.substr(10), "y"));
  u.after = b.build();
  return u;
}

struct Row {
  std::string pattern;
  Shape s;
  std::string config;
  std::string tuning; // "cached", or how many configurations the tuner timed and rejected
  double fpat = 0, heuristic = 0, gemm = 0, unfused = 0, lt = NAN;
  double errFpat = 0, errUnfused = 0, errLt = NAN, errGemm = 0;
  double tflops(double ms) const { return 2.0 * s.m * s.n * s.k / (ms * 1e-3) / 1e12; }
};

std::string fmt(double v, int prec = 3) {
  if (std::isnan(v))
    return "-";
  std::ostringstream os;
  os << std::fixed << std::setprecision(prec) << v;
  return os.str();
}
std::string sci(double v) {
  if (std::isnan(v))
    return "-";
  std::ostringstream os;
  os << std::scientific << std::setprecision(1) << v;
  return os.str();
}

/// What produced the numbers: written into every table and CSV row.
/// A CSV field, quoted when it holds a comma or a quote.
std::string csvField(const std::string& s) {
  if (s.find_first_of(",\"") == std::string::npos)
    return s;
  std::string q = "\"";
  for (char c : s)
    q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

struct Env {
  cuda::Driver* drv;
  cublasHandle_t blas;
  cublasLtHandle_t lt;
  tune::TuningCache* cache;
  tune::TuneOptions topts;
  int reps;
  // Every implementation is timed once per round, in turn; each result is the median of all
  // its runs, so that a drift of the GPU's clocks during a row falls on all of them alike.
  int rounds;
  size_t l2;
  // B declared a weight (constant between runs, as a model's are): where TMA reads it badly as
  // given, fpat reads a copy made when it is uploaded (codegen::preparesWeightB), not timed.
  bool weights = true;
};

/// Builds, runs and checks fpat's fused graph for `g` with the given per-op configurations.
struct FpatRun {
  runtime::BuildResult built;
  std::unique_ptr<runtime::Executor> ex;
};

FpatRun fpatRun(Env& env, const ir::Graph& fused,
                const std::map<ir::Vertex, codegen::TileConfig>& tiles,
                const std::map<std::string, std::vector<uint16_t>>& bits) {
  FpatRun r;
  runtime::BuildOptions o;
  o.arch = env.drv->device().arch;
  o.sms = env.drv->device().sms;
  o.tiles = tiles;
  r.built = runtime::buildKernels(fused, builtinLibrary().activations, o);
  if (!r.built.error.empty()) {
    std::cerr << r.built.error << "\n";
    std::exit(1);
  }
  r.ex = std::make_unique<runtime::Executor>(*env.drv, r.built.graph);
  r.ex->runBits(bits, true);
  return r;
}

Row benchOne(Env& env, const std::string& pattern, Shape s) {
  Row row{pattern, s, {}, {}};
  ir::Graph g = caseGraph(pattern, s, env.weights);
  ir::Graph fused = fuse(g);
  const ir::Vertex out = fused.outputs()[0];
  auto inputs = ir::randomInputs(g, 42);
  std::map<std::string, std::vector<uint16_t>> bits;
  for (auto& [name, t] : inputs)
    bits[name] = toBits(t);
  SampledReference ref = sampledReference(pattern, s, inputs);

  // fpat: tune (or take the cached result), then time tuned and heuristic in this process.
  tune::Choice c =
      tune::tune(*env.drv, fused, out, builtinLibrary().activations, *env.cache, env.topts);
  row.config = c.config.str();
  row.tuning = c.source == "cache" ? std::string("cached")
                                   : std::to_string(c.tried) + " tried, " +
                                         std::to_string(c.rejected) + " rejected";
  // The heuristic's choice, as code generation makes it without a tuned configuration.
  codegen::CodegenOptions copts;
  copts.arch = env.drv->device().arch;
  copts.sms = env.drv->device().sms;
  const codegen::TileConfig heur =
      codegen::generate(fused, out, builtinLibrary().activations, copts).tile;
  // The heuristic's kernel is timed apart only where it differs from the tuned one.
  std::vector<FpatRun> fp;
  fp.push_back(fpatRun(env, fused, {{out, c.config}}, bits));
  if (!(heur == c.config))
    fp.push_back(fpatRun(env, fused, {{out, heur}}, bits));

  // cuBLAS: the GEMM alone, and unfused with fpat's fallback kernels around it.
  UnfusedParts parts = unfusedParts(pattern, s);
  std::unique_ptr<FpatRun> before, after;
  if (parts.before) {
    std::map<std::string, std::vector<uint16_t>> b;
    for (ir::Vertex v : parts.before->vertices())
      if (parts.before->op(v).kind == ir::OpKind::Input)
        b[parts.before->op(v).name] = bits.at(parts.before->op(v).name);
    before = std::make_unique<FpatRun>(fpatRun(env, *parts.before, {}, b));
  }
  if (parts.after) {
    std::map<std::string, std::vector<uint16_t>> b;
    for (ir::Vertex v : parts.after->vertices()) {
      const std::string& n = parts.after->op(v).name;
      if (parts.after->op(v).kind == ir::OpKind::Input)
        b[n] = n == "h" ? std::vector<uint16_t>(static_cast<size_t>(s.m * s.n)) : bits.at(n);
    }
    after = std::make_unique<FpatRun>(fpatRun(env, *parts.after, {}, b));
  }
  const size_t wsBytes = static_cast<size_t>((s.m * s.k + s.k * s.n + 2 * s.m * s.n) * 2);
  const size_t rot =
      std::max<size_t>(1, std::min<size_t>(16, (2 * env.l2 + wsBytes - 1) / wsBytes));
  Rotated A(bits.at("x"), rot), B(bits.at(pattern == "gemm_bt" ? "wt" : "w"), rot);
  Rotated C(static_cast<size_t>(s.m * s.n * 2), rot);
  if (before)
    before->ex->ensureRotations(rot);
  if (after)
    after->ex->ensureRotations(rot);
  const ir::Vertex beforeOut = before ? parts.before->outputs()[0] : 0;
  const ir::Vertex afterIn = after ? *parts.after->find("h") : 0;
  const ir::Vertex afterOut = after ? parts.after->outputs()[0] : 0;
  auto aPtr = [&](size_t r) {
    return before ? reinterpret_cast<void*>(before->ex->devicePointer(beforeOut, r)) : A.ptr[r];
  };
  auto cPtr = [&](size_t r) {
    return after ? reinterpret_cast<void*>(after->ex->devicePointer(afterIn, r)) : C.ptr[r];
  };
  auto gemmOnly = [&](int i) {
    size_t r = static_cast<size_t>(i) % rot;
    cublasGemm(env.blas, A.ptr[r], B.ptr[r], C.ptr[r], s.m, s.n, s.k, pattern == "gemm_bt");
  };
  auto unfused = [&](int i) {
    size_t r = static_cast<size_t>(i) % rot;
    if (before)
      before->ex->launchAll(false, r);
    cublasGemm(env.blas, aPtr(r), B.ptr[r], cPtr(r), s.m, s.n, s.k, pattern == "gemm_bt");
    if (after)
      after->ex->launchAll(false, r);
  };

  // cuBLASLt with a fused epilogue, where cuBLASLt has this pattern.
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  if (pattern == "gemm_bias")
    epi = CUBLASLT_EPILOGUE_BIAS;
  else if (pattern == "gemm_bias_relu")
    epi = CUBLASLT_EPILOGUE_RELU_BIAS;
  else if (pattern == "gemm_bias_gelu")
    epi = CUBLASLT_EPILOGUE_GELU_BIAS; // the tanh approximation, as fpat's gelu
  std::unique_ptr<LtGemm> lt;
  std::unique_ptr<Rotated> bias;
  if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
    lt = std::make_unique<LtGemm>(env.lt, s.m, s.n, s.k, epi);
    if (lt->ok)
      bias = std::make_unique<Rotated>(bits.at("b"), 1);
    else
      lt.reset();
  }
  auto ltFused = [&](int i) {
    size_t r = static_cast<size_t>(i) % rot;
    lt->run(A.ptr[r], B.ptr[r], bias->ptr[0], C.ptr[r]);
  };

  // The outputs are checked after the first round, each before the next implementation
  // overwrites the shared buffers (C holds cuBLAS's and cuBLASLt's results).
  const size_t last = (static_cast<size_t>(env.reps) + 2) % rot;
  std::vector<float> tFpat, tHeur, tGemm, tUnfused, tLt;
  for (int round = 0; round < env.rounds; ++round) {
    append(tFpat, fp[0].ex->time(3, env.reps, env.l2 * 2));
    if (round == 0)
      row.errFpat = checkRows(reinterpret_cast<void*>(fp[0].ex->devicePointer(out)), ref, s.n);
    if (fp.size() > 1)
      append(tHeur, fp[1].ex->time(3, env.reps, env.l2 * 2));
    append(tGemm, timeRuns(3, env.reps, gemmOnly));
    append(tUnfused, timeRuns(3, env.reps, unfused));
    CK(cudaDeviceSynchronize());
    if (round == 0)
      row.errUnfused = checkRows(
          after ? reinterpret_cast<void*>(after->ex->devicePointer(afterOut, last)) : cPtr(last),
          ref, s.n);
    if (lt) {
      append(tLt, timeRuns(3, env.reps, ltFused));
      CK(cudaDeviceSynchronize());
      if (round == 0)
        row.errLt = checkRows(C.ptr[last], ref, s.n);
    }
  }
  row.fpat = median(tFpat);
  row.heuristic = fp.size() > 1 ? median(tHeur) : row.fpat; // the same kernel: measured once
  row.gemm = median(tGemm);
  row.unfused = median(tUnfused);
  if (lt)
    row.lt = median(tLt);
  return row;
}

void writeSvg(const std::string& path, const std::vector<Row>& rows, const std::string& pattern,
              const std::string& device) {
  std::vector<const Row*> rs;
  for (const Row& r : rows)
    if (r.pattern == pattern)
      rs.push_back(&r);
  if (rs.empty())
    return;
  struct Series {
    const char* name;
    const char* color;
    std::function<double(const Row&)> ms;
  };
  std::vector<Series> series = {
      {"fpat tuned (fused)", "#1f77b4", [](const Row& r) { return r.fpat; }},
      {"fpat heuristic", "#aec7e8", [](const Row& r) { return r.heuristic; }},
      {"cuBLAS GEMM + epilogue kernels", "#ff7f0e", [](const Row& r) { return r.unfused; }},
      {"cuBLASLt GELU_BIAS (fused)", "#2ca02c", [](const Row& r) { return r.lt; }},
      {"cuBLAS GEMM alone", "#7f7f7f", [](const Row& r) { return r.gemm; }}};
  double maxT = 0;
  for (const Row* r : rs)
    for (const Series& s : series)
      if (!std::isnan(s.ms(*r)))
        maxT = std::max(maxT, r->tflops(s.ms(*r)));
  maxT = std::ceil(maxT / 100) * 100;
  const int W = 980, H = 460, left = 60, bottom = 120, top = 40;
  const double plotW = W - left - 20, plotH = H - bottom - top;
  const double groupW = plotW / static_cast<double>(rs.size());
  const double barW = groupW * 0.8 / static_cast<double>(series.size());
  std::ofstream f(path);
  f << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << W / 2 << "\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">" << pattern
    << ": TFLOP/s (2MNK / time) on " << device << "</text>\n";
  for (int t = 0; t <= 4; ++t) {
    double v = maxT * t / 4, y = top + plotH - plotH * t / 4;
    f << "<line x1=\"" << left << "\" x2=\"" << W - 20 << "\" y1=\"" << y << "\" y2=\"" << y
      << "\" stroke=\"#ddd\"/><text x=\"" << left - 5 << "\" y=\"" << y + 4
      << "\" text-anchor=\"end\">" << v << "</text>\n";
  }
  for (size_t i = 0; i < rs.size(); ++i) {
    const Row& r = *rs[i];
    double x0 = left + groupW * static_cast<double>(i) + groupW * 0.1;
    for (size_t k = 0; k < series.size(); ++k) {
      double ms = series[k].ms(r);
      if (std::isnan(ms))
        continue;
      double h = plotH * r.tflops(ms) / maxT;
      f << "<rect x=\"" << x0 + barW * static_cast<double>(k) << "\" y=\"" << top + plotH - h
        << "\" width=\"" << barW * 0.95 << "\" height=\"" << h << "\" fill=\"" << series[k].color
        << "\"><title>" << series[k].name << ": " << fmt(r.tflops(ms), 1)
        << " TFLOP/s</title></rect>\n";
    }
    f << "<text x=\"" << x0 + groupW * 0.4 << "\" y=\"" << top + plotH + 15
      << "\" text-anchor=\"middle\">" << r.s.m << "x" << r.s.n << "x" << r.s.k << "</text>\n";
  }
  for (size_t k = 0; k < series.size(); ++k)
    f << "<rect x=\"" << left + 190 * (k % 3) << "\" y=\"" << H - 70 + 20 * (k / 3)
      << "\" width=\"12\" height=\"12\" fill=\"" << series[k].color << "\"/><text x=\""
      << left + 190 * (k % 3) + 16 << "\" y=\"" << H - 60 + 20 * (k / 3) << "\">" << series[k].name
      << "</text>\n";
  f << "<text x=\"" << left << "\" y=\"" << H - 10
    << "\">M x N x K; f16 in, f32 accumulate; median of timed runs with CUDA events</text>\n"
    << "</svg>\n";
}

/// The pre-norm SwiGLU FFN block of a Llama layer (d 4096, hidden H) at M tokens, end to end,
/// as the model holds it (nn.Linear weights, [out, in]):
///   y = x + (silu(n Wg^T) * (n Wu^T)) Wd^T,  n = rmsnorm(x, g)
/// fpat's fused graph (heuristic configurations: RMSNorm statistics, the dual GEMM, the down
/// GEMM with the residual) against the same graph unfused with cuBLAS for its three GEMMs and
/// fpat's kernels for RMSNorm, SiLU, the product and the residual. At small M the block is
/// bound by reading its weights: the table gives the rate they are read at.
bool benchFfn(Env& env, int64_t M, int64_t H) {
  const int64_t D = 4096;
  auto build = [&](int64_t m) {
    ir::GraphBuilder b("ffn_swiglu", builtinLibrary().activationSet());
    auto x = b.input("x", {m, D});
    auto gn = b.weight("g", {D});
    auto wg = b.weight("w_gate", {H, D}), wu = b.weight("w_up", {H, D});
    auto wd = b.weight("w_down", {D, H});
    auto n = b.rmsnorm(x, gn, 1e-6, "n");
    auto act = b.activation(b.gemm(n, wg, true, "gate"), "silu", "act");
    auto h = b.mul(act, b.gemm(n, wu, true, "up"), "h");
    b.output(b.add(x, b.gemm(h, wd, true, "down"), "y"));
    return b.build();
  };
  ir::Graph g = build(M);
  ir::Graph fused = fuse(g);
  auto inputs = ir::randomInputs(g, 5);
  std::map<std::string, std::vector<uint16_t>> bits;
  for (auto& [name, t] : inputs)
    bits[name] = toBits(t);

  // Reference rows: the block is row-wise, so up to 16 rows of x give those rows of y.
  const int64_t R = std::min<int64_t>(16, M);
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < R; ++i)
    rows.push_back(R == 1 ? 0 : i * (M - 1) / (R - 1));
  ir::Graph small = build(R);
  std::map<std::string, ir::Tensor> smallIn = inputs;
  ir::Tensor xs{{{R, D}, ir::DType::F16}, {}};
  for (int64_t r : rows)
    xs.data.insert(xs.data.end(), inputs.at("x").data.begin() + r * D,
                   inputs.at("x").data.begin() + (r + 1) * D);
  smallIn["x"] = xs;
  SampledReference ref{rows, ir::evaluate(small, smallIn)[small.outputs()[0]]};

  FpatRun f = fpatRun(env, fused, {}, bits);
  const double fpatErr =
      checkRows(reinterpret_cast<void*>(f.ex->devicePointer(fused.outputs()[0])), ref, D);
  size_t fpatLaunches = 0;
  for (ir::Vertex v : fused.vertices())
    for (const codegen::Launch& l : f.built.graph.units[v].launches)
      fpatLaunches += !l.preparesWeights();

  // Unfused, with cuBLAS for the GEMMs.
  FpatRun u = fpatRun(env, g, {}, bits);
  std::set<ir::Vertex> gemms;
  for (ir::Vertex v : g.vertices())
    if (g.op(v).kind == ir::OpKind::Gemm)
      gemms.insert(v);
  u.ex->replace(gemms, [&](ir::Vertex v, size_t set) {
    auto ops = g.operands(v);
    cublasGemm(env.blas, reinterpret_cast<void*>(u.ex->devicePointer(ops[0], set)),
               reinterpret_cast<void*>(u.ex->devicePointer(ops[1], set)),
               reinterpret_cast<void*>(u.ex->devicePointer(v, set)), g.op(ops[0]).type.shape[0],
               g.op(v).type.shape[1], g.op(ops[0]).type.shape[1], g.op(v).transposeB);
  });
  u.ex->runBits(bits, false);
  const double unfusedErr =
      checkRows(reinterpret_cast<void*>(u.ex->devicePointer(g.outputs()[0])), ref, D);
  std::vector<float> tFpat, tUnfused;
  for (int round = 0; round < env.rounds; ++round) {
    append(tFpat, f.ex->time(3, env.reps, env.l2 * 2));
    append(tUnfused, u.ex->time(3, env.reps, env.l2 * 2));
  }
  const double fpatMs = median(tFpat), unfusedMs = median(tUnfused);
  const double flops = 2.0 * M * D * H * 3, weightBytes = 2.0 * D * H * 3;
  std::string fused1;
  for (ir::Vertex v : fused.vertices())
    if (fused.op(v).kind == ir::OpKind::Fused)
      fused1 += (fused1.empty() ? "" : ", ") + fused.op(v).fused.pattern;
  std::cout << "\n## Pre-norm SwiGLU FFN block, M = " << M << ", d = " << D << ", hidden = " << H
            << " (RMSNorm, 3 GEMMs, SiLU, product, residual; weights [out, in])\n\n"
            << "fpat: " << fused1 << "\n\n"
            << "| implementation | launches | ms | TFLOP/s | weights TB/s | max rel err (sampled "
               "rows) |\n"
            << "|---|---:|---:|---:|---:|---|\n"
            << "| fpat fused | " << fpatLaunches << " | " << fmt(fpatMs) << " | "
            << fmt(flops / (fpatMs * 1e-3) / 1e12, 1) << " | "
            << fmt(weightBytes / (fpatMs * 1e-3) / 1e12, 2) << " | " << sci(fpatErr) << " |\n"
            << "| cuBLAS GEMMs + separate kernels | 7 | " << fmt(unfusedMs) << " | "
            << fmt(flops / (unfusedMs * 1e-3) / 1e12, 1) << " | "
            << fmt(weightBytes / (unfusedMs * 1e-3) / 1e12, 2) << " | " << sci(unfusedErr) << " |\n"
            << "\nspeedup over unfused: " << fmt(unfusedMs / fpatMs, 2) << "x\n";
  return fpatErr <= runtime::kRelTolerance && unfusedErr <= runtime::kRelTolerance;
}

} // namespace

/// The rows as the markdown table (stdout) and the CSV at csvPath, with the epilogue's cost: a
/// fused kernel's time over fpat's own plain GEMM at the same shape in this run.
void writeTable(const std::vector<Row>& rows, const Provenance& prov, const std::string& csvPath) {
  // NaN where the run has no gemm row for the shape.
  auto overGemm = [&](const Row& r) {
    for (const Row& g : rows)
      if (g.pattern == "gemm" && r.pattern != "gemm" && g.s.m == r.s.m && g.s.n == r.s.n &&
          g.s.k == r.s.k)
        return r.fpat / g.fpat - 1.0;
    return static_cast<double>(NAN);
  };
  std::ofstream csv(csvPath);
  csv << "pattern,M,N,K,config,fpat_ms,fpat_tflops,heuristic_ms,cublas_gemm_ms,"
         "cublas_unfused_ms,cublaslt_fused_ms,fpat_pct_of_cublas_gemm,speedup_vs_unfused,"
         "speedup_vs_cublaslt,err_fpat,err_unfused,err_cublaslt,gpu,driver,nvcc,commit,"
         "fpat_over_fpat_gemm\n";
  std::cout << "| pattern | M x N x K | config | fpat ms | TFLOP/s | heuristic ms | cuBLAS GEMM ms "
               "| cuBLAS+epilogue ms | cuBLASLt fused ms | % of cuBLAS GEMM | vs unfused | vs "
               "Lt | max rel err fpat / unfused / Lt | over fpat gemm |\n"
            << "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|\n";
  for (const Row& r : rows) {
    double pct = 100.0 * r.gemm / r.fpat;
    const double over = overGemm(r);
    std::cout << "| " << r.pattern << " | " << r.s.str() << " | " << r.config << " | "
              << fmt(r.fpat) << " | " << fmt(r.tflops(r.fpat), 1) << " | " << fmt(r.heuristic)
              << " | " << fmt(r.gemm) << " | " << fmt(r.unfused) << " | " << fmt(r.lt) << " | "
              << fmt(pct, 1) << "% | " << fmt(r.unfused / r.fpat, 2) << "x | "
              << fmt(r.lt / r.fpat, 2) << (std::isnan(r.lt) ? "" : "x") << " | " << sci(r.errFpat)
              << " / " << sci(r.errUnfused) << " / " << sci(r.errLt) << " | "
              << (std::isnan(over) ? ""
                  : over >= 0      ? "+"
                                   : "")
              << fmt(100.0 * over, 1) << (std::isnan(over) ? "" : "%") << " |\n";
    csv << r.pattern << "," << r.s.m << "," << r.s.n << "," << r.s.k << "," << r.config << ","
        << r.fpat << "," << r.tflops(r.fpat) << "," << r.heuristic << "," << r.gemm << ","
        << r.unfused << "," << r.lt << "," << pct << "," << r.unfused / r.fpat << ","
        << r.lt / r.fpat << "," << r.errFpat << "," << r.errUnfused << "," << r.errLt << ","
        << csvField(prov.gpu) << "," << csvField(prov.driver) << "," << csvField(prov.nvcc) << ","
        << csvField(prov.commit) << "," << over << "\n";
  }
}

int main(int argc, char** argv) {
  bool quick = false;
  std::string csvPath = "bench-gemm.csv", svgPath = "bench-gemm.svg";
  int candidates = 8, reps = 20, rounds = 5; // the full run fits one 10-minute GPU call
  std::vector<std::string> patternList;      // --only: benchmark just these patterns
  bool noFfn = false, bInput = false, models = false;
  std::vector<std::string> shapeArgs, configArgs, ffnArgs;
  CLI::App app{"fpat-bench-gemm - fpat's fused GEMM kernels against cuBLAS and cuBLASLt, in one "
               "process on the same data",
               "fpat-bench-gemm"};
  app.footer("Writes a markdown table (stdout), a CSV and an SVG plot, each naming the GPU, the "
             "driver, nvcc and the commit. Exits 77 without a GPU (ctest: skipped), 1 if any "
             "result disagrees with the CPU reference.");
  app.add_flag("--quick", quick, "one pattern (gemm_bias_gelu) at one shape, no FFN block");
  app.add_option("--only", patternList, "benchmark only these patterns (comma-separated)")
      ->delimiter(',')
      ->allow_extra_args(false);
  app.add_option("--shape", shapeArgs,
                 "a problem size MxNxK instead of the default list "
                 "(repeatable)")
      ->allow_extra_args(false);
  app.add_flag("--models", models,
               "instead of the shape list, each pattern at the shapes where transformer models "
               "(GPT-2, BERT, Llama, Qwen2, Phi-3, Gemma) use it; --only filters them");
  app.add_flag("--no-ffn", noFfn, "skip the SwiGLU FFN block");
  app.add_option("--ffn", ffnArgs,
                 "the FFN block at these tokens x hidden sizes (comma-separated MxH, e.g. "
                 "1x11008,4096x14336; default 4096x11008)")
      ->delimiter(',')
      ->allow_extra_args(false);
  app.add_flag("--b-input", bInput,
               "B is a plain input, not a weight: never read from a copy prepared when uploaded");
  app.add_option("--csv", csvPath, "CSV output file")->capture_default_str();
  app.add_option("--svg", svgPath, "SVG plot output file")->capture_default_str();
  app.add_option("--candidates", candidates, "configurations the tuner times per op")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--configs", configArgs,
                 "time these configurations (comma-separated names, e.g. "
                 "128x256x64_w2x1_s4_wgmma) instead of the search space; the heuristic's is "
                 "always timed too")
      ->delimiter(',')
      ->allow_extra_args(false);
  app.add_option("--reps", reps, "timed runs per measurement (at least 20)")
      ->check(CLI::Range(20, 100000))
      ->capture_default_str();
  app.add_option("--rounds", rounds,
                 "measurements per implementation, taken in turn with the others; each result "
                 "is the median over all their runs")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return fpat::reportCliError(app, e, argc, argv, "fpat-bench-gemm");
  }
  std::vector<codegen::TileConfig> configs;
  for (const std::string& item : configArgs) {
    auto t = codegen::TileConfig::parse(item);
    if (!t) {
      std::cerr << "fpat-bench-gemm: error: --configs: '" << item
                << "' is not a configuration name (e.g. 128x256x64_w2x1_s4_wgmma)\n";
      return 2;
    }
    configs.push_back(*t);
  }
  std::vector<Shape> onlyShapes;
  for (const std::string& a : shapeArgs) {
    Shape sh{};
    char tail = 0;
    if (std::sscanf(a.c_str(), "%ldx%ldx%ld%c", &sh.m, &sh.n, &sh.k, &tail) != 3 || sh.m < 1 ||
        sh.n < 1 || sh.k < 1) {
      std::cerr << "fpat-bench-gemm: error: --shape '" << a
                << "': want MxNxK with positive sizes, e.g. 4096x4096x4096\n";
      return 2;
    }
    onlyShapes.push_back(sh);
  }
  const bool ffn = !noFfn;
  std::vector<std::pair<int64_t, int64_t>> ffnShapes;
  for (const std::string& a : ffnArgs) {
    long m = 0, h = 0;
    char tail = 0;
    if (std::sscanf(a.c_str(), "%ldx%ld%c", &m, &h, &tail) != 2 || m < 1 || h < 1) {
      std::cerr << "fpat-bench-gemm: error: --ffn '" << a
                << "': want MxH with positive sizes, e.g. 4096x11008\n";
      return 2;
    }
    ffnShapes.emplace_back(m, h);
  }
  if (ffnShapes.empty())
    ffnShapes.emplace_back(4096, 11008);
  std::vector<Shape> shapes = {{512, 4096, 4096},   {1024, 4096, 4096}, {2048, 4096, 4096},
                               {4096, 4096, 4096},  {8192, 4096, 4096}, {4096, 11008, 4096},
                               {4096, 4096, 11008}, {4096, 14336, 4096}};
  const std::vector<std::string> builtinPatterns = {
      "gemm_bias_gelu",     "gemm_bias_silu", "gemm_bias_relu", "gemm_bias",
      "gemm_bias_residual", "gemm_gelu",      "gemm_silu",      "gemm_residual",
      "gemm_silu_mul",      "layernorm_gemm", "rmsnorm_gemm",   "layernorm_gemm_bias_gelu"};
  std::vector<std::string> patterns = builtinPatterns;
  if (quick) {
    shapes = {{2048, 4096, 4096}};
    patterns = {"gemm_bias_gelu"};
  }
  if (!patternList.empty()) {
    std::vector<std::string> known = builtinPatterns;
    known.insert(known.end(), {"gemm", "gemm_bt"});
    for (const std::string& p : patternList)
      if (std::find(known.begin(), known.end(), p) == known.end()) {
        std::cerr << "fpat-bench-gemm: error: --only: no benchmark for '" << p << "'"
                  << fpat::didYouMean(p, known) << "\n";
        return 2;
      }
    patterns = patternList;
  }
  if (!onlyShapes.empty())
    shapes = onlyShapes;
  // What to run, in order: every pattern at every shape, or --models' cases.
  std::vector<std::pair<std::string, Shape>> runs;
  std::string modelNames;
  if (models) {
    if (quick || !onlyShapes.empty()) {
      std::cerr << "fpat-bench-gemm: error: --models: not with " << (quick ? "--quick" : "--shape")
                << " (the models give the shapes)\n";
      return 2;
    }
    for (const ModelCase& c : kModelCases)
      if (patternList.empty() ||
          std::find(patternList.begin(), patternList.end(), c.pattern) != patternList.end()) {
        runs.emplace_back(c.pattern, c.s);
        modelNames += std::string(modelNames.empty() ? "" : "; ") + c.pattern + " " + c.s.str() +
                      " = " + c.model;
      }
    if (runs.empty()) {
      std::vector<std::string> used;
      for (const ModelCase& c : kModelCases)
        if (std::find(used.begin(), used.end(), c.pattern) == used.end())
          used.push_back(c.pattern);
      std::cerr << "fpat-bench-gemm: error: --models: no model uses --only's patterns (they use";
      for (const std::string& u : used)
        std::cerr << " " << u;
      std::cerr << ")\n";
      return 2;
    }
  } else {
    for (const std::string& p : patterns)
      for (Shape s : shapes)
        runs.emplace_back(p, s);
  }
  cuda::Driver* drv = benchDriver();
  if (!drv)
    return 77;
  Env env;
  env.drv = drv;
  CK(cublasCreate(&env.blas));
  CK(cublasLtCreate(&env.lt));
  tune::TuningCache cache;
  env.cache = &cache;
  env.topts.maxCandidates = static_cast<size_t>(candidates);
  env.topts.configs = configs;
  if (!configs.empty())
    env.topts.log = &std::cerr; // an experiment wants every candidate's time
  env.topts.reps = reps;
  env.reps = reps;
  env.rounds = rounds;
  env.weights = !bInput;
  env.l2 = static_cast<size_t>(drv->device().l2Bytes);

  const Provenance prov = provenance(*drv);
  std::cout << "# fpat GEMM benchmark on " << prov.gpu << ", driver " << prov.driver << "; "
            << prov.nvcc << "; fpat commit " << prov.commit << "; tuning cache " << cache.path()
            << "\n"
            << "# layouts: A [M, K] and C [M, N] row-major; B [K, N] row-major (cuBLAS and "
               "cuBLASLt run N, N on the transposed view), for gemm_bt B [N, K] (cuBLAS T, N); "
               "every library call reads fpat's buffers; B is "
            << (env.weights ? "a weight (where TMA reads it badly fpat reads a copy made once, "
                              "when it is uploaded, untimed)"
                            : "a plain input")
            << "\n"
            << (modelNames.empty() ? "" : "# models: " + modelNames + "\n") << "\n"
            << std::flush;
  std::vector<Row> rows;
  for (const auto& [p, s] : runs) {
    try {
      rows.push_back(benchOne(env, p, s));
    } catch (const std::exception& e) { // report the row as failed and go on with the rest
      Row r;
      r.pattern = p;
      r.s = s;
      r.config = std::string("error: ") + e.what();
      r.fpat = r.heuristic = r.gemm = r.unfused = r.errFpat = r.errUnfused = NAN;
      rows.push_back(r);
    }
    const Row& r = rows.back();
    // Progress, with the numbers, so that an interrupted run still reports what it measured.
    std::cerr << "  " << p << " " << s.str() << ": fpat " << fmt(r.fpat) << " ms (" << r.config
              << (r.tuning.empty() ? "" : ", " + r.tuning) << ", heuristic " << fmt(r.heuristic)
              << "), cuBLAS GEMM " << fmt(r.gemm) << ", unfused " << fmt(r.unfused) << ", Lt "
              << fmt(r.lt) << " -> " << fmt(100.0 * r.gemm / r.fpat, 1) << "% of cuBLAS GEMM"
              << std::endl;
  }

  writeTable(rows, prov, csvPath);
  writeSvg(svgPath, rows, "gemm_bias_gelu", drv->device().name);
  int bad = 0;
  for (const Row& r : rows)
    bad += !(r.errFpat <= runtime::kRelTolerance) || !(r.errUnfused <= runtime::kRelTolerance) ||
           (!std::isnan(r.errLt) && !(r.errLt <= runtime::kRelTolerance));
  std::cout << "\ncorrectness: " << (bad ? std::to_string(bad) + " rows FAILED" : "all rows PASS")
            << " (sampled rows vs the CPU reference, rel err <= " << runtime::kRelTolerance
            << ")\nwrote " << csvPath << " and " << svgPath << "\n";
  if (!quick && ffn)
    for (auto [m, h] : ffnShapes)
      bad += benchFfn(env, m, h) ? 0 : 1;
  cublasLtDestroy(env.lt);
  cublasDestroy(env.blas);
  return bad ? 1 : 0;
}
