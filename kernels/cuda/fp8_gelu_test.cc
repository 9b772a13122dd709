// CudaBackend::GeluCastFp8 (fp8_gelu.cu's fused kernels: the tile kernel on 8-aligned shapes,
// the per-element kernel elsewhere, and that one called directly on every shape) against the
// Backend default on the same GPU (GeluForward into a scratch, then CastFp8): the FP8 codes of
// the requested outputs (row-major, transposed or both; the other left as poisoned), amax and
// the saturated, underflow and non-finite counts exactly equal, on aligned and unaligned
// shapes, partial tiles, several tiles per block, both formats, scales that saturate and
// underflow, with infs and NaNs, huge, subnormal and GELU-underflowing inputs; the fused
// kernels leave their scratch untouched. Outputs are poisoned first. GeluCastFp8AndGrad (the
// recomputed transpose and fc1's gradient cast in one kernel) against the two casts, bit for
// bit.
// Skips, saying so, without a GPU of compute capability 8.9 or higher.
#include <cmath>
#include <cstdint>
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
#include "kernels/cuda/fp8_gelu_ops.h"

namespace boulder::kernels::cuda {
namespace {

class CudaGeluCastFp8Test : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = CudaBackend::Create(0);
    if (!b.ok()) GTEST_SKIP() << "no usable CUDA device: " << b.status().message();
    if (absl::Status s = (*b)->Fp8Supported(); !s.ok()) {
      GTEST_SKIP() << "GPU without FP8: " << s.message();
    }
    gpu_ = std::move(*b);
    rng_.seed(::testing::UnitTest::GetInstance()->random_seed() + 41);
  }
  void TearDown() override {
    if (!gpu_) return;
    absl::Status s = gpu_->Synchronize();
    EXPECT_TRUE(s.ok()) << s;
    for (void* p : owned_) gpu_->Free(p);
  }
  void* Alloc(size_t bytes, uint8_t fill) {
    void* p = *gpu_->Alloc(std::max<size_t>(bytes, 1));
    owned_.push_back(p);
    std::vector<uint8_t> poison(bytes, fill);
    gpu_->CopyFromHost(p, poison.data(), bytes);
    return p;
  }
  // v as BF16 on the device.
  void* UploadBf16(const std::vector<float>& v) {
    void* p = Alloc(v.size() * 2, 0);
    gpu_->CopyFromHostF32(p, DType::kBF16, v.data(), v.size());
    return p;
  }
  // A device scalar (the cast's scale).
  float* UploadScale(float value) {
    float* p = static_cast<float*>(Alloc(sizeof(float), 0));
    gpu_->CopyFromHost(p, &value, sizeof(float));
    return p;
  }
  template <typename T>
  std::vector<T> Download(const void* p, size_t n) {
    std::vector<T> v(n);
    gpu_->CopyToHost(v.data(), p, n * sizeof(T));
    EXPECT_TRUE(gpu_->Synchronize().ok());
    return v;
  }

  std::unique_ptr<CudaBackend> gpu_;
  std::mt19937 rng_;
  std::vector<void*> owned_;
};

enum Outputs { kBoth, kOutOnly, kOutTOnly };
enum Specials {
  kPlain,
  kNonFinite,  // ±inf and NaN among the inputs
  kExtremes,   // huge, tiny (subnormal), GELU's underflowing tail, exact zeros, no non-finite
};

struct Case {
  int rows, cols;
  Fp8Format format;
  float scale;
  Specials specials;
  Outputs outputs;
};

// Fills pre [rows x cols] (as FP32, stored as BF16) for case c.
std::vector<float> Inputs(const Case& c, std::mt19937& rng) {
  const size_t n = static_cast<size_t>(c.rows) * c.cols;
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> pre(n);
  for (size_t i = 0; i < n; ++i) pre[i] = normal(rng);
  pre[0] = 0.0f;
  if (n > 3) pre[n / 2] = -30.0f, pre[n / 3] = 40.0f;
  if (c.specials == kNonFinite) {
    pre[1] = std::numeric_limits<float>::infinity();
    pre[2] = std::numeric_limits<float>::quiet_NaN();
    pre[n - 1] = -std::numeric_limits<float>::infinity();
  }
  if (c.specials == kExtremes) {
    const float extremes[] = {3.0e38f,  -3.0e38f,  1.0e30f,  -1.0e30f, 1.0e13f,   -1.0e13f,
                              1.0e-39f, -1.0e-39f, 1.0e-40f, 2.0e-38f, -2.0e-38f, -0.0f,
                              0.0f,     -5.0f,     -8.0f,    -9.0f,    -10.0f,    -12.0f,
                              -20.0f,   1.0e-20f,  1.0e-30f, 400.0f,   -400.0f,   3.0e5f};
    // Spread over the tensor: every 7th element, cycling through the list.
    size_t k = 0;
    for (size_t i = 3; i < n; i += 7) pre[i] = extremes[k++ % std::size(extremes)];
  }
  return pre;
}

std::string CaseName(const Case& c) {
  const char* outputs[] = {"out+out_t", "out", "out_t"};
  const char* specials[] = {"", " inf/NaN", " extremes"};
  return absl::StrCat(c.rows, "x", c.cols, " ", Fp8FormatName(c.format), " scale ", c.scale, " ",
                      outputs[c.outputs], specials[c.specials]);
}

TEST_F(CudaGeluCastFp8Test, FusedKernelGivesTheDefaultPathsBytesAndStatistics) {
  const Case cases[] = {
      // Tile kernel (rows and cols multiples of 8).
      {256, 768, Fp8Format::kE4M3, 64.0f, kPlain, kBoth},         // full tiles
      {256, 768, Fp8Format::kE4M3, 64.0f, kPlain, kOutOnly},      //
      {256, 768, Fp8Format::kE4M3, 64.0f, kPlain, kOutTOnly},     //
      {128, 3072, Fp8Format::kE4M3, 3000.0f, kPlain, kBoth},      // saturates many
      {2048, 3072, Fp8Format::kE4M3, 100.0f, kPlain, kOutTOnly},  // several tiles per block
      {2048, 3072, Fp8Format::kE5M2, 100.0f, kPlain, kBoth},      //
      {1000, 136, Fp8Format::kE4M3, 50.0f, kNonFinite, kBoth},    // partial tiles
      {4104, 72, Fp8Format::kE4M3, 50.0f, kExtremes, kOutTOnly},  // partial tiles, one strip
      {520, 264, Fp8Format::kE4M3, 1.0f, kExtremes, kBoth},       //
      {520, 264, Fp8Format::kE5M2, 1e-3f, kExtremes, kOutOnly},   // underflows
      {512, 512, Fp8Format::kE4M3, 1e30f, kExtremes, kOutTOnly},  // saturates, inf products
      {64, 24, Fp8Format::kE5M2, 900.0f, kNonFinite, kBoth},      // less than a tile
      {8, 8, Fp8Format::kE4M3, 1.0f, kPlain, kBoth},              // one group
      // Per-element kernel (other shapes).
      {100, 200, Fp8Format::kE5M2, 1e-3f, kPlain, kBoth},       // rows not 8-aligned
      {37, 41, Fp8Format::kE4M3, 17.0f, kNonFinite, kBoth},     // unaligned rows and columns
      {37, 41, Fp8Format::kE4M3, 17.0f, kExtremes, kOutTOnly},  //
      {96, 100, Fp8Format::kE4M3, 2.0f, kExtremes, kOutOnly},   // cols not 8-aligned
      {1, 8, Fp8Format::kE4M3, 1.0f, kPlain, kBoth},            // one row
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(CaseName(c));
    const size_t n = static_cast<size_t>(c.rows) * c.cols;
    void* pre_d = UploadBf16(Inputs(c, rng_));
    float* scale = UploadScale(c.scale);
    const bool want_out = c.outputs != kOutTOnly, want_out_t = c.outputs != kOutOnly;
    // [0]: the fused op, [1]: the default (GeluForward + CastFp8), [2]: the per-element kernel
    // called directly (on every shape); each its own outputs and statistics.
    constexpr int kWays = 3;
    uint8_t* out[kWays];
    uint8_t* out_t[kWays];
    float* amax[kWays];
    uint64_t* counts[kWays];
    void* scratch[kWays];
    for (int k = 0; k < kWays; ++k) {
      out[k] = static_cast<uint8_t*>(Alloc(n, 0xA5));
      out_t[k] = static_cast<uint8_t*>(Alloc(n, 0x5A));
      amax[k] = static_cast<float*>(Alloc(sizeof(float), 0));
      counts[k] = static_cast<uint64_t*>(Alloc(kFp8CountersPerTensor * sizeof(uint64_t), 0));
      scratch[k] = Alloc(n * 2, 0x77);
    }
    auto o = [&](int k) { return want_out ? out[k] : nullptr; };
    auto ot = [&](int k) { return want_out_t ? out_t[k] : nullptr; };
    gpu_->GeluCastFp8(o(0), ot(0), scratch[0], pre_d, c.rows, c.cols, c.format, scale, amax[0],
                      counts[0]);
    gpu_->Backend::GeluCastFp8(o(1), ot(1), scratch[1], pre_d, c.rows, c.cols, c.format, scale,
                               amax[1], counts[1]);
    ASSERT_EQ(GeluCastFp8AnyShape(o(2), ot(2), static_cast<const __nv_bfloat16*>(pre_d), c.rows,
                                  c.cols, c.format == Fp8Format::kE4M3, scale, amax[2],
                                  reinterpret_cast<unsigned long long*>(counts[2]), gpu_->stream()),
              cudaSuccess);
    ASSERT_TRUE(gpu_->Synchronize().ok());
    const std::vector<uint64_t> c1 = Download<uint64_t>(counts[1], kFp8CountersPerTensor);
    const std::vector<float> a1 = Download<float>(amax[1], 1);
    for (int k : {0, 2}) {
      SCOPED_TRACE(k == 0 ? "GeluCastFp8" : "GeluCastFp8AnyShape");
      // Unwritten outputs keep their poison (and the default path wrote none there either).
      EXPECT_EQ(Download<uint8_t>(out[k], n), Download<uint8_t>(out[1], n));
      EXPECT_EQ(Download<uint8_t>(out_t[k], n), Download<uint8_t>(out_t[1], n));
      const std::vector<float> a = Download<float>(amax[k], 1);
      if (c.specials == kNonFinite) {
        EXPECT_TRUE(std::isnan(a[0]) && std::isnan(a1[0])) << a[0] << " " << a1[0];
      } else {
        EXPECT_EQ(a[0], a1[0]);
        EXPECT_GT(a[0], 0.0f);
      }
      EXPECT_EQ(Download<uint64_t>(counts[k], kFp8CountersPerTensor), c1);
      // The fused kernels did not touch their scratch; the default wrote GELU there.
      EXPECT_EQ(Download<uint8_t>(scratch[k], n * 2), std::vector<uint8_t>(n * 2, 0x77));
    }
    if (c.specials == kNonFinite) {
      EXPECT_EQ(c1[kFp8NonFinite], 3u);  // +inf, NaN and GELU(-inf) = NaN
    } else {
      EXPECT_EQ(c1[kFp8NonFinite], 0u);
    }
    if (!want_out) {
      EXPECT_EQ(Download<uint8_t>(out[0], n), std::vector<uint8_t>(n, 0xA5));
    }
    if (!want_out_t) {
      EXPECT_EQ(Download<uint8_t>(out_t[0], n), std::vector<uint8_t>(n, 0x5A));
    }
    if (want_out && want_out_t) {
      // The transpose is the row-major output's.
      const std::vector<uint8_t> q = Download<uint8_t>(out[0], n);
      const std::vector<uint8_t> t = Download<uint8_t>(out_t[0], n);
      size_t mismatched = 0;
      for (int r = 0; r < c.rows; ++r) {
        for (int col = 0; col < c.cols; ++col) {
          mismatched +=
              q[static_cast<size_t>(r) * c.cols + col] != t[static_cast<size_t>(col) * c.rows + r];
        }
      }
      EXPECT_EQ(mismatched, 0u);
    }
  }
}

// The extremes and scales above do reach every statistic somewhere (else the equalities would
// prove little): saturation, underflow and zero codes from zero inputs.
TEST_F(CudaGeluCastFp8Test, ExtremeInputsReachEveryStatistic) {
  const struct {
    Fp8Format format;
    float scale;
    int counter;
  } probes[] = {{Fp8Format::kE4M3, 1e30f, kFp8Saturated}, {Fp8Format::kE5M2, 1e-3f, kFp8Underflow}};
  for (const auto& p : probes) {
    const Case c{520, 264, p.format, p.scale, kExtremes, kOutTOnly};
    SCOPED_TRACE(CaseName(c));
    const size_t n = static_cast<size_t>(c.rows) * c.cols;
    void* pre_d = UploadBf16(Inputs(c, rng_));
    float* scale = UploadScale(c.scale);
    uint8_t* out_t = static_cast<uint8_t*>(Alloc(n, 0));
    float* amax = static_cast<float*>(Alloc(sizeof(float), 0));
    uint64_t* counts = static_cast<uint64_t*>(Alloc(kFp8CountersPerTensor * sizeof(uint64_t), 0));
    gpu_->GeluCastFp8(nullptr, out_t, Alloc(n * 2, 0), pre_d, c.rows, c.cols, c.format, scale, amax,
                      counts);
    const std::vector<uint64_t> cnt = Download<uint64_t>(counts, kFp8CountersPerTensor);
    EXPECT_GT(cnt[p.counter], 0u);
    EXPECT_EQ(cnt[kFp8NonFinite], 0u);
    // amax is GELU(3e38) = 3e38 rounded to BF16.
    EXPECT_NEAR(Download<float>(amax, 1)[0], 3.0e38f, 0.01e38f);
  }
}

TEST_F(CudaGeluCastFp8Test, TransposeOnlyMatchesAndRecordsTheSameStatistics) {
  const int rows = 512, cols = 3072;  // one layer's fc2 input at the seed model's width
  const size_t n = static_cast<size_t>(rows) * cols;
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> pre(n);
  for (float& x : pre) x = normal(rng_);
  void* pre_d = UploadBf16(pre);
  float* scale = UploadScale(100.0f);
  uint8_t* full_t = static_cast<uint8_t*>(Alloc(n, 0));
  uint8_t* only_t = static_cast<uint8_t*>(Alloc(n, 0x11));
  uint8_t* full = static_cast<uint8_t*>(Alloc(n, 0));
  float* amax = static_cast<float*>(Alloc(2 * sizeof(float), 0));
  uint64_t* counts = static_cast<uint64_t*>(Alloc(2 * 3 * sizeof(uint64_t), 0));
  void* scratch = Alloc(n * 2, 0);
  gpu_->GeluCastFp8(full, full_t, scratch, pre_d, rows, cols, Fp8Format::kE4M3, scale, amax,
                    counts);
  gpu_->GeluCastFp8(nullptr, only_t, scratch, pre_d, rows, cols, Fp8Format::kE4M3, scale, amax + 1,
                    counts + 3);
  ASSERT_TRUE(gpu_->Synchronize().ok());
  EXPECT_EQ(Download<uint8_t>(only_t, n), Download<uint8_t>(full_t, n));
  const std::vector<float> a = Download<float>(amax, 2);
  EXPECT_EQ(a[0], a[1]);
  const std::vector<uint64_t> c = Download<uint64_t>(counts, 6);
  EXPECT_EQ(std::vector<uint64_t>(c.begin(), c.begin() + 3),
            std::vector<uint64_t>(c.begin() + 3, c.end()));
}

// GeluCastFp8AndGrad (the MLP backward's two casts over fc1's pre-activation in one kernel)
// against the two calls it replaces on the same GPU (GeluCastFp8 with the transposed output
// only, then CastFp8Grad with dGELU; CudaBackend::set_fused_gelu_grad(false) runs them): the
// input transpose, the gradient's codes (row-major and transposed), amax, counters and bias
// gradient bit for bit, with and without the bias gradient, in hybrid (E4M3 input, E5M2
// gradient) and all-E4M3 formats, on shapes with partial tiles and several tiles per block.
TEST_F(CudaGeluCastFp8Test, FusedGeluCastAndGradCastGiveTheTwoCastsBytes) {
  struct Shape {
    int rows, cols;
  };
  for (const Shape sh : {Shape{256, 3072}, Shape{136, 200}, Shape{1032, 64}}) {
    for (const bool hybrid : {true, false}) {
      for (const bool with_bias : {true, false}) {
        const int rows = sh.rows, cols = sh.cols;
        const size_t n = size_t(rows) * cols;
        SCOPED_TRACE(absl::StrCat(rows, "x", cols, hybrid ? " hybrid" : " e4m3",
                                  with_bias ? " bias" : ""));
        std::normal_distribution<float> d(0.f, 1.f);
        std::vector<float> pre(n), dout(n), bias(cols);
        for (auto& x : pre) x = 3.f * d(rng_);
        for (auto& x : dout) x = 1e-3f * d(rng_);
        for (auto& x : bias) x = d(rng_);
        const Fp8Format in_fmt = Fp8Format::kE4M3;
        const Fp8Format g_fmt = hybrid ? Fp8Format::kE5M2 : Fp8Format::kE4M3;
        const float* in_scale = UploadScale(60.f);
        const float* g_scale = UploadScale(hybrid ? 3e5f : 2e4f);  // some saturate
        void* d_pre = UploadBf16(pre);
        struct Run {
          void *in_t, *g, *g_t, *dbias, *amax, *counts, *in_stats;
        };
        auto run = [&](bool fused) {
          Run r;
          r.in_t = Alloc(n, 0xA5);
          r.g = Alloc(n, 0x5A);
          r.g_t = Alloc(n, 0x3C);
          r.dbias = with_bias ? UploadBf16(bias) : nullptr;
          r.amax = UploadScale(0.f);
          r.counts = Alloc(3 * sizeof(uint64_t), 0);
          r.in_stats = Alloc(64, 0);
          void* d_dout = UploadBf16(dout);  // the default may overwrite it
          void* scratch = Alloc(n * 2, 0);
          gpu_->set_fused_gelu_grad(fused);
          gpu_->GeluCastFp8AndGrad(static_cast<uint8_t*>(r.in_t), in_fmt, in_scale,
                                   static_cast<float*>(r.in_stats),
                                   reinterpret_cast<uint64_t*>(static_cast<char*>(r.in_stats) + 8),
                                   static_cast<uint8_t*>(r.g), static_cast<uint8_t*>(r.g_t), d_dout,
                                   d_pre, r.dbias, rows, cols, g_fmt, g_scale,
                                   static_cast<float*>(r.amax), static_cast<uint64_t*>(r.counts),
                                   scratch);
          gpu_->set_fused_gelu_grad(true);
          return r;
        };
        const Run fused = run(true), two = run(false);
        EXPECT_EQ(Download<uint8_t>(fused.in_t, n), Download<uint8_t>(two.in_t, n))
            << "fc2's input transpose";
        EXPECT_EQ(Download<uint8_t>(fused.g, n), Download<uint8_t>(two.g, n)) << "gradient codes";
        EXPECT_EQ(Download<uint8_t>(fused.g_t, n), Download<uint8_t>(two.g_t, n))
            << "gradient transpose";
        EXPECT_EQ(Download<uint32_t>(fused.amax, 1), Download<uint32_t>(two.amax, 1)) << "amax";
        EXPECT_EQ(Download<uint64_t>(fused.counts, 3), Download<uint64_t>(two.counts, 3))
            << "saturated, underflow, non-finite";
        if (with_bias) {
          EXPECT_EQ(Download<uint16_t>(fused.dbias, cols), Download<uint16_t>(two.dbias, cols))
              << "bias gradient";
        }
        // The transpose is the transpose: spot-check the fused input transpose against a
        // fresh GeluCastFp8 of the same pre-activation.
        void* ref = Alloc(n, 0);
        gpu_->GeluCastFp8(nullptr, static_cast<uint8_t*>(ref), Alloc(n * 2, 0), d_pre, rows, cols,
                          in_fmt, in_scale, static_cast<float*>(Alloc(4, 0)),
                          static_cast<uint64_t*>(Alloc(24, 0)));
        EXPECT_EQ(Download<uint8_t>(fused.in_t, n), Download<uint8_t>(ref, n));
      }
    }
  }
}

}  // namespace
}  // namespace boulder::kernels::cuda
