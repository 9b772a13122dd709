#include <cmath>
#include <limits>
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
using testutil::ExpectAllClose;
using testutil::kScaleFloor;
using testutil::NumericGrad;
using testutil::RandomVector;

struct Shape {
  int B, T, C, NH;
};

struct Reference {
  std::vector<double> out, lse;
};

// Full T×T scores with a causal mask and a row softmax: the textbook definition.
Reference NaiveAttention(const std::vector<double>& qkv, const Shape& s) {
  const int HS = s.C / s.NH;
  const double scale = 1 / std::sqrt(static_cast<double>(HS));
  Reference r{std::vector<double>(static_cast<size_t>(s.B) * s.T * s.C),
              std::vector<double>(static_cast<size_t>(s.B) * s.NH * s.T)};
  auto at = [&](int b, int t, int part, int h, int i) {
    return qkv[((static_cast<size_t>(b) * s.T + t) * 3 + part) * s.C + h * HS + i];
  };
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      std::vector<double> scores(static_cast<size_t>(s.T) * s.T);
      for (int t = 0; t < s.T; ++t) {
        for (int j = 0; j < s.T; ++j) {
          double d = 0;
          for (int i = 0; i < HS; ++i) d += at(b, t, 0, h, i) * at(b, j, 1, h, i);
          scores[t * s.T + j] = j <= t ? d * scale : -std::numeric_limits<double>::infinity();
        }
      }
      for (int t = 0; t < s.T; ++t) {
        double m = -std::numeric_limits<double>::infinity(), sum = 0;
        for (int j = 0; j < s.T; ++j) m = std::max(m, scores[t * s.T + j]);
        for (int j = 0; j < s.T; ++j) sum += std::exp(scores[t * s.T + j] - m);
        r.lse[(static_cast<size_t>(b) * s.NH + h) * s.T + t] = m + std::log(sum);
        for (int i = 0; i < HS; ++i) {
          double o = 0;
          for (int j = 0; j < s.T; ++j) {
            o += std::exp(scores[t * s.T + j] - m) / sum * at(b, j, 2, h, i);
          }
          r.out[(static_cast<size_t>(b) * s.T + t) * s.C + h * HS + i] = o;
        }
      }
    }
  }
  return r;
}

size_t QkvSize(const Shape& s) { return static_cast<size_t>(s.B) * s.T * 3 * s.C; }
size_t OutSize(const Shape& s) { return static_cast<size_t>(s.B) * s.T * s.C; }
size_t StatsSize(const Shape& s) { return static_cast<size_t>(s.B) * s.NH * s.T; }

TEST(AttentionTest, ForwardMatchesNaiveCausalSoftmax) {
  for (const Shape s : {Shape{2, 5, 8, 2}, Shape{1, 1, 4, 1}, Shape{3, 9, 12, 3}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C);
    auto be = NewCpuBackendF64();
    // Scores of a few units, so the softmax is far from uniform.
    const auto x = RandomVector(QkvSize(s), 1, -2, 2);
    Buf<double> qkv(be.get(), x), out(be.get(), OutSize(s));
    Buf<float> stats(be.get(), StatsSize(s));
    out.Poison();
    stats.Poison();
    be->AttentionForward(out.get(), stats.get(), qkv.get(), s.B, s.T, s.C, s.NH);
    const Reference ref = NaiveAttention(x, s);
    ExpectAllClose(ref.out, out.get(), 1e-12, "out");
    ExpectAllClose(ref.lse, stats.get(), 1e-7, "stats");
  }
}

TEST(AttentionTest, BackwardMatchesFiniteDifferences) {
  const Shape s{2, 5, 8, 2};
  auto be = NewCpuBackendF64();
  Buf<double> qkv(be.get(), RandomVector(QkvSize(s), 11, -2, 2));
  Buf<double> out(be.get(), OutSize(s));
  Buf<float> stats(be.get(), StatsSize(s));
  const auto r = RandomVector(OutSize(s), 12);
  auto loss = [&] {
    be->AttentionForward(out.get(), stats.get(), qkv.get(), s.B, s.T, s.C, s.NH);
    return Dot(r, out.get());
  };
  const auto fd = NumericGrad(qkv.get(), qkv.size(), loss);
  loss();
  Buf<double> dout(be.get(), r), dqkv(be.get(), QkvSize(s));
  // Written, not accumulated: a second call on a poisoned buffer gives the same result.
  for (int call = 1; call <= 2; ++call) {
    SCOPED_TRACE(call);
    dqkv.Poison();
    be->AttentionBackward(dqkv.get(), dout.get(), qkv.get(), out.get(), stats.get(), s.B, s.T, s.C,
                          s.NH);
    ExpectAllClose(fd, dqkv.get(), 1e-7, "dqkv");
  }
}

TEST(AttentionTest, FloatForwardAgreesWithDouble) {
  const Shape s{2, 33, 64, 4};
  const auto x = RandomVector(QkvSize(s), 21, -1.5, 1.5);
  auto f32 = NewCpuBackend(2);
  Buf<float> qkv(f32.get(), x), out(f32.get(), OutSize(s));
  Buf<float> stats(f32.get(), StatsSize(s));
  out.Poison();
  f32->AttentionForward(out.get(), stats.get(), qkv.get(), s.B, s.T, s.C, s.NH);
  const Reference ref = NaiveAttention(qkv.ToVector(), s);
  ExpectAllClose(ref.out, out.get(), 1e-5, "out", kScaleFloor);
  ExpectAllClose(ref.lse, stats.get(), 1e-5, "stats", kScaleFloor);
}

// NOLINTEND(bugprone-implicit-widening-of-multiplication-result)

}  // namespace
}  // namespace boulder::kernels::cpu
