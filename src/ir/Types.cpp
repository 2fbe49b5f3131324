#include "fpat/ir/Types.h"

#include <cstring>
#include <limits>

namespace fpat::ir {

const char* dtypeName(DType t) {
  return t == DType::F16 ? "f16" : t == DType::BF16 ? "bf16" : "f32";
}

std::optional<DType> parseDType(std::string_view s) {
  if (s == "f16")
    return DType::F16;
  if (s == "f32")
    return DType::F32;
  if (s == "bf16")
    return DType::BF16;
  return std::nullopt;
}

int64_t TensorDesc::numel() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

std::string TensorDesc::shapeStr() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string TensorDesc::str() const {
  return dtypeName(dtype) + shapeStr();
}

uint16_t doubleToHalfBits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, sizeof b);
  const uint16_t sign = static_cast<uint16_t>((b >> 48) & 0x8000);
  const int exp = static_cast<int>((b >> 52) & 0x7ff);
  const uint64_t mant = b & ((uint64_t{1} << 52) - 1);
  if (exp == 0x7ff)
    return static_cast<uint16_t>(sign | 0x7c00 | (mant ? 0x200 : 0));
  if (exp == 0)
    return sign; // double subnormals are far below half's range
  int e = exp - 1023 + 15;
  if (e >= 31)
    return static_cast<uint16_t>(sign | 0x7c00);
  const uint64_t sig = mant | (uint64_t{1} << 52);
  // Bits of the 53-bit significand to drop: 42 for normals, more for half subnormals.
  int shift = 42;
  if (e <= 0) {
    shift = 42 + (1 - e);
    e = 0;
    if (shift >= 54)
      return sign;
  }
  uint64_t kept = sig >> shift;
  const uint64_t rem = sig & ((uint64_t{1} << shift) - 1);
  const uint64_t halfway = uint64_t{1} << (shift - 1);
  if (rem > halfway || (rem == halfway && (kept & 1)))
    ++kept;
  if (e == 0)
    return static_cast<uint16_t>(sign | kept); // 0x400 here is exactly the smallest normal
  if (kept == 0x800) {
    kept = 0x400;
    if (++e >= 31)
      return static_cast<uint16_t>(sign | 0x7c00);
  }
  return static_cast<uint16_t>(sign | (e << 10) | (kept & 0x3ff));
}

float halfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else { // subnormal: normalise
      int e = -1;
      do {
        mant <<= 1;
        ++e;
      } while (!(mant & 0x400));
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | ((mant & 0x3ff) << 13);
    }
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t doubleToBf16Bits(double d) {
  // As doubleToHalfBits, for bfloat16: f32's 8 exponent bits, 7 stored significand bits.
  uint64_t b;
  std::memcpy(&b, &d, sizeof b);
  const uint16_t sign = static_cast<uint16_t>((b >> 48) & 0x8000);
  const int exp = static_cast<int>((b >> 52) & 0x7ff);
  const uint64_t mant = b & ((uint64_t{1} << 52) - 1);
  if (exp == 0x7ff)
    return static_cast<uint16_t>(sign | 0x7f80 | (mant ? 0x40 : 0));
  if (exp == 0)
    return sign;
  int e = exp - 1023 + 127;
  if (e >= 255)
    return static_cast<uint16_t>(sign | 0x7f80);
  const uint64_t sig = mant | (uint64_t{1} << 52);
  int shift = 45;
  if (e <= 0) {
    shift = 45 + (1 - e);
    e = 0;
    if (shift >= 54)
      return sign;
  }
  uint64_t kept = sig >> shift;
  const uint64_t rem = sig & ((uint64_t{1} << shift) - 1);
  const uint64_t halfway = uint64_t{1} << (shift - 1);
  if (rem > halfway || (rem == halfway && (kept & 1)))
    ++kept;
  if (e == 0)
    return static_cast<uint16_t>(sign | kept);
  if (kept == 0x100) {
    kept = 0x80;
    if (++e >= 255)
      return static_cast<uint16_t>(sign | 0x7f80);
  }
  return static_cast<uint16_t>(sign | (e << 7) | (kept & 0x7f));
}

float bf16BitsToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t toBits(double d, DType t) {
  return t == DType::BF16 ? doubleToBf16Bits(d) : doubleToHalfBits(d);
}

float fromBits(uint16_t h, DType t) {
  return t == DType::BF16 ? bf16BitsToFloat(h) : halfBitsToFloat(h);
}

float roundTo(double d, DType t) {
  switch (t) {
  case DType::F16:
    return roundToHalf(d);
  case DType::BF16:
    return bf16BitsToFloat(doubleToBf16Bits(d));
  default:
    return static_cast<float>(d);
  }
}

float largestFinite(DType t) {
  switch (t) {
  case DType::F16:
    return halfBitsToFloat(0x7bff);
  case DType::BF16:
    return bf16BitsToFloat(0x7f7f);
  default:
    return std::numeric_limits<float>::max();
  }
}

} // namespace fpat::ir
