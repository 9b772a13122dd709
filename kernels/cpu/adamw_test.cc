#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/test_util.h"

namespace boulder::kernels::cpu {
namespace {

using testutil::Buf;
using testutil::ExpectAllClose;
using testutil::RandomVector;

constexpr size_t kN = 37;  // not a multiple of any vector width
constexpr int kSteps = 4;

struct Hyper {
  float lr = 3e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  float grad_scale = 0.5f;
  float max_norm = 0;  // 0: no clipping
  bool use_mask = false;
  size_t mask_offset = 0;  // the call's first element's bit in the packed mask
  bool use_master = false;
};

// The optimizer state, updated by the textbook formula in double.
struct State {
  std::vector<double> w, m, v;
};

void ReferenceStep(State* s, const std::vector<double>& grad, const std::vector<uint8_t>& mask,
                   const Hyper& h, int t, double norm_sq) {
  double clip = 1;
  if (h.max_norm > 0 && norm_sq > 0) clip = std::min(1.0, h.max_norm / std::sqrt(norm_sq));
  const double b1 = h.beta1, b2 = h.beta2;
  for (size_t i = 0; i < s->w.size(); ++i) {
    const double g = grad[i] * h.grad_scale * clip;
    s->m[i] = b1 * s->m[i] + (1 - b1) * g;
    s->v[i] = b2 * s->v[i] + (1 - b2) * g * g;
    const double mhat = s->m[i] / (1 - std::pow(b1, t));
    const double vhat = s->v[i] / (1 - std::pow(b2, t));
    const double wd = h.use_mask && mask[i] == 0 ? 0.0 : static_cast<double>(h.weight_decay);
    s->w[i] -= h.lr * (mhat / (std::sqrt(vhat) + h.eps) + wd * s->w[i]);
  }
}

// Runs kSteps AdamW steps on backend `be` and on the reference; checks after each step.
// Returns the smallest max_norm / norm over the steps (infinity without clipping), so callers
// can assert whether clipping took effect.
// floor_frac as in ExpectAllClose: FP32 results carry the rounding error of the larger terms
// they are computed from.
template <typename S>
double RunSteps(Backend* be, const Hyper& h, double rtol, double floor_frac = 1e-3) {
  State ref{RandomVector(kN, 1), std::vector<double>(kN, 0.0), std::vector<double>(kN, 0.0)};
  std::vector<uint8_t> mask(kN);
  for (size_t i = 0; i < kN; ++i) mask[i] = i % 3 == 0 ? 0 : 1;
  Buf<S> params(be, ref.w), master(be, ref.w), m(be, ref.m), v(be, ref.v), grads(be, kN);
  ref.w = params.ToVector();  // start from the backend's rounding of the initial values
  // The packed mask holds mask_offset bits of the opposite pattern before the call's bits, so
  // an offset read wrongly decays the wrong elements.
  std::vector<uint8_t> full(h.mask_offset + kN);
  for (size_t i = 0; i < full.size(); ++i) {
    full[i] = i < h.mask_offset ? (i % 3 == 0 ? 1 : 0) : mask[i - h.mask_offset];
  }
  const std::vector<uint8_t> bits = PackDecayBits(full);
  Buf<uint8_t> mask_buf(be, bits.size());
  be->CopyFromHost(mask_buf.get(), bits.data(), bits.size());
  Buf<float> norm_sq(be, 1);
  double min_ratio = std::numeric_limits<double>::infinity();
  for (int t = 1; t <= kSteps; ++t) {
    SCOPED_TRACE(t);
    grads.Set(RandomVector(kN, 100 + t, -2, 2));
    be->NormSquared(norm_sq.get(), grads.get(), kN);
    be->AdamW(params.get(), h.use_master ? master.get() : nullptr, grads.get(), m.get(), v.get(),
              h.use_mask ? DecayBits{mask_buf.get(), h.mask_offset} : DecayBits{}, kN, h.lr,
              h.beta1, h.beta2, h.eps, h.weight_decay, t, h.grad_scale, norm_sq.get(), h.max_norm);
    ReferenceStep(&ref, grads.ToVector(), mask, h, t, norm_sq[0]);
    if (h.max_norm > 0) min_ratio = std::min<double>(min_ratio, h.max_norm / std::sqrt(norm_sq[0]));
    ExpectAllClose(ref.w, params.get(), rtol, "params", floor_frac);
    ExpectAllClose(ref.m, m.get(), rtol, "m", floor_frac);
    ExpectAllClose(ref.v, v.get(), rtol, "v", floor_frac);
    if (h.use_master) ExpectAllClose(ref.w, master.get(), rtol, "master", floor_frac);
  }
  if (h.use_master) ExpectAllClose(master.ToVector(), params.get(), 0, "params == master", 0);
  return min_ratio;
}

TEST(AdamWTest, MatchesFormulaWithoutClipping) {
  auto be = NewCpuBackendF64();
  RunSteps<double>(be.get(), Hyper{}, 1e-12);
}

TEST(AdamWTest, MatchesFormulaWithClippingAndDecayMask) {
  auto be = NewCpuBackendF64();
  Hyper h;
  h.max_norm = 1.0f;  // the gradients' norm is about 7: clipping applies on every step
  h.use_mask = true;
  EXPECT_LT(RunSteps<double>(be.get(), h, 1e-12), 0.5);
}

TEST(AdamWTest, DecayBitsFromAnOffsetInThePackedMask) {
  auto be = NewCpuBackendF64();
  Hyper h;
  h.use_mask = true;
  for (size_t offset : {1, 8, 13}) {
    SCOPED_TRACE(offset);
    h.mask_offset = offset;
    RunSteps<double>(be.get(), h, 1e-12);
  }
}

TEST(AdamWTest, PackDecayBitsPutsElementIAtBitIModulo8OfByteIOver8) {
  const std::vector<uint8_t> mask = {1, 0, 0, 1, 0, 0, 0, 1, 0, 1, 7};
  EXPECT_EQ(PackDecayBits(mask), (std::vector<uint8_t>{0x89, 0x06}));
  EXPECT_TRUE(PackDecayBits({}).empty());
}

TEST(AdamWTest, ClippingThresholdAboveTheNormChangesNothing) {
  auto be = NewCpuBackendF64();
  Hyper h;
  h.max_norm = 1e6f;
  EXPECT_GT(RunSteps<double>(be.get(), h, 1e-12), 1.0);
}

TEST(AdamWTest, UpdatesMasterAndCopiesItToParams) {
  auto be = NewCpuBackendF64();
  Hyper h;
  h.use_master = true;
  h.use_mask = true;
  RunSteps<double>(be.get(), h, 1e-12);
}

TEST(AdamWTest, FloatMatchesFormula) {
  auto be = NewCpuBackend(2);
  Hyper h;
  h.max_norm = 1.0f;
  h.use_mask = true;
  RunSteps<float>(be.get(), h, 1e-5, testutil::kScaleFloor);
}

TEST(AdamWTest, ZeroGradientNormIsNotClipped) {
  auto be = NewCpuBackendF64();
  Buf<double> params(be.get(), std::vector<double>{1.0, -2.0}), grads(be.get(), 2);
  Buf<double> m(be.get(), 2), v(be.get(), 2);
  be->Memset0(grads.get(), 2 * sizeof(double));
  be->Memset0(m.get(), 2 * sizeof(double));
  be->Memset0(v.get(), 2 * sizeof(double));
  Buf<float> norm_sq(be.get(), 1);
  be->NormSquared(norm_sq.get(), grads.get(), 2);
  ASSERT_EQ(norm_sq[0], 0.0f);
  be->AdamW(params.get(), nullptr, grads.get(), m.get(), v.get(), DecayBits{}, 2, 0.1f, 0.9f,
            0.999f, 1e-8f, 0.5f, 1, 1.0f, norm_sq.get(), 1.0f);
  // Only the weight decay moves the parameters: w -= lr * wd * w.
  const double lr_wd = static_cast<double>(0.1f) * 0.5;
  EXPECT_DOUBLE_EQ(params[0], 1.0 - lr_wd * 1.0);
  EXPECT_DOUBLE_EQ(params[1], -2.0 - lr_wd * -2.0);
  EXPECT_EQ(m[0], 0.0);
  EXPECT_EQ(v[1], 0.0);
}

}  // namespace
}  // namespace boulder::kernels::cpu
