// CudaBackend::GeluCastFp8 (fp8_gelu.cu's fused kernel) against the Backend default on the same
// GPU (GeluForward into a scratch, then CastFp8): the FP8 codes of both outputs, amax and the
// saturated, underflow and non-finite counts exactly equal, on aligned and unaligned shapes,
// partial tiles, both formats, scales that saturate and underflow, with infs and NaNs among
// the inputs; the fused kernel leaves its scratch untouched. Outputs are poisoned first.
// Skips, saying so, without a GPU of compute capability 8.9 or higher.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"

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

struct Case {
  int rows, cols;
  Fp8Format format;
  float scale;
  bool specials;  // infs and NaNs among the inputs
};

TEST_F(CudaGeluCastFp8Test, FusedKernelGivesTheDefaultPathsBytesAndStatistics) {
  const Case cases[] = {
      {256, 768, Fp8Format::kE4M3, 64.0f, false},     // aligned, full tiles
      {128, 3072, Fp8Format::kE4M3, 3000.0f, false},  // saturates many
      {100, 200, Fp8Format::kE5M2, 1e-3f, false},     // partial tiles, underflows
      {37, 41, Fp8Format::kE4M3, 17.0f, true},        // unaligned rows and columns
      {64, 24, Fp8Format::kE5M2, 900.0f, true},       // cols 8-aligned, less than a tile
      {1, 8, Fp8Format::kE4M3, 1.0f, false},          // one row
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(
        absl::StrCat(c.rows, "x", c.cols, " ", Fp8FormatName(c.format), " scale ", c.scale));
    const size_t n = static_cast<size_t>(c.rows) * c.cols;
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> pre(n);
    for (size_t i = 0; i < n; ++i) pre[i] = normal(rng_);
    pre[0] = 0.0f;
    if (n > 3) pre[n / 2] = -30.0f, pre[n / 3] = 40.0f;
    if (c.specials) {
      pre[1] = std::numeric_limits<float>::infinity();
      pre[2] = std::numeric_limits<float>::quiet_NaN();
      pre[n - 1] = -std::numeric_limits<float>::infinity();
    }
    void* pre_d = Alloc(n * 2, 0);
    gpu_->CopyFromHostF32(pre_d, DType::kBF16, pre.data(), n);
    float* scale = static_cast<float*>(Alloc(sizeof(float), 0));
    gpu_->CopyFromHost(scale, &c.scale, sizeof(float));
    // [0]: the fused kernel, [1]: the default; each its own outputs and statistics.
    uint8_t* out[2];
    uint8_t* out_t[2];
    float* amax[2];
    uint64_t* counts[2];
    void* scratch[2];
    for (int k = 0; k < 2; ++k) {
      out[k] = static_cast<uint8_t*>(Alloc(n, 0xA5));
      out_t[k] = static_cast<uint8_t*>(Alloc(n, 0x5A));
      amax[k] = static_cast<float*>(Alloc(sizeof(float), 0));
      counts[k] = static_cast<uint64_t*>(Alloc(kFp8CountersPerTensor * sizeof(uint64_t), 0));
      scratch[k] = Alloc(n * 2, 0x77);
    }
    gpu_->GeluCastFp8(out[0], out_t[0], scratch[0], pre_d, c.rows, c.cols, c.format, scale, amax[0],
                      counts[0]);
    gpu_->Backend::GeluCastFp8(out[1], out_t[1], scratch[1], pre_d, c.rows, c.cols, c.format, scale,
                               amax[1], counts[1]);
    ASSERT_TRUE(gpu_->Synchronize().ok());
    EXPECT_EQ(Download<uint8_t>(out[0], n), Download<uint8_t>(out[1], n));
    EXPECT_EQ(Download<uint8_t>(out_t[0], n), Download<uint8_t>(out_t[1], n));
    const std::vector<float> a0 = Download<float>(amax[0], 1), a1 = Download<float>(amax[1], 1);
    if (c.specials) {
      EXPECT_TRUE(std::isnan(a0[0]) && std::isnan(a1[0])) << a0[0] << " " << a1[0];
    } else {
      EXPECT_EQ(a0[0], a1[0]);
      EXPECT_GT(a0[0], 0.0f);
    }
    const std::vector<uint64_t> c0 = Download<uint64_t>(counts[0], kFp8CountersPerTensor);
    const std::vector<uint64_t> c1 = Download<uint64_t>(counts[1], kFp8CountersPerTensor);
    EXPECT_EQ(c0, c1);
    if (c.specials) EXPECT_EQ(c0[kFp8NonFinite], 3u);
    // The transpose is the row-major output's.
    const std::vector<uint8_t> o = Download<uint8_t>(out[0], n), t = Download<uint8_t>(out_t[0], n);
    size_t mismatched = 0;
    for (int r = 0; r < c.rows; ++r) {
      for (int col = 0; col < c.cols; ++col) {
        mismatched +=
            o[static_cast<size_t>(r) * c.cols + col] != t[static_cast<size_t>(col) * c.rows + r];
      }
    }
    EXPECT_EQ(mismatched, 0u);
    // The fused kernel did not touch its scratch; the default wrote GELU there.
    const std::vector<uint8_t> s0 = Download<uint8_t>(scratch[0], n * 2);
    EXPECT_EQ(s0, std::vector<uint8_t>(n * 2, 0x77));
  }
}

TEST_F(CudaGeluCastFp8Test, TransposeOnlyMatchesAndRecordsTheSameStatistics) {
  const int rows = 512, cols = 3072;  // one layer's fc2 input at the seed model's width
  const size_t n = static_cast<size_t>(rows) * cols;
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> pre(n);
  for (float& x : pre) x = normal(rng_);
  void* pre_d = Alloc(n * 2, 0);
  gpu_->CopyFromHostF32(pre_d, DType::kBF16, pre.data(), n);
  const float s = 100.0f;
  float* scale = static_cast<float*>(Alloc(sizeof(float), 0));
  gpu_->CopyFromHost(scale, &s, sizeof(float));
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

}  // namespace
}  // namespace boulder::kernels::cuda
