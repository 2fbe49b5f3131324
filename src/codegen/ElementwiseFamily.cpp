// Code generators of the kernels for ops that no GEMM absorbed: row-wise norms and elementwise
// ops (activation bodies lowered from .fpat).
#include "fpat/codegen/Lowering.h"

#include <sstream>

namespace fpat::codegen::detail {

KernelUnit generateRowwise(const ir::Graph& g, ir::Vertex v, const CodegenOptions& o) {
  const ir::Op& op = g.op(v);
  KernelUnit u;
  const std::string arch = "sm" + std::to_string(o.arch);
  std::ostringstream body;
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

KernelUnit generateElementwise(const ir::Graph& g, ir::Vertex v, const dsl::PatternLibrary& lib,
                               const CodegenOptions& o) {
  const ir::Op& op = g.op(v);
  KernelUnit u;
  const std::vector<ir::Vertex> ins = g.operands(v);
  const std::string arch = "sm" + std::to_string(o.arch);
  ActivationCode acts;
  std::ostringstream body;
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

} // namespace fpat::codegen::detail
