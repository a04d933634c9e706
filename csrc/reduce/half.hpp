// float16 / bfloat16 <-> float32 conversions written as plain integer and float
// arithmetic so the compiler vectorises them inside the reduction loops.
// Rounding is round-to-nearest-even, matching PyTorch's own conversions.
#pragma once
#include <cstdint>
#include <cstring>

namespace roce::reduce {

struct Half { uint16_t bits; };
struct BFloat16 { uint16_t bits; };

inline uint32_t floatBits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bitsFloat(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline float toFloat(Half h) {
  uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  uint32_t em = h.bits & 0x7fffu;
  // Shift exponent+mantissa into float position, then rebias by 2^(127-15);
  // the multiply also normalises fp16 subnormals.
  float f = bitsFloat(em << 13) * 0x1.0p112f;
  uint32_t u = floatBits(f);
  if (em >= 0x7c00u) u |= 0x7f800000u;  // inf / nan keep their payload
  return bitsFloat(u | sign);
}

inline Half toHalf(float f) {
  uint32_t u = floatBits(f);
  uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint32_t o;
  if (u >= 0x47800000u) {                    // >= 2^16: overflow to inf, or nan
    o = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < 0x38800000u) {              // below fp16's smallest normal
    // Adding 0.5 lets the float adder round the subnormal mantissa for us.
    const uint32_t magic = ((127 - 15) + (23 - 10) + 1) << 23;
    o = floatBits(bitsFloat(u) + bitsFloat(magic)) - magic;
  } else {
    uint32_t odd = (u >> 13) & 1u;
    u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + odd;
    o = u >> 13;
  }
  return Half{static_cast<uint16_t>(o | (sign >> 16))};
}

inline float toFloat(BFloat16 b) { return bitsFloat(static_cast<uint32_t>(b.bits) << 16); }

inline BFloat16 toBFloat16(float f) {
  uint32_t u = floatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>(u >> 16)};
}

}  // namespace roce::reduce
