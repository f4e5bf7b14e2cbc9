#include "dtype.h"

#include <cmath>

namespace rc {

bool parseDType(const std::string& name, DType* out) {
  static const struct {
    const char* name;
    DType type;
  } kNames[] = {{"f32", DType::F32}, {"bf16", DType::BF16}, {"f16", DType::F16},
                {"i32", DType::I32}, {"i64", DType::I64},   {"u8", DType::U8}};
  for (const auto& entry : kNames) {
    if (name == entry.name) {
      *out = entry.type;
      return true;
    }
  }
  return false;
}

float halfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      mantissa &= 0x3ffu;
      bits = sign | (exponent << 23) | (mantissa << 13);
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToHalf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t absBits = u & 0x7fffffffu;
  if (absBits > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (absBits >= 0x477ff000u) return sign | 0x7c00u;  // overflow to inf (incl. rounding)
  if (absBits < 0x38800000u) {                        // subnormal or zero in half
    const float a = std::fabs(f);
    const float scaled = a * 16777216.0f;  // 2^24: units of the smallest subnormal
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  uint32_t rounded = absBits + 0xfffu + ((absBits >> 13) & 1u);
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

}  // namespace rc
