// Code generators of the kernels for ops that no GEMM absorbed: row-wise norms, means and
// softmax, and elementwise ops (activation bodies lowered from .fpat).
#include "fpat/codegen/Lowering.h"

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
  u.M = rows.rank() == 2 ? rows.shape[0] : 1;
  u.N = rows.shape.back();
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
  u.M = op.type.rank() == 2 ? op.type.shape[0] : 1;
  u.N = op.type.rank() >= 1 ? op.type.shape.back() : 1;
  std::string expr, kinds, suffix;
  // How each operand broadcasts to the result (NumPy rules, ranks <= 2).
  auto inputKind = [&](size_t k) -> std::string {
    const ir::TensorDesc& t = g.op(ins[k]).type;
    if (t.shape == op.type.shape)
      return "FPAT_IN_FULL";
    if (t.numel() == 1)
      return "FPAT_IN_SCALAR";
    if (t.shape.back() == 1)
      return "FPAT_IN_COLVEC";
    return "FPAT_IN_ROWVEC";
  };
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
  case ir::OpKind::Pow: {
    static const std::map<ir::OpKind, std::string> exprs = {
        {ir::OpKind::Add, "in[0] + in[1]"},
        {ir::OpKind::Mul, "in[0] * in[1]"},
        {ir::OpKind::Sub, "in[0] - in[1]"},
        {ir::OpKind::Div, "in[0] / in[1]"},
        {ir::OpKind::Pow, "powf(in[0], in[1])"}};
    expr = exprs.at(op.kind);
    kinds = binaryKinds();
    suffix = ir::opKindName(op.kind);
    // Each broadcast is its own kernel (the runtime loads kernels by name).
    if (inputKind(0) != "FPAT_IN_FULL" || inputKind(1) != "FPAT_IN_FULL")
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
       << "    (void)a;\n    return " << expr << ";\n  }\n};\n\n} // namespace\n\n"
       << "extern \"C\" __global__ void __launch_bounds__(256) " << u.name
       << "(const FpatKernelArgs a) {\n  fpat::elementwise<Op>(a);\n}\n";
  u.launches.push_back({Launch::Elements, u.name, 256, 0, {}});
  u.params = acts.params;
  u.source = body.str();
  return u;
}

} // namespace fpat::codegen::detail
