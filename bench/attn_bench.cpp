// The attention benchmark: fpat's `attention` op (the flash kernel on sm_90) at
//   prefill: FlashAttention-3's setting (its paper, Fig. 5): 16k tokens a batch (B = 16384 / S),
//            hidden 2048 (H = 2048 / d), S = 512 ... 16k, d 64 and 128, causal and not;
//            forward TFLOP/s = 4 B H S^2 d (halved when causal);
//   decode:  one query token a sequence against a KV cache, Llama-3-8B's heads (32 query heads,
//            8 KV heads, d 128), caches of 4k ... 64k at batch 1 and 16; GB/s of K and V read.
// Every op is built into one graph (its kernels compile in parallel), run once and checked on
// sampled query rows against attention computed here in double from the same inputs, then
// timed op by op (Executor::timeOps: CUDA events, buffers rotated past twice the L2). The
// figures to compare with are torch SDPA's on the same GPU (bench/torch_attn.py, same cases,
// same timing).
//
// With --cache the decode cases also run with K and V as caches [B, Hkv, Sk, d] (head-major:
// kv_append's results, and the layout exporters give past_key), beside token-major ones.
// With --append each decode case also runs as a whole step as exporters write it: past caches
// of Sk - 1 rows, the new token's key and value appended by kv_append (present_k and present_v
// outputs, checked bit for bit), the attention over them; twice in one process: with
// kv_append's copy kernels, and with the decode kernel writing the caches as it reads them
// (codegen::decodeAppend). The step's time is its kernels' times summed; GB/s counts the least
// a step must move, the past caches read and the present caches written.
//
//   fpat-bench-attn [--quick] [--no-decode] [--no-prefill] [--cache] [--append] [--d 64,128]
//                   [--reps N] [--csv F]
#include "BenchUtil.h"
#include "fpat/ir/Builder.h"
#include "fpat/runtime/Executor.h"
#include "fpat/runtime/Pipeline.h"
#include "fpat/support/CliError.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <limits>

using namespace fpat;
using namespace fpat::bench;

namespace {

struct Case {
  int64_t b, h, hkv, sq, sk, d;
  bool causal;
  bool cache = false; // K and V [B, Hkv, Sk, d], not token-major [B*Sk, Hkv*d]
  // A decode step (with cache): caches of Sk - sq rows and the sq new tokens' keys and values
  // [B*sq, Hkv*d] joined by kv_append, present_k and present_v outputs.
  bool append = false;
  std::string name() const {
    std::ostringstream os;
    os << "a_b" << b << "_h" << h << "_kv" << hkv << "_q" << sq << "_k" << sk << "_d" << d
       << (causal ? "_causal" : "") << (cache ? "_cache" : "") << (append ? "_append" : "");
    return os.str();
  }
  /// The element index of key (value) j of batch b, KV head kvh, element e.
  int64_t kvAt(int64_t bb, int64_t j, int64_t kvh, int64_t e) const {
    return cache ? ((bb * hkv + kvh) * sk + j) * d + e : ((bb * sk + j) * hkv + kvh) * d + e;
  }
  double flops() const {
    return 4.0 * static_cast<double>(b * h * sq) * static_cast<double>(sk * d) *
           (causal ? 0.5 : 1.0);
  }
  double kvBytes() const { return 2.0 * static_cast<double>(b * sk * hkv * d) * 2.0; }
  /// A step's least traffic: the past caches read, the present caches written (K and V).
  double stepBytes() const { return 2.0 * static_cast<double>(b * (2 * sk - sq) * hkv * d) * 2.0; }
};

/// The present cache [B, Hkv, Sk, d] of a step: each head's past rows, then its new tokens'.
std::vector<uint16_t> joined(const Case& c, const std::vector<uint16_t>& past,
                             const std::vector<uint16_t>& fresh) {
  const int64_t p = c.sk - c.sq;
  std::vector<uint16_t> out(static_cast<size_t>(c.b * c.hkv * c.sk * c.d));
  for (int64_t bb = 0; bb < c.b; ++bb)
    for (int64_t g = 0; g < c.hkv; ++g)
      for (int64_t j = 0; j < c.sk; ++j)
        for (int64_t e = 0; e < c.d; ++e)
          out[static_cast<size_t>(((bb * c.hkv + g) * c.sk + j) * c.d + e)] =
              j < p ? past[static_cast<size_t>(((bb * c.hkv + g) * p + j) * c.d + e)]
                    : fresh[static_cast<size_t>(((bb * c.sq + j - p) * c.hkv + g) * c.d + e)];
  return out;
}

/// Uniform values in [-1, 1) as f16 bits, from a small xorshift generator (fast at 10^8).
std::vector<uint16_t> randomBits(size_t n, uint64_t seed) {
  std::vector<uint16_t> out(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] =
        ir::doubleToHalfBits(static_cast<double>(x >> 40) / static_cast<double>(1ull << 23) - 1.0);
  }
  return out;
}

double halfAt(const std::vector<uint16_t>& v, int64_t i) {
  return ir::halfBitsToFloat(v[static_cast<size_t>(i)]);
}

/// The largest error of sampled output rows against attention in double, relative to the
/// largest |value| of each row (f16 outputs of a softmax average).
double sampledError(const Case& c, const std::vector<uint16_t>& q, const std::vector<uint16_t>& k,
                    const std::vector<uint16_t>& v, const ir::Tensor& out) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  double worst = 0;
  for (int s = 0; s < 6; ++s) {
    const int64_t b = s % c.b, h = (s * 7) % c.h, i = (s * 104729) % c.sq;
    const int64_t kvh = h / (c.h / c.hkv);
    std::vector<double> p(static_cast<size_t>(c.sk));
    double mx = -INFINITY;
    for (int64_t j = 0; j < c.sk; ++j) {
      double dot = 0;
      for (int64_t e = 0; e < c.d; ++e)
        dot += halfAt(q, ((b * c.sq + i) * c.h + h) * c.d + e) * halfAt(k, c.kvAt(b, j, kvh, e));
      p[static_cast<size_t>(j)] =
          c.causal && j > i + c.sk - c.sq ? -INFINITY : dot * scale; // bottom-right
      mx = std::max(mx, p[static_cast<size_t>(j)]);
    }
    double sum = 0;
    for (double& x : p)
      sum += (x = std::exp(x - mx));
    double rowMax = 1e-6, err = 0;
    std::vector<double> ref(static_cast<size_t>(c.d), 0.0);
    for (int64_t j = 0; j < c.sk; ++j)
      for (int64_t e = 0; e < c.d; ++e)
        ref[static_cast<size_t>(e)] +=
            p[static_cast<size_t>(j)] / sum * halfAt(v, c.kvAt(b, j, kvh, e));
    for (int64_t e = 0; e < c.d; ++e) {
      const double got = out.data[static_cast<size_t>(((b * c.sq + i) * c.h + h) * c.d + e)];
      rowMax = std::max(rowMax, std::abs(ref[static_cast<size_t>(e)]));
      err = std::max(err, std::isfinite(got) ? std::abs(got - ref[static_cast<size_t>(e)]) : 1e9);
    }
    worst = std::max(worst, err / rowMax);
  }
  return worst;
}

struct Result {
  Case c;
  double ms = NAN, err = NAN;
  std::string kernel;
  bool appended = false; // the decode kernel wrote the caches (no kv_append kernels)
};

/// Builds every case into one graph, checks and times each op (a step's ops summed).
/// `appendInDecode`: codegen::CodegenOptions::appendInDecode.
std::vector<Result> runCases(cuda::Driver& drv, const std::vector<Case>& cases, int reps,
                             bool appendInDecode = false) {
  ir::GraphBuilder gb("attention_bench");
  for (const Case& c : cases) {
    const std::string n = c.name();
    auto q = gb.input(n + "_q", {c.b * c.sq, c.h * c.d});
    const std::vector<int64_t> kv = c.cache ? std::vector<int64_t>{c.b, c.hkv, c.sk, c.d}
                                            : std::vector<int64_t>{c.b * c.sk, c.hkv * c.d};
    ir::Value k, v;
    if (c.append) {
      const std::vector<int64_t> past{c.b, c.hkv, c.sk - c.sq, c.d}, fresh{c.b * c.sq, c.hkv * c.d};
      k = gb.kvAppend(gb.input(n + "_pk", past), gb.input(n + "_nk", fresh), n + "_k");
      v = gb.kvAppend(gb.input(n + "_pv", past), gb.input(n + "_nv", fresh), n + "_v");
    } else {
      k = gb.input(n + "_k", kv);
      v = gb.input(n + "_v", kv);
    }
    ir::Value mask;
    if (c.causal) {
      std::vector<float> m(static_cast<size_t>(c.sq * c.sk));
      for (int64_t i = 0; i < c.sq; ++i)
        for (int64_t j = 0; j < c.sk; ++j)
          m[static_cast<size_t>(i * c.sk + j)] =
              j > i + c.sk - c.sq ? -std::numeric_limits<float>::infinity() : 0.0f;
      mask = gb.weight(n + "_mask", {1, 1, c.sq, c.sk}, ir::DType::F16, m);
    } else {
      mask = gb.constant(0.0, {});
    }
    auto scale = gb.constant(1.0 / std::sqrt(static_cast<double>(c.d)), {});
    gb.output(gb.attention(q, k, v, mask, scale, c.b, c.d, n));
    if (c.append)
      gb.output(k).output(v);
  }
  ir::Graph g = gb.build();
  runtime::BuildOptions o;
  o.arch = drv.device().arch;
  o.sms = drv.device().sms;
  o.appendInDecode = appendInDecode;
  runtime::BuildResult built = runtime::buildKernels(g, {}, o);
  if (!built.error.empty()) {
    std::cerr << built.error << "\n";
    std::exit(1);
  }
  std::map<std::string, std::vector<uint16_t>> bits;
  uint64_t seed = 1;
  for (ir::Vertex v : g.vertices()) {
    const ir::Op& op = g.op(v);
    if (op.kind != ir::OpKind::Input)
      continue;
    if (op.data) {
      std::vector<uint16_t> w(op.data->size());
      for (size_t i = 0; i < w.size(); ++i)
        w[i] = ir::doubleToHalfBits((*op.data)[i]);
      bits[op.name] = std::move(w);
    } else {
      bits[op.name] = randomBits(static_cast<size_t>(op.type.numel()), seed++);
    }
  }
  runtime::Executor ex(drv, built.graph);
  runtime::RunResult r = ex.runBits(bits, true);
  const ir::Graph& fg = built.graph.graph;
  std::vector<Result> out;
  std::vector<std::vector<ir::Vertex>> ops; // by case: the ops its time sums
  size_t at = 0;                            // the case's first output
  for (const Case& c : cases) {
    const std::string n = c.name();
    double err = 0;
    if (c.append) { // the caches bit for bit, then the attention over them
      const std::vector<uint16_t> k = joined(c, bits.at(n + "_pk"), bits.at(n + "_nk"));
      const std::vector<uint16_t> v = joined(c, bits.at(n + "_pv"), bits.at(n + "_nv"));
      for (size_t i = 0; i < k.size(); ++i)
        if (r.outputs[at + 1].data[i] != ir::halfBitsToFloat(k[i]) ||
            r.outputs[at + 2].data[i] != ir::halfBitsToFloat(v[i])) {
          err = 1e9;
          break;
        }
      err = std::max(err, sampledError(c, bits.at(n + "_q"), k, v, r.outputs[at]));
    } else {
      err = sampledError(c, bits.at(n + "_q"), bits.at(n + "_k"), bits.at(n + "_v"), r.outputs[at]);
    }
    const ir::Vertex v = fg.outputs()[at];
    Result res{c, NAN, err, built.graph.units[v].name, !built.graph.units[v].extraIns.empty()};
    out.push_back(res);
    ops.push_back({v});
    if (c.append)
      ops.back().insert(ops.back().end(), {fg.outputs()[at + 1], fg.outputs()[at + 2]});
    at += c.append ? 3 : 1;
  }
  const size_t l2 = static_cast<size_t>(drv.device().l2Bytes);
  for (const auto& [v, ms] : ex.timeOps(3, reps, 2 * l2))
    for (size_t i = 0; i < cases.size(); ++i)
      if (std::find(ops[i].begin(), ops[i].end(), v) != ops[i].end())
        out[i].ms = (std::isnan(out[i].ms) ? 0.0 : out[i].ms) + ms;
  return out;
}

std::string fixed(double x, int digits) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << x;
  return os.str();
}

} // namespace

int main(int argc, char** argv) {
  bool quick = false, noDecode = false, noPrefill = false, cache = false, append = false;
  int reps = 20;
  std::vector<int64_t> dims{64, 128};
  std::string csvPath = "bench-attn.csv";
  CLI::App app{"fpat-bench-attn - fpat's attention kernels at FlashAttention-3's prefill sizes "
               "and at decode sizes, checked and timed on the GPU",
               "fpat-bench-attn"};
  app.footer("Writes markdown tables (stdout) and a CSV, naming the GPU, the driver, nvcc and the "
             "commit. Exits 77 without a GPU (ctest: skipped), 1 if a result disagrees with the "
             "sampled reference.");
  app.add_flag("--quick", quick, "d 128 at S 1k and 8k, causal and not; decode at 16k");
  app.add_flag("--no-decode", noDecode, "skip the decode cases");
  app.add_flag("--no-prefill", noPrefill, "skip the prefill cases");
  app.add_flag("--cache", cache,
               "decode also with K and V as caches [B, Hkv, Sk, d] (head-major, as kv_append "
               "writes them)");
  app.add_flag("--append", append,
               "decode also as whole steps with kv_append (past caches of KV length - 1 rows and "
               "the new token), with its copy kernels and with the decode kernel writing the "
               "caches");
  app.add_option("--d", dims, "the prefill cases' head dimensions")
      ->delimiter(',')
      ->check(CLI::IsMember({64, 128}))
      ->capture_default_str();
  app.add_option("--reps", reps, "timed runs per op (at least 10)")
      ->check(CLI::Range(10, 100000))
      ->capture_default_str();
  app.add_option("--csv", csvPath, "CSV output file")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return fpat::reportCliError(app, e, argc, argv, "fpat-bench-attn");
  }
  cuda::Driver* drv = benchDriver();
  if (!drv)
    return 77;
  const Provenance prov = provenance(*drv);
  std::cout << "# fpat attention benchmark on " << prov.gpu << ", driver " << prov.driver << "; "
            << prov.nvcc << "; fpat commit " << prov.commit << "\n"
            << "# f16; q [B*S, H*d], k and v [B*S, Hkv*d] token-major (or, marked cache, [B, Hkv, "
               "S, d]); median of "
            << reps
            << " runs per op after 3 warm-up runs, CUDA events, buffers rotated past 2x L2\n\n";
  std::vector<Case> prefill, decode;
  for (int64_t d : dims)
    for (int64_t s : {512, 1024, 2048, 4096, 8192, 16384})
      for (bool causal : {false, true}) {
        if (quick && (d != 128 || (s != 1024 && s != 8192)))
          continue;
        prefill.push_back({16384 / s, 2048 / d, 2048 / d, s, s, d, causal});
      }
  for (int64_t b : {int64_t{1}, int64_t{16}})
    for (int64_t kv : {4096, 16384, 65536}) {
      if ((quick && kv != 16384) || (b == 16 && kv > 16384))
        continue;
      for (bool headMajor : {false, true})
        if (!headMajor || cache)
          decode.push_back({b, 32, 8, 1, kv, 128, false, headMajor});
    }
  std::vector<Case> steps;
  if (append)
    for (Case c : decode)
      if (c.cache) { // (--cache's cases; the same sizes without it)
        c.append = true;
        steps.push_back(c);
      }
  if (append && !cache)
    for (Case c : decode) {
      c.cache = c.append = true;
      steps.push_back(c);
    }
  std::ofstream csv(csvPath);
  csv << "gpu,commit,kind,B,H,Hkv,Sq,Sk,d,causal,cache,ms,tflops,gbps,rel_err,kernel\n";
  int bad = 0;
  auto report = [&](const std::vector<Result>& rs, bool isDecode) {
    if (isDecode)
      std::cout << "| B | KV length | K, V | ms | K+V read GB/s | rel err | kernel |\n"
                   "|---:|---:|---|---:|---:|---:|---|\n";
    else
      std::cout << "| d | S | B | H | causal | ms | TFLOP/s | rel err | kernel |\n"
                   "|---:|---:|---:|---:|---|---:|---:|---:|---|\n";
    for (const Result& r : rs) {
      const Case& c = r.c;
      const double tflops = c.flops() / (r.ms * 1e-3) / 1e12;
      const double gbps = c.kvBytes() / (r.ms * 1e-3) / 1e9;
      const bool ok = r.err <= 2e-2;
      bad += !ok;
      if (isDecode)
        std::cout << "| " << c.b << " | " << c.sk << " | " << (c.cache ? "cache" : "tokens")
                  << " | " << fixed(r.ms, 4) << " | " << fixed(gbps, 0) << " | " << fixed(r.err, 4)
                  << (ok ? "" : " FAIL") << " | " << r.kernel << " |\n";
      else
        std::cout << "| " << c.d << " | " << c.sq << " | " << c.b << " | " << c.h << " | "
                  << (c.causal ? "yes" : "no") << " | " << fixed(r.ms, 4) << " | "
                  << fixed(tflops, 1) << " | " << fixed(r.err, 4) << (ok ? "" : " FAIL") << " | "
                  << r.kernel << " |\n";
      csv << '"' << prov.gpu << "\"," << prov.commit << "," << (isDecode ? "decode" : "prefill")
          << "," << c.b << "," << c.h << "," << c.hkv << "," << c.sq << "," << c.sk << "," << c.d
          << "," << c.causal << "," << c.cache << "," << r.ms << "," << tflops << "," << gbps << ","
          << r.err << "," << r.kernel << "\n";
    }
    std::cout << std::endl;
  };
  if (!noPrefill && !prefill.empty()) {
    std::cout << "## prefill (16k tokens a batch, hidden 2048; FLOPs 4 B H S^2 d, halved when "
                 "causal)\n\n";
    report(runCases(*drv, prefill, reps), false);
  }
  if (!noDecode && !decode.empty()) {
    std::cout << "## decode (one query token; 32 query heads, 8 KV heads, d 128)\n\n";
    report(runCases(*drv, decode, reps), true);
  }
  if (!noDecode && !steps.empty()) {
    // The step as exporters write it, with kv_append's copies and then without them. (While the
    // decode kernel's cache writes are new, codegen takes them only with FPAT_DECODE_APPEND=1.)
    setenv("FPAT_DECODE_APPEND", "1", 1);
    const std::vector<Result> copies = runCases(*drv, steps, reps, false);
    const std::vector<Result> fused = runCases(*drv, steps, reps, true);
    std::cout << "## decode steps with kv_append (past caches of KV length - 1 rows, one new "
                 "token; GB/s of the least a step moves: past read, present written)\n\n"
                 "| B | KV length | copies ms | GB/s | decode writes the caches ms | GB/s | "
                 "speedup | rel err | kernel |\n|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
    for (size_t i = 0; i < steps.size(); ++i) {
      const Case& c = steps[i];
      const Result &a = copies[i], &f = fused[i];
      const bool ok = a.err <= 2e-2 && f.err <= 2e-2;
      bad += !ok;
      std::cout << "| " << c.b << " | " << c.sk << " | " << fixed(a.ms, 4) << " | "
                << fixed(c.stepBytes() / (a.ms * 1e-3) / 1e9, 0) << " | " << fixed(f.ms, 4)
                << (f.appended ? "" : " (not taken)") << " | "
                << fixed(c.stepBytes() / (f.ms * 1e-3) / 1e9, 0) << " | " << fixed(a.ms / f.ms, 2)
                << "x | " << fixed(std::max(a.err, f.err), 4) << (ok ? "" : " FAIL") << " | "
                << f.kernel << " |\n";
      for (const Result* r : {&a, &f})
        csv << '"' << prov.gpu << "\"," << prov.commit << ","
            << (r->appended ? "step_append" : "step_copies") << "," << c.b << "," << c.h << ","
            << c.hkv << "," << c.sq << "," << c.sk << "," << c.d << "," << c.causal << ",1,"
            << r->ms << ",0," << c.stepBytes() / (r->ms * 1e-3) / 1e9 << "," << r->err << ","
            << r->kernel << "\n";
    }
    std::cout << std::endl;
  }
  std::cout << "correctness: " << (bad ? std::to_string(bad) + " cases FAILED" : "all cases PASS")
            << " (sampled rows vs attention in double, error <= 2e-2 of the row's largest "
               "value)\nwrote "
            << csvPath << "\n";
  return bad ? 1 : 0;
}
