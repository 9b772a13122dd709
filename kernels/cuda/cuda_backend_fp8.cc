// CudaBackend's FP8 ops: the cast-transpose and scale update launch fp8.cu's kernels; the
// GEMM is cuBLASLt's FP8 matmul (TN: both operands K-contiguous, per-tensor dequantisation
// scales through A/B scale pointers, BF16 output and bias).
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/fp8_gelu_ops.h"
#include "kernels/cuda/fp8_ops.h"

namespace boulder::kernels::cuda {
#define BOULDER_REQUIRE_FP8(cond, msg)                                       \
  do {                                                                       \
    if (!(cond)) {                                                           \
      Fail(absl::InvalidArgumentError(absl::StrCat("cuda backend: ", msg))); \
      return;                                                                \
    }                                                                        \
  } while (0)

absl::Status CudaBackend::Fp8Supported() const {
  if (cc_major_ * 10 + cc_minor_ >= 89) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(device_name_, " has compute capability ", cc_major_, ".", cc_minor_,
                   "; FP8 training needs 8.9 or higher (Ada, Hopper) — set precision: bf16, or "
                   "fp8.emulate: true to emulate FP8 on the cpu backend"));
}

void CudaBackend::CastFp8(uint8_t* out, uint8_t* out_t, const void* inp, int rows, int cols,
                          Fp8Format format, const float* scale, float* amax, uint64_t* counts) {
  if (!Ok()) return;
  // Per shape and layout in the profile (weights, activations; row-major q, transposed t).
  ProfileScope profile(this, profiling_ ? absl::StrCat("CastFp8 ", rows, "x", cols,
                                                      out != nullptr ? " q" : "",
                                                      out_t != nullptr ? " t" : "")
                                        : std::string());
  BOULDER_REQUIRE_FP8(out != nullptr || out_t != nullptr, "CastFp8 without an output");
  Check(cuda::CastFp8(out, out_t, static_cast<const bf16*>(inp), rows, cols,
                      format == Fp8Format::kE4M3, scale, amax,
                      reinterpret_cast<unsigned long long*>(counts), stream_),
        "CastFp8");
}

void CudaBackend::CastFp8Batch(const std::vector<Fp8CastJob>& jobs, Fp8Format format) {
  if (!Ok() || jobs.empty()) return;
  ProfileScope profile(this, profiling_ ? absl::StrCat("CastFp8Batch ", jobs.size(), " tensors")
                                        : std::string());
  std::vector<cuda::CastBatchJob> launch(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Fp8CastJob& j = jobs[i];
    BOULDER_REQUIRE_FP8(j.out != nullptr || j.out_t != nullptr, "CastFp8Batch without an output");
    launch[i] = {j.out,   j.out_t, static_cast<const bf16*>(j.inp),
                 j.rows,  j.cols,  j.scale,
                 j.amax,  reinterpret_cast<unsigned long long*>(j.counts)};
  }
  Check(cuda::CastFp8Batch(launch.data(), static_cast<int>(launch.size()),
                           format == Fp8Format::kE4M3, stream_),
        "CastFp8Batch");
}

void CudaBackend::TransposeFp8(uint8_t* out, const uint8_t* in, int rows, int cols) {
  if (!Ok()) return;
  ProfileScope profile(this, profiling_ ? absl::StrCat("TransposeFp8 ", rows, "x", cols)
                                        : std::string());
  Check(cuda::TransposeFp8(out, in, rows, cols, stream_), "TransposeFp8");
}

void CudaBackend::CastFp8Grad(uint8_t* out, uint8_t* out_t, void* dout, const void* pre,
                              void* dbias, int rows, int cols, Fp8Format format, const float* scale,
                              float* amax, uint64_t* counts) {
  if (!Ok()) return;
  BOULDER_REQUIRE_FP8(out != nullptr || out_t != nullptr, "CastFp8Grad without an output");
  if (!cuda::CastFp8GradFusable(out, out_t, dout, pre, rows, cols)) {
    Backend::CastFp8Grad(out, out_t, dout, pre, dbias, rows, cols, format, scale, amax, counts);
    return;
  }
  ProfileScope profile(this, profiling_ ? absl::StrCat("CastFp8Grad ", rows, "x", cols,
                                                      pre != nullptr ? " dgelu" : "")
                                        : std::string());
  Check(cuda::CastFp8Grad(out, out_t, static_cast<const bf16*>(dout), static_cast<const bf16*>(pre),
                          static_cast<bf16*>(dbias), rows, cols, format == Fp8Format::kE4M3, scale,
                          amax, reinterpret_cast<unsigned long long*>(counts), scratch_, stream_),
        "CastFp8Grad");
}

void CudaBackend::ResidualLayerNormFp8Forward(void* residual, void* out, float* mean, float* rstd,
                                              const void* a, const void* b, const void* weight,
                                              const void* bias, int N, int C, uint8_t* fp8_out,
                                              uint8_t* fp8_out_t, Fp8Format format,
                                              const float* scale, float* amax, uint64_t* counts) {
  if (!Ok()) return;
  BOULDER_REQUIRE_FP8(fp8_out != nullptr || fp8_out_t != nullptr,
                      "ResidualLayerNormFp8Forward without an FP8 output");
  if (!fused_layernorm_fp8_ ||
      !cuda::LayerNormFp8Fusable(residual, a, b, weight, bias, fp8_out, fp8_out_t, N, C)) {
    Backend::ResidualLayerNormFp8Forward(residual, out, mean, rstd, a, b, weight, bias, N, C,
                                         fp8_out, fp8_out_t, format, scale, amax, counts);
    return;
  }
  ProfileScope profile(this, "ResidualLayerNormFp8Forward");
  Check(cuda::ResidualLayerNormFp8Forward(
            static_cast<bf16*>(residual), mean, rstd, static_cast<const bf16*>(a),
            static_cast<const bf16*>(b), static_cast<const bf16*>(weight),
            static_cast<const bf16*>(bias), N, C, fp8_out, fp8_out_t, format == Fp8Format::kE4M3,
            scale, amax, reinterpret_cast<unsigned long long*>(counts), stream_),
        "ResidualLayerNormFp8Forward");
}

void CudaBackend::LayerNormFp8FromStats(uint8_t* fp8_out, uint8_t* fp8_out_t, void* scratch,
                                        const void* inp, const float* mean, const float* rstd,
                                        const void* weight, const void* bias, int N, int C,
                                        Fp8Format format, const float* scale, float* amax,
                                        uint64_t* counts) {
  if (!Ok()) return;
  BOULDER_REQUIRE_FP8(fp8_out != nullptr || fp8_out_t != nullptr,
                      "LayerNormFp8FromStats without an FP8 output");
  BOULDER_REQUIRE_FP8(C % 8 == 0, absl::StrCat("hidden ", C, " is not a multiple of 8"));
  auto* cnt = reinterpret_cast<unsigned long long*>(counts);
  const bool e4m3 = format == Fp8Format::kE4M3;
  if (fused_layernorm_fp8_ &&
      cuda::LayerNormFp8Fusable(nullptr, inp, nullptr, weight, bias, fp8_out, fp8_out_t, N, C)) {
    ProfileScope profile(this, "LayerNormFp8FromStats");
    Check(cuda::LayerNormFp8FromStats(static_cast<const bf16*>(inp), mean, rstd,
                                      static_cast<const bf16*>(weight),
                                      static_cast<const bf16*>(bias), N, C, fp8_out, fp8_out_t,
                                      e4m3, scale, amax, cnt, stream_),
          "LayerNormFp8FromStats");
    return;
  }
  // Unfused, as the forward's fallback: y into scratch, then CastFp8.
  {
    ProfileScope profile(this, "LayerNormFromStats");
    Check(cuda::LayerNormFromStats(static_cast<bf16*>(scratch), static_cast<const bf16*>(inp), mean,
                                   rstd, static_cast<const bf16*>(weight),
                                   static_cast<const bf16*>(bias), N, C, stream_),
          "LayerNormFromStats");
  }
  CastFp8(fp8_out, fp8_out_t, scratch, N, C, format, scale, amax, counts);
}

bool CudaBackend::RoutesToOwnFp8Gemm(int M, int N, int K, bool a_e4m3, bool b_e4m3, const void* a,
                                     const void* b, const void* out, const void* bias,
                                     bool fast_accum) const {
  return fp8_gemm_ != Fp8Gemm::kCublasLt && Fp8GemmSm90Available() &&
         Fp8GemmSm90Supports(M, N, K, a_e4m3, b_e4m3, a, b, out, bias) &&
         (fp8_gemm_ == Fp8Gemm::kSm90 || Fp8GemmSm90Preferred(M, N, K, fast_accum));
}

void CudaBackend::MatmulFp8(void* out, const uint8_t* a, Fp8Format a_format,
                            const float* a_scale_inv, const uint8_t* b, Fp8Format b_format,
                            const float* b_scale_inv, const void* bias, int M, int N, int K,
                            bool accumulate, bool fast_accum) {
  if (!Ok()) return;
  const bool a_e4m3 = a_format == Fp8Format::kE4M3, b_e4m3 = b_format == Fp8Format::kE4M3;
  const bool own = RoutesToOwnFp8Gemm(M, N, K, a_e4m3, b_e4m3, a, b, out, bias, fast_accum);
  // The profile names which GEMM ran: " sm90" for ours (fp8_gemm_sm90.h).
  ProfileScope profile(this, profiling_ ? absl::StrCat("MatmulFp8 ", M, "x", N, " k=", K,
                                                      accumulate ? " +=" : "", own ? " sm90" : "")
                                        : std::string());
  BOULDER_REQUIRE_FP8(
      M % 16 == 0 && N % 16 == 0 && K % 16 == 0,
      absl::StrCat("FP8 GEMM dims M=", M, " N=", N, " K=", K, " must be multiples of 16"));
  BOULDER_REQUIRE_FP8(a_format == Fp8Format::kE4M3 || b_format == Fp8Format::kE4M3,
                      "FP8 GEMM with two E5M2 operands (cuBLASLt needs one E4M3)");
  BOULDER_REQUIRE_FP8(!(accumulate && bias != nullptr), "FP8 GEMM: bias with accumulate");
  if (own) {
    Check(Fp8GemmSm90(static_cast<bf16*>(out), a, a_e4m3, a_scale_inv, b, b_e4m3, b_scale_inv,
                      static_cast<const bf16*>(bias), M, N, K, accumulate, fast_accum, stream_,
                      fp8_gemm_tile_),
          "Fp8GemmSm90");
    return;
  }
  GemmShape s = Fp8TnShape(M, N, K, a_e4m3, b_e4m3);
  s.epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  s.accumulate = accumulate;
  s.fast_accum = fast_accum;
  Check(matmul_->Run(s, b, a, out, bias, nullptr, stream_, b_scale_inv, a_scale_inv));
}

bool CudaBackend::MatmulFp8GeluCast(void* pre, uint8_t* gelu_out, const uint8_t* a,
                                    Fp8Format a_format, const float* a_scale_inv, const uint8_t* b,
                                    Fp8Format b_format, const float* b_scale_inv, const void* bias,
                                    int M, int N, int K, Fp8Format gelu_format,
                                    const float* gelu_scale, float* gelu_amax,
                                    uint64_t* gelu_counts) {
  if (!Ok()) return true;  // the backend has failed: nothing runs (as every op)
  const bool e4m3 = a_format == Fp8Format::kE4M3 && b_format == Fp8Format::kE4M3 &&
                    gelu_format == Fp8Format::kE4M3;
  const Fp8GemmGeluCast gelu{gelu_out, gelu_scale, gelu_amax,
                             reinterpret_cast<unsigned long long*>(gelu_counts)};
  if (!fp8_gemm_gelu_ || !e4m3 ||
      !RoutesToOwnFp8Gemm(M, N, K, true, true, a, b, pre, bias, /*fast_accum=*/true) ||
      !Fp8GemmSm90SupportsGeluCast(true, true, /*accumulate=*/false, /*fast_accum=*/true, gelu)) {
    return false;
  }
  ProfileScope profile(this, profiling_
                                 ? absl::StrCat("MatmulFp8GeluCast ", M, "x", N, " k=", K, " sm90")
                                 : std::string());
  Check(Fp8GemmSm90(static_cast<bf16*>(pre), a, true, a_scale_inv, b, true, b_scale_inv,
                    static_cast<const bf16*>(bias), M, N, K, /*accumulate=*/false,
                    /*fast_accum=*/true, stream_, fp8_gemm_tile_, &gelu),
        "Fp8GemmSm90 (GELU cast)");
  return true;
}

void CudaBackend::GeluCastFp8(uint8_t* out, uint8_t* out_t, void* scratch, const void* pre,
                              int rows, int cols, Fp8Format format, const float* scale, float* amax,
                              uint64_t* counts) {
  if (!Ok()) return;
  ProfileScope profile(this, "GeluCastFp8");
  BOULDER_REQUIRE_FP8(out != nullptr || out_t != nullptr, "GeluCastFp8 without an output");
  // One pass, scratch untouched (fp8_gelu.cu).
  Check(cuda::GeluCastFp8(out, out_t, static_cast<const bf16*>(pre), rows, cols,
                          format == Fp8Format::kE4M3, scale, amax,
                          reinterpret_cast<unsigned long long*>(counts), stream_),
        "GeluCastFp8");
}

void CudaBackend::GeluCastFp8AndGrad(uint8_t* in_t, Fp8Format in_format, const float* in_scale,
                                     float* in_amax, uint64_t* in_counts, uint8_t* g_out,
                                     uint8_t* g_out_t, void* dout, const void* pre, void* dbias,
                                     int rows, int cols, Fp8Format g_format, const float* g_scale,
                                     float* g_amax, uint64_t* g_counts, void* scratch) {
  if (!Ok()) return;
  BOULDER_REQUIRE_FP8(in_t != nullptr, "GeluCastFp8AndGrad without the input transpose");
  BOULDER_REQUIRE_FP8(g_out != nullptr || g_out_t != nullptr,
                      "GeluCastFp8AndGrad without a gradient output");
  if (!fused_gelu_grad_ ||
      !cuda::GeluCastFp8AndGradFusable(in_t, g_out, g_out_t, dout, pre, rows, cols)) {
    Backend::GeluCastFp8AndGrad(in_t, in_format, in_scale, in_amax, in_counts, g_out, g_out_t,
                                dout, pre, dbias, rows, cols, g_format, g_scale, g_amax, g_counts,
                                scratch);
    return;
  }
  ProfileScope profile(this, profiling_ ? absl::StrCat("GeluCastFp8AndGrad ", rows, "x", cols)
                                        : std::string());
  Check(cuda::GeluCastFp8AndGrad(in_t, in_format == Fp8Format::kE4M3, in_scale, g_out, g_out_t,
                                 static_cast<const bf16*>(dout), static_cast<const bf16*>(pre),
                                 static_cast<bf16*>(dbias), rows, cols,
                                 g_format == Fp8Format::kE4M3, g_scale, g_amax,
                                 reinterpret_cast<unsigned long long*>(g_counts), scratch_, stream_),
        "GeluCastFp8AndGrad");
}

void CudaBackend::GeluForward(void* out, const void* inp, size_t n) {
  if (!Ok()) return;
  ProfileScope profile(this, "GeluForward");
  Check(cuda::GeluForward(static_cast<bf16*>(out), static_cast<const bf16*>(inp), n, stream_),
        "GeluForward");
}

void CudaBackend::GeluBackward(void* dout, const void* pre, size_t n) {
  if (!Ok()) return;
  ProfileScope profile(this, "GeluBackward");
  Check(GeluBackwardInPlace(static_cast<bf16*>(dout), static_cast<const bf16*>(pre), n, stream_),
        "GeluBackwardInPlace");
}

void CudaBackend::BiasBackward(void* dbias, const void* dout, int N, int OC) {
  if (!Ok()) return;
  ProfileScope profile(this, "BiasBackward");
  Check(ColumnSumAccumulate(static_cast<bf16*>(dbias), static_cast<const bf16*>(dout), N, OC,
                            scratch_, stream_),
        "ColumnSumAccumulate");
}

void CudaBackend::Fp8ScaleUpdate(float* scale, float* scale_inv, int scale_inv_stride,
                                 float* history, float* amax, const float* fp8_max, int n,
                                 int history_len, bool use_history_max, int margin,
                                 const float* skip_if_non_finite) {
  if (!Ok()) return;
  ProfileScope profile(this, "Fp8ScaleUpdate");
  Check(cuda::Fp8ScaleUpdate(scale, scale_inv, scale_inv_stride, history, amax, fp8_max, n,
                             history_len, use_history_max, margin, skip_if_non_finite, stream_),
        "Fp8ScaleUpdate");
}

}  // namespace boulder::kernels::cuda
