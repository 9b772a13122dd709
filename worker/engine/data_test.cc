#include "worker/engine/data.h"

#include <cmath>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/rng.h"

namespace boulder::engine {
namespace {

using ::testing::HasSubstr;

TEST(RngTest, SplitMix64MatchesReference) {
  // First outputs of SplitMix64 from state 0 (Vigna's reference implementation).
  uint64_t state = 0;
  EXPECT_EQ(SplitMix64(&state), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(SplitMix64(&state), 0x6E789E6AA1B965F4ull);
}

TEST(RngTest, GaussianHasUnitMomentsAndBelowStaysInRange) {
  Rng rng(42);
  double sum = 0, sum_sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double g = rng.Gaussian();
    sum += g;
    sum_sq += g * g;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(sum_sq / n), 1.0, 0.01);
  int counts[6] = {};
  for (int i = 0; i < 60000; ++i) {
    const uint64_t x = rng.Below(6);
    ASSERT_LT(x, 6u);
    ++counts[x];
  }
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);
}

TEST(ArithmeticDataTest, RowsHaveConstantStrideAndShiftedTargets) {
  const int V = 96, S = 6, B = 16, T = 20;
  ArithmeticData data(V, S, 1234);
  const Batch b = data.Get(/*rank=*/0, /*step=*/1, /*micro=*/0, B, T);
  ASSERT_EQ(b.inputs.size(), size_t{B * T});
  ASSERT_EQ(b.targets.size(), size_t{B * T});
  ASSERT_EQ(b.strides.size(), size_t{B});
  std::set<int32_t> strides;
  for (int r = 0; r < B; ++r) {
    const int32_t s = b.strides[r];
    EXPECT_GE(s, 1);
    EXPECT_LE(s, S);
    strides.insert(s);
    for (int t = 0; t < T; ++t) {
      const int32_t x = b.inputs[r * T + t];
      const int32_t y = b.targets[r * T + t];
      ASSERT_GE(x, 0);
      ASSERT_LT(x, V);
      EXPECT_EQ(y, (x + s) % V) << "row " << r << " t " << t;
      if (t + 1 < T) {
        EXPECT_EQ(b.inputs[r * T + t + 1], y);
      }
    }
  }
  EXPECT_GT(strides.size(), 2u);  // 16 rows over 6 strides: more than two kinds
}

TEST(ArithmeticDataTest, DeterministicPerSeedAndDistinctAcrossRankStepMicro) {
  ArithmeticData a(96, 6, 7), same(96, 6, 7), other_seed(96, 6, 8);
  const Batch base = a.Get(0, 5, 1, 8, 16);
  EXPECT_EQ(same.Get(0, 5, 1, 8, 16).inputs, base.inputs);
  EXPECT_NE(other_seed.Get(0, 5, 1, 8, 16).inputs, base.inputs);
  EXPECT_NE(a.Get(1, 5, 1, 8, 16).inputs, base.inputs);
  EXPECT_NE(a.Get(0, 6, 1, 8, 16).inputs, base.inputs);
  EXPECT_NE(a.Get(0, 5, 0, 8, 16).inputs, base.inputs);
}

TEST(ArithmeticDataTest, RanksSliceTheGlobalBatchOfOneWorker) {
  // 3 ranks of micro-batch 4 see exactly the rows 1 worker of batch 12 sees, in rank order.
  ArithmeticData data(96, 6, 7);
  const int B = 4, T = 16, N = 3;
  for (int micro = 0; micro < 2; ++micro) {
    const Batch global = data.Get(0, 9, micro, N * B, T);
    std::vector<int32_t> inputs, targets, strides;
    for (int rank = 0; rank < N; ++rank) {
      const Batch b = data.Get(rank, 9, micro, B, T);
      inputs.insert(inputs.end(), b.inputs.begin(), b.inputs.end());
      targets.insert(targets.end(), b.targets.begin(), b.targets.end());
      strides.insert(strides.end(), b.strides.begin(), b.strides.end());
    }
    EXPECT_EQ(inputs, global.inputs);
    EXPECT_EQ(targets, global.targets);
    EXPECT_EQ(strides, global.strides);
  }
  const Batch seven = data.Get(0, 9, 0, 7, T);
  EXPECT_EQ(data.GetRows(9, 0, 5, 2, T).inputs,
            std::vector<int32_t>(seven.inputs.begin() + 5 * T, seven.inputs.end()));
}

TEST(ArithmeticDataTest, PromptIsHeldOutConstantStrideSequence) {
  ArithmeticData data(96, 6, 7);
  int32_t stride = 0;
  const std::vector<int32_t> p = data.Prompt(10, &stride);
  ASSERT_EQ(p.size(), 10u);
  EXPECT_EQ(data.Prompt(10), p);
  int32_t measured = 0;
  EXPECT_TRUE(HasConstantStride(p, 96, &measured));
  EXPECT_EQ(measured, stride);
  EXPECT_GE(stride, 1);
  EXPECT_LE(stride, 6);
  // A different seed gives a different prompt (phase or stride).
  EXPECT_NE(ArithmeticData(96, 6, 8).Prompt(10), p);
}

TEST(HasConstantStrideTest, WrapsModVocab) {
  int32_t s = -1;
  EXPECT_TRUE(HasConstantStride({90, 94, 2, 6}, 96, &s));
  EXPECT_EQ(s, 4);
  EXPECT_FALSE(HasConstantStride({1, 3, 6}, 96));
  EXPECT_TRUE(HasConstantStride({5}, 96, &s));
  EXPECT_EQ(s, 0);
}

TEST(ArithmeticDataTest, FromSpecChecksSourceAndStride) {
  v1::JobSpec spec;
  spec.mutable_model()->set_vocab_size(96);
  spec.mutable_data()->set_source("arithmetic");
  spec.mutable_data()->set_max_stride(6);
  EXPECT_TRUE(ArithmeticData::FromSpec(spec).ok());
  spec.mutable_data()->set_max_stride(96);
  EXPECT_THAT(ArithmeticData::FromSpec(spec).status().message(),
              HasSubstr("data.max_stride: 96 is not in [1, vocab_size 96)"));
  spec.mutable_data()->set_source("tokens.bin");
  const absl::Status s = ArithmeticData::FromSpec(spec).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("data.source: 'tokens.bin'"));
}

}  // namespace
}  // namespace boulder::engine
