// Host-side parts of our FP8 GEMM (fp8_gemm_sm90.h), no GPU needed: the shapes and pointers it
// takes, and kAuto's tile width, which on the H200's 132 multiprocessors must pick what
// fp8_gemm_bench measured faster (bench/fp8-gemm-2026-12-04.md, ms per call, 256 vs 128
// columns): GPT-2 qkv forward 0.0620 vs 0.0641, fc1 0.0779 vs 0.0842, projection 0.0275 vs
// 0.0274 (level), fc2 0.0653 vs 0.0757; seed qkv 0.0392 vs 0.0358, projection 0.0198 vs
// 0.0169, fc1 0.0452 vs 0.0470, fc2 0.0439 vs 0.0414; hidden-2048 qkv 0.1660 vs 0.1955, fc1
// 0.2244 vs 0.2578, projection 0.0607 vs 0.0695.
#include "kernels/cuda/fp8_gemm_sm90.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace boulder::kernels::cuda {
namespace {

constexpr int kH200 = 132;

TEST(Fp8GemmSm90AutoColumnsTest, PicksTheMeasuredFasterTileOnTheBenchmarkForwards) {
  // GPT-2: 16384 rows.
  EXPECT_EQ(Fp8GemmSm90AutoColumns(16384, 2304, true, kH200), 256);
  EXPECT_EQ(Fp8GemmSm90AutoColumns(16384, 3072, true, kH200), 256);
  EXPECT_EQ(Fp8GemmSm90AutoColumns(16384, 768, true, kH200), 256);
  // seed: 8192 rows; 256 columns leave a last round of 48 of 132 tiles (qkv) or 60 (projection).
  EXPECT_EQ(Fp8GemmSm90AutoColumns(8192, 2304, true, kH200), 128);
  EXPECT_EQ(Fp8GemmSm90AutoColumns(8192, 768, true, kH200), 128);
  EXPECT_EQ(Fp8GemmSm90AutoColumns(8192, 3072, true, kH200), 256);
  // hidden 2048: 8192 rows.
  EXPECT_EQ(Fp8GemmSm90AutoColumns(8192, 6144, true, kH200), 256);
  EXPECT_EQ(Fp8GemmSm90AutoColumns(8192, 8192, true, kH200), 256);
  EXPECT_EQ(Fp8GemmSm90AutoColumns(8192, 2048, true, kH200), 256);
}

TEST(Fp8GemmSm90AutoColumnsTest, SplitAccumulationAndOddWidthsTakeTheNarrowTile) {
  EXPECT_EQ(Fp8GemmSm90AutoColumns(16384, 3072, false, kH200), 128);  // registers
  EXPECT_EQ(Fp8GemmSm90AutoColumns(16384, 1152, true, kH200), 128);   // 1152 % 256 != 0
  EXPECT_EQ(Fp8GemmSm90AutoColumns(16384, 3072, true, 0), 256);       // unknown device: 1 SM
}

TEST(Fp8GemmSm90SupportsTest, ShapesFormatsAndAlignment) {
  alignas(256) static uint8_t buf[1024];
  const void* p = buf;
  EXPECT_TRUE(Fp8GemmSm90Supports(128, 128, 128, true, true, p, p, p, p));
  EXPECT_TRUE(Fp8GemmSm90Supports(256, 384, 768, false, true, p, p, p, nullptr));
  EXPECT_TRUE(Fp8GemmSm90Supports(256, 384, 768, true, false, p, p, p, nullptr));
  EXPECT_FALSE(Fp8GemmSm90Supports(256, 384, 768, false, false, p, p, p, nullptr))
      << "two E5M2 operands";
  EXPECT_FALSE(Fp8GemmSm90Supports(192, 128, 128, true, true, p, p, p, nullptr)) << "M % 128";
  EXPECT_FALSE(Fp8GemmSm90Supports(128, 96, 128, true, true, p, p, p, nullptr)) << "N % 128";
  EXPECT_FALSE(Fp8GemmSm90Supports(128, 128, 64, true, true, p, p, p, nullptr)) << "K % 128";
  EXPECT_FALSE(Fp8GemmSm90Supports(0, 128, 128, true, true, p, p, p, nullptr));
  EXPECT_FALSE(Fp8GemmSm90Supports(128, 128, 128, true, true, buf + 8, p, p, nullptr)) << "a";
  EXPECT_FALSE(Fp8GemmSm90Supports(128, 128, 128, true, true, p, buf + 8, p, nullptr)) << "b";
  EXPECT_FALSE(Fp8GemmSm90Supports(128, 128, 128, true, true, p, p, buf + 8, nullptr)) << "out";
  EXPECT_TRUE(Fp8GemmSm90Supports(128, 128, 128, true, true, p, p, p, buf + 4)) << "bias 4 B";
  EXPECT_FALSE(Fp8GemmSm90Supports(128, 128, 128, true, true, p, p, p, buf + 2)) << "bias";
}

}  // namespace
}  // namespace boulder::kernels::cuda
