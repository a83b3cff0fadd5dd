// bfloat16 and float16 <-> float on the bit patterns, shared by the C++ kernels (cpu_attention.cpp,
// cpu_kernels.cpp) and the C++ code generator's prelude (flambeau/_inductor/codegen_cpp.py), kept
// here once (flambeau/_backends/cpp_headers.py inlines it where a source is compiled from its text).
// Written without branches so that simd loops vectorise them (a bfloat16 is a float's upper half:
// widening is a shift; float16 is re-biased, its subnormals through one float subtraction).
// Narrowing rounds to nearest even, as PyTorch's c10::BFloat16 / c10::Half: NaN becomes bfloat16
// 0x7FC0, float16 0x7E00 (sign kept), a float16 overflow infinity.
#ifndef FLAMBEAU_LOWP_H
#define FLAMBEAU_LOWP_H
#include <cstdint>
#include <cstring>
static inline float fl_bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline uint32_t fl_f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
static inline float fl_bf16_to_f32(uint16_t h) { return fl_bits_f32(uint32_t(h) << 16); }
static inline uint16_t fl_f32_to_bf16(float f) {
  uint32_t u = fl_f32_bits(f);
  uint16_t r = uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  return f != f ? uint16_t(0x7FC0) : r;
}
static inline float fl_f16_to_f32(uint16_t h) {
  uint32_t o = (uint32_t(h) & 0x7FFFu) << 13, e = o & (0x7C00u << 13);
  uint32_t normal = o + ((127u - 15u) << 23) + (e == (0x7C00u << 13) ? ((128u - 16u) << 23) : 0u);
  uint32_t sub = fl_f32_bits(fl_bits_f32(o + (113u << 23)) - fl_bits_f32(113u << 23));
  return fl_bits_f32((e == 0 ? sub : normal) | ((uint32_t(h) & 0x8000u) << 16));
}
static inline uint16_t fl_f32_to_f16(float f) {
  uint32_t u = fl_f32_bits(f), sign = u & 0x80000000u, x = u ^ sign;
  uint32_t big = x > 0x7F800000u ? 0x7E00u : 0x7C00u;                       // NaN / overflow
  uint32_t sub = fl_f32_bits(fl_bits_f32(x) + fl_bits_f32(126u << 23)) - (126u << 23);   // < 2^-14
  uint32_t normal = (x + ((15u - 127u) << 23) + 0xFFFu + ((x >> 13) & 1u)) >> 13;
  uint32_t r = x >= 0x47800000u ? big : (x < 0x38800000u ? sub : normal);
  return uint16_t(r | (sign >> 16));
}
#endif
