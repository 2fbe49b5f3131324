// The flash-attention kernel for the `attention` op on sm_90 (fpat_flash.cuh): what its bias
// operand means (nothing, a causal mask, a tensor), its tile, its launch.
#include "fpat/codegen/Lowering.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

namespace fpat::codegen::detail {

namespace {

/// Whether every covered score (i, j) of a [.., Sq, Sk] mask reads `masked(i, j)`: a value at
/// most -1e30 (or -inf) where masked, 0 elsewhere. `data` is the bias padded to rank 4.
template <class Masked>
bool maskIs(const std::vector<float>& data, const int64_t (&shape)[4], Masked masked) {
  for (size_t e = 0; e < data.size(); ++e) {
    const int64_t j = static_cast<int64_t>(e) % shape[3];
    const int64_t i = static_cast<int64_t>(e) / shape[3] % shape[2];
    const bool want = masked(i, j);
    if (want ? !(data[e] <= -1e30f) : data[e] != 0.0f)
      return false;
  }
  return true;
}

} // namespace

FlashMask flashMask(const ir::Graph& g, ir::Vertex bias, const ir::AttnShape& s) {
  const ir::Op& op = g.op(bias);
  // A scalar shifts every score of a row alike: the softmax does not see it.
  if (op.kind == ir::OpKind::Constant)
    return std::isfinite(op.value) ? FlashMask::None : FlashMask::Bias;
  if (op.kind != ir::OpKind::Input || !op.weight || !op.data)
    return FlashMask::Bias;
  const std::vector<int64_t>& bs = op.type.shape;
  int64_t shape[4] = {1, 1, 1, 1};
  for (size_t i = 0; i < bs.size() && i < 4; ++i)
    shape[4 - bs.size() + i] = bs[i];
  if (maskIs(*op.data, shape, [](int64_t, int64_t) { return false; }))
    return FlashMask::None;
  // Causal, bottom-right aligned, every row keeping at least key 0 (Sk >= Sq): then no row
  // is fully masked and -inf and finfo.min fills give the same softmax.
  const int64_t off = s.sk - s.sq;
  if (off >= 0 && shape[2] == s.sq && shape[3] == s.sk &&
      maskIs(*op.data, shape, [&](int64_t i, int64_t j) { return j > i + off; }))
    return FlashMask::Causal;
  return FlashMask::Bias;
}

bool flashAttentionFits(const ir::AttnShape& s, int arch) {
  return arch == 90 && (s.headDim == 64 || s.headDim == 128) && s.batch * s.sq < (1ll << 31) &&
         s.batch * s.sk < (1ll << 31) && s.heads <= 65535 && s.batch <= 65535;
}

KernelUnit generateFlashAttention(const ir::Graph& g, ir::Vertex v, const CodegenOptions& o,
                                  const ir::AttnShape& s, const int64_t (&bias)[4],
                                  FlashMask mask) {
  // Key blocks of 128, FA3's intra-warpgroup overlap and the consumers taking turns
  // (bench/RESULTS.md, session 34: blocks of 176, FA3's tile for head dimension 128, ran 3%
  // faster at S = 8k, but ptxas serializes their wgmma at some sizes: too few registers).
  // FPAT_FLASH=<BN>[s][p] asks for another (an experiment's knob: "s" runs the blocks one
  // after the other, "p" makes the consumers take turns).
  int bn = 128;
  bool overlap = true, pingpong = true;
  if (const char* env = std::getenv("FPAT_FLASH")) {
    const int want = std::atoi(env);
    if (want == 64 || want == 128 || want == 176 || want == 192)
      bn = want;
    overlap = std::string(env).find('s') == std::string::npos;
    pingpong = std::string(env).find('p') != std::string::npos;
  }
  const int64_t d = s.headDim;
  const int smem = static_cast<int>(128 * d * 2 + 2 * 2 * bn * d * 2 + 1024);
  if (smem > 232448)
    bn = 128; // 192-key blocks of head dimension 128 do not fit two stages
  const int smemBytes = static_cast<int>(128 * d * 2 + 2 * 2 * bn * d * 2 + 1024);
  const ir::Op& scale = g.op(g.operands(v)[4]);
  const bool positive =
      scale.kind == ir::OpKind::Constant && std::isfinite(scale.value) && scale.value > 0;
  const int kind = mask == FlashMask::None ? 0 : mask == FlashMask::Causal ? 1 : 2;
  const char* maskName = kind == 0 ? "none" : kind == 1 ? "causal" : "bias";
  KernelUnit u;
  u.family = "attention";
  u.sm90a = true;
  u.M = s.batch * s.sq;
  u.N = s.heads * d;
  u.K = s.sk;
  std::string sizes = "b" + std::to_string(s.batch) + "_h" + std::to_string(s.heads) + "_kv" +
                      std::to_string(s.kvHeads) + "_q" + std::to_string(s.sq) + "_k" +
                      std::to_string(s.sk) + "_d" + std::to_string(d) + "_" + maskName;
  if (kind == 2)
    for (int64_t b : bias)
      sizes += "_" + std::to_string(b);
  const std::string tile = std::to_string(bn) + (overlap ? "o" : "s") + (pingpong ? "p" : "");
  u.name = "fpat_flash_attention_" + sizes + "_sm90a_" + tile;
  u.what = ref(g, v) + " = attention";
  std::ostringstream body;
  body << header("attention (flash attention)", o,
                 {"family:   attention (sm_90a: TMA, wgmma for Q K^T and P V, online softmax in "
                  "registers; fpat_flash.cuh)",
                  "sizes:    B " + std::to_string(s.batch) + ", Sq " + std::to_string(s.sq) +
                      ", Sk " + std::to_string(s.sk) + ", H " + std::to_string(s.heads) + ", Hkv " +
                      std::to_string(s.kvHeads) + ", d " + std::to_string(d),
                  std::string("mask:     ") +
                      (kind == 0   ? "none (no bias, or one the softmax cannot see)"
                       : kind == 1 ? "causal, bottom-right (recognised from the bias's values)"
                                   : "the bias tensor, read per score"),
                  "tile:     128 query rows x " + std::to_string(bn) + " keys, " +
                      (overlap ? "softmax overlapped with P V" : "blocks in sequence") +
                      (pingpong ? ", consumers taking turns" : "")})
       << "#include \"fpat_flash.cuh\"\n\n"
       << "namespace {\n\nstruct Dims {\n"
       << "  static constexpr int64_t B = " << s.batch << ", Sq = " << s.sq << ", Sk = " << s.sk
       << ";\n  static constexpr int64_t H = " << s.heads << ", Hkv = " << s.kvHeads
       << ", Hd = " << d << ";\n"
       << "  static constexpr int kMask = " << kind << "; // 0 none, 1 causal, 2 bias\n"
       << "  static constexpr bool kScalePositive = " << (positive ? "true" : "false")
       << "; // a constant > 0\n"
       << "  static constexpr int64_t bias0 = " << bias[0] << ", bias1 = " << bias[1]
       << ", bias2 = " << bias[2] << ", bias3 = " << bias[3] << ";\n};\n\n"
       << "using Tile = fpat::FlashTile<" << d << ", " << bn << ", " << (overlap ? "true" : "false")
       << ">;\n\n} // namespace\n\n"
       << "extern \"C\" __global__ void __launch_bounds__(384, 1)\n"
       << u.name << "(const __grid_constant__ FpatTmaArgs p) {\n"
       << "  fpat::flashAttention<Dims, Tile>(p);\n}\n";
  Launch l{Launch::Fixed, u.name, 384, smemBytes, {}};
  l.blocks[0] = (s.sq + 127) / 128;
  l.blocks[1] = s.heads;
  l.blocks[2] = s.batch;
  l.tma = {TmaMap{0, s.heads * d, s.batch * s.sq, 64, 128},
           TmaMap{1, s.kvHeads * d, s.batch * s.sk, 64, bn},
           TmaMap{2, s.kvHeads * d, s.batch * s.sk, 64, bn}};
  u.launches.push_back(l);
  u.source = body.str();
  return u;
}

} // namespace fpat::codegen::detail
