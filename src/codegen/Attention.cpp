// The flash-attention kernel for the `attention` op on sm_90 (fpat_flash.cuh): what its bias
// operand means (nothing, a causal mask, a tensor), its tile, its launch.
#include "fpat/codegen/Lowering.h"
#include "fpat/codegen/kernels/fpat_abi.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace fpat::codegen::detail {

namespace {

/// Whether every covered score (i, j) of a [.., Sq, Sk] mask reads `masked(i, j)`: a value at
/// most ir::kMaskedAtMost (or -inf) where masked, 0 elsewhere. `data` is the bias padded to rank 4.
template <class Masked>
bool maskIs(const std::vector<float>& data, const int64_t (&shape)[4], Masked masked) {
  for (size_t e = 0; e < data.size(); ++e) {
    const int64_t j = static_cast<int64_t>(e) % shape[3];
    const int64_t i = static_cast<int64_t>(e) / shape[3] % shape[2];
    const bool want = masked(i, j);
    if (want ? !(data[e] <= ir::kMaskedAtMost) : data[e] != 0.0f)
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
         s.batch * s.sk * (s.kvHeadMajor ? s.kvHeads : 1) < (1ll << 31) && s.heads <= 65535 &&
         s.batch <= 65535;
}

namespace {

int maskCode(FlashMask mask) {
  return mask == FlashMask::None ? 0 : mask == FlashMask::Causal ? 1 : 2;
}

} // namespace

/// The sizes in a kernel's name: b2_h8_kv2_q333_k333_d128_causal.
std::string sizesName(const ir::AttnShape& s, FlashMask mask) {
  const int kind = maskCode(mask);
  return "b" + std::to_string(s.batch) + "_h" + std::to_string(s.heads) + "_kv" +
         std::to_string(s.kvHeads) + "_q" + std::to_string(s.sq) + "_k" + std::to_string(s.sk) +
         "_d" + std::to_string(s.headDim) + (s.kvHeadMajor ? "_cache" : "") + "_" +
         (kind == 0   ? "none"
          : kind == 1 ? "causal"
                      : "bias");
}

AttnPitches attnPitches(const ir::Graph& g, ir::Vertex v) {
  const std::vector<ir::Vertex> ins = g.operands(v);
  AttnPitches p;
  // A cache [B, Hkv, Sk, d] (kv_append's) holds a head's rows d apart.
  auto pitch = [&](ir::Vertex w) {
    const std::vector<int64_t>& t = g.op(w).type.shape;
    return t.size() == 4 ? t[3] : ir::rowPitch(g, w);
  };
  p.q = ir::rowPitch(g, ins.at(0));
  p.k = pitch(ins.at(1));
  p.v = pitch(ins.at(2));
  for (size_t i = 0; i < 3; ++i)
    p.dense = p.dense && !ir::columnViewOf(g, ins[i]);
  return p;
}

std::string AttnPitches::suffix() const {
  return dense ? "" : "_p" + std::to_string(q) + "_" + std::to_string(k) + "_" + std::to_string(v);
}

std::string AttnPitches::members() const {
  return "  static constexpr int64_t qPitch = " + std::to_string(q) +
         ", kPitch = " + std::to_string(k) + ", vPitch = " + std::to_string(v) +
         "; // elements a row\n";
}

/// sizesName, and for a bias tensor its strides over [B, H, Sq, Sk]: the flash kernel's sizes.
std::string flashSizesName(const ir::AttnShape& s, FlashMask mask, const int64_t (&bias)[4]) {
  std::string sizes = sizesName(s, mask);
  if (mask == FlashMask::Bias)
    for (int64_t b : bias)
      sizes += "_" + std::to_string(b);
  return sizes;
}

namespace {

/// The header lines both kernels' files start with.
std::vector<std::string> headerLines(const std::string& family, const ir::AttnShape& s,
                                     FlashMask mask, const std::string& tile) {
  const int kind = maskCode(mask);
  return {"family:   attention (" + family + "; fpat_flash.cuh)",
          "sizes:    B " + std::to_string(s.batch) + ", Sq " + std::to_string(s.sq) + ", Sk " +
              std::to_string(s.sk) + ", H " + std::to_string(s.heads) + ", Hkv " +
              std::to_string(s.kvHeads) + ", d " + std::to_string(s.headDim),
          std::string("mask:     ") +
              (kind == 0   ? "none (no bias, or one the softmax cannot see)"
               : kind == 1 ? "causal, bottom-right (recognised from the bias's values)"
                           : "the bias tensor, read per score"),
          "tile:     " + tile};
}

/// The tensor map of K or V (operand `in`), boxes of 64 columns and `rows` keys: token-major
/// rows of Hkv d, or a cache [B, Hkv, Sk, d] as rows of d.
TmaMap kvMap(int in, const ir::AttnShape& s, int rows) {
  return s.kvHeadMajor ? TmaMap{in, s.headDim, s.batch * s.kvHeads * s.sk, 64, rows}
                       : TmaMap{in, s.kvHeads * s.headDim, s.batch * s.sk, 64, rows};
}

/// The Dims struct the kernel templates read (sizes, mask, scale, bias strides, `extra`).
std::string dimsStruct(const ir::Graph& g, ir::Vertex v, const ir::AttnShape& s, FlashMask mask,
                       const int64_t (&bias)[4], const std::string& extra) {
  const ir::Op& scale = g.op(g.operands(v)[4]);
  const bool positive =
      scale.kind == ir::OpKind::Constant && std::isfinite(scale.value) && scale.value > 0;
  std::ostringstream os;
  os << "struct Dims {\n"
     << "  static constexpr int64_t B = " << s.batch << ", Sq = " << s.sq << ", Sk = " << s.sk
     << ";\n  static constexpr int64_t H = " << s.heads << ", Hkv = " << s.kvHeads
     << ", Hd = " << s.headDim << ";\n"
     << "  static constexpr int kMask = " << maskCode(mask) << "; // 0 none, 1 causal, 2 bias\n"
     << "  static constexpr bool kKvHeadMajor = " << (s.kvHeadMajor ? "true" : "false")
     << "; // k and v: caches [B, Hkv, Sk, d], or token-major\n"
     << "  static constexpr bool kScalePositive = " << (positive ? "true" : "false")
     << "; // a constant > 0\n"
     << "  static constexpr int64_t bias0 = " << bias[0] << ", bias1 = " << bias[1]
     << ", bias2 = " << bias[2] << ", bias3 = " << bias[3] << ";\n"
     << extra << "};\n";
  return os.str();
}

KernelUnit attentionUnit(const ir::Graph& g, ir::Vertex v, const ir::AttnShape& s) {
  KernelUnit u;
  u.family = "attention";
  u.sm90a = true;
  u.M = s.batch * s.sq;
  u.N = s.heads * s.headDim;
  u.K = s.sk;
  u.what = ref(g, v) + " = attention";
  return u;
}

/// Query rows per KV head the decode kernel computes together (fpat::DecodeTile::RMAX).
constexpr int64_t kDecodeRows = 8;

/// fpat::FlashTile::SMEM_BYTES: the Q tile, two stages of K and V, 1 KB for alignment.
int64_t flashSmem(int64_t d, int64_t rows, int64_t keys) {
  return rows * d * 2 + 2 * 2 * keys * d * 2 + 1024;
}

} // namespace

std::optional<FlashConfig> flashFromEnvironment() {
  const char* env = std::getenv("FPAT_FLASH");
  return env ? FlashConfig::parse(env) : std::nullopt;
}

/// `f` made one the kernel implements at these sizes.
FlashConfig fitted(FlashConfig f, const ir::AttnShape& s) {
  if (flashSmem(s.headDim, 128, f.bn) > FPAT_SM90_SMEM_BYTES)
    f.bn = 128; // two stages of larger key blocks do not fit shared memory
  if (s.headDim != 64 || f.bn > 128)
    f.consumers = 2; // fpat::FlashTile: three consumers have 160 registers a thread
  f.dynamic = f.dynamic && f.resident;
  return f;
}

/// The flash kernel's configuration for an attention of these sizes.
FlashConfig flashConfig(const ir::AttnShape& s, FlashMask mask, const FlashConfig* chosen) {
  // Key blocks of 128, FA3's intra-warpgroup overlap, the two consumers taking turns
  // (bench/RESULTS.md, session 34: turns +8-17% at S = 1k, equal within the runs' noise at
  // 8k; blocks of 176, FA3's tile for head dimension 128, up to 3% faster at S >= 8k and
  // slower below, but ptxas serializes their wgmma at some sizes: too few registers).
  // One CTA resident per SM walks the tiles, the next tile's loads overlapping the tile
  // before (session 37, without a causal mask: d 128 +3-14%, S = 2048 534 -> 589-592 TFLOP/s;
  // d 64 +4-9% to S = 2048, -2% from 8k). Causal tiles differ in length: a static walk did not
  // balance them (S = 16k: 415 against 640 for one CTA a tile), so with a causal mask each
  // resident CTA takes the next tile from a counter as it becomes free (session 42, H100,
  // against one CTA a tile: +4-31% at S = 512-8192, d 64 and 128, -2% at d 128, S = 16k;
  // without a mask the counter was within 2% of the static walk).
  // At head dimension 64 the softmax's exponentials take as long as the tensor cores' work, and
  // two consumers leave both idle while they wait: three consumers of 64 rows (192-row tiles,
  // FA3's tile there) taking tiles from the counter (session 44, H100, against the default
  // then: no mask +4-26% from S = 1k (475 -> 534 TFLOP/s at 16k), equal at 512; causal +3-11%
  // from S = 4096, equal at 2048 and -15-18% at 512-1024, where the larger tiles balance worse;
  // the tuner at 200 keys, 80 heads: 23% slower than two consumers).
  // FPAT_FLASH=<BN>[s][p][r][d][t] asks for another (an experiment's knob: "s" runs the blocks
  // one after the other, "p" makes the consumers take turns, "r" keeps one CTA resident per SM
  // that walks the tiles, "d" with "r" hands the tiles out as CTAs become free, "t" has three
  // consumers of 64 rows where the head dimension is 64 and blocks have at most 128 keys);
  // `chosen` (the tuner's) comes before both.
  if (chosen)
    return fitted(*chosen, s);
  if (std::optional<FlashConfig> f = flashFromEnvironment())
    return fitted(*f, s);
  FlashConfig f;
  f.consumers = s.headDim == 64 && s.sk >= (mask == FlashMask::Causal ? 4096 : 512) ? 3 : 2;
  f.dynamic = mask == FlashMask::Causal || f.consumers == 3;
  return fitted(f, s);
}

KernelUnit generateFlashAttention(const ir::Graph& g, ir::Vertex v, const CodegenOptions& o,
                                  const ir::AttnShape& s, const int64_t (&bias)[4],
                                  FlashMask mask) {
  const FlashConfig f = flashConfig(s, mask, o.flash);
  const int64_t d = s.headDim;
  const int bn = f.bn, consumers = f.consumers;
  const bool overlap = f.overlap, pingpong = f.pingpong, resident = f.resident, dynamic = f.dynamic;
  const int bm = 64 * consumers, threads = 128 * (consumers + 1);
  const int smemBytes = static_cast<int>(flashSmem(d, bm, bn));
  KernelUnit u = attentionUnit(g, v, s);
  const std::string tile = f.str();
  u.name = "fpat_flash_attention_" + flashSizesName(s, mask, bias) + "_sm90a_" + tile;
  std::ostringstream body;
  body << header("attention (flash attention)", o,
                 headerLines("sm_90a: TMA, wgmma for Q K^T and P V, online softmax in registers", s,
                             mask,
                             std::to_string(bm) + " query rows x " + std::to_string(bn) +
                                 " keys, " + std::to_string(consumers) + " consumers, " +
                                 (overlap ? "softmax overlapped with P V" : "blocks in sequence") +
                                 (pingpong ? ", consumers taking turns" : "") +
                                 (resident ? ", one CTA per SM walking the tiles" : "") +
                                 (dynamic ? " as they become free" : "")))
       << "#include \"fpat_flash.cuh\"\n\nnamespace {\n\n"
       << dimsStruct(g, v, s, mask, bias, "") << "\nusing Tile = fpat::FlashTile<" << d << ", "
       << bn << ", " << (overlap ? "true" : "false") << ", " << (pingpong ? "true" : "false")
       << ", " << (resident ? "true" : "false") << ", " << (dynamic ? "true" : "false") << ", "
       << consumers << ">;\n\n} // namespace\n\n"
       << "extern \"C\" __global__ void __launch_bounds__(" << threads << ", 1)\n"
       << u.name << "(const __grid_constant__ FpatTmaArgs p) {\n"
       << "  fpat::flashAttention<Dims, Tile>(p);\n}\n";
  Launch l{Launch::Fixed, u.name, threads, smemBytes, {}};
  l.blocks[0] = (s.sq + bm - 1) / bm;
  l.blocks[1] = s.heads;
  l.blocks[2] = s.batch;
  if (resident) {
    l.blocks[0] = std::min<int64_t>(l.blocks[0] * s.heads * s.batch, std::max(1, o.sms));
    l.blocks[1] = l.blocks[2] = 1;
  }
  if (dynamic)
    u.scratchBytes = 2 * sizeof(unsigned); // fpat::flashNextTile's counters
  // q, k and v through TMA maps whose rows may be wider than the heads (column views).
  const AttnPitches pitch = attnPitches(g, v);
  l.tma = {TmaMap{0, s.heads * d, s.batch * s.sq, 64, bm}, kvMap(1, s, bn), kvMap(2, s, bn)};
  l.tma[0].pitch = pitch.q;
  l.tma[1].pitch = pitch.k;
  l.tma[2].pitch = pitch.v;
  u.launches.push_back(l);
  u.source = body.str();
  return u;
}

bool flashDecodeFits(const ir::AttnShape& s) {
  return s.heads / s.kvHeads * s.sq <= kDecodeRows;
}

std::optional<DecodeAppend> decodeAppend(const ir::Graph& g, ir::Vertex attention,
                                         const CodegenOptions& o, std::string* whyNot) {
  auto no = [&](const std::string& why) -> std::optional<DecodeAppend> {
    if (whyNot)
      *whyNot = why;
    return std::nullopt;
  };
  if (g.op(attention).kind != ir::OpKind::Attention || !o.appendInDecode)
    return no("");
  std::string why;
  const std::optional<ir::AttnShape> s = ir::attnShape(g, attention, why);
  if (!s || !flashAttentionFits(*s, o.arch) || !flashDecodeFits(*s))
    return no(""); // not the decode kernel
  const std::vector<ir::Vertex> ins = g.operands(attention);
  // The caches K and V come from: the operands themselves (head-major), or the kv_append {batch}
  // whose columns they are (token-major rows).
  auto cacheOf = [&](ir::Vertex x) -> std::optional<ir::Vertex> {
    if (s->kvHeadMajor)
      return g.op(x).kind == ir::OpKind::KvAppend ? std::optional<ir::Vertex>(x) : std::nullopt;
    if (g.op(x).kind != ir::OpKind::Slice || !ir::isColumnView(g, x))
      return std::nullopt;
    const ir::Vertex c = g.operands(x).at(0);
    return g.op(c).kind == ir::OpKind::KvAppend && g.op(c).batch > 0 ? std::optional<ir::Vertex>(c)
                                                                     : std::nullopt;
  };
  const std::optional<ir::Vertex> ck = cacheOf(ins.at(1)), cv = cacheOf(ins.at(2));
  if (!ck || !cv)
    return no(""); // no kv_append's cache: nothing to write
  // Off unless FPAT_DECODE_APPEND=1 until the kernel has run on a GPU (session 54 was lent
  // none): then on by default, FPAT_DECODE_APPEND=0 the experiment's knob to keep the copies.
  if (const char* env = std::getenv("FPAT_DECODE_APPEND"); !env || std::string(env) != "1")
    return no("the decode kernel writes the caches only with FPAT_DECODE_APPEND=1 for now");
  DecodeAppend d{*ck, *cv, 0, 0, !s->kvHeadMajor, 0, 0};
  if (ins[1] == ins[2])
    return no("k and v are one value");
  if (d.rows) {
    // Each column view read by this attention alone, and every column of the caches read.
    for (ir::Vertex x : {ins[1], ins[2]})
      for (ir::Vertex u : g.users(x))
        if (u != attention)
          return no(ref(g, x) + " is also read by " + ref(g, u));
    d.kCol = g.op(ins[1]).begin;
    d.vCol = g.op(ins[2]).begin;
    const int64_t kEnd = g.op(ins[1]).end, vEnd = g.op(ins[2]).end;
    const int64_t kw = g.op(d.k).type.shape.back(), vw = g.op(d.v).type.shape.back();
    const bool covered = d.k == d.v ? (d.kCol == 0 && kEnd == d.vCol && vEnd == kw) ||
                                          (d.vCol == 0 && vEnd == d.kCol && kEnd == kw)
                                    : d.kCol == 0 && kEnd == kw && d.vCol == 0 && vEnd == vw;
    if (!covered)
      return no("k and v do not cover every column of " + ref(g, d.k) +
                (d.k == d.v ? "" : " and " + ref(g, d.v)));
  }
  for (ir::Vertex c : {d.k, d.v}) {
    const ir::Op& op = g.op(c);
    if (!d.rows && op.batch != 0)
      return no(ref(g, c) + " holds token rows (kv_append {batch})");
    // Read by this attention alone (once; or through its column views), and by the graph's
    // outputs.
    for (ir::Vertex u : g.users(c))
      if (d.rows ? u != ins[1] && u != ins[2] : u != attention)
        return no(ref(g, c) + " is also read by " + ref(g, u));
    if (!d.rows && g.users(c).size() != 1)
      return no(ref(g, c) + " is read twice by " + ref(g, attention));
    const ir::KvAppendDims k =
        ir::kvAppendDims(op, g.op(g.operands(c).at(0)).type.shape, op.type.shape);
    if (c == d.k) {
      d.past = k.past;
      d.fresh = k.fresh;
    } else if (k.past != d.past || k.fresh != d.fresh) {
      return no("the key and value caches differ in length");
    }
  }
  // The new tokens fill one 64-key tile, read once (fpat::flashDecode), after at least one of
  // the cache's.
  if (d.past < 1)
    return no("the past caches are empty");
  if (d.fresh < 1 || d.fresh > 64)
    return no(std::to_string(d.fresh) + " new tokens (the kernel takes 1 to 64)");
  return d;
}

std::optional<ir::Vertex> appendedBy(const ir::Graph& g, ir::Vertex v, const CodegenOptions& o,
                                     std::string* whyNot) {
  if (g.op(v).kind != ir::OpKind::KvAppend)
    return std::nullopt;
  std::vector<ir::Vertex> readers; // the attention ops reading it, or its column views
  for (ir::Vertex u : g.users(v)) {
    readers.push_back(u);
    if (g.op(u).kind == ir::OpKind::Slice) {
      const std::vector<ir::Vertex> more = g.users(u);
      readers.insert(readers.end(), more.begin(), more.end());
    }
  }
  for (ir::Vertex u : readers) {
    std::string why;
    if (const std::optional<DecodeAppend> d = decodeAppend(g, u, o, &why);
        d && (d->k == v || d->v == v))
      return u;
    if (whyNot && !why.empty())
      *whyNot = why;
  }
  return std::nullopt;
}

KernelUnit generateFlashDecode(const ir::Graph& g, ir::Vertex v, const CodegenOptions& o,
                               const ir::AttnShape& s, const int64_t (&bias)[4], FlashMask mask) {
  const int64_t d = s.headDim, rows = s.heads / s.kvHeads * s.sq;
  const std::optional<DecodeAppend> append = decodeAppend(g, v, o);
  // Keys the tensor maps read a head: the past rows where the kernel appends the new ones.
  const int64_t mapped = append ? append->past : s.sk;
  // Splits of the keys (FlashAttention-3's rule): the fewest whose last wave of CTAs (two fit
  // an SM: 3 stages of 64-key K and V tiles) is at least 85% as full as the best count's, each
  // split at least one tile, none empty. Session 34: 3 splits of 128 (batch, KV head) units,
  // 1.45 waves, read the cache at 3.2 TB/s; this rule's 2 splits (one wave) at 3.9.
  const int64_t tiles = (mapped + 63) / 64, units = s.batch * s.kvHeads;
  const int64_t slots = 2 * std::max(1, o.sms), most = std::min<int64_t>(tiles, 256);
  auto fill = [&](int64_t n) {
    const int64_t ctas = units * n;
    return static_cast<double>(ctas) / static_cast<double>((ctas + slots - 1) / slots * slots);
  };
  double best = 0;
  for (int64_t n = 1; n <= most; ++n)
    best = std::max(best, fill(n));
  int64_t splits = 1;
  while (splits < most && fill(splits) < 0.85 * best)
    ++splits;
  // FPAT_DECODE_SPLITS=n asks for n splits instead (an experiment's knob), at most one a tile
  // and 4096 (the merge's shared memory).
  if (const char* env = std::getenv("FPAT_DECODE_SPLITS"); env && std::atoi(env) > 0)
    splits = std::min<int64_t>({std::atoi(env), tiles, 4096});
  const int64_t splitTiles = (tiles + splits - 1) / splits;
  splits = (tiles + splitTiles - 1) / splitTiles;
  KernelUnit u = attentionUnit(g, v, s);
  const AttnPitches pitch = attnPitches(g, v); // q read by loads, k and v by TMA
  // Where the kernel writes the caches: the new tokens' rows, token-major (ir::rowPitch: in
  // place in a QKV projection), in[7] and in[8] after the past caches in[5] and in[6].
  int64_t newPitch[2] = {0, 0};
  std::string appendName;
  std::vector<std::string> lines =
      headerLines("sm_90a: split keys, TMA, mma.sync", s, mask,
                  std::to_string(rows) + " query rows per KV head, 64-key tiles, " +
                      std::to_string(splits) + " splits of " + std::to_string(splitTiles) +
                      " tiles" + (splits > 1 ? ", merged by a second launch" : ""));
  // Token-major caches (append->rows): rows of the caches' width; head-major: of d.
  int64_t cachePitch[2] = {d, d}, pastPitch[2] = {d, d};
  if (append) {
    const std::vector<ir::Vertex> kIns = g.operands(append->k), vIns = g.operands(append->v);
    newPitch[0] = ir::rowPitch(g, kIns.at(1));
    newPitch[1] = ir::rowPitch(g, vIns.at(1));
    if (append->rows) {
      cachePitch[0] = g.op(append->k).type.shape.back();
      cachePitch[1] = g.op(append->v).type.shape.back();
      pastPitch[0] = ir::rowPitch(g, kIns.at(0));
      pastPitch[1] = ir::rowPitch(g, vIns.at(0));
    }
    u.extraIns = {kIns.at(0), vIns.at(0), kIns.at(1), vIns.at(1)};
    u.writesOperands = {1, 2};
    appendName =
        "_append" + std::to_string(append->past) +
        (append->rows
             ? "_rows" + std::to_string(append->kCol) + "_" + std::to_string(append->vCol) + "_" +
                   std::to_string(cachePitch[0]) + "_" + std::to_string(cachePitch[1])
             : "");
    if (newPitch[0] != s.kvHeads * d || newPitch[1] != s.kvHeads * d)
      appendName += "_n" + std::to_string(newPitch[0]) + "_" + std::to_string(newPitch[1]);
    const std::string caches = append->k == append->v
                                   ? ref(g, append->k)
                                   : ref(g, append->k) + " and " + ref(g, append->v);
    lines.push_back("appends:  writes " + caches + " (kv_append: " + std::to_string(append->past) +
                    " cached rows, " + std::to_string(append->fresh) + " new, a " +
                    (append->rows ? "sequence, token-major" : "head") + ") as it reads them");
    u.what += ", writing " + caches;
  }
  u.name = "fpat_flash_decode_" + flashSizesName(s, mask, bias) + pitch.suffix() + appendName +
           "_s" + std::to_string(splits) + "_sm90a";
  std::ostringstream body;
  body << header("attention (flash decode)", o, lines)
       << "#include \"fpat_flash.cuh\"\n\nnamespace {\n\n"
       << dimsStruct(
              g, v, s, mask, bias,
              "  static constexpr int kSplits = " + std::to_string(splits) +
                  ", kSplitTiles = " + std::to_string(splitTiles) + ";\n" + pitch.members() +
                  "  static constexpr bool kAppend = " + (append ? "true" : "false") +
                  "; // the kernel writes k and v (kv_append's caches)\n" +
                  "  static constexpr int64_t P = " + std::to_string(mapped) + ", kNewPitch = " +
                  std::to_string(newPitch[0]) + ", vNewPitch = " + std::to_string(newPitch[1]) +
                  "; // keys a head in the maps; the new rows' pitches\n" +
                  "  static constexpr bool kCacheRows = " +
                  (append && append->rows ? "true" : "false") +
                  "; // the caches token-major [B*Sk, E], not [B, Hkv, Sk, d]\n" +
                  "  static constexpr int64_t kCachePitch = " + std::to_string(cachePitch[0]) +
                  ", vCachePitch = " + std::to_string(cachePitch[1]) +
                  ", kCol = " + std::to_string(append ? append->kCol : 0) +
                  ", vCol = " + std::to_string(append ? append->vCol : 0) +
                  "; // cache rows' pitches; K's and V's first columns in them\n")
       << "\nusing Tile = fpat::DecodeTile<" << d << ">;\n\n} // namespace\n\n"
       << "extern \"C\" __global__ void __launch_bounds__(160)\n"
       << u.name << "(const __grid_constant__ FpatTmaArgs p) {\n"
       << "  fpat::flashDecode<Dims, Tile>(p);\n}\n";
  // fpat::DecodeTile::SMEM_BYTES: three stages of 64-key K and V tiles, and alignment.
  const int smemBytes = static_cast<int>(3 * 2 * 64 * d * 2 + 1024);
  Launch l{Launch::Fixed, u.name, 160, smemBytes, {}};
  l.blocks[0] = splits;
  l.blocks[1] = s.kvHeads;
  l.blocks[2] = s.batch;
  l.tma = {kvMap(1, s, 64), kvMap(2, s, 64)};
  l.tma[0].pitch = pitch.k;
  l.tma[1].pitch = pitch.v;
  if (append && !append->rows) { // the past caches [B, Hkv, P, d], rows of d
    l.tma[0] = TmaMap{5, d, s.batch * s.kvHeads * mapped, 64, 64};
    l.tma[1] = TmaMap{6, d, s.batch * s.kvHeads * mapped, 64, 64};
  } else if (append) { // token-major [B*P, E]: K and V from their columns kCol and vCol
    l.tma[0] = TmaMap{5, cachePitch[0], s.batch * mapped, 64, 64};
    l.tma[1] = TmaMap{6, cachePitch[1], s.batch * mapped, 64, 64};
    l.tma[0].pitch = pastPitch[0];
    l.tma[1].pitch = pastPitch[1];
  }
  u.launches.push_back(l);
  if (splits > 1) {
    body << "\nextern \"C\" __global__ void __launch_bounds__(" << d << ")\n"
         << u.name << "_merge(const FpatKernelArgs a) {\n"
         << "  fpat::flashDecodeCombine<Dims>(a);\n}\n";
    // Launched to overlap the splits' tail (programmatic dependent launch): its CTAs wait in
    // fpat::waitPriorGrid for the partial results.
    Launch m{Launch::Fixed, u.name + "_merge", static_cast<int>(d), 0, {}};
    m.overlapsPrevious = true;
    m.blocks[0] = rows;
    m.blocks[1] = s.kvHeads;
    m.blocks[2] = s.batch;
    u.launches.push_back(m);
    u.scratchBytes = static_cast<size_t>(units * splits * rows * (d + 2)) * sizeof(float);
  }
  u.source = body.str();
  return u;
}

} // namespace fpat::codegen::detail

namespace fpat::codegen {

std::optional<FlashTuning> flashTuning(const ir::Graph& g, ir::Vertex v, int arch) {
  const ir::Op& op = g.op(v);
  if (op.kind != ir::OpKind::Attention)
    return std::nullopt;
  const std::vector<ir::Vertex> ins = g.operands(v);
  std::string why;
  const std::optional<ir::AttnShape> s = ir::attnShape(g, v, why);
  if (!s || !detail::flashAttentionFits(*s, arch))
    return std::nullopt;
  const detail::FlashMask mask = detail::flashMask(g, ins[3], *s);
  if (detail::flashDecodeFits(*s))
    return std::nullopt;
  FlashTuning t;
  t.m = s->batch * s->sq;
  t.n = s->heads * s->headDim;
  t.k = s->sk;
  // What the kernel's source depends on besides its configuration: the sizes and mask (its
  // name), the bias's strides, the element type and whether the scale is a positive constant.
  const ir::Op& scale = g.op(ins[4]);
  const std::array<int64_t, 4> st = detail::broadcastStrides(g.op(ins[3]).type.shape);
  const int64_t bias[4] = {st[0], st[1], st[2], st[3]};
  t.signature = "flash_attention_" + detail::flashSizesName(*s, mask, bias) + "_" +
                ir::dtypeName(op.type.dtype) +
                (scale.kind == ir::OpKind::Constant && scale.value > 0 ? "" : "_scale");
  // The heuristic's first; then blocks of 128 and 176 keys (FA3's d 128 tile), two consumers
  // and three (d 64), tiles walked in a fixed stride and from the counter, and with a causal
  // mask one CTA a tile (the hardware's balance). Each made what the kernel implements here.
  t.candidates.push_back(detail::flashConfig(*s, mask, nullptr));
  t.forced = detail::flashFromEnvironment().has_value();
  auto add = [&](const FlashConfig& f) {
    const FlashConfig c = detail::fitted(f, *s);
    if (std::find(t.candidates.begin(), t.candidates.end(), c) == t.candidates.end())
      t.candidates.push_back(c);
  };
  for (int consumers : {2, 3})
    for (int bn : {128, 176})
      for (bool counter : {false, true})
        add({bn, consumers, true, true, true, counter});
  if (mask == detail::FlashMask::Causal)
    add({128, 2, true, true, false, false});
  return t;
}

} // namespace fpat::codegen
