// Element types, their sizes and names, and the bf16/fp16 conversions used by host code.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace rc {

enum class DType : int32_t { F32 = 0, BF16 = 1, F16 = 2, I32 = 3, I64 = 4, U8 = 5 };

inline size_t dtypeSize(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}

inline const char* dtypeName(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
  }
  return "?";
}

bool parseDType(const std::string& name, DType* out);

inline bool isFloating(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

// bf16 stored as the upper half of an IEEE float; conversion rounds to nearest even and keeps NaN.
struct bf16 {
  uint16_t bits;
};

inline float bf16ToFloat(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Branch-free so that loops over it vectorise.
inline uint16_t floatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quietNan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quietNan : rounded);
}

float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);

}  // namespace rc
