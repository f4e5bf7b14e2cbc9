// Emulated cuda_fp16.h: the __half storage type (IEEE binary16) and its f32 conversions (round to
// nearest even, subnormals, overflow to infinity), for device and host code compiled by the host
// compiler.
#pragma once

#include <cstdint>

#include "rc_emu/numeric.h"

// 16 bits, trivially copyable, like the device type; arithmetic goes through f32 explicitly.
struct __half {
  unsigned short __x;
};
typedef __half half;

static_assert(sizeof(__half) == 2 && alignof(__half) == 2, "__half must be 2 bytes");

inline __half __float2half_rn(float f) { return __half{::rc_emu::floatToHalfBits(f)}; }
inline __half __float2half(float f) { return __float2half_rn(f); }
inline float __half2float(__half h) { return ::rc_emu::halfBitsToFloat(h.__x); }
inline __half __ushort_as_half(unsigned short bits) { return __half{bits}; }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
