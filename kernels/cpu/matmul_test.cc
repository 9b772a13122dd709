#include <cmath>
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
using testutil::Dot;
using testutil::ExpectAccumulated;
using testutil::ExpectAllClose;
using testutil::kScaleFloor;
using testutil::NumericGrad;
using testutil::RandomVector;

constexpr int kN = 7;
constexpr int kC = 6;
constexpr int kOC = 5;

double GeluRef(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

// d/dx GeluRef, with tanh' = 1 - tanh².
double GeluGradRef(double x) {
  const double k = std::sqrt(2 / M_PI);
  const double th = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * k * (1 + 3 * 0.044715 * x * x);
}

// pre = x·Wᵀ + b by a triple loop.
std::vector<double> Linear(const std::vector<double>& x, const std::vector<double>& w,
                           const std::vector<double>* b, int N, int C, int OC) {
  std::vector<double> y(N * OC);
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      double s = b != nullptr ? (*b)[o] : 0;
      for (int c = 0; c < C; ++c) s += x[n * C + c] * w[o * C + c];
      y[n * OC + o] = s;
    }
  }
  return y;
}

TEST(MatmulTest, ForwardMatchesTripleLoop) {
  auto be = NewCpuBackendF64();
  const auto x = RandomVector(kN * kC, 1), w = RandomVector(kOC * kC, 2);
  const auto b = RandomVector(kOC, 3);
  Buf<double> inp(be.get(), x), weight(be.get(), w), bias(be.get(), b);
  Buf<double> out(be.get(), kN * kOC), pre(be.get(), kN * kOC);

  out.Poison();
  be->MatmulForward(out.get(), nullptr, inp.get(), weight.get(), nullptr, kN, kC, kOC,
                    Epilogue::kNone);
  ExpectAllClose(Linear(x, w, nullptr, kN, kC, kOC), out.get(), 1e-12, "no bias");

  out.Poison();
  be->MatmulForward(out.get(), nullptr, inp.get(), weight.get(), bias.get(), kN, kC, kOC,
                    Epilogue::kNone);
  ExpectAllClose(Linear(x, w, &b, kN, kC, kOC), out.get(), 1e-12, "bias");

  for (bool with_bias : {false, true}) {
    SCOPED_TRACE(with_bias ? "gelu, bias" : "gelu, no bias");
    out.Poison();
    pre.Poison();
    be->MatmulForward(out.get(), pre.get(), inp.get(), weight.get(),
                      with_bias ? bias.get() : nullptr, kN, kC, kOC, Epilogue::kGelu);
    const auto want_pre = Linear(x, w, with_bias ? &b : nullptr, kN, kC, kOC);
    std::vector<double> want_out(want_pre.size());
    for (size_t i = 0; i < want_pre.size(); ++i) want_out[i] = GeluRef(want_pre[i]);
    ExpectAllClose(want_pre, pre.get(), 1e-12, "pre_gelu");
    ExpectAllClose(want_out, out.get(), 1e-12, "out");
  }
}

// Backward against central differences of Σ r·out, for both epilogues; the parameter grads
// accumulate (checked over two calls), dinp is overwritten, dout becomes the
// pre-activation grad when there is a GELU.
void CheckBackward(Epilogue epilogue) {
  auto be = NewCpuBackendF64();
  const bool gelu = epilogue == Epilogue::kGelu;
  Buf<double> inp(be.get(), RandomVector(kN * kC, 11, -2, 2));
  Buf<double> weight(be.get(), RandomVector(kOC * kC, 12));
  Buf<double> bias(be.get(), RandomVector(kOC, 13));
  Buf<double> out(be.get(), kN * kOC), pre(be.get(), kN * kOC);
  const auto r = RandomVector(kN * kOC, 14);
  auto loss = [&] {
    be->MatmulForward(out.get(), gelu ? pre.get() : nullptr, inp.get(), weight.get(), bias.get(),
                      kN, kC, kOC, epilogue);
    return Dot(r, out.get());
  };
  const auto fd_inp = NumericGrad(inp.get(), inp.size(), loss);
  const auto fd_weight = NumericGrad(weight.get(), weight.size(), loss);
  const auto fd_bias = NumericGrad(bias.get(), bias.size(), loss);
  loss();

  const auto dweight0 = RandomVector(kOC * kC, 15), dbias0 = RandomVector(kOC, 16);
  Buf<double> dinp(be.get(), kN * kC), dweight(be.get(), dweight0), dbias(be.get(), dbias0);
  Buf<double> dout(be.get(), kN * kOC);
  for (int call = 1; call <= 2; ++call) {
    SCOPED_TRACE(call);
    dout.Set(r);
    dinp.Poison();
    be->MatmulBackward(dinp.get(), dweight.get(), dbias.get(), dout.get(),
                       gelu ? pre.get() : nullptr, inp.get(), weight.get(), kN, kC, kOC);
    ExpectAllClose(fd_inp, dinp.get(), 1e-8, "dinp");
    ExpectAccumulated(dweight0, dweight.get(), call, fd_weight, 1e-8, "dweight");
    ExpectAccumulated(dbias0, dbias.get(), call, fd_bias, 1e-8, "dbias");
  }
  // dout now holds dL/dpre: for the bias, that is exactly the per-column sum over rows.
  std::vector<double> want_dout(r);
  if (gelu) {
    for (int i = 0; i < kN * kOC; ++i) want_dout[i] *= GeluGradRef(pre[i]);
  }
  ExpectAllClose(want_dout, dout.get(), 1e-13, "dout");
}

TEST(MatmulTest, BackwardMatchesFiniteDifferences) { CheckBackward(Epilogue::kNone); }

TEST(MatmulTest, GeluBackwardMatchesFiniteDifferences) { CheckBackward(Epilogue::kGelu); }

TEST(MatmulTest, BackwardSkipsNullDinpAndDbias) {
  auto be = NewCpuBackendF64();
  const auto x = RandomVector(kN * kC, 21), w = RandomVector(kOC * kC, 22);
  const auto r = RandomVector(kN * kOC, 23);
  Buf<double> inp(be.get(), x), weight(be.get(), w), dout(be.get(), r);
  Buf<double> dweight(be.get(), kOC * kC);
  be->Memset0(dweight.get(), dweight.size() * sizeof(double));
  be->MatmulBackward(nullptr, dweight.get(), nullptr, dout.get(), nullptr, inp.get(), weight.get(),
                     kN, kC, kOC);
  std::vector<double> want(kOC * kC, 0.0);
  for (int o = 0; o < kOC; ++o) {
    for (int c = 0; c < kC; ++c) {
      for (int n = 0; n < kN; ++n) want[o * kC + c] += r[n * kOC + o] * x[n * kC + c];
    }
  }
  ExpectAllClose(want, dweight.get(), 1e-12, "dweight");
  ExpectAllClose(r, dout.get(), 0, "dout (no GELU: unchanged)");
}

// The cpu override of MatmulBackwardGelu against Backend's default (the unfused sequence):
// the same dGELU'd data gradient and weight gradient bit for bit, the bias gradients summed in
// another order; null gradients are skipped.
TEST(MatmulTest, BackwardGeluEqualsTheUnfusedSequence) {
  auto be = NewCpuBackend(2);
  const int N = 37, F = 24, C = 16;  // fc2: [N, F] -> [N, C]
  const auto pre = RandomVector(N * F, 1, -3, 3), inp = RandomVector(N * F, 2),
             w = RandomVector(C * F, 3), dout = RandomVector(N * C, 4), dpb0 = RandomVector(F, 5),
             dw0 = RandomVector(C * F, 6), db0 = RandomVector(C, 7);
  for (bool with_grads : {true, false}) {
    SCOPED_TRACE(with_grads);
    Buf<float> p(be.get(), pre), x(be.get(), inp), wt(be.get(), w), dy(be.get(), dout);
    Buf<float> dp[2] = {Buf<float>(be.get(), N * F), Buf<float>(be.get(), N * F)};
    Buf<float> dpb[2] = {Buf<float>(be.get(), dpb0), Buf<float>(be.get(), dpb0)};
    Buf<float> dw[2] = {Buf<float>(be.get(), dw0), Buf<float>(be.get(), dw0)};
    Buf<float> db[2] = {Buf<float>(be.get(), db0), Buf<float>(be.get(), db0)};
    for (int i = 0; i < 2; ++i) {
      dp[i].Poison();
      void* g_pb = with_grads ? dpb[i].get() : nullptr;
      void* g_w = with_grads ? dw[i].get() : nullptr;
      void* g_b = with_grads ? db[i].get() : nullptr;
      if (i == 0) {
        be->MatmulBackwardGelu(dp[i].get(), g_pb, p.get(), g_w, g_b, dy.get(), x.get(), wt.get(), N,
                               F, C);
      } else {
        be->Backend::MatmulBackwardGelu(dp[i].get(), g_pb, p.get(), g_w, g_b, dy.get(), x.get(),
                                        wt.get(), N, F, C);
      }
    }
    EXPECT_EQ(dp[0].ToVector(), dp[1].ToVector());
    EXPECT_EQ(dw[0].ToVector(), dw[1].ToVector());
    ExpectAllClose(dpb[1].ToVector(), dpb[0].get(), 1e-5, "dpre_bias");
    ExpectAllClose(db[1].ToVector(), db[0].get(), 1e-5, "dbias");
    if (!with_grads) {
      EXPECT_EQ(dpb[0].ToVector(), Buf<float>(be.get(), dpb0).ToVector());
      EXPECT_EQ(dw[0].ToVector(), Buf<float>(be.get(), dw0).ToVector());
    }
  }
}

TEST(MatmulTest, FloatForwardAgreesWithDouble) {
  const int N = 40, C = 64, OC = 96;
  const auto x = RandomVector(N * C, 31, -2, 2), w = RandomVector(OC * C, 32, -0.2, 0.2);
  const auto b = RandomVector(OC, 33);
  auto f64 = NewCpuBackendF64();
  auto f32 = NewCpuBackend(2);
  Buf<double> inp64(f64.get(), x), w64(f64.get(), w), b64(f64.get(), b);
  Buf<double> out64(f64.get(), N * OC), pre64(f64.get(), N * OC);
  Buf<float> inp32(f32.get(), x), w32(f32.get(), w), b32(f32.get(), b);
  Buf<float> out32(f32.get(), N * OC), pre32(f32.get(), N * OC);
  // The FP64 reference on the FP32-rounded inputs: only the op's own rounding is measured.
  inp64.Set(inp32.ToVector());
  w64.Set(w32.ToVector());
  b64.Set(b32.ToVector());
  f64->MatmulForward(out64.get(), pre64.get(), inp64.get(), w64.get(), b64.get(), N, C, OC,
                     Epilogue::kGelu);
  out32.Poison();
  f32->MatmulForward(out32.get(), pre32.get(), inp32.get(), w32.get(), b32.get(), N, C, OC,
                     Epilogue::kGelu);
  ExpectAllClose(pre64.ToVector(), pre32.get(), 1e-5, "pre_gelu", kScaleFloor);
  ExpectAllClose(out64.ToVector(), out32.get(), 1e-5, "out", kScaleFloor);
}

// NOLINTEND(bugprone-implicit-widening-of-multiplication-result)

}  // namespace
}  // namespace boulder::kernels::cpu
