// The fused LayerNorm + FP8 cast (CudaBackend::ResidualLayerNormFp8Forward) against the unfused
// ops it replaces (ResidualLayerNormForward or LayerNormForward, then CastFp8) on the same GPU,
// on fresh random inputs, outputs poisoned first. Backend::ResidualLayerNormFp8Forward's
// contract is bit-identity: the FP8 bytes (row-major and transposed), residual, mean, rstd,
// amax and the saturated / underflow / non-finite counters must match exactly — with scales
// that saturate, that flush most values to zero, with a non-finite input row, with residual
// aliasing its input, for both block sizes of the kernel (8 and 16 warps, chosen by the row
// count), and for shapes that take the unfused fallback. And Backend::LayerNormFp8FromStats (FP8
// training's backward recomputing qkv's and fc1's FP8 input from the LayerNorm's kept input,
// mean and rstd) against the forward's bytes and statistics, fused and unfused, on the same
// kinds of inputs and shapes.
// Skips, saying so, without a GPU of compute capability 8.9 or higher.
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/ops.h"

namespace boulder::kernels::cuda {
namespace {

// "" when equal, else the number of differing elements and the first one.
template <typename T>
std::string Diff(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return absl::StrCat("sizes ", got.size(), " vs ", want.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i] && bad++ == 0) first = i;
  }
  if (bad == 0) return "";
  return absl::StrCat(bad, " of ", got.size(), " differ, first at ", first, ": 0x",
                      absl::Hex(uint64_t(got[first])), " vs 0x", absl::Hex(uint64_t(want[first])));
}

class CudaLayerNormFp8Test : public ::testing::Test {
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
  std::vector<T> Download(const void* p, size_t n) {
    std::vector<T> v(n);
    gpu_->CopyToHost(v.data(), p, n * sizeof(T));
    absl::Status s = gpu_->Synchronize();
    EXPECT_TRUE(s.ok()) << s;
    return v;
  }
  std::vector<float> Normal(size_t n, float mean, float spread) {
    std::normal_distribution<float> d(mean, spread);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }

  struct Outputs {
    std::vector<uint8_t> q, q_t;
    std::vector<uint16_t> residual;
    std::vector<uint32_t> mean, rstd;  // bit patterns
    uint32_t amax;
    std::vector<uint64_t> counts;
  };

  // One run on copies of the inputs: fused (ResidualLayerNormFp8Forward with the fused kernel
  // on) or the unfused ops. alias: residual is written over a's copy (residual = a + b in place).
  Outputs Run(bool fused, bool with_residual, bool alias, const std::vector<float>& a,
              const std::vector<float>& b, const std::vector<float>& w,
              const std::vector<float>& bias, int N, int C, Fp8Format f, float scale,
              bool with_t = true) {
    const size_t n = size_t(N) * C;
    void* da = UploadBF16(a);
    void* db = UploadBF16(b);
    void* dw = UploadBF16(w);
    void* dbias = UploadBF16(bias);
    void* residual = nullptr;
    if (with_residual) residual = alias ? da : UploadBF16(std::vector<float>(n, -7.0f));
    void* ln = UploadBF16(std::vector<float>(n, 3.0f));
    float* mean = Upload(std::vector<float>(N, -1.0f));
    float* rstd = Upload(std::vector<float>(N, -1.0f));
    uint8_t* q = Upload(std::vector<uint8_t>(n, 0x55));
    uint8_t* q_t = Upload(std::vector<uint8_t>(n, 0x55));
    float* d_scale = Upload(std::vector<float>{scale});
    // Statistics accumulate: start from non-zero values.
    float* d_amax = Upload(std::vector<float>{0.25f});
    uint64_t* d_counts = Upload(std::vector<uint64_t>{5, 6, 7});
    if (fused) {
      gpu_->set_fused_layernorm_fp8(true);
      gpu_->ResidualLayerNormFp8Forward(residual, ln, mean, rstd, da, db, dw, dbias, N, C, q,
                                        with_t ? q_t : nullptr, f, d_scale, d_amax, d_counts);
    } else {
      if (with_residual) {
        gpu_->ResidualLayerNormForward(residual, ln, mean, rstd, da, db, dw, dbias, N, C);
      } else {
        gpu_->LayerNormForward(ln, mean, rstd, da, dw, dbias, N, C);
      }
      gpu_->CastFp8(q, q_t, ln, N, C, f, d_scale, d_amax, d_counts);
    }
    Outputs o;
    o.q = Download<uint8_t>(q, n);
    o.q_t = Download<uint8_t>(q_t, n);
    if (with_residual) o.residual = Download<uint16_t>(residual, n);
    o.mean = Download<uint32_t>(mean, N);
    o.rstd = Download<uint32_t>(rstd, N);
    o.amax = Download<uint32_t>(d_amax, 1)[0];
    o.counts = Download<uint64_t>(d_counts, 3);
    return o;
  }

  // Fused against unfused; expect_fused: the shape must take the fused kernel.
  void Case(int N, int C, bool with_residual, bool alias, Fp8Format f, float scale,
            bool expect_fused, bool non_finite = false, float spread = 1.5f) {
    SCOPED_TRACE(absl::StrCat(N, "x", C, with_residual ? " residual" : " plain",
                              alias ? " aliased" : "", " ", FormatName(f), " scale ", scale,
                              non_finite ? " non-finite" : ""));
    const size_t n = size_t(N) * C;
    std::vector<float> a = Normal(n, 0.3f, spread), b = Normal(n, -0.1f, spread);
    std::vector<float> w = Normal(C, 1.0f, 0.5f), bias = Normal(C, 0.0f, 0.2f);
    // A few columns with large weights: their outputs stand far above the rest.
    for (int c = 0; c < C; c += 37) w[c] *= 40.0f;
    if (non_finite) {
      a[size_t(N / 2) * C + 3] = std::numeric_limits<float>::infinity();
      a[size_t(N - 1) * C + C - 1] = std::numeric_limits<float>::quiet_NaN();
    }
    // The fused kernel's conditions on this run's (fresh, aligned) buffers.
    EXPECT_EQ(expect_fused, N % 8 == 0 && C % 8 == 0);
    const Outputs want = Run(false, with_residual, alias, a, b, w, bias, N, C, f, scale);
    const Outputs got = Run(true, with_residual, alias, a, b, w, bias, N, C, f, scale);
    EXPECT_EQ(Diff(got.q, want.q), "") << "row-major FP8 bytes";
    EXPECT_EQ(Diff(got.q_t, want.q_t), "") << "transposed FP8 bytes";
    EXPECT_EQ(Diff(got.residual, want.residual), "") << "residual";
    EXPECT_EQ(Diff(got.mean, want.mean), "") << "mean";
    EXPECT_EQ(Diff(got.rstd, want.rstd), "") << "rstd";
    EXPECT_EQ(got.amax, want.amax) << "amax differs";
    EXPECT_EQ(Diff(got.counts, want.counts), "") << "counters";
    // Without a transpose (training's forward; a row kernel where fused): the same.
    const Outputs rows = Run(true, with_residual, alias, a, b, w, bias, N, C, f, scale, false);
    EXPECT_EQ(Diff(rows.q, want.q), "") << "row-major FP8 bytes, no transpose";
    EXPECT_EQ(Diff(rows.q_t, std::vector<uint8_t>(n, 0x55)), "") << "a transpose was written";
    EXPECT_EQ(Diff(rows.residual, want.residual), "") << "residual, no transpose";
    EXPECT_EQ(Diff(rows.mean, want.mean), "") << "mean, no transpose";
    EXPECT_EQ(Diff(rows.rstd, want.rstd), "") << "rstd, no transpose";
    EXPECT_EQ(rows.amax, want.amax) << "amax differs, no transpose";
    EXPECT_EQ(Diff(rows.counts, want.counts), "") << "counters, no transpose";
    // The cases exercise what they claim: counters moved from their starting values.
    if (scale >= 1000.0f) {
      EXPECT_GT(want.counts[kFp8Saturated], 5u) << "no saturation";
    }
    if (scale <= 1e-4f) {
      EXPECT_GT(want.counts[kFp8Underflow], 6u) << "no underflow";
    }
    if (non_finite) {
      EXPECT_GT(want.counts[kFp8NonFinite], 7u) << "no non-finite element";
    }
    // The transpose is the transpose.
    int wrong_t = 0;
    for (int r = 0; r < N; ++r)
      for (int c = 0; c < C; ++c) wrong_t += got.q_t[size_t(c) * N + r] != got.q[size_t(r) * C + c];
    EXPECT_EQ(wrong_t, 0);
  }
  static const char* FormatName(Fp8Format f) { return Fp8FormatName(f); }

  // The forward (ResidualLayerNormFp8Forward, fused or not), then LayerNormFp8FromStats (fused
  // or not) from the residual (or a), mean and rstd it kept, with statistics starting from the
  // same values: the FP8 bytes (both layouts, and the transpose alone), amax and counters must
  // be the forward's.
  void FromStatsCase(int N, int C, bool with_residual, Fp8Format f, float scale, bool forward_fused,
                     bool recompute_fused, bool non_finite = false) {
    SCOPED_TRACE(absl::StrCat("from stats ", N, "x", C, with_residual ? " residual" : " plain", " ",
                              FormatName(f), " scale ", scale, forward_fused ? " fwd fused" : "",
                              recompute_fused ? " recompute fused" : "",
                              non_finite ? " non-finite" : ""));
    const size_t n = size_t(N) * C;
    std::vector<float> a = Normal(n, 0.3f, 1.5f), b = Normal(n, -0.1f, 1.5f);
    std::vector<float> w = Normal(C, 1.0f, 0.5f), bias = Normal(C, 0.0f, 0.2f);
    for (int c = 0; c < C; c += 37) w[c] *= 40.0f;
    if (non_finite) {
      a[size_t(N / 2) * C + 3] = std::numeric_limits<float>::infinity();
      a[size_t(N - 1) * C + C - 1] = std::numeric_limits<float>::quiet_NaN();
    }
    void* da = UploadBF16(a);
    void* db = UploadBF16(b);
    void* dw = UploadBF16(w);
    void* dbias = UploadBF16(bias);
    void* residual = with_residual ? UploadBF16(std::vector<float>(n, -7.0f)) : nullptr;
    void* ln = UploadBF16(std::vector<float>(n, 3.0f));
    float* mean = Upload(std::vector<float>(N, -1.0f));
    float* rstd = Upload(std::vector<float>(N, -1.0f));
    float* d_scale = Upload(std::vector<float>{scale});
    auto fp8 = [&] { return Upload(std::vector<uint8_t>(n, 0x55)); };
    auto amax = [&] { return Upload(std::vector<float>{0.25f}); };
    auto counts = [&] { return Upload(std::vector<uint64_t>{5, 6, 7}); };
    uint8_t *q = fp8(), *q_t = fp8(), *rq = fp8(), *rq_t = fp8(), *only_t = fp8();
    float *fwd_amax = amax(), *re_amax = amax(), *only_amax = amax();
    uint64_t *fwd_counts = counts(), *re_counts = counts(), *only_counts = counts();
    gpu_->set_fused_layernorm_fp8(forward_fused);
    gpu_->ResidualLayerNormFp8Forward(residual, ln, mean, rstd, da, db, dw, dbias, N, C, q, q_t, f,
                                      d_scale, fwd_amax, fwd_counts);
    // The recomputation's scratch is the forward's BF16 LayerNorm buffer, as in the model.
    const void* x = with_residual ? residual : da;
    gpu_->set_fused_layernorm_fp8(recompute_fused);
    gpu_->LayerNormFp8FromStats(rq, rq_t, ln, x, mean, rstd, dw, dbias, N, C, f, d_scale, re_amax,
                                re_counts);
    gpu_->LayerNormFp8FromStats(nullptr, only_t, ln, x, mean, rstd, dw, dbias, N, C, f, d_scale,
                                only_amax, only_counts);
    // The forward again without a transpose (training's; fused: the row kernel).
    uint8_t* fq = fp8();
    float* fq_amax = amax();
    uint64_t* fq_counts = counts();
    gpu_->set_fused_layernorm_fp8(forward_fused);
    gpu_->ResidualLayerNormFp8Forward(residual, ln, mean, rstd, da, db, dw, dbias, N, C, fq,
                                      nullptr, f, d_scale, fq_amax, fq_counts);
    gpu_->set_fused_layernorm_fp8(true);
    const std::vector<uint8_t> want_q = Download<uint8_t>(q, n);
    const std::vector<uint8_t> want_t = Download<uint8_t>(q_t, n);
    EXPECT_EQ(Diff(Download<uint8_t>(fq, n), want_q), "") << "forward without transpose";
    EXPECT_EQ(Download<uint32_t>(fq_amax, 1)[0], Download<uint32_t>(fwd_amax, 1)[0])
        << "forward without transpose: amax";
    EXPECT_EQ(Diff(Download<uint64_t>(fq_counts, 3), Download<uint64_t>(fwd_counts, 3)), "")
        << "forward without transpose: counters";
    EXPECT_EQ(Diff(Download<uint8_t>(rq, n), want_q), "") << "row-major FP8 bytes";
    EXPECT_EQ(Diff(Download<uint8_t>(rq_t, n), want_t), "") << "transposed FP8 bytes";
    EXPECT_EQ(Diff(Download<uint8_t>(only_t, n), want_t), "") << "transpose-only FP8 bytes";
    const uint32_t want_amax = Download<uint32_t>(fwd_amax, 1)[0];
    EXPECT_EQ(Download<uint32_t>(re_amax, 1)[0], want_amax) << "amax differs";
    EXPECT_EQ(Download<uint32_t>(only_amax, 1)[0], want_amax) << "transpose-only amax differs";
    const std::vector<uint64_t> want_counts = Download<uint64_t>(fwd_counts, 3);
    EXPECT_EQ(Diff(Download<uint64_t>(re_counts, 3), want_counts), "") << "counters";
    EXPECT_EQ(Diff(Download<uint64_t>(only_counts, 3), want_counts), "")
        << "transpose-only counters";
    // The cases exercise what they claim.
    if (scale >= 1000.0f) {
      EXPECT_GT(want_counts[kFp8Saturated], 5u) << "no saturation";
    }
    if (scale <= 1e-4f) {
      EXPECT_GT(want_counts[kFp8Underflow], 6u) << "no underflow";
    }
    if (non_finite) {
      EXPECT_GT(want_counts[kFp8NonFinite], 7u) << "no non-finite element";
    }
    // The forward's transpose is its row-major output transposed (it wrote them both).
    int wrong_t = 0;
    for (int r = 0; r < N; ++r)
      for (int c = 0; c < C; ++c) wrong_t += want_t[size_t(c) * N + r] != want_q[size_t(r) * C + c];
    EXPECT_EQ(wrong_t, 0);
  }

  std::unique_ptr<CudaBackend> gpu_;
  std::vector<void*> owned_;
  std::mt19937 rng_;
};

TEST_F(CudaLayerNormFp8Test, FusableOnlyForTheShapesItHandles) {
  void* p = *gpu_->Alloc(64);
  owned_.push_back(p);
  uint8_t* q = static_cast<uint8_t*>(p);
  EXPECT_TRUE(LayerNormFp8Fusable(p, p, p, p, p, q, q, 16384, 768));
  EXPECT_TRUE(LayerNormFp8Fusable(nullptr, p, nullptr, p, p, nullptr, q, 8192, 2048));
  EXPECT_FALSE(LayerNormFp8Fusable(p, p, p, p, p, q, q, 12, 768));      // N % 8
  EXPECT_FALSE(LayerNormFp8Fusable(p, p, p, p, p, q, q, 16, 20));       // C % 8
  EXPECT_FALSE(LayerNormFp8Fusable(p, p, p, p, p, q + 4, q, 16, 768));  // unaligned out
  EXPECT_FALSE(LayerNormFp8Fusable(p, p, p, p, p, nullptr, nullptr, 16, 768));
  EXPECT_FALSE(LayerNormFp8Fusable(p, p, p, p, p, q, q, 16, 1 << 20));  // tile too large
}

TEST_F(CudaLayerNormFp8Test, Gpt2WidthBitIdentical) {
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    Case(256, 768, true, false, f, 1.0f, true);
    Case(256, 768, false, false, f, 2.0f, true);
  }
  Case(256, 768, true, true, Fp8Format::kE4M3, 0.5f, true);
}

TEST_F(CudaLayerNormFp8Test, Hidden2048BitIdentical) {
  Case(128, 2048, true, false, Fp8Format::kE4M3, 1.0f, true);
  Case(136, 2048, false, false, Fp8Format::kE5M2, 4.0f, true);  // a partial 32-row tile
}

// The kernel's block size follows the row count (8 warps per 32-row tile where that still
// gives about 3 blocks per SM, else 16): the benchmark shapes at full size, each with a partial
// last tile, at the launcher's choice and at each block size fusion_bench compares.
TEST_F(CudaLayerNormFp8Test, EveryBlockSizeBitIdentical) {
  struct Warps {  // restored however the test ends
    ~Warps() { SetLayerNormFp8BlockWarps(0); }
  } restore;
  for (const int warps : {0, 8, 16, 32}) {
    SCOPED_TRACE(testing::Message() << "warps per block " << warps << " (0: the launcher's)");
    SetLayerNormFp8BlockWarps(warps);
    Case(16392, 768, true, false, Fp8Format::kE4M3, 1.0f, true);   // GPT-2
    Case(16392, 768, false, false, Fp8Format::kE5M2, 2.0f, true);  //
    Case(8200, 2048, true, false, Fp8Format::kE4M3, 1.0f, true);   // hidden-2048
    Case(8200, 768, true, true, Fp8Format::kE4M3, 0.5f, true);     // seed
  }
}

// The forward without a transpose runs a row kernel and the recomputation the cast-transpose
// tile kernel; the 32-row-tile kernel gives the same bytes and statistics for both
// (SetLayerNormReferenceKernels(true)).
TEST_F(CudaLayerNormFp8Test, TileKernelOnlyBitIdentical) {
  struct TileOnly {  // restored however the test ends
    TileOnly() { SetLayerNormReferenceKernels(true); }
    ~TileOnly() { SetLayerNormReferenceKernels(false); }
  } tile_only;
  Case(8200, 2048, true, false, Fp8Format::kE4M3, 1.0f, true);   // 16 warps
  Case(16392, 768, false, false, Fp8Format::kE5M2, 2.0f, true);  // 8 warps
  Case(96, 768, true, false, Fp8Format::kE4M3, 1.0f, true, /*non_finite=*/true);
  FromStatsCase(1024, 2048, true, Fp8Format::kE4M3, 0.5f, true, true);
  FromStatsCase(8192, 768, true, Fp8Format::kE5M2, 1.0f, true, true);
}

TEST_F(CudaLayerNormFp8Test, SaturationUnderflowAndNonFiniteBitIdentical) {
  Case(96, 768, true, false, Fp8Format::kE4M3, 4096.0f, true);  // saturates
  Case(96, 768, true, false, Fp8Format::kE5M2, 1e6f, true);     // saturates E5M2
  Case(96, 768, false, false, Fp8Format::kE4M3, 1e-5f, true);   // flushes to zero
  Case(96, 768, true, false, Fp8Format::kE4M3, 1.0f, true, /*non_finite=*/true);
}

TEST_F(CudaLayerNormFp8Test, SmallAndOddShapes) {
  Case(40, 24, true, false, Fp8Format::kE4M3, 8.0f, true);  // 2 tiles, 3 column chunks
  Case(8, 8, false, false, Fp8Format::kE4M3, 1.0f, true);
  Case(12, 64, true, false, Fp8Format::kE4M3, 1.0f, false);    // N % 8: the unfused fallback
  Case(1, 3000, false, false, Fp8Format::kE5M2, 1.0f, false);  // N % 8 and wide
}

TEST_F(CudaLayerNormFp8Test, FromStatsGivesTheForwardsBytes) {
  // The model's shapes (seed and GPT-2: C 768; hidden-2048), fused forward and recompute.
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    FromStatsCase(8192, 768, true, f, 1.0f, true, true);
    FromStatsCase(1024, 2048, false, f, 2.0f, true, true);
  }
  FromStatsCase(1024, 2048, true, Fp8Format::kE4M3, 0.5f, true, true);
  // Every pairing of fused and unfused forward and recomputation.
  for (bool forward_fused : {false, true}) {
    for (bool recompute_fused : {false, true}) {
      FromStatsCase(256, 768, true, Fp8Format::kE4M3, 1.0f, forward_fused, recompute_fused);
    }
  }
}

TEST_F(CudaLayerNormFp8Test, FromStatsSaturationUnderflowAndNonFinite) {
  FromStatsCase(96, 768, true, Fp8Format::kE4M3, 4096.0f, true, true);
  FromStatsCase(96, 768, false, Fp8Format::kE5M2, 1e6f, true, true);
  FromStatsCase(96, 768, true, Fp8Format::kE4M3, 1e-5f, true, true);
  FromStatsCase(96, 768, true, Fp8Format::kE4M3, 1.0f, true, true, /*non_finite=*/true);
  FromStatsCase(96, 768, true, Fp8Format::kE4M3, 1.0f, false, false, /*non_finite=*/true);
}

TEST_F(CudaLayerNormFp8Test, FromStatsOddShapes) {
  FromStatsCase(136, 2048, false, Fp8Format::kE5M2, 4.0f, true, true);  // a partial 32-row tile
  FromStatsCase(40, 24, true, Fp8Format::kE4M3, 8.0f, true, true);      // 2 tiles, 3 column chunks
  FromStatsCase(8, 8, false, Fp8Format::kE4M3, 1.0f, true, true);
  FromStatsCase(12, 64, true, Fp8Format::kE4M3, 1.0f, true, true);    // N % 8: unfused both
  FromStatsCase(1, 3000, false, Fp8Format::kE5M2, 1.0f, true, true);  // N % 8 and wide
  FromStatsCase(100, 776, true, Fp8Format::kE4M3, 2.0f, true, true);  // N % 8, C % 32 != 0
}

}  // namespace
}  // namespace boulder::kernels::cuda
