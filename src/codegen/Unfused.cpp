// Code generators of the kernels for ops that no GEMM absorbed: row-wise norms, means and
// softmax, and elementwise ops (activation bodies lowered from .fpat).
#include "fpat/codegen/Lowering.h"
#include "fpat/support/Hash.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <sstream>

namespace fpat::codegen::detail {

/// The most 16-byte words a lane holds of a norm's row (fpat_rowwise.cuh's normRowsHeld).
constexpr int64_t kNormHeldWords = 32;

KernelUnit generateRowwise(const ir::Graph& g, ir::Vertex v, const CodegenOptions& o) {
  const ir::Op& op = g.op(v);
  KernelUnit u;
  const std::string arch = "sm" + std::to_string(o.arch);
  std::ostringstream body;
  const bool layer = op.kind == ir::OpKind::LayerNorm;
  const bool mean = op.kind == ir::OpKind::ReduceMean;
  const bool softmax = op.kind == ir::OpKind::Softmax;
  // M rows of N elements: the operand's for a reduction, the result's for a norm.
  const ir::TensorDesc& rows = mean ? g.op(g.operands(v)[0]).type : op.type;
  u.family = "rowwise";
  u.N = rows.shape.back();
  u.M = rows.numel() / u.N; // every dimension but the last is rows
  u.eps = static_cast<float>(op.eps);
  // A norm's row held in registers, V 16-byte words a lane, where the row is 16-byte words
  // and V is at most 32 (N <= 8192: every model's hidden size we meet); longer or odd rows
  // loop over memory.
  const int64_t words = u.N % 8 == 0 ? u.N / 8 : 0;
  const int64_t held =
      !mean && !softmax && words > 0 && words <= 32 * kNormHeldWords ? (words + 31) / 32 : 0;
  u.name = std::string("fpat_") +
           (mean      ? "reduce_mean"
            : softmax ? "softmax"
            : layer   ? "layernorm"
                      : "rmsnorm") +
           (held ? "_held" + std::to_string(held) : "") + "_" + arch;
  u.what = ref(g, v) + " = " + ir::opKindName(op.kind);
  const std::string tf = layer ? "true" : "false";
  body << header(std::string(ir::opKindName(op.kind)) + " (not fused)", o,
                 {held ? "family:   rowwise (one warp per row held in registers, " +
                             std::to_string(held) + " 16-byte words a lane, f32 statistics)"
                  : softmax ? "family:   rowwise (one warp per row, f32 maximum and sum)"
                            : "family:   rowwise (one warp per row, f32 statistics)"})
       << "#include \"fpat_rowwise.cuh\"\n\n"
       << "extern \"C\" __global__ void __launch_bounds__(256) " << u.name
       << "(const FpatKernelArgs a) {\n  fpat::"
       << (mean      ? std::string("meanRows(a)")
           : softmax ? std::string("softmaxRows(a)")
           : held    ? "normRowsHeld<" + tf + ", " + std::to_string(held) + ">(a)"
                     : "normRows<" + tf + ">(a)")
       << ";\n}\n";
  u.launches.push_back({Launch::Rows, u.name, 256, 0, {}});
  u.source = body.str();
  return u;
}

/// The element strides of an operand of shape `s` over a rank-4 result it broadcasts to
/// (NumPy: trailing dimensions aligned; 0 where it repeats).
std::array<int64_t, 4> broadcastStrides(const std::vector<int64_t>& s) {
  std::array<int64_t, 4> strides = {0, 0, 0, 0};
  int64_t step = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    const size_t d = s.size() - 1 - i;
    strides[3 - i] = s[d] == 1 ? 0 : step;
    step *= s[d];
  }
  return strides;
}

namespace {

/// `struct Bcast` of a generated kernel: the result's shape padded to rank 4 and, in
/// `at(k, i)`, operand k's element index for element i of the result (NumPy broadcasting).
std::string broadcastStruct(const ir::TensorDesc& out, const std::vector<ir::TensorDesc>& ins) {
  std::vector<int64_t> shape = out.shape;
  while (shape.size() < 4)
    shape.insert(shape.begin(), 1);
  std::ostringstream st;
  st << "struct Bcast {\n  // the result's shape " << out.shapeStr()
     << ", each operand's element strides over it (0: broadcast)\n"
     << "  __device__ static int64_t at(int k, int64_t i) {\n"
     << "    const int64_t i3 = i % " << shape[3] << ", i2 = i / " << shape[3] << " % " << shape[2]
     << ", i1 = i / " << shape[3] * shape[2] << " % " << shape[1] << ", i0 = i / "
     << shape[3] * shape[2] * shape[1] << ";\n";
  for (size_t k = 0; k < ins.size(); ++k) {
    const std::array<int64_t, 4> strides = broadcastStrides(ins[k].shape);
    st << "    " << (k + 1 < ins.size() ? "if (k == " + std::to_string(k) + ") " : "")
       << "return i0 * " << strides[0] << " + i1 * " << strides[1] << " + i2 * " << strides[2]
       << " + i3 * " << strides[3] << ";\n";
  }
  st << "  }\n};\n\n";
  return st.str();
}

} // namespace

KernelUnit generateElementwise(const ir::Graph& g, ir::Vertex v, dsl::Activations defs,
                               const CodegenOptions& o) {
  const ir::Op& op = g.op(v);
  KernelUnit u;
  const std::vector<ir::Vertex> ins = g.operands(v);
  const std::string arch = "sm" + std::to_string(o.arch);
  ActivationCode acts;
  std::ostringstream body;
  // Elementwise: bias_add, activation and the broadcasting binary ops.
  u.family = "elementwise";
  u.N = op.type.rank() >= 1 ? op.type.shape.back() : 1;
  u.M = op.type.numel() / u.N;
  std::string expr, kinds, suffix;
  // How each operand broadcasts to the result (NumPy rules, ranks <= 2).
  auto inputKind = [&](size_t k) -> std::string {
    const ir::TensorDesc& t = g.op(ins[k]).type;
    if (t.shape == op.type.shape)
      return "FPAT_IN_FULL";
    if (t.numel() == 1)
      return "FPAT_IN_SCALAR";
    if (op.type.rank() > 2)
      return "FPAT_IN_ROWVEC"; // a trailing block of the result, repeated (below)
    if (t.shape.back() == 1)
      return "FPAT_IN_COLVEC";
    return "FPAT_IN_ROWVEC";
  };
  // Rank 3 and 4 (attention's scores, masks, heads): an operand that is the result's trailing
  // dimensions (leading 1s aside), e.g. a [1, 1, Sq, Sk] mask over [B, H, Sq, Sk], repeats
  // every numel(operand) elements, and the kernel's rows are that long. Any other broadcast
  // (RoPE's [1, S, 1, d] tables over [B, S, H, d]) indexes each operand through its strides.
  std::string general; // the strides struct of a general broadcast, or empty
  if (op.type.rank() > 2) {
    int64_t period = 0;
    bool trailingOnly = true;
    for (ir::Vertex w : ins) {
      const ir::TensorDesc& t = g.op(w).type;
      if (t.shape == op.type.shape || t.numel() == 1)
        continue;
      std::vector<int64_t> core = t.shape;
      while (!core.empty() && core.front() == 1)
        core.erase(core.begin());
      const bool trailing = core.size() <= op.type.shape.size() &&
                            std::equal(core.begin(), core.end(),
                                       op.type.shape.end() - static_cast<long>(core.size()));
      const int64_t n = t.numel();
      trailingOnly = trailingOnly && trailing && !(period && period != n);
      period = n;
    }
    if (trailingOnly && period) {
      u.N = period;
      u.M = op.type.numel() / period;
    } else if (!trailingOnly) {
      std::vector<ir::TensorDesc> types;
      for (ir::Vertex w : ins)
        types.push_back(g.op(w).type);
      general = broadcastStruct(op.type, types);
      u.N = op.type.shape.back();
      u.M = op.type.numel() / u.N;
    }
  }
  auto binaryKinds = [&] {
    const std::string k0 = inputKind(0), k1 = inputKind(1);
    return k0 == k1 ? k0 : "k == 0 ? " + k0 + " : " + k1;
  };
  switch (op.kind) {
  case ir::OpKind::BiasAdd:
    expr = "in[0] + in[1]";
    kinds = "k == 1 ? FPAT_IN_ROWVEC : FPAT_IN_FULL";
    suffix = "bias_add";
    break;
  case ir::OpKind::Add:
  case ir::OpKind::Mul:
  case ir::OpKind::Sub:
  case ir::OpKind::Div:
  case ir::OpKind::Pow:
  case ir::OpKind::Max:
  case ir::OpKind::Min: {
    // Max and Min pass NaN on, as the reference does (fmaxf would drop it).
    static const std::map<ir::OpKind, std::string> exprs = {
        {ir::OpKind::Add, "in[0] + in[1]"},
        {ir::OpKind::Mul, "in[0] * in[1]"},
        {ir::OpKind::Sub, "in[0] - in[1]"},
        {ir::OpKind::Div, "in[0] / in[1]"},
        {ir::OpKind::Pow, "powf(in[0], in[1])"},
        {ir::OpKind::Max, "in[0] != in[0] || in[0] > in[1] ? in[0] : in[1]"},
        {ir::OpKind::Min, "in[0] != in[0] || in[0] < in[1] ? in[0] : in[1]"}};
    expr = exprs.at(op.kind);
    kinds = binaryKinds();
    suffix = ir::opKindName(op.kind);
    // Each broadcast is its own kernel (the runtime loads kernels by name).
    if (!general.empty())
      suffix += "_bcast_" + sha256Hex(general).substr(0, 12);
    else if (inputKind(0) != "FPAT_IN_FULL" || inputKind(1) != "FPAT_IN_FULL")
      for (size_t k = 0; k < 2; ++k)
        suffix += "_" + std::string(1, static_cast<char>(std::tolower(inputKind(k)[8])));
    break;
  }
  case ir::OpKind::Activation:
    expr = callActivation(op.fn, op.params, "in[0]", ref(g, v), defs, acts, "kFma");
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
       << activationFunctions(acts, defs) << (acts.fns.empty() ? "" : "\n")
       << "namespace {\n\nstruct Op {\n"
       << "  static constexpr int kInputs = " << nin << ";\n"
       << "  __host__ __device__ static constexpr int kind(int k) {\n"
       << "    return " << kinds << ";\n  }\n"
       << "  // kFma: exp and division on the FMA pipe (every second element).\n"
       << "  template <bool kFma = false>\n"
       << "  __device__ __forceinline__ float operator()(const float* in,\n"
       << "                                              const FpatKernelArgs& a) const {\n"
       << "    (void)a;\n    return " << expr << ";\n  }\n};\n\n"
       << general << "} // namespace\n\n"
       << "extern \"C\" __global__ void __launch_bounds__(256) " << u.name
       << "(const FpatKernelArgs a) {\n  fpat::"
       << (general.empty() ? "elementwise<Op>(a)" : "broadcastElementwise<Op, Bcast>(a)")
       << ";\n}\n";
  u.launches.push_back({Launch::Elements, u.name, 256, 0, {}});
  u.params = acts.params;
  u.source = body.str();
  return u;
}

KernelUnit generateAttentionOp(const ir::Graph& g, ir::Vertex v, const CodegenOptions& o) {
  const ir::Op& op = g.op(v);
  const std::vector<ir::Vertex> ins = g.operands(v);
  KernelUnit u;
  const std::string arch = "sm" + std::to_string(o.arch);
  std::ostringstream body;
  u.what = ref(g, v) + " = " + ir::opKindName(op.kind);
  if (op.kind == ir::OpKind::Slice) {
    const ir::TensorDesc& in = g.op(ins[0]).type;
    u.family = "elementwise";
    u.N = op.end - op.begin;
    u.M = op.type.numel() / u.N;
    u.name = "fpat_slice_" + std::to_string(in.shape.back()) + "_" + std::to_string(op.begin) +
             "_" + std::to_string(op.end) + "_" + arch;
    body << header("slice (columns " + std::to_string(op.begin) + " to " + std::to_string(op.end) +
                       " of " + std::to_string(in.shape.back()) + ")",
                   o, {"family:   elementwise (a copy, one element per thread)"})
         << "#include \"fpat_attention.cuh\"\n\n"
         << "extern \"C\" __global__ void __launch_bounds__(256) " << u.name
         << "(const FpatKernelArgs a) {\n  fpat::sliceColumns<" << in.shape.back() << ", "
         << op.begin << ", " << u.N << ">(a);\n}\n";
    u.launches.push_back({Launch::Elements, u.name, 256, 0, {}});
    u.source = body.str();
    return u;
  }
  if (op.kind == ir::OpKind::BatchFirst || op.kind == ir::OpKind::SeqFirst) {
    // Rows [lead, rows / lead] written transposed: sequence-first to batch-first or back.
    const bool toBatch = op.kind == ir::OpKind::BatchFirst;
    u.family = "elementwise";
    u.N = op.type.shape.back();
    u.M = op.type.shape[0];
    const int64_t lead = toBatch ? u.M / op.batch : op.batch, other = u.M / lead;
    const std::string sizes = std::to_string(toBatch ? lead : other) + "x" +
                              std::to_string(op.batch) + "_" + std::to_string(u.N);
    u.name = std::string("fpat_") + ir::opKindName(op.kind) + "_" + sizes + "_" + arch;
    body << header(std::string(ir::opKindName(op.kind)) + " (rows of " + std::to_string(u.N) +
                       ": " +
                       (toBatch ? "sequence-first to batch-first"
                                : "batch-first to "
                                  "sequence-first") +
                       ", batch " + std::to_string(op.batch) + ")",
                   o, {"family:   elementwise (a copy of 16-byte pieces where rows allow)"})
         << "#include \"fpat_attention.cuh\"\n\n"
         << "extern \"C\" __global__ void __launch_bounds__(256) " << u.name
         << "(const FpatKernelArgs a) {\n  fpat::transposeRows<" << lead << ", " << other << ", "
         << u.N << ">(a);\n}\n";
    u.launches.push_back({Launch::Elements, u.name, 256, 0, {}});
    u.source = body.str();
    return u;
  }
  if (op.kind == ir::OpKind::KvAppend) {
    std::string copied; // why a decode kernel reading the cache does not write it
    if (const std::optional<ir::Vertex> by = appendedBy(g, v, o, &copied)) {
      u.what =
          ref(g, v) + " = kv_append: no kernel (" + ref(g, *by) + "'s decode kernel writes it)";
      return u;
    }
    if (!copied.empty())
      u.what += " (a copy: " + copied + ")";
    // The cache's rows of each (batch, KV head), then the new tokens' rows of that head (a
    // token-major cache: one head of all its columns).
    const ir::KvAppendDims k = ir::kvAppendDims(op, g.op(ins[0]).type.shape, op.type.shape);
    const int64_t c[4] = {k.batch, k.kvHeads, k.past, k.headDim};
    const int64_t S = k.fresh, pitch = ir::rowPitch(g, ins[1]);
    u.family = "elementwise";
    u.N = c[3];
    u.M = op.type.numel() / u.N;
    u.name = "fpat_kv_append_b" + std::to_string(c[0]) + "_kv" + std::to_string(c[1]) + "_p" +
             std::to_string(c[2]) + "_s" + std::to_string(S) + "_d" + std::to_string(c[3]) +
             (pitch != c[1] * c[3] ? "_p" + std::to_string(pitch) : "") + "_" + arch;
    body << header("kv_append (a cache [" + std::to_string(c[0]) + ", " + std::to_string(c[1]) +
                       ", " + std::to_string(c[2]) + ", " + std::to_string(c[3]) + "] and " +
                       std::to_string(S) + (S == 1 ? " new token" : " new tokens") + " a batch)",
                   o, {"family:   elementwise (a copy of 16-byte pieces where rows allow)"})
         << "#include \"fpat_attention.cuh\"\n\n"
         << "extern \"C\" __global__ void __launch_bounds__(256) " << u.name
         << "(const FpatKernelArgs a) {\n  fpat::appendKv<" << c[0] << ", " << c[1] << ", " << c[2]
         << ", " << S << ", " << c[3] << ", " << pitch << ">(a);\n}\n";
    u.launches.push_back({Launch::Elements, u.name, 256, 0, {}});
    u.source = body.str();
    return u;
  }
  if (op.kind == ir::OpKind::Concat || op.kind == ir::OpKind::Rope) {
    u.family = "elementwise";
    u.N = op.type.shape.back();
    u.M = op.type.numel() / u.N;
    std::string call, what, extra;
    if (op.kind == ir::OpKind::Concat) {
      const int64_t wa = g.op(ins[0]).type.shape.back(), wb = g.op(ins[1]).type.shape.back();
      u.name = "fpat_concat_" + std::to_string(wa) + "_" + std::to_string(wb) + "_" + arch;
      call = "concatColumns<" + std::to_string(wa) + ", " + std::to_string(wb) + ">(a)";
      what = "concat (rows of " + std::to_string(wa) + " and " + std::to_string(wb) + ")";
    } else {
      std::vector<ir::TensorDesc> types;
      for (ir::Vertex w : ins)
        types.push_back(g.op(w).type);
      extra = "namespace {\n\n" + broadcastStruct(op.type, types) + "} // namespace\n\n";
      // x may be (a view of) a column view: its tokens a projection's width apart.
      const int64_t w = ir::rowPitch(g, v), pitch = ir::rowPitch(g, ins[0]);
      u.name = std::string("fpat_rope_") + (op.interleaved ? "pairs_" : "") + std::to_string(u.N) +
               (pitch != w ? "_p" + std::to_string(pitch) : "") + "_" +
               sha256Hex(extra).substr(0, 12) + "_" + arch;
      call = (op.interleaved ? "ropePairs<" : "ropeHalves<") + std::to_string(u.N) + ", " +
             std::to_string(w) + ", " + std::to_string(pitch) + ", Bcast>(a)";
      what = std::string("rope (") + (op.interleaved ? "interleaved" : "rotate_half") +
             " form, rows of " + std::to_string(u.N) + ")";
    }
    body << header(what, o, {"family:   elementwise (one element per thread)"})
         << "#include \"fpat_attention.cuh\"\n\n"
         << extra << "extern \"C\" __global__ void __launch_bounds__(256) " << u.name
         << "(const FpatKernelArgs a) {\n  fpat::" << call << ";\n}\n";
    u.launches.push_back({Launch::Elements, u.name, 256, 0, {}});
    u.source = body.str();
    return u;
  }
  std::string why;
  const std::optional<ir::AttnShape> s = ir::attnShape(g, v, why);
  if (!s)
    throw CodegenError(ref(g, v) + ": " + why);
  // The bias's strides over the scores [B, H, Sq, Sk] (0 where it broadcasts).
  int64_t bias[4] = {0, 0, 0, 0};
  if (op.kind == ir::OpKind::Attention) {
    const std::array<int64_t, 4> st = broadcastStrides(g.op(ins[3]).type.shape);
    std::copy(st.begin(), st.end(), bias);
  }
  if (op.kind == ir::OpKind::Attention && flashAttentionFits(*s, o.arch)) {
    const FlashMask mask = flashMask(g, ins[3], *s);
    return flashDecodeFits(*s) ? generateFlashDecode(g, v, o, *s, bias, mask)
                               : generateFlashAttention(g, v, o, *s, bias, mask);
  }
  const char* kind = op.kind == ir::OpKind::AttnQk   ? "attn_qk"
                     : op.kind == ir::OpKind::AttnPv ? "attn_pv"
                                                     : "attention";
  std::string sizes = "b" + std::to_string(s->batch) + "_h" + std::to_string(s->heads) + "_kv" +
                      std::to_string(s->kvHeads) + "_q" + std::to_string(s->sq) + "_k" +
                      std::to_string(s->sk) + "_d" + std::to_string(s->headDim) +
                      (s->kvHeadMajor ? "_cache" : "");
  const AttnPitches pitch = op.kind == ir::OpKind::Attention ? attnPitches(g, v) : AttnPitches{};
  if (op.kind == ir::OpKind::Attention) {
    for (int64_t b : bias)
      sizes += "_" + std::to_string(b);
    sizes += pitch.suffix();
  }
  u.family = "attention";
  u.name = std::string("fpat_") + kind + "_" + sizes + "_" + arch;
  const bool rows = op.kind == ir::OpKind::Attention;
  u.M = rows ? s->batch * s->heads * s->sq : op.type.numel();
  u.N = rows ? s->headDim : 1;
  body << header(std::string(kind) + " (not fused)", o,
                 {rows ? "family:   attention (CUDA cores: one warp per query row, online softmax "
                         "in f32; not the flash-attention kernel)"
                       : "family:   attention (CUDA cores: one output element per thread)",
                  "sizes:    B " + std::to_string(s->batch) + ", Sq " + std::to_string(s->sq) +
                      ", Sk " + std::to_string(s->sk) + ", H " + std::to_string(s->heads) +
                      ", Hkv " + std::to_string(s->kvHeads) + ", d " + std::to_string(s->headDim)})
       << "#include \"fpat_attention.cuh\"\n\n"
       << "namespace {\n\nstruct Dims {\n"
       << "  static constexpr int64_t B = " << s->batch << ", Sq = " << s->sq << ", Sk = " << s->sk
       << ";\n  static constexpr int64_t H = " << s->heads << ", Hkv = " << s->kvHeads
       << ", Hd = " << s->headDim << ";\n"
       << "  static constexpr int64_t bias0 = " << bias[0] << ", bias1 = " << bias[1]
       << ", bias2 = " << bias[2] << ", bias3 = " << bias[3] << ";\n"
       << "  static constexpr bool kKvHeadMajor = " << (s->kvHeadMajor ? "true" : "false")
       << "; // k and v: caches [B, Hkv, Sk, d], or token-major\n"
       << (op.kind == ir::OpKind::Attention ? pitch.members() : "") << "};\n\n} // namespace\n\n"
       << "extern \"C\" __global__ void __launch_bounds__(256) " << u.name
       << "(const FpatKernelArgs a) {\n  fpat::"
       << (op.kind == ir::OpKind::AttnQk   ? "attnScores"
           : op.kind == ir::OpKind::AttnPv ? "attnValues"
                                           : "attentionRows")
       << "<Dims>(a);\n}\n";
  u.launches.push_back({rows ? Launch::Rows : Launch::Elements, u.name, 256, 0, {}});
  u.source = body.str();
  return u;
}

} // namespace fpat::codegen::detail
