#include "kernels/cpu/cpu_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/argmax.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/crossentropy.h"
#include "kernels/cpu/encoder.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/residual.h"

namespace boulder::kernels::cpu {
namespace {

// Cache-line (and AVX-512 vector) alignment.
constexpr size_t kAlignment = 64;

template <typename S>
S* As(void* p) {
  return static_cast<S*>(p);
}
template <typename S>
const S* As(const void* p) {
  return static_cast<const S*>(p);
}

// FP32 -> BF16, round to nearest even; NaNs stay (quiet) NaNs.
uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float Bf16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

int64_t PhysicalMemoryBytes() {
  const int64_t pages = sysconf(_SC_PHYS_PAGES);
  const int64_t page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<int64_t>(pages) * page_size;
}

}  // namespace

template <typename S>
CpuBackend<S>::CpuBackend(int num_threads) : threads_(ResolveThreads(num_threads)) {}

template <typename S>
CpuBackend<S>::~CpuBackend() {
  absl::MutexLock lock(&mu_);
  for (auto& [ptr, bytes] : allocations_) std::free(ptr);
}

template <typename S>
DType CpuBackend<S>::compute_dtype() const {
  return sizeof(S) == sizeof(double) ? DType::kF64 : DType::kF32;
}

template <typename S>
absl::StatusOr<void*> CpuBackend<S>::Alloc(size_t bytes) {
  void* ptr = nullptr;
  // A zero-byte request still gets a distinct pointer, so Free stays symmetric.
  if (posix_memalign(&ptr, kAlignment, std::max<size_t>(bytes, 1)) != 0 || ptr == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cpu backend: cannot allocate ", bytes, " bytes of host memory"));
  }
  absl::MutexLock lock(&mu_);
  allocations_.emplace(ptr, bytes);
  allocated_bytes_ += static_cast<int64_t>(bytes);
  peak_bytes_ = std::max(peak_bytes_, allocated_bytes_);
  return ptr;
}

template <typename S>
void CpuBackend<S>::Free(void* ptr) {
  if (ptr == nullptr) return;
  {
    absl::MutexLock lock(&mu_);
    auto it = allocations_.find(ptr);
    if (it == allocations_.end()) {
      // Freeing memory this backend did not allocate is a caller bug that would corrupt
      // the heap if let through.
      std::fprintf(stderr, "cpu backend: Free(%p) of a pointer not from Alloc\n", ptr);
      std::abort();
    }
    allocated_bytes_ -= static_cast<int64_t>(it->second);
    allocations_.erase(it);
  }
  std::free(ptr);
}

template <typename S>
void CpuBackend<S>::Memset0(void* ptr, size_t bytes) {
  std::memset(ptr, 0, bytes);
}

template <typename S>
void CpuBackend<S>::CopyFromHostF32(void* dst, DType dtype, const float* src, size_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kF64:
      std::copy(src, src + n, As<double>(dst));
      return;
    case DType::kBF16:
      std::transform(src, src + n, As<uint16_t>(dst), FloatToBf16);
      return;
  }
}

template <typename S>
void CpuBackend<S>::CopyToHostF32(float* dst, const void* src, DType dtype, size_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kF64: {
      const double* s = As<double>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::kBF16:
      std::transform(As<uint16_t>(src), As<uint16_t>(src) + n, dst, Bf16ToFloat);
      return;
  }
}

template <typename S>
void CpuBackend<S>::CopyFromHost(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}

template <typename S>
void CpuBackend<S>::CopyToHost(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}

template <typename S>
MemoryStats CpuBackend<S>::GetMemoryStats() const {
  MemoryStats stats;
  {
    absl::MutexLock lock(&mu_);
    stats.allocated_bytes = allocated_bytes_;
    stats.peak_bytes = peak_bytes_;
    stats.reserved_bytes = allocated_bytes_;
  }
  stats.device_total_bytes = PhysicalMemoryBytes();
  return stats;
}

template <typename S>
void CpuBackend<S>::EncoderForward(void* out, const int32_t* tokens, const void* wte,
                                   const void* wpe, int B, int T, int C) {
  cpu::EncoderForward(threads_, As<S>(out), tokens, As<S>(wte), As<S>(wpe), B, T, C);
}

template <typename S>
void CpuBackend<S>::EncoderBackward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens,
                                    int B, int T, int C) {
  cpu::EncoderBackward(threads_, As<S>(dwte), As<S>(dwpe), As<S>(dout), tokens, B, T, C);
}

template <typename S>
void CpuBackend<S>::LayerNormForward(void* out, float* mean, float* rstd, const void* inp,
                                     const void* weight, const void* bias, int N, int C) {
  cpu::LayerNormForward(threads_, As<S>(out), mean, rstd, As<S>(inp), As<S>(weight), As<S>(bias), N,
                        C);
}

template <typename S>
void CpuBackend<S>::LayerNormBackward(void* dinp, void* dweight, void* dbias, const void* dout,
                                      const void* inp, const void* weight, const float* mean,
                                      const float* rstd, int N, int C) {
  cpu::LayerNormBackward(threads_, As<S>(dinp), As<S>(dweight), As<S>(dbias), As<S>(dout),
                         As<S>(inp), As<S>(weight), mean, rstd, N, C);
}

template <typename S>
void CpuBackend<S>::MatmulForward(void* out, void* pre_gelu, const void* inp, const void* weight,
                                  const void* bias, int N, int C, int OC, Epilogue epilogue) {
  cpu::MatmulForward(threads_, As<S>(out), As<S>(pre_gelu), As<S>(inp), As<S>(weight), As<S>(bias),
                     N, C, OC, epilogue);
}

template <typename S>
void CpuBackend<S>::MatmulBackwardGelu(void* dpre, void* dpre_bias, const void* pre, void* dweight,
                                       void* dbias, void* dout, const void* inp, const void* weight,
                                       int N, int C, int OC) {
  cpu::MatmulBackward(threads_, As<S>(dpre), As<S>(dweight), As<S>(dbias), As<S>(dout),
                      static_cast<const S*>(nullptr), As<S>(inp), As<S>(weight), N, C, OC,
                      weight_gradient_overwrite_);
  // The epilogue alone: dpre *= gelu'(pre), dpre_bias += Σ_rows dpre.
  cpu::MatmulBackward(threads_, static_cast<S*>(nullptr), static_cast<S*>(nullptr),
                      As<S>(dpre_bias), As<S>(dpre), As<S>(pre), static_cast<const S*>(nullptr),
                      static_cast<const S*>(nullptr), N, 0, C);
}

template <typename S>
void CpuBackend<S>::MatmulBackward(void* dinp, void* dweight, void* dbias, void* dout,
                                   const void* pre_gelu, const void* inp, const void* weight, int N,
                                   int C, int OC) {
  cpu::MatmulBackward(threads_, As<S>(dinp), As<S>(dweight), As<S>(dbias), As<S>(dout),
                      As<S>(pre_gelu), As<S>(inp), As<S>(weight), N, C, OC,
                      weight_gradient_overwrite_);
}

template <typename S>
void CpuBackend<S>::AttentionForward(void* out, float* stats, const void* qkv, int B, int T, int C,
                                     int NH) {
  cpu::AttentionForward(threads_, As<S>(out), stats, As<S>(qkv), B, T, C, NH);
}

template <typename S>
bool CpuBackend<S>::AttentionForwardFp8Cast(void* out, float* stats, const void* qkv, int B, int T,
                                            int C, int NH, uint8_t* fp8_out, Fp8Format format,
                                            const float* scale, float* amax, uint64_t* counts) {
  AttentionForward(out, stats, qkv, B, T, C, NH);
  CastFp8(fp8_out, nullptr, out, B * T, C, format, scale, amax, counts);
  return true;
}

template <typename S>
void CpuBackend<S>::AttentionBackward(void* dqkv, const void* dout, const void* qkv,
                                      const void* out, const float* stats, int B, int T, int C,
                                      int NH) {
  cpu::AttentionBackward(threads_, As<S>(dqkv), As<S>(dout), As<S>(qkv), As<S>(out), stats, B, T, C,
                         NH);
}

template <typename S>
void CpuBackend<S>::ResidualForward(void* out, const void* a, const void* b, size_t n) {
  cpu::ResidualForward(threads_, As<S>(out), As<S>(a), As<S>(b), n);
}

template <typename S>
void CpuBackend<S>::SoftmaxCrossEntropy(float* losses, void* logits, const int32_t* targets, int N,
                                        int V, int Vp, float dloss) {
  cpu::SoftmaxCrossEntropy(threads_, losses, As<S>(logits), targets, N, V, Vp, dloss);
}

template <typename S>
void CpuBackend<S>::NormSquared(float* out, const void* x, size_t n) {
  cpu::NormSquared(threads_, out, As<S>(x), n);
}

template <typename S>
void CpuBackend<S>::NormSquaredBeside(float* out, const void* x, size_t n, bool accumulate) {
  float sum = 0.0f;
  cpu::NormSquared(threads_, &sum, As<S>(x), n);
  *out = accumulate ? *out + sum : sum;
}

template <typename S>
void CpuBackend<S>::AdamW(void* params, void* master, const void* grads, void* m, void* v,
                          DecayBits decay, size_t n, float lr, float beta1, float beta2, float eps,
                          float weight_decay, int t, float grad_scale, const float* norm_sq,
                          float max_norm) {
  AdamWParams p;
  p.lr = lr;
  p.beta1 = beta1;
  p.beta2 = beta2;
  p.eps = eps;
  p.weight_decay = weight_decay;
  p.t = t;
  p.grad_scale = grad_scale;
  p.norm_sq = norm_sq;
  p.max_norm = max_norm;
  cpu::AdamW(threads_, As<S>(params), As<S>(master), As<S>(grads), As<S>(m), As<S>(v), decay, n, p);
}

template <typename S>
void CpuBackend<S>::SetAdamWStep(float* step, float lr, int t, float beta1, float beta2,
                                 bool skip_non_finite) {
  step[0] = lr;
  std::memcpy(&step[1], &t, sizeof(t));
  step[3] = skip_non_finite ? 1.0f : 0.0f;
}

template <typename S>
void CpuBackend<S>::AdamWDeviceStep(void* params, void* master, const void* grads, void* m, void* v,
                                    DecayBits decay, size_t n, const float* step, float beta1,
                                    float beta2, float eps, float weight_decay, float grad_scale,
                                    const float* norm_sq, float max_norm) {
  if (step[3] != 0.0f && norm_sq != nullptr && !std::isfinite(*norm_sq)) return;  // skipped
  int t = 0;
  std::memcpy(&t, &step[1], sizeof(t));
  AdamW(params, master, grads, m, v, decay, n, step[0], beta1, beta2, eps, weight_decay, t,
        grad_scale, norm_sq, max_norm);
}

template <typename S>
void CpuBackend<S>::Argmax(int32_t* out, const void* logits, int N, int V, int Vp) {
  cpu::Argmax(threads_, out, As<S>(logits), N, V, Vp);
}

template <typename S>
absl::Status CpuBackend<S>::Fp8Supported() const {
  return absl::FailedPreconditionError(
      "the cpu backend has no FP8 hardware; it emulates FP8 rounding exactly when the job sets "
      "fp8.emulate: true");
}

template <typename S>
void CpuBackend<S>::CastFp8(uint8_t* out, uint8_t* out_t, const void* inp, int rows, int cols,
                            Fp8Format format, const float* scale, float* amax, uint64_t* counts) {
  cpu::CastFp8(out, out_t, As<S>(inp), rows, cols, format, scale, amax, counts);
}

template <typename S>
void CpuBackend<S>::TransposeFp8(uint8_t* out, const uint8_t* in, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) out[size_t(c) * rows + r] = in[size_t(r) * cols + c];
  }
}

template <typename S>
void CpuBackend<S>::LayerNormFp8FromStats(uint8_t* fp8_out, uint8_t* fp8_out_t, void* scratch,
                                          const void* inp, const float* mean, const float* rstd,
                                          const void* weight, const void* bias, int N, int C,
                                          Fp8Format format, const float* scale, float* amax,
                                          uint64_t* counts) {
  // The forward (Backend::ResidualLayerNormFp8Forward's default) casts LayerNormForward's out.
  cpu::LayerNormFromStats(threads_, As<S>(scratch), As<S>(inp), mean, rstd, As<S>(weight),
                          As<S>(bias), N, C);
  cpu::CastFp8(fp8_out, fp8_out_t, As<S>(scratch), N, C, format, scale, amax, counts);
}

template <typename S>
void CpuBackend<S>::MatmulFp8(void* out, const uint8_t* a, Fp8Format a_format,
                              const float* a_scale_inv, const uint8_t* b, Fp8Format b_format,
                              const float* b_scale_inv, const void* bias, int M, int N, int K,
                              bool accumulate, bool /*fast_accum*/) {
  cpu::MatmulFp8(threads_, As<S>(out), a, a_format, *a_scale_inv, b, b_format, *b_scale_inv,
                 As<S>(bias), M, N, K, accumulate);
}

template <typename S>
bool CpuBackend<S>::MatmulFp8GeluCast(void* pre, uint8_t* gelu_out, const uint8_t* a,
                                      Fp8Format a_format, const float* a_scale_inv,
                                      const uint8_t* b, Fp8Format b_format,
                                      const float* b_scale_inv, const void* bias, int M, int N,
                                      int K, Fp8Format gelu_format, const float* gelu_scale,
                                      float* gelu_amax, uint64_t* gelu_counts) {
  MatmulFp8(pre, a, a_format, a_scale_inv, b, b_format, b_scale_inv, bias, M, N, K,
            /*accumulate=*/false, /*fast_accum=*/true);
  // Bands of rows through a temporary of at most ~1M values (CastFp8's amax and counters
  // accumulate, so the bands' casts record what one cast of the whole would).
  const int band = std::max(1, std::min(M, (1 << 20) / std::max(N, 1)));
  std::vector<S> g(static_cast<size_t>(band) * N);
  for (int r0 = 0; r0 < M; r0 += band) {
    const int rows = std::min(band, M - r0);
    GeluForward(g.data(), As<S>(pre) + static_cast<size_t>(r0) * N, static_cast<size_t>(rows) * N);
    CastFp8(gelu_out + static_cast<size_t>(r0) * N, nullptr, g.data(), rows, N, gelu_format,
            gelu_scale, gelu_amax, gelu_counts);
  }
  return true;
}

template <typename S>
void CpuBackend<S>::GeluForward(void* out, const void* inp, size_t n) {
  S* o = As<S>(out);
  const S* x = As<S>(inp);
  // Element-wise, so the same results on any number of threads (the model's backward
  // recomputes every layer's GELU output with it).
  const int64_t m = static_cast<int64_t>(n);
#pragma omp parallel for num_threads(threads_) schedule(static) if (m >= (int64_t{1} << 16))
  for (int64_t i = 0; i < m; ++i) o[i] = Gelu(x[i]);
}

template <typename S>
void CpuBackend<S>::GeluBackward(void* dout, const void* pre, size_t n) {
  S* d = As<S>(dout);
  const S* p = As<S>(pre);
  for (size_t i = 0; i < n; ++i) d[i] = d[i] * GeluGrad(p[i]);
}

template <typename S>
void CpuBackend<S>::BiasBackward(void* dbias, const void* dout, int N, int OC) {
  S* db = As<S>(dbias);
  const S* d = As<S>(dout);
  for (int r = 0; r < N; ++r) {
    for (int c = 0; c < OC; ++c) db[c] += d[static_cast<size_t>(r) * OC + c];
  }
}

template <typename S>
void CpuBackend<S>::Fp8ScaleUpdate(float* scale, float* scale_inv, int scale_inv_stride,
                                   float* history, float* amax, const float* fp8_max, int n,
                                   int history_len, bool use_history_max, int margin,
                                   const float* skip_if_non_finite) {
  if (skip_if_non_finite != nullptr && !std::isfinite(*skip_if_non_finite)) return;  // skipped
  cpu::Fp8ScaleUpdate(scale, scale_inv, scale_inv_stride, history, amax, fp8_max, n, history_len,
                      use_history_max, margin);
}

template class CpuBackend<float>;
template class CpuBackend<double>;

}  // namespace boulder::kernels::cpu

namespace boulder::kernels {

std::unique_ptr<Backend> NewCpuBackend(int num_threads) {
  return std::make_unique<cpu::CpuBackend<float>>(num_threads);
}

std::unique_ptr<Backend> NewCpuBackendF64(int num_threads) {
  return std::make_unique<cpu::CpuBackend<double>>(num_threads);
}

}  // namespace boulder::kernels
