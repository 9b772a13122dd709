// kernels/split_master.h: the split of an FP32 master weight into its BF16 working weight and a
// 16-bit low half, and the join back. Every high half with the low halves where rounding
// changes (0, 1, 0x7fff, 0x8000, 0x8001, 0xffff) and random ones: the join gives the FP32 bits
// back exactly, and the working weight is the nearest BF16 (ties away from zero).
#include "kernels/split_master.h"

#include <cmath>
#include <cstdint>
#include <random>

#include "gtest/gtest.h"

namespace boulder::kernels {
namespace {

bool IsNan(uint32_t b) { return (b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu) != 0; }

// Round to nearest even, on the bits (what __float2bfloat16 does for a non-NaN).
uint16_t RoundNearestEven(uint32_t b) {
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

void CheckOne(uint32_t b) {
  uint16_t hi = 0, lo = 0;
  SplitMaster(BitsFloat(b), &hi, &lo);
  const float joined = JoinMaster(hi, lo);
  if (IsNan(b)) {
    ASSERT_TRUE(IsNan(static_cast<uint32_t>(hi) << 16)) << std::hex << b << " hi " << hi;
    ASSERT_TRUE(std::isnan(joined)) << std::hex << b;
    return;
  }
  ASSERT_EQ(FloatBits(joined), b) << std::hex << b << " hi " << hi << " lo " << lo;
  const uint16_t low = b & 0xffffu;
  if (low == 0x8000u) {
    // An exact tie: away from zero (the larger magnitude), where round-to-even may go down.
    ASSERT_EQ(hi, static_cast<uint16_t>((b >> 16) + 1)) << std::hex << b;
  } else {
    ASSERT_EQ(hi, RoundNearestEven(b)) << std::hex << b;
  }
}

TEST(SplitMasterTest, EveryHighHalfJoinsBackExactlyAndRoundsToNearest) {
  std::mt19937 rng(7);
  for (uint32_t high = 0; high <= 0xffffu; ++high) {
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu,
                         static_cast<uint32_t>(rng() & 0xffffu)}) {
      CheckOne((high << 16) | low);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(SplitMasterTest, SpecialValues) {
  for (float f : {0.0f, -0.0f, INFINITY, -INFINITY, 3.4028235e38f, -3.4028235e38f, 1e-45f,
                  -1e-45f, 1.1754944e-38f, 1.0f, -1.0f}) {
    CheckOne(FloatBits(f));
  }
  // Past BF16's largest finite value the working weight is infinity, and the master survives.
  uint16_t hi = 0, lo = 0;
  SplitMaster(3.4028235e38f, &hi, &lo);
  EXPECT_EQ(hi, 0x7f80u);
  EXPECT_EQ(JoinMaster(hi, lo), 3.4028235e38f);
  // Every NaN's working weight is a NaN (a payload in the low bits must not make it a number).
  for (uint32_t nan : {0x7fc00000u, 0x7fffffffu, 0xffffffffu, 0x7f800001u, 0xff808000u}) {
    CheckOne(nan);
  }
}

TEST(SplitMasterTest, RandomWeightsJoinBackExactly) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (int i = 0; i < 200000; ++i) {
    const float w = normal(rng);
    uint16_t hi = 0, lo = 0;
    SplitMaster(w, &hi, &lo);
    ASSERT_EQ(FloatBits(JoinMaster(hi, lo)), FloatBits(w)) << w;
    // The working weight is within half a BF16 unit of the master.
    const float working = BitsFloat(static_cast<uint32_t>(hi) << 16);
    const float unit = std::ldexp(1.0f, std::ilogb(w) - 7);
    ASSERT_LE(std::fabs(working - w), 0.5f * unit) << w;
  }
}

}  // namespace
}  // namespace boulder::kernels
