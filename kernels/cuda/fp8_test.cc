// The CUDA FP8 ops against the CPU backend's exact emulation (kernels/cpu/fp8.h), on fresh
// random inputs (BF16-rounded so both see the same values), outputs poisoned first:
//   - cast(-transpose): codes identical to the emulation's (both round to nearest even and
//     saturate); decoded values within Transformer Engine's tolerances (E4M3 rtol 0.125 /
//     atol 0.0675, E5M2 rtol 0.25 / atol 0.125) of the scaled input; amax and the saturated,
//     underflow and non-finite counts exactly equal;
//   - FP8 GEMM (cuBLASLt, TN, scale pointers, BF16 out): within TE's tolerances (of the
//     operands' formats) of the emulated GEMM on the same FP8 operands, plus bias and
//     accumulate, with and without fast accumulation;
//   - the delayed-scaling update: scales, inverses and histories bit-identical to the CPU's,
//     including amax 0, inf, NaN, subnormal and huge values and margins.
// Skips, saying so, without a GPU of compute capability 8.9 or higher.
#include "kernels/cpu/fp8.h"

#include <array>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/fp8_gemm_sm90.h"
#include "kernels/cuda/fp8_ops.h"
#include "kernels/cuda/ops.h"

namespace boulder::kernels::cuda {
namespace {

float RoundBF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  x += 0x7fffu + ((x >> 16) & 1u);
  x &= 0xffff0000u;
  std::memcpy(&f, &x, 4);
  return f;
}

struct Tol {
  double rtol, atol;
};
Tol TeTolerance(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? Tol{0.125, 0.0675} : Tol{0.25, 0.125};
}

class CudaFp8Test : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = CudaBackend::Create(0);
    if (!b.ok()) GTEST_SKIP() << "no usable CUDA device: " << b.status().message();
    if (absl::Status s = (*b)->Fp8Supported(); !s.ok()) {
      GTEST_SKIP() << "GPU without FP8: " << s.message();
    }
    gpu_ = std::move(*b);
    rng_.seed(::testing::UnitTest::GetInstance()->random_seed() + 29);
  }
  void TearDown() override {
    if (!gpu_) return;  // skipped, or a test dropped a backend in an error state
    absl::Status s = gpu_->Synchronize();
    EXPECT_TRUE(s.ok()) << s;
    for (void* p : owned_) gpu_->Free(p);
  }
  template <typename T>
  T* Upload(const std::vector<T>& v) {
    void* p = *gpu_->Alloc(std::max<size_t>(v.size(), 1) * sizeof(T));
    owned_.push_back(p);
    gpu_->CopyFromHost(p, v.data(), v.size() * sizeof(T));
    return static_cast<T*>(p);
  }
  void* UploadBF16(const std::vector<float>& v) {
    void* p = *gpu_->Alloc(v.size() * 2);
    owned_.push_back(p);
    gpu_->CopyFromHostF32(p, DType::kBF16, v.data(), v.size());
    return p;
  }
  template <typename T>
  std::vector<T> Download(const T* p, size_t n) {
    std::vector<T> v(n);
    gpu_->CopyToHost(v.data(), p, n * sizeof(T));
    absl::Status s = gpu_->Synchronize();
    EXPECT_TRUE(s.ok()) << s;
    return v;
  }

  // A fused op's FP8 cast ([0]) against the separate cast it replaces ([1]): codes[rows × cols],
  // amax and counters bit-identical. Returns the counters.
  std::vector<uint64_t> ExpectSameCast(uint8_t* const (&codes)[2], float* const (&amax)[2],
                                       uint64_t* const (&counts)[2], size_t rows, int cols) {
    const size_t n = rows * cols;
    const std::vector<uint8_t> fused = Download(codes[0], n), apart = Download(codes[1], n);
    size_t first = 0;
    while (first < n && fused[first] == apart[first]) ++first;
    EXPECT_EQ(first, n) << "codes differ first at " << first / cols << "," << first % cols;
    EXPECT_EQ(Download(amax[0], 1)[0], Download(amax[1], 1)[0]) << "amax";
    const std::vector<uint64_t> c = Download(counts[1], kFp8CountersPerTensor);
    EXPECT_EQ(Download(counts[0], kFp8CountersPerTensor), c) << "counters";
    return c;
  }

  // Random BF16 values with a share of outliers (saturate), tiny values (underflow) and zeros.
  // With specials, also about one in 200 each of +inf, -inf, NaN and -0.
  std::vector<float> Inputs(size_t n, float spread, bool specials = false) {
    std::normal_distribution<float> d(0.f, spread);
    std::uniform_int_distribution<int> kind(0, specials ? 799 : 19);
    std::vector<float> v(n);
    for (auto& x : v) {
      const int k = kind(rng_) % (specials ? 800 : 20);
      x = d(rng_);
      if (k % 20 == 0) x *= 1e4f;
      if (k % 20 == 1) x *= 1e-12f;
      if (k % 20 == 2) x = 0.0f;
      if (specials && k == 3) x = INFINITY;
      if (specials && k == 4) x = -INFINITY;
      if (specials && k == 5) x = NAN;
      if (specials && k == 6) x = -0.0f;
      x = RoundBF16(x);
    }
    return v;
  }

  void CastCase(Fp8Format f, int rows, int cols, float scale, bool specials = false) {
    SCOPED_TRACE(absl::StrCat(FormatName(f), " ", rows, "x", cols, " scale ", scale,
                              specials ? " with inf/NaN/-0" : ""));
    std::vector<float> x = Inputs(size_t(rows) * cols, 2.0f, specials);
    void* in = UploadBF16(x);
    std::vector<uint8_t> poison(x.size(), 0x7F);
    uint8_t* out = Upload(poison);
    uint8_t* out_t = Upload(poison);
    float* d_scale = Upload(std::vector<float>{scale});
    float* d_amax = Upload(std::vector<float>{0.0f});
    uint64_t* d_counts = Upload(std::vector<uint64_t>{0, 0, 0});
    gpu_->CastFp8(out, out_t, in, rows, cols, f, d_scale, d_amax, d_counts);
    const std::vector<uint8_t> got = Download(out, x.size()), got_t = Download(out_t, x.size());
    const float amax = Download(d_amax, 1)[0];
    const std::vector<uint64_t> counts = Download(d_counts, 3);

    std::vector<uint8_t> want(x.size()), want_t(x.size());
    float want_amax = 0;
    uint64_t want_counts[3] = {0, 0, 0};
    cpu::CastFp8<float>(want.data(), want_t.data(), x.data(), rows, cols, f, &scale, &want_amax,
                        want_counts);
    const Tol tol = TeTolerance(f);
    int mismatched = 0, out_of_tol = 0, transposed_wrong = 0;
    std::string first;
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        const size_t i = size_t(r) * cols + c;
        if (got[i] != want[i]) {
          if (mismatched++ == 0) {
            first = absl::StrCat("[", r, ",", c, "] x=", x[i], " gpu 0x", absl::Hex(got[i]),
                                 " cpu 0x", absl::Hex(want[i]));
          }
        }
        if (got_t[size_t(c) * rows + r] != got[i]) ++transposed_wrong;
        // Against the (saturated) scaled input, as TE checks its casts.
        const float max = Fp8Max(f);
        const float y = std::max(-max, std::min(max, x[i] * scale));
        const float v = cpu::DecodeFp8(got[i], f);
        if (std::isfinite(x[i]) && !(std::fabs(v - y) <= tol.atol + tol.rtol * std::fabs(y))) {
          ++out_of_tol;
        }
      }
    }
    EXPECT_EQ(mismatched, 0) << "codes differing from the CPU emulation; first " << first;
    EXPECT_EQ(transposed_wrong, 0) << "out_t is not the transpose of out";
    EXPECT_EQ(out_of_tol, 0) << "decoded values outside TE's tolerance";
    if (std::isnan(want_amax)) {
      EXPECT_TRUE(std::isnan(amax)) << "a NaN input makes amax NaN, got " << amax;
    } else {
      EXPECT_EQ(amax, want_amax);
    }
    EXPECT_EQ(counts[kFp8Saturated], want_counts[kFp8Saturated]);
    EXPECT_EQ(counts[kFp8Underflow], want_counts[kFp8Underflow]);
    EXPECT_EQ(counts[kFp8NonFinite], want_counts[kFp8NonFinite]);
    if (x.size() >= 1000) {
      EXPECT_GT(want_counts[kFp8Saturated], 0u) << "the case should exercise saturation";
      EXPECT_GT(want_counts[kFp8Underflow], 0u) << "the case should exercise underflow";
    }
  }

  static const char* FormatName(Fp8Format f) { return Fp8FormatName(f); }

  std::unique_ptr<CudaBackend> gpu_;
  std::vector<void*> owned_;
  std::mt19937 rng_;
};

TEST_F(CudaFp8Test, CastTransposeMatchesEmulationE4M3) {
  CastCase(Fp8Format::kE4M3, 256, 768, 64.0f);
  CastCase(Fp8Format::kE4M3, 16384, 96, 16.0f);  // vectorised path, many tiles per block
  CastCase(Fp8Format::kE4M3, 200, 72, 2.0f);     // vectorised path, partial 64x64 tiles
  CastCase(Fp8Format::kE4M3, 100, 72, 3.0f);     // partial tiles
  CastCase(Fp8Format::kE4M3, 1, 33, 500.0f);
}

// The vectorised path's counting shortcuts (saturation tested only where a block of 8 can
// saturate; underflow as zero codes less zero inputs) against the emulation's per-element rules,
// with infinities, NaNs and negative zeros among the inputs.
TEST_F(CudaFp8Test, VectorisedCastCountsSpecialValuesLikeEmulation) {
  CastCase(Fp8Format::kE4M3, 512, 192, 32.0f, /*specials=*/true);
  CastCase(Fp8Format::kE5M2, 256, 320, 4096.0f, /*specials=*/true);
  CastCase(Fp8Format::kE4M3, 16, 32, 0.0f);  // scale 0: every non-zero input underflows
}

TEST_F(CudaFp8Test, CastTransposeMatchesEmulationE5M2) {
  CastCase(Fp8Format::kE5M2, 128, 2304, 4096.0f);
  CastCase(Fp8Format::kE5M2, 3072, 768, 1024.0f);
  CastCase(Fp8Format::kE5M2, 37, 45, 8.0f);
}

// The fused backward cast (dGELU + bias gradient + cast-transpose) against the same three ops
// run unfused on the CPU backend (FP32): codes decode within TE's tolerance of the CPU's
// g·scale (the GPU rounds g to BF16 first), dbias within 1e-2 relative of the CPU's column
// sums, amax within 1%, out_t the transpose of out, and two runs bit-identical (the column
// sums are reduced in a fixed order).
TEST_F(CudaFp8Test, FusedGradCastMatchesUnfusedCpu) {
  std::unique_ptr<Backend> cpu = NewCpuBackend(0);
  for (const bool gelu : {true, false}) {
    const int rows = 1024, cols = 384;
    const float scale = 256.0f;
    SCOPED_TRACE(gelu ? "with dGELU" : "without dGELU");
    std::normal_distribution<float> d(0.f, 1.f);
    std::vector<float> dout(size_t(rows) * cols), pre(dout.size()), dbias0(cols);
    for (auto& x : dout) x = RoundBF16(0.05f * d(rng_));
    // Without dGELU, outliers that saturate and tiny values that underflow too.
    if (!gelu) dout = Inputs(dout.size(), 0.05f);
    for (auto& x : pre) x = RoundBF16(2.f * d(rng_));
    for (auto& x : dbias0) x = RoundBF16(d(rng_));
    // GPU, twice from the same inputs.
    std::vector<uint8_t> got, got_t;
    std::vector<float> got_bias;
    float got_amax = 0;
    std::vector<uint64_t> got_counts;
    for (int run = 0; run < 2; ++run) {
      void* g_dout = UploadBF16(dout);
      void* g_pre = UploadBF16(pre);
      void* g_bias = UploadBF16(dbias0);
      std::vector<uint8_t> poison(dout.size(), 0x7F);
      uint8_t* out = Upload(poison);
      uint8_t* out_t = Upload(poison);
      float* d_scale = Upload(std::vector<float>{scale});
      float* d_amax = Upload(std::vector<float>{0.0f});
      uint64_t* d_counts = Upload(std::vector<uint64_t>{0, 0, 0});
      gpu_->CastFp8Grad(out, out_t, g_dout, gelu ? g_pre : nullptr, g_bias, rows, cols,
                        Fp8Format::kE5M2, d_scale, d_amax, d_counts);
      std::vector<float> bias(cols);
      gpu_->CopyToHostF32(bias.data(), g_bias, DType::kBF16, cols);
      const std::vector<uint8_t> o = Download(out, dout.size()), ot = Download(out_t, dout.size());
      const float amax = Download(d_amax, 1)[0];
      if (run == 0) {
        got = o, got_t = ot, got_bias = bias, got_amax = amax;
        got_counts = Download(d_counts, 3);
      } else {
        EXPECT_EQ(o, got) << "codes differ between two runs";
        EXPECT_EQ(0, std::memcmp(bias.data(), got_bias.data(), cols * sizeof(float)))
            << "dbias differs between two runs";
      }
    }
    // CPU reference: the unfused default.
    std::vector<float> c_dout = dout, c_bias = dbias0;
    std::vector<uint8_t> want(dout.size()), want_t(dout.size());
    float c_scale = scale, c_amax = 0;
    std::vector<uint64_t> c_counts(3, 0);
    cpu->CastFp8Grad(want.data(), want_t.data(), c_dout.data(), gelu ? pre.data() : nullptr,
                     c_bias.data(), rows, cols, Fp8Format::kE5M2, &c_scale, &c_amax,
                     c_counts.data());
    const Tol tol = TeTolerance(Fp8Format::kE5M2);
    int out_of_tol = 0, transposed_wrong = 0;
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        const size_t i = size_t(r) * cols + c;
        if (got_t[size_t(c) * rows + r] != got[i]) ++transposed_wrong;
        const float max = Fp8Max(Fp8Format::kE5M2);  // the CPU's g (its dout after the call)
        const float y = std::max(-max, std::min(max, c_dout[i] * scale));
        const float v = cpu::DecodeFp8(got[i], Fp8Format::kE5M2);
        if (!(std::fabs(v - y) <= tol.atol + tol.rtol * std::fabs(y))) ++out_of_tol;
      }
    }
    EXPECT_EQ(transposed_wrong, 0) << "out_t is not the transpose of out";
    EXPECT_EQ(out_of_tol, 0) << "decoded values outside TE's tolerance of the CPU's g";
    EXPECT_NEAR(got_amax, c_amax, 0.01 * c_amax);
    if (!gelu) {
      // g = dout exactly: the codes and every counter are the emulation's.
      EXPECT_EQ(got, want) << "codes differ from the CPU emulation's";
      EXPECT_EQ(got_amax, c_amax);
      EXPECT_EQ(got_counts, c_counts);
    }
    double num = 0, den = 0;
    for (int c = 0; c < cols; ++c) {
      num += (double(got_bias[c]) - c_bias[c]) * (double(got_bias[c]) - c_bias[c]);
      den += double(c_bias[c] - dbias0[c]) * (c_bias[c] - dbias0[c]) + 1e-30;
    }
    EXPECT_LT(std::sqrt(num / den), 1e-2) << "dbias increment: relative L2 error";
  }
}

TEST_F(CudaFp8Test, CastCountsNonFiniteAndAccumulatesAmax) {
  const std::vector<float> x = {1.0f, INFINITY, -2.0f, NAN, 0.5f, 3.0f, -INFINITY, 0.0f};
  void* in = UploadBF16(x);
  uint8_t* out = Upload(std::vector<uint8_t>(8, 0));
  float* d_scale = Upload(std::vector<float>{1.0f});
  float* d_amax = Upload(std::vector<float>{5.0f});  // max-accumulated across casts
  uint64_t* d_counts = Upload(std::vector<uint64_t>{1, 2, 3});
  gpu_->CastFp8(out, nullptr, in, 2, 4, Fp8Format::kE4M3, d_scale, d_amax, d_counts);
  const std::vector<uint64_t> counts = Download(d_counts, 3);
  EXPECT_TRUE(std::isnan(Download(d_amax, 1)[0])) << "a NaN input makes amax NaN";
  EXPECT_EQ(counts[kFp8NonFinite], 3u + 3u);
  EXPECT_EQ(counts[kFp8Saturated], 1u);
  EXPECT_EQ(counts[kFp8Underflow], 2u);
  const std::vector<uint8_t> q = Download(out, 8);
  EXPECT_EQ(q[1], 0x7E) << "+inf saturates to 448";
  EXPECT_EQ(q[6], 0xFE) << "-inf saturates to -448";

  const std::vector<float> y = {1.0f, -7.0f};
  void* in2 = UploadBF16(y);
  float* d_amax2 = Upload(std::vector<float>{5.0f});
  gpu_->CastFp8(nullptr, out, in2, 1, 2, Fp8Format::kE4M3, d_scale, d_amax2, d_counts);
  EXPECT_EQ(Download(d_amax2, 1)[0], 7.0f);
}

class CudaFp8GemmTest : public CudaFp8Test {
 protected:
  // out[M,N] = deq(a[M,K]) · deq(b[N,K])ᵀ (+ bias) on both backends from the same FP8 codes.
  void Case(int M, int N, int K, Fp8Format fa, Fp8Format fb, bool with_bias, bool accumulate,
            bool fast) {
    SCOPED_TRACE(absl::StrCat(M, "x", N, "x", K, " ", FormatName(fa), "·", FormatName(fb),
                              with_bias ? " bias" : "", accumulate ? " accumulate" : "",
                              fast ? " fast_accum" : ""));
    std::normal_distribution<float> d(0.f, 1.f);
    auto codes = [&](size_t n, Fp8Format f, float scale) {
      std::vector<uint8_t> v(n);
      for (auto& c : v) c = cpu::EncodeFp8(d(rng_) * scale, f);
      return v;
    };
    const float sa = 0.03f, sb = 0.5f;  // dequantisation factors (scale_inv)
    const std::vector<uint8_t> a = codes(size_t(M) * K, fa, 40.f),
                               b = codes(size_t(N) * K, fb, 3.f);
    std::vector<float> bias(N), init(size_t(M) * N);
    for (auto& x : bias) x = RoundBF16(d(rng_));
    for (auto& x : init) x = RoundBF16(d(rng_));

    std::vector<float> want = accumulate ? init : std::vector<float>(size_t(M) * N, 0.f);
    cpu::MatmulFp8<float>(8, want.data(), a.data(), fa, sa, b.data(), fb, sb,
                          with_bias ? bias.data() : nullptr, M, N, K, accumulate);
    void* out = UploadBF16(accumulate ? init : std::vector<float>(size_t(M) * N, NAN));
    gpu_->MatmulFp8(out, Upload(a), fa, Upload(std::vector<float>{sa}), Upload(b), fb,
                    Upload(std::vector<float>{sb}), with_bias ? UploadBF16(bias) : nullptr, M, N, K,
                    accumulate, fast);
    std::vector<float> got(size_t(M) * N);
    gpu_->CopyToHostF32(got.data(), out, DType::kBF16, got.size());
    absl::Status s = gpu_->Synchronize();
    ASSERT_TRUE(s.ok()) << s;
    const Tol tol = fa == Fp8Format::kE5M2 || fb == Fp8Format::kE5M2
                        ? TeTolerance(Fp8Format::kE5M2)
                        : TeTolerance(Fp8Format::kE4M3);
    // Hopper's fast accumulation (forward only) keeps a reduced-precision accumulator: over
    // hundreds of thousands of outputs, a handful of heavily cancelling sums land just past
    // TE's tolerance (seen on the H200: 1 element of 589,824 at 1.08x it). With fast
    // accumulation, at most 1 in 100,000 elements may pass 1x TE's tolerance and none 2x.
    int bad = 0, very_bad = 0;
    double num = 0, den = 0;
    std::string first;
    for (size_t i = 0; i < got.size(); ++i) {
      num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
      den += double(want[i]) * want[i];
      const double err = std::fabs(got[i] - want[i]);
      const double allowed = tol.atol + tol.rtol * std::fabs(want[i]);
      if (!(err <= allowed)) {
        if (bad++ == 0)
          first = absl::StrCat("[", i / N, ",", i % N, "] gpu ", got[i], " cpu ", want[i]);
      }
      if (!(err <= 2 * allowed)) ++very_bad;
    }
    if (fast) {
      EXPECT_LE(bad, std::max<size_t>(1, got.size() / 100000))
          << "elements outside TE's tolerance; first " << first;
      EXPECT_EQ(very_bad, 0) << "elements outside twice TE's tolerance; first " << first;
    } else {
      EXPECT_EQ(bad, 0) << "elements outside TE's tolerance; first " << first;
    }
    EXPECT_LT(std::sqrt(num / den), 1e-2) << "relative L2 error";
    last_ = std::move(got);
  }
  std::vector<float> last_;  // the last Case's output
};

TEST_F(CudaFp8GemmTest, ForwardShapes) {
  Case(256, 2304, 768, Fp8Format::kE4M3, Fp8Format::kE4M3, true, false, true);
  Case(64, 96, 128, Fp8Format::kE4M3, Fp8Format::kE4M3, false, false, false);
}

TEST_F(CudaFp8GemmTest, DgradAndWgradWithE5M2Gradients) {
  // dinp = dout(E5M2) · Wᵀ(E4M3); dW += doutᵀ(E5M2) · inpᵀ(E4M3), accumulating.
  Case(256, 768, 3072, Fp8Format::kE5M2, Fp8Format::kE4M3, false, false, false);
  Case(768, 3072, 512, Fp8Format::kE5M2, Fp8Format::kE4M3, false, true, false);
  Case(48, 32, 64, Fp8Format::kE4M3, Fp8Format::kE5M2, false, true, false);
}

// Our Hopper kernel (fp8_gemm_sm90.h) with each tile, forced on every shape it takes: fewer
// tiles than CTAs, more (each CTA walks several, and K = 384 makes the stage ring wrap inside
// and across tiles), all three operand-format pairs, bias, accumulate, fast and split
// accumulation; two runs give the same bits.
TEST_F(CudaFp8GemmTest, OwnSm90KernelMatchesEmulation) {
  if (!Fp8GemmSm90Available()) GTEST_SKIP() << "our FP8 GEMM needs compute capability 9.0";
  const Fp8Format e4 = Fp8Format::kE4M3, e5 = Fp8Format::kE5M2;
  for (Fp8GemmTile tile : {Fp8GemmTile::kAuto, Fp8GemmTile::kN128, Fp8GemmTile::kPingPong}) {
    SCOPED_TRACE(tile == Fp8GemmTile::kN128       ? "tile 128"
                 : tile == Fp8GemmTile::kPingPong ? "ping-pong (128 where split)"
                                                  : "auto tile");
    gpu_->set_fp8_gemm(CudaBackend::Fp8Gemm::kSm90, tile);
    Case(256, 2304, 768, e4, e4, true, false, true);
    Case(128, 128, 128, e4, e4, false, false, false);
    Case(256, 768, 3072, e5, e4, false, false, false);
    Case(768, 3072, 512, e5, e4, false, true, false);
    Case(384, 256, 128, e4, e5, false, true, true);
    const auto rng = rng_;  // the same inputs twice
    Case(2048, 2304, 384, e4, e4, true, false, true);
    const std::vector<float> first = last_;
    rng_ = rng;
    Case(2048, 2304, 384, e4, e4, true, false, true);
    EXPECT_TRUE(first == last_) << "two runs differ";
    Case(2048, 1280, 384, e5, e4, false, true, false);
  }
}

// MatmulFp8GeluCast on our kernel (fc2's input cast in fc1's epilogue) against the same kernel
// then GeluCastFp8 (the unfused path), with each tile: the BF16 pre-activation, the FP8 codes,
// amax and every counter bit-identical. The scale saturates the largest values, and the
// pre-activations' negative tail flushes to zero; fewer tiles than CTAs and several per CTA.
TEST_F(CudaFp8GemmTest, OwnSm90GeluCastMatchesGemmThenGeluCastFp8) {
  if (!Fp8GemmSm90Available()) GTEST_SKIP() << "our FP8 GEMM needs compute capability 9.0";
  const Fp8Format e4 = Fp8Format::kE4M3;
  std::normal_distribution<float> d(0.f, 1.f);
  gpu_->set_fp8_gemm_gelu(true);
  for (Fp8GemmTile tile : {Fp8GemmTile::kAuto, Fp8GemmTile::kN128, Fp8GemmTile::kPingPong}) {
    gpu_->set_fp8_gemm(CudaBackend::Fp8Gemm::kSm90, tile);
    for (const auto& [M, N, K] :
         {std::array<int, 3>{256, 768, 384}, std::array<int, 3>{2048, 3072, 768}}) {
      SCOPED_TRACE(absl::StrCat(M, "x", N, "x", K, " tile ", static_cast<int>(tile)));
      std::vector<uint8_t> a(size_t(M) * K), b(size_t(N) * K);
      for (auto& c : a) c = cpu::EncodeFp8(d(rng_) * 40.f, e4);
      for (auto& c : b) c = cpu::EncodeFp8(d(rng_) * 3.f, e4);
      std::vector<float> bias(N);
      for (auto& x : bias) x = RoundBF16(d(rng_));
      const uint8_t *da = Upload(a), *db = Upload(b);
      const float *sa = Upload(std::vector<float>{0.03f}), *sb = Upload(std::vector<float>{0.5f});
      const void* dbias = UploadBF16(bias);
      const float* scale = Upload(std::vector<float>{4.f});
      void* pre[2] = {UploadBF16(std::vector<float>(size_t(M) * N, NAN)),
                      UploadBF16(std::vector<float>(size_t(M) * N, NAN))};
      uint8_t* codes[2] = {Upload(std::vector<uint8_t>(size_t(M) * N, 0x7f)),
                           Upload(std::vector<uint8_t>(size_t(M) * N, 0x7f))};
      float* amax[2] = {Upload(std::vector<float>{0.f}), Upload(std::vector<float>{0.f})};
      uint64_t* counts[2] = {Upload(std::vector<uint64_t>(kFp8CountersPerTensor, 0)),
                             Upload(std::vector<uint64_t>(kFp8CountersPerTensor, 0))};
      ASSERT_TRUE(gpu_->MatmulFp8GeluCast(pre[0], codes[0], da, e4, sa, db, e4, sb, dbias, M, N, K,
                                          e4, scale, amax[0], counts[0]));
      gpu_->MatmulFp8(pre[1], da, e4, sa, db, e4, sb, dbias, M, N, K, false, true);
      gpu_->GeluCastFp8(codes[1], nullptr, nullptr, pre[1], M, N, e4, scale, amax[1], counts[1]);
      const size_t n = size_t(M) * N;
      EXPECT_TRUE(Download(static_cast<const uint16_t*>(pre[0]), n) ==
                  Download(static_cast<const uint16_t*>(pre[1]), n))
          << "pre-activation";
      const std::vector<uint64_t> c = ExpectSameCast(codes, amax, counts, size_t(M), N);
      EXPECT_GT(c[0], 0u) << "nothing saturated";
      EXPECT_GT(c[1], 0u) << "nothing flushed to zero";
    }
  }
  // Off (the default) or on shapes our kernel does not take, the caller runs the two ops.
  gpu_->set_fp8_gemm_gelu(false);
  EXPECT_FALSE(gpu_->MatmulFp8GeluCast(nullptr, nullptr, nullptr, e4, nullptr, nullptr, e4, nullptr,
                                       nullptr, 128, 128, 128, e4, nullptr, nullptr, nullptr));
  gpu_->set_fp8_gemm_gelu(true);
  EXPECT_FALSE(gpu_->MatmulFp8GeluCast(nullptr, nullptr, nullptr, e4, nullptr, nullptr, e4, nullptr,
                                       nullptr, 48, 128, 128, e4, nullptr, nullptr, nullptr));
}

// AttentionForwardFp8Cast on the wgmma forward (the projection's input cast in its epilogue)
// against AttentionForward then CastFp8: the BF16 output, the statistics for the backward, the
// FP8 codes, amax and every counter bit-identical; head sizes 64 and 128, T not a multiple of
// the 128-query tile. The scale saturates the largest outputs.
TEST_F(CudaFp8Test, AttentionForwardFp8CastMatchesForwardThenCastFp8) {
  if (!AttentionWgmmaAvailable()) GTEST_SKIP() << "the wgmma attention forward needs sm_90a";
  gpu_->set_fp8_attention_cast(true);  // the default, unless the environment said off
  std::normal_distribution<float> d(0.f, 1.f);
  struct Shape {
    int B, T, NH, C;
  };
  for (const Shape& sh : {Shape{2, 1024, 12, 768}, Shape{1, 300, 4, 512}}) {
    SCOPED_TRACE(absl::StrCat("B=", sh.B, " T=", sh.T, " NH=", sh.NH, " C=", sh.C));
    const size_t rows = size_t(sh.B) * sh.T, n = rows * sh.C;
    std::vector<float> qkv(rows * 3 * sh.C);
    for (auto& x : qkv) x = RoundBF16(d(rng_));
    const void* dqkv = UploadBF16(qkv);
    const float* scale = Upload(std::vector<float>{200.f});
    void* out[2] = {UploadBF16(std::vector<float>(n, NAN)), UploadBF16(std::vector<float>(n, NAN))};
    float* lse[2] = {Upload(std::vector<float>(size_t(sh.B) * sh.NH * sh.T, NAN)),
                     Upload(std::vector<float>(size_t(sh.B) * sh.NH * sh.T, NAN))};
    uint8_t* codes[2] = {Upload(std::vector<uint8_t>(n, 0x7f)),
                         Upload(std::vector<uint8_t>(n, 0x7f))};
    float* amax[2] = {Upload(std::vector<float>{0.f}), Upload(std::vector<float>{0.f})};
    uint64_t* counts[2] = {Upload(std::vector<uint64_t>(kFp8CountersPerTensor, 0)),
                           Upload(std::vector<uint64_t>(kFp8CountersPerTensor, 0))};
    ASSERT_TRUE(gpu_->AttentionForwardFp8Cast(out[0], lse[0], dqkv, sh.B, sh.T, sh.C, sh.NH,
                                              codes[0], Fp8Format::kE4M3, scale, amax[0],
                                              counts[0]));
    gpu_->AttentionForward(out[1], lse[1], dqkv, sh.B, sh.T, sh.C, sh.NH);
    gpu_->CastFp8(codes[1], nullptr, out[1], int(rows), sh.C, Fp8Format::kE4M3, scale, amax[1],
                  counts[1]);
    EXPECT_TRUE(Download(static_cast<const uint16_t*>(out[0]), n) ==
                Download(static_cast<const uint16_t*>(out[1]), n))
        << "BF16 output";
    const size_t nl = size_t(sh.B) * sh.NH * sh.T;
    const std::vector<float> l0 = Download(lse[0], nl), l1 = Download(lse[1], nl);
    EXPECT_EQ(std::memcmp(l0.data(), l1.data(), nl * 4), 0) << "log-sum-exp";
    EXPECT_GT(ExpectSameCast(codes, amax, counts, rows, sh.C)[0], 0u) << "nothing saturated";
  }
  EXPECT_NE(gpu_->Fp8Settings().find("the projection's in the attention forward on"),
            std::string::npos)
      << gpu_->Fp8Settings();
  // Off, the caller runs the two ops.
  gpu_->set_fp8_attention_cast(false);
  EXPECT_NE(gpu_->Fp8Settings().find("the projection's in the attention forward off"),
            std::string::npos)
      << gpu_->Fp8Settings();
  EXPECT_FALSE(gpu_->AttentionForwardFp8Cast(nullptr, nullptr, nullptr, 1, 1, 64, 1, nullptr,
                                             Fp8Format::kE4M3, nullptr, nullptr, nullptr));
}

TEST_F(CudaFp8GemmTest, RejectsBadShapesAndTwoE5M2Operands) {
  std::vector<uint8_t> z(32 * 32, 0);
  void* out = UploadBF16(std::vector<float>(32 * 32, 0.f));
  float* one = Upload(std::vector<float>{1.f});
  gpu_->MatmulFp8(out, Upload(z), Fp8Format::kE5M2, one, Upload(z), Fp8Format::kE5M2, one, nullptr,
                  32, 32, 32, false, false);
  absl::Status s = gpu_->Synchronize();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("two E5M2 operands"), std::string::npos) << s;
  gpu_.reset();  // the backend's error is sticky
}

TEST_F(CudaFp8Test, ScaleUpdateIsBitIdenticalToCpu) {
  const int H = 8;
  std::vector<float> amaxes = {0.0f,
                               INFINITY,
                               NAN,
                               1e-45f,
                               1e-40f,
                               3e38f,
                               0x1p-100f,
                               448.0f,
                               1.0f,
                               0.3f,
                               57344.f,
                               1e-3f,
                               std::numeric_limits<float>::max()};
  std::uniform_real_distribution<float> e(-60.f, 60.f);
  while (amaxes.size() < 500)
    amaxes.push_back(std::exp2(e(rng_)) * (1.f + amaxes.size() % 13 / 16.f));
  const int n = static_cast<int>(amaxes.size());
  for (int margin : {0, 2, 31}) {
    for (bool use_max : {true, false}) {
      SCOPED_TRACE(absl::StrCat("margin ", margin, use_max ? " max" : " most_recent"));
      std::vector<float> scale(n), scale_inv(n), hist(size_t(n) * H), fp8_max(n);
      std::uniform_real_distribution<float> u(0.f, 4.f);
      for (int i = 0; i < n; ++i) {
        scale[i] = 1.0f + i % 5;
        scale_inv[i] = 1.0f / scale[i];
        fp8_max[i] = i % 2 ? 448.f : 57344.f;
        for (int j = 0; j < H; ++j) hist[size_t(i) * H + j] = (i + j) % 7 == 0 ? NAN : u(rng_);
        if (i % 3 == 0)
          for (int j = 0; j < H; ++j) hist[size_t(i) * H + j] = 0.f;
      }
      std::vector<float> amax = amaxes;
      float* ds = Upload(scale);
      float* dsi = Upload(scale_inv);
      float* dh = Upload(hist);
      float* da = Upload(amax);
      float* dm = Upload(fp8_max);
      // Two rounds, so the rolled histories feed the second.
      for (int round = 0; round < 2; ++round) {
        gpu_->Fp8ScaleUpdate(ds, dsi, 1, dh, da, dm, n, H, use_max, margin, nullptr);
        cpu::Fp8ScaleUpdate(scale.data(), scale_inv.data(), 1, hist.data(), amax.data(),
                            fp8_max.data(), n, H, use_max, margin);
        gpu_->CopyFromHost(da, amaxes.data(), n * sizeof(float));
        amax = amaxes;
      }
      auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
      };
      const std::vector<float> gs = Download(ds, n), gsi = Download(dsi, n),
                               gh = Download(dh, size_t(n) * H);
      int first = -1;
      for (int i = 0; i < n && first < 0; ++i) {
        if (std::memcmp(&gs[i], &scale[i], 4) != 0) first = i;
      }
      EXPECT_TRUE(same_bits(gs, scale))
          << "scale differs first at " << first << " (amax " << (first >= 0 ? amaxes[first] : 0)
          << "): gpu " << (first >= 0 ? gs[first] : 0) << " cpu "
          << (first >= 0 ? scale[first] : 0);
      EXPECT_TRUE(same_bits(gsi, scale_inv)) << "scale_inv";
      // Histories may hold NaNs with different payloads: compare NaN-ness, then values.
      for (size_t i = 0; i < gh.size(); ++i) {
        if (std::isnan(hist[i])) {
          ASSERT_TRUE(std::isnan(gh[i])) << i;
        } else {
          ASSERT_EQ(gh[i], hist[i]) << i;
        }
      }
    }
  }
}

TEST_F(CudaFp8Test, GeluForwardMatchesCpu) {
  std::unique_ptr<Backend> cpu = NewCpuBackend(1);
  std::normal_distribution<float> d(0.f, 2.f);
  std::vector<float> x(1003);
  for (auto& v : x) v = RoundBF16(d(rng_));
  void* in = UploadBF16(x);
  void* out = UploadBF16(std::vector<float>(x.size(), NAN));
  gpu_->GeluForward(out, in, x.size());
  std::vector<float> got(x.size()), want(x.size());
  gpu_->CopyToHostF32(got.data(), out, DType::kBF16, x.size());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  cpu->GeluForward(want.data(), x.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-2 * std::fabs(want[i]) + 1e-3) << "x = " << x[i];
  }
}

// TransposeFp8: the FP8 weight's bytes transposed, for aligned multiples of 16 (the 128 x 128
// tile kernel, and the 64 x 64 one it replaced: SetFp8WideTranspose) and odd shapes (bytes),
// partial tiles included; equal to CastFp8's own transpose.
TEST_F(CudaFp8Test, TransposeFp8IsTheCastsTranspose) {
  struct Restore {
    ~Restore() { SetFp8WideTranspose(true); }
  } restore;
  const int shapes[][2] = {{768, 768},  {2304, 768}, {3072, 768}, {6144, 2048}, {2048, 8192},
                           {192, 80},   {144, 400},  {16, 16},    {40, 24},     {7, 13}};
  for (int i = 0; i < 2 * int(std::size(shapes)); ++i) {
    const bool wide = i < int(std::size(shapes));
    const auto& shape = shapes[i % std::size(shapes)];
    SetFp8WideTranspose(wide);
    const int rows = shape[0], cols = shape[1];
    SCOPED_TRACE(absl::StrCat(rows, "x", cols, wide ? " (128 x 128 tiles)" : " (64 x 64 tiles)"));
    const size_t n = size_t(rows) * cols;
    void* x = UploadBF16(Inputs(n, 0.05f, /*specials=*/true));
    uint8_t* q = Upload(std::vector<uint8_t>(n, 0x55));
    uint8_t* q_t = Upload(std::vector<uint8_t>(n, 0x55));
    uint8_t* got = Upload(std::vector<uint8_t>(n, 0xAA));
    float* d_scale = Upload(std::vector<float>{64.0f});
    float* d_amax = Upload(std::vector<float>{0.0f});
    uint64_t* d_counts = Upload(std::vector<uint64_t>{0, 0, 0});
    gpu_->CastFp8(q, q_t, x, rows, cols, Fp8Format::kE4M3, d_scale, d_amax, d_counts);
    gpu_->TransposeFp8(got, q, rows, cols);
    const std::vector<uint8_t> want = Download(q_t, n), t = Download(got, n), rm = Download(q, n);
    EXPECT_EQ(t, want);
    int wrong = 0;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) wrong += t[size_t(c) * rows + r] != rm[size_t(r) * cols + c];
    EXPECT_EQ(wrong, 0);
  }
}

// CastFp8Batch (a step's weights in a few launches): every job's bytes (row-major and
// transposed), amax and counters exactly as CastFp8 gives them one by one. 30 jobs: more than
// one launch's worth; shapes from the seed/GPT-2/hidden-2048 Linears, a few tiny and odd ones
// (rows or cols not multiples of 8: cast on their own), jobs with only one of the outputs, and
// two jobs sharing one tensor's statistics.
TEST_F(CudaFp8Test, CastBatchMatchesOneCastPerJob) {
  const int shapes[][2] = {{2304, 768}, {768, 768}, {3072, 768}, {768, 3072}, {6144, 2048},
                           {2048, 2048}, {8, 8},    {64, 72},    {12, 40},    {40, 13}};
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    SCOPED_TRACE(FormatName(f));
    struct Case {
      int rows, cols;
      void* inp;
      uint8_t *out[2], *out_t[2];
      float* amax[2];
      uint64_t* counts[2];
    };
    std::vector<Case> cases;
    float* d_scale = Upload(std::vector<float>{f == Fp8Format::kE4M3 ? 64.0f : 256.0f});
    for (int i = 0; i < 30; ++i) {
      Case c;
      c.rows = shapes[i % 10][0];
      c.cols = shapes[i % 10][1];
      const size_t n = size_t(c.rows) * c.cols;
      c.inp = UploadBF16(Inputs(n, 0.05f, /*specials=*/i % 7 == 3));
      for (int k = 0; k < 2; ++k) {
        c.out[k] = i % 3 == 1 ? nullptr : Upload(std::vector<uint8_t>(n, 0x55));
        c.out_t[k] = i % 3 == 2 ? nullptr : Upload(std::vector<uint8_t>(n, 0x55));
        c.amax[k] = Upload(std::vector<float>{0.125f});
        c.counts[k] = Upload(std::vector<uint64_t>{4, 5, 6});
      }
      cases.push_back(c);
    }
    // Reference: CastFp8 per job ([0]); the batch ([1]), where jobs 28 and 29 add to job 27's
    // statistics (as they do in the reference below).
    std::vector<Fp8CastJob> jobs;
    for (int i = 0; i < 30; ++i) {
      Case& c = cases[i];
      const int st = i >= 28 ? 27 : i;
      gpu_->CastFp8(c.out[0], c.out_t[0], c.inp, c.rows, c.cols, f, d_scale, cases[st].amax[0],
                    cases[st].counts[0]);
      Fp8CastJob j;
      j.out = c.out[1];
      j.out_t = c.out_t[1];
      j.inp = c.inp;
      j.rows = c.rows;
      j.cols = c.cols;
      j.scale = d_scale;
      j.amax = cases[st].amax[1];
      j.counts = cases[st].counts[1];
      jobs.push_back(j);
    }
    gpu_->CastFp8Batch(jobs, f);
    for (int i = 0; i < 30; ++i) {
      SCOPED_TRACE(absl::StrCat("job ", i, ": ", cases[i].rows, "x", cases[i].cols));
      const Case& c = cases[i];
      const size_t n = size_t(c.rows) * c.cols;
      if (c.out[0] != nullptr) {
        EXPECT_EQ(Download(c.out[1], n), Download(c.out[0], n));
      }
      if (c.out_t[0] != nullptr) {
        EXPECT_EQ(Download(c.out_t[1], n), Download(c.out_t[0], n));
      }
      EXPECT_EQ(Download(reinterpret_cast<uint32_t*>(c.amax[1]), 1),
                Download(reinterpret_cast<uint32_t*>(c.amax[0]), 1));
      EXPECT_EQ(Download(c.counts[1], 3), Download(c.counts[0], 3));
    }
    // The cases count something: saturation (1e4 outliers at these scales) and underflow.
    const std::vector<uint64_t> counts = Download(cases[0].counts[0], 3);
    EXPECT_GT(counts[kFp8Saturated], 4u);
    EXPECT_GT(counts[kFp8Underflow], 5u);
  }
}

}  // namespace
}  // namespace boulder::kernels::cuda
