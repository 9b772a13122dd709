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

constexpr int kN = 10;
constexpr int kC = 8;

struct Reference {
  std::vector<double> out, mean, rstd;
};

Reference DirectLayerNorm(const std::vector<double>& x, const std::vector<double>& w,
                          const std::vector<double>& b, int N, int C) {
  Reference r{std::vector<double>(x.size()), std::vector<double>(N), std::vector<double>(N)};
  for (int n = 0; n < N; ++n) {
    double m = 0, var = 0;
    for (int c = 0; c < C; ++c) m += x[n * C + c] / C;
    for (int c = 0; c < C; ++c) var += (x[n * C + c] - m) * (x[n * C + c] - m) / C;
    const double s = 1 / std::sqrt(var + 1e-5);
    for (int c = 0; c < C; ++c) r.out[n * C + c] = (x[n * C + c] - m) * s * w[c] + b[c];
    r.mean[n] = m;
    r.rstd[n] = s;
  }
  return r;
}

TEST(LayerNormTest, ForwardMatchesDirectComputation) {
  auto be = NewCpuBackendF64();
  const auto x = RandomVector(kN * kC, 1, -2, 3);
  const auto w = RandomVector(kC, 2, 0.5, 1.5);
  const auto b = RandomVector(kC, 3);
  Buf<double> inp(be.get(), x), weight(be.get(), w), bias(be.get(), b), out(be.get(), kN * kC);
  Buf<float> mean(be.get(), kN), rstd(be.get(), kN);
  out.Poison();
  mean.Poison();
  rstd.Poison();
  be->LayerNormForward(out.get(), mean.get(), rstd.get(), inp.get(), weight.get(), bias.get(), kN,
                       kC);
  const Reference ref = DirectLayerNorm(x, w, b, kN, kC);
  ExpectAllClose(ref.out, out.get(), 1e-12, "out");
  ExpectAllClose(ref.mean, mean.get(), 1e-7, "mean", 1e-2);
  ExpectAllClose(ref.rstd, rstd.get(), 1e-7, "rstd");
}

TEST(LayerNormTest, BackwardMatchesFiniteDifferencesAndAccumulates) {
  auto be = NewCpuBackendF64();
  Buf<double> inp(be.get(), RandomVector(kN * kC, 11, -2, 3));
  Buf<double> weight(be.get(), RandomVector(kC, 12, 0.5, 1.5));
  Buf<double> bias(be.get(), RandomVector(kC, 13));
  Buf<double> out(be.get(), kN * kC);
  Buf<float> mean(be.get(), kN), rstd(be.get(), kN);
  const auto r = RandomVector(kN * kC, 14);
  auto loss = [&] {
    be->LayerNormForward(out.get(), mean.get(), rstd.get(), inp.get(), weight.get(), bias.get(), kN,
                         kC);
    return Dot(r, out.get());
  };
  const auto fd_inp = NumericGrad(inp.get(), inp.size(), loss);
  const auto fd_weight = NumericGrad(weight.get(), weight.size(), loss);
  const auto fd_bias = NumericGrad(bias.get(), bias.size(), loss);
  loss();

  // dinp accumulates (residual stream), as do the parameter grads: start from random values.
  const auto dinp0 = RandomVector(kN * kC, 15);
  const auto dweight0 = RandomVector(kC, 16);
  const auto dbias0 = RandomVector(kC, 17);
  Buf<double> dinp(be.get(), dinp0), dweight(be.get(), dweight0), dbias(be.get(), dbias0);
  Buf<double> dout(be.get(), r);
  for (int call = 1; call <= 2; ++call) {
    be->LayerNormBackward(dinp.get(), dweight.get(), dbias.get(), dout.get(), inp.get(),
                          weight.get(), mean.get(), rstd.get(), kN, kC);
    SCOPED_TRACE(call);
    ExpectAccumulated(dinp0, dinp.get(), call, fd_inp, 1e-8, "dinp");
    ExpectAccumulated(dweight0, dweight.get(), call, fd_weight, 1e-8, "dweight");
    ExpectAccumulated(dbias0, dbias.get(), call, fd_bias, 1e-8, "dbias");
  }
  ExpectAllClose(r, dout.get(), 0, "dout (unchanged)");
}

TEST(LayerNormTest, FloatForwardAgreesWithDouble) {
  const int N = 33, C = 48;
  const auto x = RandomVector(N * C, 21, -2, 3);
  const auto w = RandomVector(C, 22, 0.5, 1.5);
  const auto b = RandomVector(C, 23);
  auto be = NewCpuBackend(2);
  Buf<float> inp(be.get(), x), weight(be.get(), w), bias(be.get(), b), out(be.get(), N * C);
  Buf<float> mean(be.get(), N), rstd(be.get(), N);
  out.Poison();
  be->LayerNormForward(out.get(), mean.get(), rstd.get(), inp.get(), weight.get(), bias.get(), N,
                       C);
  // The reference on the float-rounded inputs, so only the op's own rounding is measured.
  const Reference ref = DirectLayerNorm(inp.ToVector(), weight.ToVector(), bias.ToVector(), N, C);
  // Relative to the output's scale: outputs near 0 come from cancellation of O(1) terms.
  ExpectAllClose(ref.out, out.get(), 1e-5, "out", kScaleFloor);
  ExpectAllClose(ref.rstd, rstd.get(), 1e-5, "rstd", kScaleFloor);
}

// NOLINTEND(bugprone-implicit-widening-of-multiplication-result)

}  // namespace
}  // namespace boulder::kernels::cpu
