// float16 (IEEE binary16) and bfloat16 conversions, for every module that makes or reduces them. To float is exact; from float
// rounds to nearest even, overflows to infinity and keeps NaN a (quiet) NaN.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace tessera {

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa · 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline uint16_t FloatToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u | ((abs >> 13) & 0x1ffu);  // NaN, quiet
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // ≥ 65520 rounds to infinity
  if (abs < 0x38800000u) {  // below 2^-14: a subnormal half (or zero); 1024 becomes 2^-14
    const float scaled = std::bit_cast<float>(abs) * 0x1p24f;  // exact: a power of two
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  // Normal: round the 23-bit mantissa to 10 bits (ties to even); a carry moves
  // into the exponent, as it should. Then rebias the exponent from 127 to 15.
  const uint32_t rounded = (abs + 0xfffu + ((abs >> 13) & 1u)) >> 13;
  return sign | static_cast<uint16_t>(rounded - (112u << 10));
}

inline float BFloat16ToFloat(uint16_t b) { return std::bit_cast<float>(uint32_t{b} << 16); }

inline uint16_t FloatToBFloat16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace tessera
