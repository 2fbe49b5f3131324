// Tensor descriptions and fp16 conversions shared by every phase.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace fpat::ir {

enum class DType { F16, F32, BF16 };

const char* dtypeName(DType t);
std::optional<DType> parseDType(std::string_view s);
inline size_t dtypeSize(DType t) {
  return t == DType::F32 ? 4 : 2;
}
/// f16 and bf16: the 16-bit types the GPU kernels take.
inline bool isHalfPrecision(DType t) {
  return t != DType::F32;
}

/// The largest rank of a value.
constexpr int kMaxRank = 4;
/// The largest value of an attention bias (a mask's fill) that masks: a score plus it is at
/// least 1e9 below a kept key's, whose weight the softmax then makes 0 in f32, as -inf's
/// (finfo.min, -inf, Falcon's masked_fill with -1e9). Only a row that keeps no key differs:
/// the fill gives it equal weights, an addition its scores' softmax.
constexpr double kMaskedAtMost = -1e9;

/// Shape (rank 0 to 4, row-major; ranks 3 and 4 are attention's [B, H, Sq, Sk] scores and
/// masks) and element type (f16, f32 or bf16) of a value.
struct TensorDesc {
  std::vector<int64_t> shape;
  DType dtype = DType::F16;

  int rank() const { return static_cast<int>(shape.size()); }
  int64_t numel() const;
  /// `f16[1024, 4096]`
  std::string str() const;
  /// `[1024, 4096]`
  std::string shapeStr() const;
  bool operator==(const TensorDesc& o) const { return shape == o.shape && dtype == o.dtype; }
  bool operator!=(const TensorDesc& o) const { return !(*this == o); }
};

/// IEEE binary16 conversions with round-to-nearest-even; the reference interpreter uses them
/// to give f16 tensors exactly the storage semantics of the GPU.
inline std::ostream& operator<<(std::ostream& os, const TensorDesc& t) {
  return os << t.str();
}
inline std::ostream& operator<<(std::ostream& os, DType t) {
  return os << dtypeName(t);
}

uint16_t doubleToHalfBits(double d);
float halfBitsToFloat(uint16_t h);
inline float roundToHalf(double d) {
  return halfBitsToFloat(doubleToHalfBits(d));
}
/// bfloat16 (8 exponent bits, 8 significand bits), round-to-nearest-even from double.
uint16_t doubleToBf16Bits(double d);
float bf16BitsToFloat(uint16_t h);
/// The 16-bit storage of f16 or bf16 values, and back.
uint16_t toBits(double d, DType t);
float fromBits(uint16_t h, DType t);
/// `d` rounded to the values of `t` (f32: to float).
float roundTo(double d, DType t);
/// The largest finite value of `t` (f16 65504, bf16 about 3.39e38, f32 about 3.40e38).
float largestFinite(DType t);

} // namespace fpat::ir
