// bfloat16 storage: 8 exponent bits like fp32, 7 mantissa bits. Used where halving memory or
// bytes on the wire helps (KV cache, transferred weights); all arithmetic stays in fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace rlf {

struct bf16 {
  uint16_t bits = 0;
};

// Round to nearest even; NaN stays NaN.
inline bf16 to_bf16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))
    return bf16{uint16_t((u >> 16) | 0x40)};
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t((u + rounding) >> 16)};
}

inline float to_float(bf16 value) {
  const uint32_t u = uint32_t(value.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline void to_bf16(bf16* out, const float* in, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = to_bf16(in[i]);
}
inline void to_float(float* out, const bf16* in, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = to_float(in[i]);
}

}  // namespace rlf
