// Emulated cuda_bf16.h: the __nv_bfloat16 storage type and its f32 conversions (round to nearest
// even), for device and host code compiled by the host compiler.
#pragma once

#include <cstdint>

#include "rc_emu/numeric.h"

// 16 bits, trivially copyable, like the device type; arithmetic goes through f32 explicitly.
struct __nv_bfloat16 {
  unsigned short __x;
};
typedef __nv_bfloat16 nv_bfloat16;

static_assert(sizeof(__nv_bfloat16) == 2 && alignof(__nv_bfloat16) == 2, "__nv_bfloat16 must be 2 bytes");

inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{::rc_emu::floatToBf16Bits(f)}; }
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return ::rc_emu::bf16BitsToFloat(h.__x); }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) { return __nv_bfloat16{bits}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
