// FP8 emulation: encoding against known values and a brute-force nearest search, the cast's
// statistics, the emulated GEMM, and the delayed-scaling update against its formula.
#include "kernels/cpu/fp8.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/fp8_recipe.h"

namespace boulder::kernels::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Known {
  float x;
  uint8_t code;
};

TEST(Fp8EncodeTest, E4M3KnownValues) {
  const Known cases[] = {
      {0.0f, 0x00},     {-0.0f, 0x80},    {1.0f, 0x38},     {-1.0f, 0xB8},     {0.5f, 0x30},
      {448.0f, 0x7E},   {-448.0f, 0xFE},  {500.0f, 0x7E},   {1e30f, 0x7E},     {kInf, 0x7E},
      {-kInf, 0xFE},    {240.0f, 0x77},   {0x1p-6f, 0x08},  {0x1p-9f, 0x01},   {0x1p-10f, 0x00},
      {0x3p-10f, 0x02}, {0x1.1p0f, 0x38}, {0x1.3p0f, 0x3A}, {0x1.7p-7f, 0x06}, {464.0f, 0x7E},
      {0x1.cp8f, 0x7E}, {0x1.bp8f, 0x7E}, {0x1.9p8f, 0x7C},
  };
  for (const Known& k : cases) {
    EXPECT_EQ(EncodeFp8(k.x, Fp8Format::kE4M3), k.code) << "x = " << k.x;
  }
  EXPECT_EQ(EncodeFp8(kNaN, Fp8Format::kE4M3) & 0x7F, 0x7F);
  EXPECT_TRUE(std::isnan(DecodeFp8(0x7F, Fp8Format::kE4M3)));
  EXPECT_EQ(DecodeFp8(0x7E, Fp8Format::kE4M3), 448.0f);
  EXPECT_EQ(DecodeFp8(0x01, Fp8Format::kE4M3), 0x1p-9f);
}

TEST(Fp8EncodeTest, E5M2KnownValues) {
  const Known cases[] = {
      {0.0f, 0x00},     {1.0f, 0x3C},   {-2.0f, 0xC0},    {57344.0f, 0x7B}, {60000.0f, 0x7B},
      {kInf, 0x7B},     {-kInf, 0xFB},  {0x1p-14f, 0x04}, {0x1p-16f, 0x01}, {0x1p-17f, 0x00},
      {0x3p-17f, 0x02}, {1.125f, 0x3C}, {1.375f, 0x3E},   {1.3f, 0x3D},     {0x1.ep-1f, 0x3C},
  };
  for (const Known& k : cases) {
    EXPECT_EQ(EncodeFp8(k.x, Fp8Format::kE5M2), k.code) << "x = " << k.x;
  }
  EXPECT_EQ(DecodeFp8(0x7C, Fp8Format::kE5M2), kInf);
  EXPECT_TRUE(std::isnan(DecodeFp8(0x7D, Fp8Format::kE5M2)));
  EXPECT_EQ(DecodeFp8(0x7B, Fp8Format::kE5M2), 57344.0f);
}

// Every finite code decodes and re-encodes to itself, and encoding picks the nearest
// representable value (ties to the even code) for random inputs across the whole range.
TEST(Fp8EncodeTest, RoundTripAndNearestEvenAgainstBruteForce) {
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    SCOPED_TRACE(Fp8FormatName(f));
    std::vector<std::pair<float, uint8_t>> finite;  // non-negative values and their codes
    for (int c = 0; c < 256; ++c) {
      const float v = DecodeFp8(static_cast<uint8_t>(c), f);
      if (!std::isfinite(v)) continue;
      EXPECT_EQ(EncodeFp8(v, f), c) << "code " << c;
      if (c < 0x80) finite.push_back({v, static_cast<uint8_t>(c)});
    }
    const float max = Fp8Max(f);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> exponent(-22.0f, 17.0f);
    for (int i = 0; i < 20000; ++i) {
      const float x = std::exp2(exponent(rng));
      uint8_t want = 0;
      if (x >= max) {
        want = EncodeFp8(max, f);
      } else {
        float best = kInf;
        for (const auto& [v, c] : finite) {
          const float d = std::fabs(v - x);
          if (d < best || (d == best && (c & 1) == 0)) {
            best = d;
            want = c;
          }
        }
      }
      ASSERT_EQ(EncodeFp8(x, f), want) << "x = " << x;
      ASSERT_EQ(EncodeFp8(-x, f), want | 0x80) << "x = " << -x;
    }
  }
}

TEST(Fp8CastTest, ScalesTransposesAndCounts) {
  // 2 x 3, scale 2: values chosen to saturate, underflow, stay exact and be non-finite.
  const std::vector<float> x = {1.0f, -300.0f, 0x1p-12f, 0.0f, 3.0f, kInf};
  const float scale = 2.0f;
  float amax = 0.5f;
  uint64_t counts[kFp8CountersPerTensor] = {5, 0, 0};
  std::vector<uint8_t> out(6, 0xAA), out_t(6, 0xAA);
  CastFp8(out.data(), out_t.data(), x.data(), 2, 3, Fp8Format::kE4M3, &scale, &amax, counts);
  const std::vector<uint8_t> want = {0x40, 0xFE, 0x00, 0x00, 0x4C, 0x7E};
  EXPECT_EQ(out, want);
  const std::vector<uint8_t> want_t = {want[0], want[3], want[1], want[4], want[2], want[5]};
  EXPECT_EQ(out_t, want_t);
  EXPECT_EQ(amax, kInf);
  EXPECT_EQ(counts[kFp8Saturated], 6u);  // 5 before + (-600 beyond 448)
  EXPECT_EQ(counts[kFp8Underflow], 1u);  // 2^-11 rounds to 0; 0 itself is not counted
  EXPECT_EQ(counts[kFp8NonFinite], 1u);

  // A NaN makes amax NaN; only the transposed output may be requested.
  const std::vector<double> y = {0.25, kNaN};
  amax = 1.0f;
  uint64_t c2[kFp8CountersPerTensor] = {0, 0, 0};
  std::vector<uint8_t> t2(2);
  CastFp8<double>(nullptr, t2.data(), y.data(), 1, 2, Fp8Format::kE5M2, &scale, &amax, c2);
  EXPECT_TRUE(std::isnan(amax));
  EXPECT_EQ(t2[0], EncodeFp8(0.5f, Fp8Format::kE5M2));
  EXPECT_EQ(c2[kFp8NonFinite], 1u);
}

TEST(Fp8MatmulTest, MatchesTheDecodedProduct) {
  const int M = 5, N = 4, K = 7;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> code(0, 255);
  std::vector<uint8_t> a(M * K), b(N * K);
  for (auto& c : a) c = EncodeFp8(DecodeFp8(code(rng) & 0x77, Fp8Format::kE4M3), Fp8Format::kE4M3);
  for (auto& c : b) c = EncodeFp8(DecodeFp8(code(rng) & 0x6F, Fp8Format::kE5M2), Fp8Format::kE5M2);
  const std::vector<float> bias = {0.5f, -1.0f, 2.0f, 0.0f};
  std::vector<float> out(M * N, kNaN);
  MatmulFp8<float>(1, out.data(), a.data(), Fp8Format::kE4M3, 0.25f, b.data(), Fp8Format::kE5M2,
                   2.0f, bias.data(), M, N, K, false);
  std::vector<double> want(M * N), tol(M * N);
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      double s = 0, s_abs = 0;
      for (int k = 0; k < K; ++k) {
        const double t = double(DecodeFp8(a[i * K + k], Fp8Format::kE4M3)) * 0.25 *
                         DecodeFp8(b[j * K + k], Fp8Format::kE5M2) * 2.0;
        s += t;
        s_abs += std::fabs(t);
      }
      want[i * N + j] = s + bias[j];
      tol[i * N + j] = 4e-6 * (s_abs + 2.0);  // FP32 accumulation of K terms
      EXPECT_NEAR(out[i * N + j], want[i * N + j], tol[i * N + j]);
    }
  }
  // accumulate: out += product, the bias is not added again.
  MatmulFp8<float>(1, out.data(), a.data(), Fp8Format::kE4M3, 0.25f, b.data(), Fp8Format::kE5M2,
                   2.0f, nullptr, M, N, K, true);
  for (int i = 0; i < M * N; ++i) {
    const double w = 2 * want[i] - bias[i % N];
    EXPECT_NEAR(out[i], w, 2 * tol[i]) << i;
  }
}

// The formula, written out independently of fp8_recipe.h.
float Expected(float amax, float prev, float max, int margin) {
  if (!(amax > 0) || std::isinf(amax) || std::isnan(amax)) return prev;
  const float s = (max / amax) / std::exp2(static_cast<float>(margin));
  if (!(s >= std::numeric_limits<float>::min()) || std::isinf(s)) return prev;
  return s;
}

TEST(Fp8ScaleUpdateTest, RollsHistoryAndAppliesTheFormula) {
  const int n = 3, H = 4;
  std::vector<float> scale = {1.0f, 1.0f, 8.0f}, scale_inv(n, kNaN);
  std::vector<float> history = {2.0f, 8.0f, 1.0f, 0.5f,  // tensor 0
                                0.0f, 0.0f, 0.0f, 0.0f,  // tensor 1
                                1.0f, 1.0f, 1.0f, 100.0f};
  std::vector<float> amax = {3.0f, 0.25f, 2.0f};
  const std::vector<float> max = {448.0f, 57344.0f, 448.0f};
  Fp8ScaleUpdate(scale.data(), scale_inv.data(), 1, history.data(), amax.data(), max.data(), n, H,
                 /*use_history_max=*/true, /*margin=*/1);
  // Histories rolled: the oldest entry (0.5, 0, 100) dropped.
  EXPECT_EQ(history, (std::vector<float>{3.0f, 2.0f, 8.0f, 1.0f, 0.25f, 0.0f, 0.0f, 0.0f, 2.0f,
                                         1.0f, 1.0f, 1.0f}));
  EXPECT_EQ(amax, (std::vector<float>{0.0f, 0.0f, 0.0f}));
  EXPECT_EQ(scale[0], 448.0f / 8.0f / 2.0f);
  EXPECT_EQ(scale[1], 57344.0f / 0.25f / 2.0f);
  EXPECT_EQ(scale[2], 448.0f / 2.0f / 2.0f);
  for (int i = 0; i < n; ++i) EXPECT_EQ(scale_inv[i], 1.0f / scale[i]);

  // most_recent: only h[0] counts.
  std::vector<float> s2 = {1.0f}, si2(1), h2 = {100.0f, 100.0f}, a2 = {7.0f}, m2 = {448.0f};
  Fp8ScaleUpdate(s2.data(), si2.data(), 1, h2.data(), a2.data(), m2.data(), 1, 2, false, 0);
  EXPECT_EQ(s2[0], 448.0f / 7.0f);
  EXPECT_EQ(h2, (std::vector<float>{7.0f, 100.0f}));
}

TEST(Fp8ScaleUpdateTest, ZeroInfNanAndOverflowingScalesKeepThePreviousScale) {
  struct Case {
    float amax;
    float want;  // with prev 3.0
  };
  const Case cases[] = {
      {0.0f, 3.0f},
      {kInf, 3.0f},
      {kNaN, 3.0f},
      {-1.0f, 3.0f},
      {1e-45f, 3.0f},  // 448 / denormal overflows to inf
      {448.0f, 1.0f},
      {0x1p-100f, 448.0f * 0x1p100f},
      {3e38f, 448.0f / 3e38f},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.amax);
    std::vector<float> s = {3.0f}, si(1), h = {0.0f}, a = {c.amax}, m = {448.0f};
    Fp8ScaleUpdate(s.data(), si.data(), 1, h.data(), a.data(), m.data(), 1, 1, true, 0);
    EXPECT_EQ(s[0], c.want);
    EXPECT_EQ(s[0], Expected(c.amax, 3.0f, 448.0f, 0));
    EXPECT_EQ(si[0], 1.0f / c.want);
  }
  // A NaN anywhere in the history makes the max NaN: the scale stays until it rolls out.
  std::vector<float> s = {3.0f}, si(1), h = {1.0f, kNaN, 0.0f}, a = {2.0f}, m = {448.0f};
  Fp8ScaleUpdate(s.data(), si.data(), 1, h.data(), a.data(), m.data(), 1, 3, true, 0);
  EXPECT_EQ(s[0], 3.0f);  // history {2, 1, NaN}
  a[0] = 4.0f;
  Fp8ScaleUpdate(s.data(), si.data(), 1, h.data(), a.data(), m.data(), 1, 3, true, 0);
  EXPECT_EQ(s[0], 448.0f / 4.0f);  // {4, 2, 1}: the NaN rolled out
}

TEST(Fp8ScaleUpdateTest, RandomAmaxesMatchTheFormulaBitForBit) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> e(-40.0f, 40.0f);
  for (int margin : {0, 1, 3}) {
    for (int i = 0; i < 2000; ++i) {
      const float amax = std::exp2(e(rng)) * (1.0f + (i % 7) / 8.0f);
      const float max = i % 2 ? 448.0f : 57344.0f;
      std::vector<float> s = {1.0f}, si(1), h = {0.0f}, a = {amax}, m = {max};
      Fp8ScaleUpdate(s.data(), si.data(), 1, h.data(), a.data(), m.data(), 1, 1, true, margin);
      ASSERT_EQ(s[0], Expected(amax, 1.0f, max, margin)) << amax << " margin " << margin;
    }
  }
}

}  // namespace
}  // namespace boulder::kernels::cpu
