// Backend::ResidualLayerNormFp8Forward's default (the cpu backend and its FP8 emulation) against
// the ops its contract names: (Residual)LayerNormForward then CastFp8 — the FP8 bytes of both
// layouts, residual, mean, rstd, amax and counters identical, and the bytes those of the
// emulation's encoding (kernels/cpu/fp8.h) of the LayerNorm output. And the cpu backend's
// LayerNormFp8FromStats (FP8 training's backward) against that forward: the same bytes, amax
// and counters from the kept input and statistics, on the FP32 and FP64 backends.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/fp8.h"

namespace boulder::kernels {
namespace {

struct Result {
  std::vector<float> residual, ln, mean, rstd;
  std::vector<uint8_t> q, q_t;
  float amax;
  std::vector<uint64_t> counts;
};

// The cpu backend's buffers are host memory: plain vectors serve as device buffers.
Result RunLayerNorm(Backend& be, bool fused, bool with_residual, bool alias, std::vector<float> a,
                    const std::vector<float>& b, const std::vector<float>& w,
                    const std::vector<float>& bias, int N, int C, Fp8Format f, float scale) {
  const size_t n = size_t(N) * C;
  Result r;
  r.residual.assign(n, -7.0f);
  r.ln.assign(n, 3.0f);
  r.mean.assign(N, -1.0f);
  r.rstd.assign(N, -1.0f);
  r.q.assign(n, 0x55);
  r.q_t.assign(n, 0x55);
  r.amax = 0.25f;
  r.counts = {5, 6, 7};
  float* residual = with_residual ? (alias ? a.data() : r.residual.data()) : nullptr;
  if (fused) {
    be.ResidualLayerNormFp8Forward(residual, r.ln.data(), r.mean.data(), r.rstd.data(), a.data(),
                                   b.data(), w.data(), bias.data(), N, C, r.q.data(), r.q_t.data(),
                                   f, &scale, &r.amax, r.counts.data());
  } else {
    if (with_residual) {
      be.ResidualLayerNormForward(residual, r.ln.data(), r.mean.data(), r.rstd.data(), a.data(),
                                  b.data(), w.data(), bias.data(), N, C);
    } else {
      be.LayerNormForward(r.ln.data(), r.mean.data(), r.rstd.data(), a.data(), w.data(),
                          bias.data(), N, C);
    }
    be.CastFp8(r.q.data(), r.q_t.data(), r.ln.data(), N, C, f, &scale, &r.amax, r.counts.data());
  }
  EXPECT_TRUE(be.Synchronize().ok());
  if (alias) r.residual = a;
  return r;
}

TEST(LayerNormFp8Test, DefaultMatchesLayerNormThenCastFp8) {
  std::unique_ptr<Backend> be = NewCpuBackend(1);
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.2f, 1.5f);
  const int N = 12, C = 20;
  const size_t n = size_t(N) * C;
  std::vector<float> a(n), b(n), w(C), bias(C);
  for (auto* v : {&a, &b, &w, &bias})
    for (float& x : *v) x = d(rng);
  for (int c = 0; c < C; c += 7) w[c] *= 50.0f;  // outliers to saturate
  a[5 * C + 2] = std::numeric_limits<float>::infinity();
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    for (float scale : {1.0f, 3000.0f, 1e-5f}) {
      for (int mode = 0; mode < 3; ++mode) {  // plain, residual, residual aliasing a
        SCOPED_TRACE(testing::Message()
                     << Fp8FormatName(f) << " scale " << scale << " mode " << mode);
        const bool with_residual = mode > 0, alias = mode == 2;
        const Result want =
            RunLayerNorm(*be, false, with_residual, alias, a, b, w, bias, N, C, f, scale);
        const Result got =
            RunLayerNorm(*be, true, with_residual, alias, a, b, w, bias, N, C, f, scale);
        EXPECT_EQ(got.q, want.q);
        EXPECT_EQ(got.q_t, want.q_t);
        if (with_residual) {
          EXPECT_EQ(got.residual, want.residual);
        }
        EXPECT_EQ(std::memcmp(got.mean.data(), want.mean.data(), N * 4), 0);
        EXPECT_EQ(std::memcmp(got.rstd.data(), want.rstd.data(), N * 4), 0);
        EXPECT_EQ(std::memcmp(&got.amax, &want.amax, 4), 0);
        EXPECT_EQ(got.counts, want.counts);
        // The bytes are the emulation's encoding of the LayerNorm output, transposed alike.
        int wrong = 0;
        for (int r = 0; r < N; ++r) {
          for (int c = 0; c < C; ++c) {
            const size_t i = size_t(r) * C + c;
            const uint8_t q = cpu::EncodeFp8(want.ln[i] * scale, f);
            wrong += got.q[i] != q || got.q_t[size_t(c) * N + r] != q;
          }
        }
        EXPECT_EQ(wrong, 0);
        if (scale > 1000.0f) {
          EXPECT_GT(got.counts[kFp8Saturated], 5u);
        }
        if (scale < 1e-4f) {
          EXPECT_GT(got.counts[kFp8Underflow], 6u);
        }
        EXPECT_GT(got.counts[kFp8NonFinite], 7u);  // the inf row
      }
    }
  }
}

// The forward (ResidualLayerNormFp8Forward), then LayerNormFp8FromStats from what it kept (the
// residual, or a; mean; rstd) with fresh statistics: the bytes, amax and counters must match.
// S: the backend's compute type.
template <typename S>
void ExpectFromStatsMatchesForward(Backend& be, bool with_residual, int N, int C, Fp8Format f,
                                   float scale, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << be.name() << " " << sizeof(S) * 8 << "-bit " << N << "x" << C
                                  << (with_residual ? " residual " : " plain ") << Fp8FormatName(f)
                                  << " scale " << scale);
  std::mt19937 rng(seed);
  std::normal_distribution<double> d(0.2, 1.5);
  const size_t n = size_t(N) * C;
  std::vector<S> a(n), b(n), w(C), bias(C), residual(n, S(-7)), ln(n, S(3));
  for (auto* v : {&a, &b, &w, &bias})
    for (S& x : *v) x = static_cast<S>(d(rng));
  for (int c = 0; c < C; c += 7) w[c] *= 50;  // outliers to saturate
  a[size_t(N / 2) * C + 1] = std::numeric_limits<S>::infinity();
  std::vector<float> mean(N, -1.0f), rstd(N, -1.0f);
  std::vector<uint8_t> q(n, 0x55), q_t(n, 0x55);
  float amax = 0.25f;
  std::vector<uint64_t> counts = {5, 6, 7};
  be.ResidualLayerNormFp8Forward(with_residual ? residual.data() : nullptr, ln.data(), mean.data(),
                                 rstd.data(), a.data(), b.data(), w.data(), bias.data(), N, C,
                                 q.data(), q_t.data(), f, &scale, &amax, counts.data());
  const std::vector<S>& x = with_residual ? residual : a;
  std::vector<S> scratch(n, S(9));
  std::vector<uint8_t> rq(n, 0xAA), rq_t(n, 0xAA);
  float ramax = 0.25f;
  std::vector<uint64_t> rcounts = {5, 6, 7};
  be.LayerNormFp8FromStats(rq.data(), rq_t.data(), scratch.data(), x.data(), mean.data(),
                           rstd.data(), w.data(), bias.data(), N, C, f, &scale, &ramax,
                           rcounts.data());
  EXPECT_TRUE(be.Synchronize().ok());
  EXPECT_EQ(rq, q);
  EXPECT_EQ(rq_t, q_t);
  EXPECT_EQ(std::memcmp(&ramax, &amax, 4), 0);
  EXPECT_EQ(rcounts, counts);
  EXPECT_GT(counts[kFp8NonFinite], 7u);  // the inf element
  if (scale > 1000.0f) {
    EXPECT_GT(counts[kFp8Saturated], 5u);
  }
  // The transpose alone, as the model's backward asks for it.
  std::vector<uint8_t> only_t(n, 0xAA);
  ramax = 0.25f;
  be.LayerNormFp8FromStats(nullptr, only_t.data(), scratch.data(), x.data(), mean.data(),
                           rstd.data(), w.data(), bias.data(), N, C, f, &scale, &ramax,
                           rcounts.data());
  EXPECT_EQ(only_t, q_t);
}

TEST(LayerNormFp8Test, FromStatsGivesTheForwardsBytes) {
  std::unique_ptr<Backend> f32 = NewCpuBackend(2);
  std::unique_ptr<Backend> f64 = NewCpuBackendF64(2);
  uint32_t seed = 3;
  for (bool with_residual : {false, true}) {
    for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
      for (float scale : {1.0f, 3000.0f}) {
        ExpectFromStatsMatchesForward<float>(*f32, with_residual, 12, 20, f, scale, ++seed);
        ExpectFromStatsMatchesForward<double>(*f64, with_residual, 12, 20, f, scale, ++seed);
      }
    }
  }
  // Large enough for the row loop to run on both threads.
  ExpectFromStatsMatchesForward<float>(*f32, true, 512, 768, Fp8Format::kE4M3, 2.0f, 99);
  ExpectFromStatsMatchesForward<double>(*f64, false, 512, 768, Fp8Format::kE4M3, 2.0f, 100);
}

}  // namespace
}  // namespace boulder::kernels
