#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/test_util.h"

namespace boulder::kernels::cpu {
namespace {

// Shapes here are small int constants, so their products cannot overflow int.
// NOLINTBEGIN(bugprone-implicit-widening-of-multiplication-result)

using testutil::Buf;
using testutil::ExpectAllClose;
using testutil::kScaleFloor;
using testutil::NumericGrad;
using testutil::RandomVector;

constexpr int kN = 6, kV = 7, kVp = 10;
constexpr float kDloss = 0.25f;

// -log softmax(row)[target] over the first V columns, written the obvious way (safe for
// these small logits).
double DirectLoss(const double* row, int V, int target) {
  double sum = 0;
  for (int j = 0; j < V; ++j) sum += std::exp(row[j]);
  return std::log(sum) - row[target];
}

std::vector<int32_t> Targets() { return {0, 6, 3, 3, 1, 5}; }

TEST(SoftmaxCrossEntropyTest, MatchesDirectComputationWithPadding) {
  auto be = NewCpuBackendF64();
  auto x = RandomVector(kN * kVp, 1, -3, 3);
  // The padding columns hold large values: they must not enter the softmax.
  for (int n = 0; n < kN; ++n) {
    for (int j = kV; j < kVp; ++j) x[n * kVp + j] = 50.0 + j;
  }
  const auto targets = Targets();
  Buf<double> logits(be.get(), x);
  Buf<int32_t> tgt(be.get(), kN);
  be->CopyFromHost(tgt.get(), targets.data(), kN * sizeof(int32_t));
  Buf<float> losses(be.get(), kN);
  losses.Poison();
  be->SoftmaxCrossEntropy(losses.get(), logits.get(), tgt.get(), kN, kV, kVp, kDloss);

  std::vector<double> want_loss(kN), want_grad(kN * kVp, 0.0);
  for (int n = 0; n < kN; ++n) {
    const double* row = x.data() + n * kVp;
    want_loss[n] = DirectLoss(row, kV, targets[n]);
    double sum = 0;
    for (int j = 0; j < kV; ++j) sum += std::exp(row[j]);
    for (int j = 0; j < kV; ++j) {
      want_grad[n * kVp + j] = (std::exp(row[j]) / sum - (j == targets[n] ? 1.0 : 0.0)) * kDloss;
    }
  }
  ExpectAllClose(want_loss, losses.get(), 1e-7, "losses");
  // floor_frac 0: the padding columns must be exactly 0.
  ExpectAllClose(want_grad, logits.get(), 1e-13, "dlogits", 0);
}

// The gradient written in place is the derivative of dloss * Σ losses.
TEST(SoftmaxCrossEntropyTest, GradientMatchesFiniteDifferencesOfTheLoss) {
  auto be = NewCpuBackendF64();
  auto x = RandomVector(kN * kVp, 11, -3, 3);
  const auto targets = Targets();
  auto total = [&] {
    double sum = 0;
    for (int n = 0; n < kN; ++n) sum += kDloss * DirectLoss(x.data() + n * kVp, kV, targets[n]);
    return sum;
  };
  auto fd = NumericGrad(x.data(), x.size(), total);
  Buf<double> logits(be.get(), x);
  Buf<int32_t> tgt(be.get(), kN);
  be->CopyFromHost(tgt.get(), targets.data(), kN * sizeof(int32_t));
  Buf<float> losses(be.get(), kN);
  be->SoftmaxCrossEntropy(losses.get(), logits.get(), tgt.get(), kN, kV, kVp, kDloss);
  ExpectAllClose(fd, logits.get(), 1e-7, "dlogits");
}

TEST(SoftmaxCrossEntropyTest, StableForLargeLogits) {
  auto be = NewCpuBackend(1);
  // exp(1000) overflows any float type: only the max-shifted form survives.
  std::vector<double> x = {1000.0, 999.0, 998.0, 0.0};
  Buf<float> logits(be.get(), x);
  const int32_t target = 1;
  Buf<int32_t> tgt(be.get(), 1);
  be->CopyFromHost(tgt.get(), &target, sizeof(target));
  Buf<float> losses(be.get(), 1);
  be->SoftmaxCrossEntropy(losses.get(), logits.get(), tgt.get(), 1, 3, 4, 1.0f);
  const double lse = 1000.0 + std::log(1 + std::exp(-1.0) + std::exp(-2.0));
  EXPECT_NEAR(losses[0], lse - 999.0, 1e-5);
  EXPECT_NEAR(logits[0], std::exp(1000.0 - lse), 1e-6);
  EXPECT_NEAR(logits[1], std::exp(999.0 - lse) - 1, 1e-6);
  EXPECT_EQ(logits[3], 0.0f);
}

TEST(SoftmaxCrossEntropyTest, OutOfRangeTargetGivesNanLossAndZeroGradient) {
  auto be = NewCpuBackend(1);
  const int N = 3;
  const std::vector<int32_t> targets = {2, kV, -1};  // kV is a padding column, not a class
  Buf<float> logits(be.get(), RandomVector(N * kVp, 21));
  Buf<int32_t> tgt(be.get(), N);
  be->CopyFromHost(tgt.get(), targets.data(), N * sizeof(int32_t));
  Buf<float> losses(be.get(), N);
  be->SoftmaxCrossEntropy(losses.get(), logits.get(), tgt.get(), N, kV, kVp, 1.0f);
  EXPECT_TRUE(std::isfinite(losses[0]));
  EXPECT_TRUE(std::isnan(losses[1]));
  EXPECT_TRUE(std::isnan(losses[2]));
  for (int n = 1; n < N; ++n) {
    for (int j = 0; j < kVp; ++j) EXPECT_EQ(logits[n * kVp + j], 0.0f) << n << "," << j;
  }
}

TEST(SoftmaxCrossEntropyTest, FloatAgreesWithDouble) {
  const int N = 64, V = 96, Vp = 128;
  const auto x = RandomVector(N * Vp, 31, -4, 4);
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = (n * 37) % V;
  auto f64 = NewCpuBackendF64();
  auto f32 = NewCpuBackend(2);
  Buf<float> l32(f32.get(), x);
  Buf<double> l64(f64.get(), l32.ToVector());
  Buf<int32_t> tgt(f32.get(), N);
  f32->CopyFromHost(tgt.get(), targets.data(), N * sizeof(int32_t));
  Buf<float> loss32(f32.get(), N), loss64(f64.get(), N);
  f32->SoftmaxCrossEntropy(loss32.get(), l32.get(), tgt.get(), N, V, Vp, 1.0f / N);
  f64->SoftmaxCrossEntropy(loss64.get(), l64.get(), tgt.get(), N, V, Vp, 1.0f / N);
  ExpectAllClose(loss64.ToVector(), loss32.get(), 1e-5, "losses", kScaleFloor);
  ExpectAllClose(l64.ToVector(), l32.get(), 1e-5, "dlogits", kScaleFloor);
}

// NOLINTEND(bugprone-implicit-widening-of-multiplication-result)

}  // namespace
}  // namespace boulder::kernels::cpu
