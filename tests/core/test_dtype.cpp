// DType sizes and the fp32 <-> bf16 conversion: round to nearest, ties to even, against a reference
// written from the definition (the two bf16 neighbours of x, the nearer one, the even one on a tie).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.h"
#include "core/philox.h"

namespace moe {
namespace {

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Reference for finite x: truncate, then compare the distances to both neighbours in double.
uint16_t reference_bf16(float x) {
  const uint32_t u = bits_of(x);
  const uint16_t down = uint16_t(u >> 16), up = uint16_t(down + 1);
  const double lo = float_of(uint32_t(down) << 16);
  if ((u & 0xffffu) == 0) return down;
  const uint32_t up_bits = uint32_t(up) << 16;
  const double hi = (up_bits & 0x7f800000u) == 0x7f800000u ? std::copysign(INFINITY, x) : double(float_of(up_bits));
  // Past the largest finite bf16 the upper neighbour is infinity; its distance is taken as 2^128 - |x|.
  const double dlo = std::abs(double(x) - lo);
  const double dhi = std::isinf(hi) ? std::ldexp(1.0, 128) - std::abs(double(x)) : std::abs(hi - double(x));
  if (dlo < dhi) return down;
  if (dhi < dlo) return up;
  return (down & 1) ? up : down;
}

TEST(DType, Sizes) {
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_EQ(dtype_size(DType::I32), 4u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_EQ(dtype_of<float>(), DType::F32);
  EXPECT_EQ(dtype_of<double>(), DType::F64);
  EXPECT_STREQ(dtype_name(DType::BF16), "bf16");
}

TEST(DType, Bf16RoundsToNearestEven) {
  // Exact values pass unchanged; halfway cases go to the even neighbour.
  EXPECT_EQ(float_to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(bf16_to_float(float_to_bf16(-2.5f)), -2.5f);
  EXPECT_EQ(float_to_bf16(float_of(0x3f808000u)).bits, 0x3f80);  // tie, 0x3f80 even: down
  EXPECT_EQ(float_to_bf16(float_of(0x3f818000u)).bits, 0x3f82);  // tie, 0x3f81 odd: up
  EXPECT_EQ(float_to_bf16(float_of(0x3f808001u)).bits, 0x3f81);  // above the tie: up
  EXPECT_EQ(float_to_bf16(float_of(0x3f807fffu)).bits, 0x3f80);  // below the tie: down
  // Overflow to infinity, infinities and NaN.
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()).bits, 0x7f80);
  EXPECT_EQ(float_to_bf16(INFINITY).bits, 0x7f80);
  EXPECT_EQ(float_to_bf16(-INFINITY).bits, 0xff80);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(float_of(0x7f800001u)))));  // signalling NaN stays NaN

  const RngStream rng(5, "bf16");
  for (uint64_t i = 0; i < 200000; ++i) {
    const uint32_t u = uint32_t(rng.bits(i, 0)[0]);
    const float x = float_of(u);
    if (!std::isfinite(x)) continue;
    ASSERT_EQ(float_to_bf16(x).bits, reference_bf16(x)) << std::hex << u;
    // The relative error of a normal value is at most half a bf16 ulp, 2^-8.
    if (std::abs(x) > 1e-30f && std::abs(x) < 1e30f) {
      ASSERT_LE(std::abs(double(bf16_to_float(float_to_bf16(x))) - x), std::ldexp(std::abs(double(x)), -8));
    }
  }
}

}  // namespace
}  // namespace moe
