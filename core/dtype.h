// Element types chosen at run time: what a buffer stores and what an op accumulates in (docs/model.md: the
// router in fp32 whatever the compute precision; bf16 storage with fp32 accumulation; fp64 for the
// gradient checks). The sizes and the fp32 <-> bf16 conversions live here, written once for every
// backend (they compile as device code too: the CUDA backend's kernels round exactly as the CPU does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/host_device.h"

namespace moe {

enum class DType : uint8_t { F32, BF16, F64, I32, I64, U8 };  // U8: masks

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
    case DType::I32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::U8:
      return 1;
    case DType::F64:
    case DType::I64:
      return 8;
  }
  return 0;
}

constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::F64:
      return "f64";
    case DType::I32:
      return "i32";
    case DType::I64:
      return "i64";
    case DType::U8:
      return "u8";
  }
  return "?";
}

// bfloat16: the upper half of an IEEE fp32, stored as its bits.
struct bf16 {
  uint16_t bits = 0;
};
static_assert(sizeof(bf16) == 2, "bf16 is its 16 bits: buffers and MPI messages hold it as uint16_t");

// The bits of a float and back (std::bit_cast is not device code).
MOE_HOST_DEVICE constexpr uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  return __builtin_bit_cast(uint32_t, x);
#endif
}
MOE_HOST_DEVICE constexpr float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return __builtin_bit_cast(float, u);
#endif
}

// fp32 -> bf16 rounding to nearest, ties to even; NaN stays a (quiet) NaN, infinities stay infinite.
MOE_HOST_DEVICE constexpr bf16 float_to_bf16(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x0040u)};  // NaN: keep it quiet
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t((u + rounding) >> 16)};
}

MOE_HOST_DEVICE constexpr float bf16_to_float(bf16 x) { return bits_float(uint32_t(x.bits) << 16); }

// x rounded to the nearest bf16 (through fp32 for a double), kept in its own type: what a bf16 GEMM reads.
template <typename T>
MOE_HOST_DEVICE constexpr T round_to_bf16(T x) {
  return T(bf16_to_float(float_to_bf16(float(x))));
}

// An activation its producer holds rounded to bf16 (train.precision = bf16): a tensor the layers keep for their bf16
// GEMMs (the experts' rows, a = x W1, b = x W3, the SwiGLU's output, the attention's input; docs/design.md
// "Precision"): fp32
// storage keeps the bf16 bits (half the memory and half the bytes moved); fp64 storage (the gradient checks) the
// rounded values in fp64.
template <typename T>
using Rounded = std::conditional_t<std::is_same_v<T, float>, bf16, T>;

// The size of a value held rounded in elements of T where `held` (0.5: bf16 beside fp32; 1: fp64's rounded values),
// else 0: the `held` of core/sizes.h's footprints.
template <typename T>
constexpr double held_size(bool held) {
  return held ? double(sizeof(Rounded<T>)) / double(sizeof(T)) : 0.0;
}

template <typename T>
MOE_HOST_DEVICE constexpr Rounded<T> to_rounded(T x) {
  if constexpr (std::is_same_v<T, float>)
    return float_to_bf16(x);
  else
    return round_to_bf16(x);
}

// The value a held-rounded element stands for, in its storage type.
template <typename T>
MOE_HOST_DEVICE constexpr T from_rounded(Rounded<T> x) {
  if constexpr (std::is_same_v<T, float>)
    return bf16_to_float(x);
  else
    return x;
}

// A value written as stored or, kRounded, held rounded (fp64 holds its rounded values, so the flag says which).
template <typename T, bool kRounded>
using Stored = std::conditional_t<kRounded, Rounded<T>, T>;
template <bool kRounded, typename T>
MOE_HOST_DEVICE constexpr Stored<T, kRounded> stored(T v) {
  if constexpr (kRounded)
    return to_rounded(v);
  else
    return v;
}

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::F64;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::BF16;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::I32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::I64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::U8;
}

}  // namespace moe
