#include "codegen/Codegen.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <set>
#include <sstream>

namespace fpat::codegen {

std::string TileConfig::str() const {
  return std::to_string(bm) + "x" + std::to_string(bn) + "x" + std::to_string(bk) + "_w" +
         std::to_string(bm / wm) + "x" + std::to_string(bn / wn) + "_s" + std::to_string(stages) +
         (backend == Backend::MmaSync         ? "_mma"
          : backend == Backend::Wgmma         ? "_wgmma"
          : backend == Backend::WgmmaPingPong ? "_pingpong"
                                              : "");
}

std::optional<TileConfig> TileConfig::parse(const std::string& text) {
  TileConfig t;
  int warpsM = 0, warpsN = 0, used = 0;
  if (std::sscanf(text.c_str(), "%dx%dx%d_w%dx%d_s%d%n", &t.bm, &t.bn, &t.bk, &warpsM, &warpsN,
                  &t.stages, &used) != 6)
    return std::nullopt;
  const std::string rest = text.substr(static_cast<size_t>(used));
  if (rest == "_mma")
    t.backend = Backend::MmaSync;
  else if (rest == "_wgmma")
    t.backend = Backend::Wgmma;
  else if (rest == "_pingpong")
    t.backend = Backend::WgmmaPingPong;
  else if (!rest.empty())
    return std::nullopt;
  if (t.bm <= 0 || t.bn <= 0 || t.bk <= 0 || warpsM <= 0 || warpsN <= 0 || t.stages <= 0 ||
      t.bm % warpsM || t.bn % warpsN)
    return std::nullopt;
  t.wm = t.bm / warpsM;
  t.wn = t.bn / warpsN;
  if (t.wgmma()) { // only what fpat_wgmma.cuh implements
    auto known = wgmmaConfigs();
    bool shapeKnown = std::any_of(known.begin(), known.end(), [&](const TileConfig& k) {
      return k.bm == t.bm && k.bn == t.bn && k.bk == t.bk && k.wm == t.wm && k.wn == t.wn &&
             k.backend == t.backend;
    });
    if (!shapeKnown || t.stages < 2)
      return std::nullopt;
  }
  return t;
}

int gemmSmemBytes(const TileConfig& t, bool transB) {
  if (t.wgmma()) // the ring of A and B stages, 1 KB for aligning it to the swizzle atom
    return t.stages * (t.bm + t.bn) * t.bk * 2 + 1024;
  const int pad = 8;
  int a = t.bm * (t.bk + pad);
  int b = transB ? t.bn * (t.bk + pad) : t.bk * (t.bn + pad);
  int pipe = t.stages * (a + b) * 2;
  int epi = (t.bm / t.wm) * (t.bn / t.wn) * 16 * 20 * 4;
  return std::max(pipe, epi);
}

bool tmaCompatible(int64_t m, int64_t n, int64_t k, bool transB) {
  const int64_t limit = int64_t{1} << 31;
  return m >= 1 && n >= 1 && k >= 1 && m < limit && n < limit && k < limit && k % 8 == 0 &&
         (transB || n % 8 == 0);
}

std::vector<TileConfig> wgmmaConfigs() {
  std::vector<TileConfig> out;
  auto add = [&](int bm, int bn, Backend b) {
    const int stage = (bm + bn) * 64 * 2;
    const int deepest = std::min(8, (232448 - 1024 - 1024) / stage); // 1 KB of static smem
    const int wm = b == Backend::WgmmaPingPong ? bm : 64;
    for (int stages = deepest; stages >= std::max(2, deepest - 1); --stages)
      out.push_back(TileConfig{bm, bn, 64, wm, bn, stages, b});
  };
  for (int bm : {128, 64})
    for (int bn : {256, 128, 64})
      add(bm, bn, Backend::Wgmma);
  for (auto [bm, bn] : {std::pair{128, 128}, {64, 256}, {128, 64}, {64, 128}})
    add(bm, bn, Backend::WgmmaPingPong);
  return out;
}

double wgmmaScore(const TileConfig& t, int64_t m, int64_t n, int sms, bool epilogueReads) {
  const bool pp = t.backend == Backend::WgmmaPingPong;
  const double tiles =
      static_cast<double>((m + t.bm - 1) / t.bm) * static_cast<double>((n + t.bn - 1) / t.bn);
  const double waves = std::ceil(tiles / sms);
  const double useful = static_cast<double>(m) * static_cast<double>(n) / (tiles * t.bm * t.bn);
  // Cooperative tiles relative to 128x256; ping-pong relative to that at 4096^3: 0.91-0.96
  // without epilogue inputs, 1.0-1.06 with a bias (its loads overlap the other consumer's
  // MMAs). Ping-pong needs two tiles per CTA to overlap anything.
  double speed = t.bm == 128 ? (t.bn == 256   ? 1.0
                                : t.bn == 128 ? 0.9
                                              : 0.75)
                             : (t.bn == 256   ? 0.85
                                : t.bn == 128 ? 0.75
                                              : 0.6);
  if (pp) {
    const double big = t.bm * t.bn >= 128 * 128 ? 1.0 : 0.85;
    speed = (tiles >= 2.0 * sms ? (epilogueReads ? 1.05 : 0.92) : 0.5) * big *
            (t.bm == 64 ? 0.97 : 1.0);
  }
  // The deepest ring of a shape first, except that an epilogue reading inputs wants L1, which
  // shares the SM's 256 KB with shared memory: its bias/residual loads measured 10-18% slower
  // with a 226 KB ring than with 194 KB (bench/RESULTS.md, gemm_bias_residual).
  const int stage = (t.bm + t.bn) * t.bk * 2;
  const bool deepest = (t.stages + 1) * stage + 2048 > 232448 || t.stages >= 8;
  const bool lowL1 = epilogueReads && gemmSmemBytes(t, false) > 200 * 1024;
  return tiles / (waves * sms) * useful * speed * (deepest ? 1.0 : 0.98) * (lowL1 ? 0.9 : 1.0);
}

namespace {

/// Hopper default: the wgmma configuration with the best wgmmaScore.
TileConfig hopperTile(int64_t m, int64_t n, int numSms, bool epilogueReads) {
  TileConfig best;
  double bestScore = -1;
  for (const TileConfig& t : wgmmaConfigs()) {
    const double score = wgmmaScore(t, m, n, numSms, epilogueReads);
    if (score > bestScore + 1e-9) {
      best = t;
      bestScore = score;
    }
  }
  return best;
}

} // namespace

TileConfig defaultTile(int64_t m, int64_t n, int arch, int numSms, bool norm, bool tma,
                       bool epilogueReads) {
  if (arch == 90 && !norm && tma)
    return hopperTile(m, n, numSms, epilogueReads);
  auto tiles = [&](int bm, int bn) { return ((m + bm - 1) / bm) * ((n + bn - 1) / bn); };
  if (arch < 80) { // no cp.async: the register path, two stages
    if (tiles(128, 128) >= numSms)
      return TileConfig{128, 128, 32, 64, 32, 2};
    return TileConfig{64, 64, 32, 32, 32, 2};
  }
  // sm_80+: the software-pipelined cp.async loop with 64x64 warp tiles and 64-deep k-tiles,
  // the fastest family measured on the H200 (bench/RESULTS.md), where the device's opt-in
  // shared memory holds three stages of it (sm_80/sm_90: yes; sm_86/sm_89, 99 KB: no).
  const int smemOptin = arch == 80 || arch == 87 ? 166912 : arch >= 90 ? 232448 : 101376;
  auto fits = [&](const TileConfig& t) {
    return std::max(gemmSmemBytes(t, false), gemmSmemBytes(t, true)) <= smemOptin;
  };
  auto fills = [&](int bm, int bn) { return tiles(bm, bn) * 10 >= numSms * 9; }; // one wave, 90%
  const TileConfig wide{128, 256, 64, 64, 64, 3}, tall{256, 128, 64, 64, 64, 3};
  if (norm) {
    // The in-place normalisation wants many threads per tile: the wide tile (8 warps; it
    // spills 108 bytes there, which measured harmless) or 64x32 warp tiles; the 4-warp and
    // tall 64x64 tiles measured 30-180% slower (bench/RESULTS.md, 8ef7d43).
    if (n >= m && fits(wide) && fills(wide.bm, wide.bn))
      return wide;
    if (fills(128, 128))
      return TileConfig{128, 128, 64, 64, 32, 3};
    return TileConfig{64, 64, 32, 32, 32, 3};
  }
  const TileConfig& big = n >= m ? wide : tall;
  if (fits(big) && fills(big.bm, big.bn))
    return big;
  const TileConfig mid{128, 128, 64, 64, 64, 3};
  if (fits(mid) && fills(128, 128))
    return mid;
  if (tiles(128, 128) >= numSms)
    return TileConfig{128, 128, 32, 64, 64, 3};
  // Fewer tiles than SMs: 64x64 tiles give four times as many CTAs.
  return TileConfig{64, 64, 32, 32, 32, 3};
}

namespace {

std::string ref(const ir::Graph& g, ir::Vertex v) {
  return "%" + g.op(v).name;
}

std::string sanitize(const std::string& s) {
  std::string o;
  for (char c : s)
    o += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return o;
}

/// Device functions of the activations an op uses, and their parameter values: each use of
/// an activation with its own parameters gets its own block of a.params[].
struct ActivationCode {
  std::vector<float> params;            // values for a.params[], in order of first use
  std::vector<std::string> fns;         // activations used, in order of first use
  std::map<std::string, int> paramBase; // "fn(values)" -> index of its first parameter
};

/// Registers one use of `fn` with the given parameters (the rest take their defaults) and
/// returns the CUDA call on `arg`.
std::string callActivation(const std::string& fn, const std::map<std::string, double>& given,
                           const std::string& arg, const std::string& who,
                           const dsl::PatternLibrary& lib, ActivationCode& code) {
  const dsl::ActivationDef* a = lib.findActivation(fn);
  if (!a)
    throw CodegenError("no .fpat body for activation '" + fn + "' (used by " + who + ")");
  if (std::find(code.fns.begin(), code.fns.end(), fn) == code.fns.end())
    code.fns.push_back(fn);
  std::vector<float> values;
  std::string key = fn + "(";
  for (size_t i = 0; i < a->paramNames.size(); ++i) {
    auto it = given.find(a->paramNames[i]);
    values.push_back(static_cast<float>(it != given.end() ? it->second : a->paramDefaults[i]));
    key += formatDouble(values.back()) + ",";
  }
  auto [it, fresh] = code.paramBase.emplace(key, static_cast<int>(code.params.size()));
  if (fresh)
    code.params.insert(code.params.end(), values.begin(), values.end());
  if (code.params.size() > 8)
    throw CodegenError(who + " needs more than 8 activation parameters");
  std::string s = "fpat_act_" + fn + "(" + arg;
  for (size_t i = 0; i < a->paramNames.size(); ++i)
    s += ", a.params[" + std::to_string(it->second + static_cast<int>(i)) + "]";
  return s + ")";
}

/// The body of a fused op's epilogue functor: one named value per node of its tree, in
/// evaluation order. Operands of shape [N] are read at the column, [M, N] at (row, col).
std::string epilogueBody(const ir::Graph& g, ir::Vertex v, const dsl::PatternLibrary& lib,
                         ActivationCode& acts) {
  const ir::Op& op = g.op(v);
  const ir::Epilogue& e = op.fused.epilogue;
  if (op.kind != ir::OpKind::Fused || e.identity())
    return "    return v;\n";
  const std::vector<ir::Vertex> ins = g.operands(v);
  std::ostringstream os;
  auto name = [](int i) { return "t" + std::to_string(i); };
  for (size_t i = 0; i < e.nodes.size(); ++i) {
    const ir::EpilogueNode& n = e.nodes[i];
    os << "    const float " << name(static_cast<int>(i)) << " = ";
    switch (n.kind) {
    case ir::EpiKind::Acc:
      os << "v; // acc\n";
      break;
    case ir::EpiKind::Operand: {
      const bool vec = g.op(ins.at(static_cast<size_t>(n.operand))).type.rank() == 1;
      os << "fpat::ldh(a.in[" << n.operand << "], " << (vec ? "col" : "row * a.N + col")
         << "); // $" << n.operand << (vec ? " [N]" : " [M, N]") << "\n";
      break;
    }
    case ir::EpiKind::BiasAdd:
    case ir::EpiKind::Add:
    case ir::EpiKind::Mul:
      os << name(n.lhs) << (n.kind == ir::EpiKind::Mul ? " * " : " + ") << name(n.rhs) << "; // "
         << (n.kind == ir::EpiKind::BiasAdd ? "bias_add"
             : n.kind == ir::EpiKind::Add   ? "add"
                                            : "mul")
         << "\n";
      break;
    case ir::EpiKind::Activation:
      os << callActivation(n.fn, n.params, name(n.lhs), ref(g, v), lib, acts) << ";\n";
      break;
    }
  }
  os << "    return " << name(static_cast<int>(e.nodes.size()) - 1) << ";\n";
  return os.str();
}

/// The same epilogue on two adjacent columns (col even, N even): operands load as one
/// 4-byte pair, halving the epilogue's load instructions. Kernels that store f16 pairs call it.
std::string epiloguePairBody(const ir::Graph& g, ir::Vertex v, const dsl::PatternLibrary& lib,
                             ActivationCode& acts) {
  const ir::Op& op = g.op(v);
  const ir::Epilogue& e = op.fused.epilogue;
  if (op.kind != ir::OpKind::Fused || e.identity())
    return "    return v;\n";
  const std::vector<ir::Vertex> ins = g.operands(v);
  std::ostringstream os;
  auto name = [](int i) { return "t" + std::to_string(i); };
  for (size_t i = 0; i < e.nodes.size(); ++i) {
    const ir::EpilogueNode& n = e.nodes[i];
    os << "    const float2 " << name(static_cast<int>(i)) << " = ";
    switch (n.kind) {
    case ir::EpiKind::Acc:
      os << "v;\n";
      break;
    case ir::EpiKind::Operand: {
      const bool vec = g.op(ins.at(static_cast<size_t>(n.operand))).type.rank() == 1;
      os << "fpat::ldh2(a.in[" << n.operand << "], " << (vec ? "col" : "row * a.N + col") << ");\n";
      break;
    }
    case ir::EpiKind::BiasAdd:
    case ir::EpiKind::Add:
    case ir::EpiKind::Mul: {
      const char* o = n.kind == ir::EpiKind::Mul ? " * " : " + ";
      os << "make_float2(" << name(n.lhs) << ".x" << o << name(n.rhs) << ".x, " << name(n.lhs)
         << ".y" << o << name(n.rhs) << ".y);\n";
      break;
    }
    case ir::EpiKind::Activation:
      os << "make_float2("
         << callActivation(n.fn, n.params, name(n.lhs) + ".x", ref(g, v), lib, acts) << ", "
         << callActivation(n.fn, n.params, name(n.lhs) + ".y", ref(g, v), lib, acts) << ");\n";
      break;
    }
  }
  os << "    return " << name(static_cast<int>(e.nodes.size()) - 1) << ";\n";
  return os.str();
}

void requireF16(const ir::Graph& g, ir::Vertex v) {
  auto check = [&](ir::Vertex u) {
    if (g.op(u).type.dtype != ir::DType::F16)
      throw CodegenError("GPU kernels take f16 tensors; " + ref(g, u) + " is " +
                         g.op(u).type.str());
  };
  check(v);
  for (ir::Vertex u : g.operands(v))
    check(u);
}

/// The comment block at the top of a generated file. It describes the kernel, not the op, so
/// that every op needing the same kernel gets the same source (and one cubin).
std::string header(const std::string& kernel, const CodegenOptions& o,
                   const std::vector<std::string>& lines) {
  std::ostringstream os;
  os << "// Generated by fpat " << o.version << " for sm_" << o.arch << ". Do not edit.\n";
  os << "// kernel:   " << kernel << "\n";
  for (const std::string& l : lines)
    os << "// " << l << "\n";
  return os.str();
}

std::string activationFunctions(const ActivationCode& code, const dsl::PatternLibrary& lib) {
  std::string out;
  for (const std::string& fn : code.fns)
    out += dsl::emitActivationFunction(*lib.findActivation(fn));
  return out;
}

} // namespace

KernelUnit generate(const ir::Graph& g, ir::Vertex v, const dsl::PatternLibrary& lib,
                    const CodegenOptions& o) {
  const ir::Op& op = g.op(v);
  KernelUnit u;
  if (op.kind == ir::OpKind::Input)
    return u;
  requireF16(g, v);
  const std::vector<ir::Vertex> ins = g.operands(v);
  const std::string arch = "sm" + std::to_string(o.arch);
  const std::string where = [&] {
    auto it = o.sources.find(op.fused.pattern);
    return it == o.sources.end() ? std::string() : " [" + it->second + "]";
  }();
  ActivationCode acts;
  std::ostringstream body;

  if (const ir::FamilyInfo* family = ir::familyOf(op)) {
    const bool norm = family->normalisesA;
    const int normKind = !norm                          ? 0
                         : op.fused.norm == "layernorm" ? 1
                         : op.fused.norm == "rmsnorm"   ? 2
                                                        : -1;
    if (normKind < 0)
      throw CodegenError(ref(g, v) + ": norm_gemm without a norm kind");
    const size_t bIdx = normKind == 0 ? 1 : normKind == 1 ? 3 : 2;
    if (ins.size() <= bIdx)
      throw CodegenError(ref(g, v) + ": too few operands for its kernel family");
    const ir::TensorDesc& A = g.op(ins[0]).type;
    u.M = op.type.shape[0];
    u.N = op.type.shape[1];
    u.K = A.shape[1];
    u.eps = static_cast<float>(op.eps);
    u.transB = op.transposeB;
    u.vec = vectorLoads(u.M, u.N, u.K, u.transB);
    u.family = family->name;
    u.needsRowStats = norm;
    // The wgmma backend where it applies; otherwise (or when a forced configuration asks for
    // it where it cannot run) the cp.async backends, with the reason in the generated file.
    const bool tmaOk =
        family->hasWgmmaPath && o.arch == 90 && tmaCompatible(u.M, u.N, u.K, u.transB);
    u.epilogueReads = op.kind == ir::OpKind::Fused && !op.fused.epilogue.operands().empty();
    u.tile = o.tile ? *o.tile : defaultTile(u.M, u.N, o.arch, o.sms, norm, tmaOk, u.epilogueReads);
    std::string fallback;
    if (u.tile.wgmma() && !tmaOk) {
      fallback = "fallback: " + u.tile.str() + " cannot run here (" +
                 (norm           ? std::string("norm_gemm has no wgmma kernel")
                  : o.arch != 90 ? "wgmma needs sm_90, not sm_" + std::to_string(o.arch)
                  : u.K % 8 != 0 ? "TMA needs K % 8 == 0, K is " + std::to_string(u.K)
                  : u.N % 8 != 0 ? "TMA needs N % 8 == 0 for B [K, N], N is " + std::to_string(u.N)
                                 : std::string("a dimension exceeds 2^31")) +
                 ")";
      u.tile = defaultTile(u.M, u.N, o.arch, o.sms, norm, false);
    }
    const TileConfig& t = u.tile;
    u.sm90a = t.wgmma();

    const std::string epi = epilogueBody(g, v, lib, acts);
    const std::string base = op.kind == ir::OpKind::Fused ? sanitize(op.fused.pattern) : "gemm";
    const std::string cfg = t.str() + (u.transB ? "_bt" : "") +
                            (t.wgmma() ? ""
                             : u.vec   ? "_vec"
                                       : "_any");
    u.name = "fpat_" + base + "_" + (t.wgmma() ? std::string("sm90a") : arch) + "_" + cfg;
    // The fallback is said in the log line, not in the source: the source describes the kernel
    // (every op that needs it shares one cubin), the log line the op.
    u.what = ref(g, v) + " = " + (op.kind == ir::OpKind::Fused ? op.fused.pattern : "gemm") +
             where + (fallback.empty() ? "" : " (" + fallback + ")");
    std::vector<std::string> lines;
    if (t.wgmma()) {
      const bool pp = t.backend == Backend::WgmmaPingPong;
      const int consumers = pp ? 2 : t.bm / t.wm;
      lines = {"family:   " + u.family + " (TMA + wgmma m64n" + std::to_string(t.bn) +
                   "k16, warp-specialized, persistent; f16 in, f32 accumulate)",
               "config:   CTA " + std::to_string(t.bm) + "x" + std::to_string(t.bn) + "x" +
                   std::to_string(t.bk) + ", " + std::to_string(consumers) + " consumer warpgroup" +
                   (consumers > 1 ? "s" : "") + (pp ? " taking alternate tiles (ping-pong)" : "") +
                   " + 1 producer, " + std::to_string(t.stages) + " stages, " +
                   std::to_string(t.threads()) + " threads" +
                   (u.transB ? ", B is [N, K]" : ", B is [K, N]")};
    } else {
      lines = {"family:   " + u.family +
                   (t.backend == Backend::MmaSync ? " (mma.sync m16n8k16" : " (WMMA") +
                   ", f16 in, f32 accumulate)" +
                   (norm ? ", A normalised on load (" + op.fused.norm + ")" : ""),
               "config:   CTA " + std::to_string(t.bm) + "x" + std::to_string(t.bn) + "x" +
                   std::to_string(t.bk) + ", warp " + std::to_string(t.wm) + "x" +
                   std::to_string(t.wn) + ", " + std::to_string(t.stages) + " stages, " +
                   std::to_string(t.threads()) + " threads, " +
                   (u.vec ? "16-byte loads" : "bounds-checked loads") +
                   (u.transB ? ", B is [N, K]" : ", B is [K, N]")};
    }
    lines.push_back("epilogue: " + (op.kind == ir::OpKind::Fused
                                        ? ir::printEpilogue(op.fused.epilogue)
                                        : std::string("acc")));
    body << header(op.kind == ir::OpKind::Fused ? "pattern " + op.fused.pattern + where
                                                : std::string("gemm (not fused)"),
                   o, lines)
         << (t.wgmma() ? "#include \"fpat_wgmma.cuh\"\n" : "#include \"fpat_gemm.cuh\"\n");
    if (norm)
      body << "#include \"fpat_rowwise.cuh\"\n";
    body << "\n" << activationFunctions(acts, lib);
    body << (acts.fns.empty() ? "" : "\n") << "namespace {\n\n"
         << "struct Epilogue {\n"
         << "  __device__ __forceinline__ float operator()(float v, int64_t row, int64_t col,\n"
         << "                                              const FpatKernelArgs& a) const {\n"
         << "    (void)row;\n    (void)col;\n    (void)a;\n"
         << epi << "  }\n";
    if (t.wgmma())
      body << "  __device__ __forceinline__ float2 pair(float2 v, int64_t row, int64_t col,\n"
           << "                                         const FpatKernelArgs& a) const {\n"
           << "    (void)row;\n    (void)col;\n    (void)a;\n"
           << epiloguePairBody(g, v, lib, acts) << "  }\n";
    body << "};\n\n";
    if (t.wgmma()) {
      body << "using Tile = fpat::WgmmaTile<" << t.bm << ", " << t.bn << ", " << t.stages << ", "
           << (t.backend == Backend::WgmmaPingPong ? "true" : "false") << ">;\n"
           << "// The launch's dynamic shared memory (computed on the host) must be the kernel's.\n"
           << "static_assert(fpat::wgmmaSmemBytes<Tile>() == " << gemmSmemBytes(t, u.transB)
           << ", \"host and device disagree on shared memory\");\n\n} // namespace\n\n"
           << "extern \"C\" __global__ void __launch_bounds__(" << t.threads() << ", 1) " << u.name
           << "(const __grid_constant__ FpatTmaArgs p) {\n"
           << "  fpat::gemmWgmma<Tile, " << (u.transB ? "true" : "false") << ", Epilogue>(p);\n}\n";
      Launch l{Launch::Persistent, u.name, t.threads(), gemmSmemBytes(t, u.transB), {}};
      // Box shapes as fpat_wgmma.cuh loads them: A in BK x BM boxes; B [N, K] in BK x BN
      // boxes, B [K, N] in 64-column x BK boxes.
      l.tma.push_back({0, u.K, u.M, t.bk, t.bm});
      const int b = static_cast<int>(bIdx);
      l.tma.push_back(u.transB ? TmaMap{b, u.K, u.N, t.bk, t.bn} : TmaMap{b, u.N, u.K, 64, t.bk});
      u.launches.push_back(l);
      u.params = acts.params;
      u.source = body.str();
      return u;
    }
    body << "using Tile = fpat::GemmTile<" << t.bm << ", " << t.bn << ", " << t.bk << ", " << t.wm
         << ", " << t.wn << ", " << t.stages << ">;\n"
         << "// The launch's dynamic shared memory (computed on the host) must be the kernel's.\n"
         << "static_assert(fpat::gemmSmemBytes<Tile, " << (u.transB ? "true" : "false")
         << ">() == " << gemmSmemBytes(t, u.transB)
         << ", \"host and device disagree on shared memory\");\n\n} // namespace\n\n";
    if (norm) {
      body << "extern \"C\" __global__ void __launch_bounds__(256) " << u.name
           << "_rowstats(const FpatKernelArgs a) {\n"
           << "  fpat::rowStatsPass<" << (normKind == 1 ? "true" : "false") << ">(a);\n}\n\n";
      u.launches.push_back({Launch::Rows, u.name + "_rowstats", 256, 0, {}});
    }
    body << "extern \"C\" __global__ void __launch_bounds__(" << t.threads() << ") " << u.name
         << "(const FpatKernelArgs a) {\n"
         << "  fpat::gemm<Tile, " << (u.transB ? "true" : "false") << ", "
         << (u.vec ? "true" : "false") << ", " << normKind << ", Epilogue"
         << (t.backend == Backend::MmaSync ? ", true" : "") << ">(a);\n}\n";
    u.launches.push_back({Launch::GemmTiles, u.name, t.threads(), gemmSmemBytes(t, u.transB), {}});
    u.params = acts.params;
    u.source = body.str();
    return u;
  }

  if (op.kind == ir::OpKind::Fused)
    throw CodegenError(ref(g, v) + ": no kernel family '" + op.fused.family +
                       "' implements pattern " + op.fused.pattern);

  if (op.kind == ir::OpKind::LayerNorm || op.kind == ir::OpKind::RmsNorm) {
    const bool layer = op.kind == ir::OpKind::LayerNorm;
    u.family = "rowwise";
    u.M = op.type.shape[0];
    u.N = op.type.shape[1];
    u.eps = static_cast<float>(op.eps);
    u.name = std::string("fpat_") + (layer ? "layernorm" : "rmsnorm") + "_" + arch;
    u.what = ref(g, v) + " = " + ir::opKindName(op.kind);
    body << header(std::string(ir::opKindName(op.kind)) + " (not fused)", o,
                   {"family:   rowwise (one warp per row, f32 statistics)"})
         << "#include \"fpat_rowwise.cuh\"\n\n"
         << "extern \"C\" __global__ void __launch_bounds__(256) " << u.name
         << "(const FpatKernelArgs a) {\n  fpat::normRows<" << (layer ? "true" : "false")
         << ">(a);\n}\n";
    u.launches.push_back({Launch::Rows, u.name, 256, 0, {}});
    u.source = body.str();
    return u;
  }

  // Elementwise: bias_add, activation, add, mul.
  u.family = "elementwise";
  u.M = op.type.rank() == 2 ? op.type.shape[0] : 1;
  u.N = op.type.shape.back();
  std::string expr, kinds, suffix;
  switch (op.kind) {
  case ir::OpKind::BiasAdd:
    expr = "in[0] + in[1]";
    kinds = "k == 1 ? FPAT_IN_ROWVEC : FPAT_IN_FULL";
    suffix = "bias_add";
    break;
  case ir::OpKind::Add:
    expr = "in[0] + in[1]";
    kinds = "FPAT_IN_FULL";
    suffix = "add";
    break;
  case ir::OpKind::Mul:
    expr = "in[0] * in[1]";
    kinds = "FPAT_IN_FULL";
    suffix = "mul";
    break;
  case ir::OpKind::Activation:
    expr = callActivation(op.fn, op.params, "in[0]", ref(g, v), lib, acts);
    kinds = "FPAT_IN_FULL";
    suffix = sanitize(op.fn);
    break;
  default:
    throw CodegenError(ref(g, v) + ": no kernel for op kind " + ir::opKindName(op.kind));
  }
  u.name = "fpat_ew_" + suffix + "_" + arch;
  u.what = ref(g, v) + " = " +
           (op.kind == ir::OpKind::Activation ? "activation " + op.fn : ir::opKindName(op.kind));
  const size_t nin = ins.size();
  body << header((op.kind == ir::OpKind::Activation ? "activation " + op.fn
                                                    : std::string(ir::opKindName(op.kind))) +
                     " (not fused)",
                 o, {"family:   elementwise (8 elements per thread, 16-byte vectors)"})
       << "#include \"fpat_elementwise.cuh\"\n\n"
       << activationFunctions(acts, lib) << (acts.fns.empty() ? "" : "\n")
       << "namespace {\n\nstruct Op {\n"
       << "  static constexpr int kInputs = " << nin << ";\n"
       << "  __host__ __device__ static constexpr int kind(int k) {\n"
       << "    return " << kinds << ";\n  }\n"
       << "  __device__ __forceinline__ float operator()(const float* in,\n"
       << "                                              const FpatKernelArgs& a) const {\n"
       << "    (void)a;\n    return " << expr << ";\n  }\n};\n\n} // namespace\n\n"
       << "extern \"C\" __global__ void __launch_bounds__(256) " << u.name
       << "(const FpatKernelArgs a) {\n  fpat::elementwise<Op>(a);\n}\n";
  u.launches.push_back({Launch::Elements, u.name, 256, 0, {}});
  u.params = acts.params;
  u.source = body.str();
  return u;
}

} // namespace fpat::codegen
