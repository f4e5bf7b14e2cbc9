// Bit-exact conversions between f32 and the 16-bit float formats (bf16, IEEE binary16), as the
// device's conversion instructions perform them: round to nearest even, overflow to infinity,
// binary16 subnormals, NaN kept as a quiet NaN of the same sign. Shared by the emulated
// cuda_bf16.h / cuda_fp16.h and by the cuDNN, cuBLAS and NCCL stand-ins.
#pragma once

#include <cstdint>
#include <cstring>

namespace rc_emu {

inline uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// bf16 is the upper half of an f32: round the lower 16 bits away, ties to even.
inline uint16_t floatToBf16Bits(float f) {
  const uint32_t u = floatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  // Adding 0x7fff rounds up above the halfway point; the result's lowest kept bit breaks ties.
  // A carry out of the mantissa moves to the next binade (or infinity), which is the correct result.
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float bf16BitsToFloat(uint16_t b) { return bitsToFloat(static_cast<uint32_t>(b) << 16); }

// f32 -> binary16 (1 sign, 5 exponent bits with bias 15, 10 mantissa bits).
inline uint16_t floatToHalfBits(float f) {
  const uint32_t u = floatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {
    // NaN: the upper payload bits survive, the quiet bit is set.
    return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x03ffu));
  }
  // 65520 (0x477ff000) is halfway between the largest half, 65504, and 2^16; the tie goes to the even
  // neighbour, 2^16, i.e. infinity. Infinity itself lands here too.
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a < 0x38800000u) {
    // Below 2^-14: a binary16 subnormal (or zero), in units of 2^-24. f32 subnormals are far below
    // half a unit and round to zero.
    const uint32_t exponent = a >> 23;
    if (exponent < 102) return sign;  // below 2^-25, under half the smallest subnormal: zero
    // value = mantissa * 2^(exponent - 150) = (mantissa >> shift) units of 2^-24, shift = 126 - exponent.
    const uint32_t mantissa = (a & 0x007fffffu) | 0x00800000u;
    const uint32_t shift = 126u - exponent;  // 14 .. 24
    uint32_t q = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (q & 1u) != 0)) ++q;  // may carry into the smallest normal: still correct
    return static_cast<uint16_t>(sign | q);
  }
  // Normal range: rebias the exponent (127 -> 15) and round 13 mantissa bits away, ties to even.
  const uint32_t rounded = a + 0x0fffu + ((a >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

inline float halfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x03ffu;
  if (exponent == 0x1fu) return bitsToFloat(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN (payload kept)
  if (exponent != 0) return bitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return bitsToFloat(sign);  // signed zero
  // Subnormal: mantissa * 2^-24; normalise so that the leading one becomes the implicit bit.
  uint32_t e = 113;  // the exponent of 2^-14 in f32
  while ((mantissa & 0x0400u) == 0) {
    mantissa <<= 1;
    --e;
  }
  return bitsToFloat(sign | (e << 23) | ((mantissa & 0x03ffu) << 13));
}

}  // namespace rc_emu
