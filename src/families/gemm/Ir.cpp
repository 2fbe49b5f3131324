// The GEMM families' IR part (gemm, norm_gemm, dual_gemm, norm_dual_gemm): one or two GEMMs
// on one A, which is an input or the layernorm / rmsnorm of one. Main operands: gemm A, B;
// norm_gemm x, gamma[, beta], B; the dual families Bg, Bu for B.
#include "Gemm.h"
#include "fpat/ir/Reference.h"

#include <memory>

namespace fpat::families {

namespace {
using namespace ir;
using ir::detail::gemmProduct;
using ir::detail::normRows;

class GemmFamily final : public KernelFamily {
public:
  GemmFamily(Family id, const char* name)
      : KernelFamily(id, name), normalisesA(gemm::kindOf(id).normalisesA),
        gemms(gemm::kindOf(id).gemms) {}

  size_t bIndex(const Op& op) const override {
    if (!normalisesA)
      return 1;
    return op.fused.norm == "layernorm" ? 3 : 2;
  }
  size_t mainOperandCount(const Op& op) const override {
    return bIndex(op) + static_cast<size_t>(gemms);
  }

  std::optional<FamilyError> check(const Op& op, const std::vector<OperandInfo>& in,
                                   MainShape& shape) const override {
    auto fail = [](int operand, std::string message) {
      return std::optional<FamilyError>(FamilyError{operand, std::move(message)});
    };
    const FusedAttrs& f = op.fused;
    const bool norm = normalisesA;
    if (norm != !f.norm.empty() || (norm && f.norm != "layernorm" && f.norm != "rmsnorm"))
      return fail(-1, norm ? "a " + f.family + " op needs norm = layernorm or norm = rmsnorm"
                           : "norm = " + f.norm + " belongs to family norm_gemm, not " + f.family);
    // Main operands: gemm A, B; norm_gemm x, gamma[, beta], B; the dual families Bg, Bu for B.
    const size_t bIdx = bIndex(op), mains = mainOperandCount(op);
    if (in.size() < mains)
      return fail(-1, "family " + f.family + (norm ? " (" + f.norm + ")" : "") + " takes " +
                          std::to_string(mains) + " main operands but was given " +
                          std::to_string(in.size()));
    if (in[0].type.rank() != 2)
      return fail(0, "the GEMM's operands must be 2-D");
    const int64_t m = in[0].type.shape[0], k = in[0].type.shape[1];
    int64_t cols = -1;
    for (size_t b = bIdx; b < mains; ++b) {
      if (in[b].type.rank() != 2)
        return fail(static_cast<int>(b), "the GEMM's operands must be 2-D");
      const std::vector<int64_t>& bs = in[b].type.shape;
      if ((op.transposeB ? bs[1] : bs[0]) != k)
        return fail(static_cast<int>(b), operandRef(in, b) +
                                             " does not fit operand 0's K = " + std::to_string(k) +
                                             (op.transposeB ? " (B is [N, K])" : " (B is [K, N])"));
      const int64_t bn = op.transposeB ? bs[0] : bs[1];
      if (cols >= 0 && bn != cols)
        return fail(static_cast<int>(b), operandRef(in, b) + " has N = " + std::to_string(bn) +
                                             ", the first GEMM's B N = " + std::to_string(cols) +
                                             ": the two GEMMs' results must have one shape");
      cols = bn;
    }
    for (size_t i = 1; i < bIdx; ++i)
      if (in[i].type.shape != std::vector<int64_t>{k})
        return fail(static_cast<int>(i),
                    operandRef(in, i) + " must have shape [" + std::to_string(k) + "]");
    if (gemms == 2 && (!f.epilogue.readsSecondAcc() || checkEpilogueStructure(f.epilogue) ==
                                                           "the epilogue does not use "
                                                           "the accumulator (acc)"))
      return fail(-1, "family " + f.family +
                          " computes two GEMMs: its epilogue must read both "
                          "accumulators, acc and acc2 (e.g. epilogue = \"mul(silu(acc), acc2)\")");
    if (gemms == 1 && f.epilogue.readsSecondAcc())
      return fail(-1, "the epilogue reads acc2, the second GEMM's accumulator, which only the "
                      "dual families (dual_gemm, norm_dual_gemm) compute");
    shape = {m, cols, k};
    return std::nullopt;
  }

  void accumulate(const Op& op, const std::function<const Tensor&(size_t)>& operand,
                  const MainShape& shape, std::vector<double>& acc,
                  std::vector<double>& acc2) const override {
    const auto m = static_cast<size_t>(shape.m), n = static_cast<size_t>(shape.n),
               k = static_cast<size_t>(shape.k);
    const Tensor* a = &operand(0);
    Tensor normed;
    if (normalisesA) {
      const bool layer = op.fused.norm == "layernorm";
      if (!layer && op.fused.norm != "rmsnorm")
        throw ReferenceError("fused op %" + op.name + " of family " + name + " has no norm kind");
      const Tensor& x = operand(0);
      normed = Tensor{x.desc, std::vector<float>(x.data.size())};
      normRows(x, operand(1), layer ? &operand(2) : nullptr, op.eps, /*rms=*/!layer, normed);
      a = &normed;
    }
    const size_t b = bIndex(op);
    acc = gemmProduct(*a, operand(b), op.transposeB, m, n, k);
    // The dual families: the second GEMM, on the same A, read as acc2.
    if (gemms == 2)
      acc2 = gemmProduct(*a, operand(b + 1), op.transposeB, m, n, k);
  }

private:
  const bool normalisesA;
  const int gemms;
};

} // namespace

std::unique_ptr<ir::KernelFamily> gemmIr(ir::Family id, const char* familyName) {
  return std::make_unique<GemmFamily>(id, familyName);
}

} // namespace fpat::families
