// The CPU reference backend: Backend (kernels/backend.h) over host memory, with every op
// written once as a template over the scalar type S and instantiated for float (the FP32
// backend, NewCpuBackend) and double (the FP64 backend for finite-difference tests,
// NewCpuBackendF64). compute_dtype() == state_dtype() == FP32 or FP64.
//
// Ops run synchronously on the calling thread plus a team of num_threads() OpenMP threads;
// GEMMs are split across the same team with OpenBLAS single-threaded (blas.h says why). For
// a fixed thread count the results are bit-identical run to run; the non-GEMM ops are also
// identical across thread counts.
//
// Memory: 64-byte aligned host allocations, tracked for GetMemoryStats (reserved ==
// allocated: nothing is cached; device_total is the machine's physical RAM). Destroying the
// backend frees whatever is still allocated. Alloc/Free/GetMemoryStats are safe to call
// from several threads; the ops are not (one thread drives a backend, as Backend says).
#ifndef BOULDER_KERNELS_CPU_CPU_BACKEND_H_
#define BOULDER_KERNELS_CPU_CPU_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "kernels/backend.h"

namespace boulder::kernels::cpu {

template <typename S>
class CpuBackend final : public Backend {
 public:
  // num_threads <= 0: as many threads as cores this process may run on.
  explicit CpuBackend(int num_threads);
  ~CpuBackend() override;
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  int num_threads() const { return threads_; }

  std::string name() const override { return "cpu"; }
  DType compute_dtype() const override;
  DType state_dtype() const override { return compute_dtype(); }

  absl::StatusOr<void*> Alloc(size_t bytes) override;
  void Free(void* ptr) override;
  void Memset0(void* ptr, size_t bytes) override;
  void CopyFromHostF32(void* dst, DType dtype, const float* src, size_t n) override;
  void CopyToHostF32(float* dst, const void* src, DType dtype, size_t n) override;
  void CopyFromHost(void* dst, const void* src, size_t bytes) override;
  void CopyToHost(void* dst, const void* src, size_t bytes) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::StatusOr<uint64_t> Checksum(const void* data, size_t bytes) override {
    return ChecksumHost(data, bytes);  // host memory: no copy
  }
  MemoryStats GetMemoryStats() const override;

  void EncoderForward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B,
                      int T, int C) override;
  void EncoderBackward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B,
                       int T, int C) override;
  void LayerNormForward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                        const void* bias, int N, int C) override;
  void LayerNormBackward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                         const void* weight, const float* mean, const float* rstd, int N,
                         int C) override;
  void MatmulForward(void* out, void* pre_gelu, const void* inp, const void* weight,
                     const void* bias, int N, int C, int OC, Epilogue epilogue) override;
  void MatmulBackward(void* dinp, void* dweight, void* dbias, void* dout, const void* pre_gelu,
                      const void* inp, const void* weight, int N, int C, int OC) override;
  // fc2's backward, then dGELU and the bias gradient in one pass (the order MatmulBackward with
  // pre_gelu uses, so results equal the unfused sequence's bit for bit).
  void MatmulBackwardGelu(void* dpre, void* dpre_bias, const void* pre, void* dweight, void* dbias,
                          void* dout, const void* inp, const void* weight, int N, int C,
                          int OC) override;
  // Both ops in one call: the default's results (so the Model's fused path runs here too).
  bool AttentionForwardFp8Cast(void* out, float* stats, const void* qkv, int B, int T, int C,
                               int NH, uint8_t* fp8_out, Fp8Format format, const float* scale,
                               float* amax, uint64_t* counts) override;
  void AttentionForward(void* out, float* stats, const void* qkv, int B, int T, int C,
                        int NH) override;
  void AttentionBackward(void* dqkv, const void* dout, const void* qkv, const void* out,
                         const float* stats, int B, int T, int C, int NH) override;
  void ResidualForward(void* out, const void* a, const void* b, size_t n) override;
  void SoftmaxCrossEntropy(float* losses, void* logits, const int32_t* targets, int N, int V,
                           int Vp, float dloss) override;
  void NormSquared(float* out, const void* x, size_t n) override;
  void NormSquaredBeside(float* out, const void* x, size_t n, bool accumulate) override;
  void JoinNormSquared() override {}  // NormSquaredBeside has run already
  void AdamW(void* params, void* master, const void* grads, void* m, void* v, DecayBits decay,
             size_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int t,
             float grad_scale, const float* norm_sq, float max_norm) override;
  // "Device" memory is host memory: step holds lr and t (its bits) until AdamWDeviceStep.
  void SetAdamWStep(float* step, float lr, int t, float beta1, float beta2,
                    bool skip_non_finite) override;
  void AdamWDeviceStep(void* params, void* master, const void* grads, void* m, void* v,
                       DecayBits decay, size_t n, const float* step, float beta1, float beta2,
                       float eps, float weight_decay, float grad_scale, const float* norm_sq,
                       float max_norm) override;
  void Argmax(int32_t* out, const void* logits, int N, int V, int Vp) override;
  // FP8 ops emulated exactly (kernels/cpu/fp8.h); Fp8Supported() says they are emulated.
  absl::Status Fp8Supported() const override;
  void CastFp8(uint8_t* out, uint8_t* out_t, const void* inp, int rows, int cols, Fp8Format format,
               const float* scale, float* amax, uint64_t* counts) override;
  void TransposeFp8(uint8_t* out, const uint8_t* in, int rows, int cols) override;
  void LayerNormFp8FromStats(uint8_t* fp8_out, uint8_t* fp8_out_t, void* scratch, const void* inp,
                             const float* mean, const float* rstd, const void* weight,
                             const void* bias, int N, int C, Fp8Format format, const float* scale,
                             float* amax, uint64_t* counts) override;
  void MatmulFp8(void* out, const uint8_t* a, Fp8Format a_format, const float* a_scale_inv,
                 const uint8_t* b, Fp8Format b_format, const float* b_scale_inv, const void* bias,
                 int M, int N, int K, bool accumulate, bool fast_accum) override;
  // Both ops in one call (the GELU into a temporary of its own): the default's results, so the
  // Model's fused path runs everywhere (and is checked against the unfused one on the CPU).
  bool MatmulFp8GeluCast(void* pre, uint8_t* gelu_out, const uint8_t* a, Fp8Format a_format,
                         const float* a_scale_inv, const uint8_t* b, Fp8Format b_format,
                         const float* b_scale_inv, const void* bias, int M, int N, int K,
                         Fp8Format gelu_format, const float* gelu_scale, float* gelu_amax,
                         uint64_t* gelu_counts) override;
  void GeluForward(void* out, const void* inp, size_t n) override;
  void GeluBackward(void* dout, const void* pre, size_t n) override;
  void BiasBackward(void* dbias, const void* dout, int N, int OC) override;
  void Fp8ScaleUpdate(float* scale, float* scale_inv, int scale_inv_stride, float* history,
                      float* amax, const float* fp8_max, int n, int history_len,
                      bool use_history_max, int margin, const float* skip_if_non_finite) override;

 private:
  const int threads_;
  mutable absl::Mutex mu_;
  std::unordered_map<void*, size_t> allocations_ ABSL_GUARDED_BY(mu_);
  int64_t allocated_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

extern template class CpuBackend<float>;
extern template class CpuBackend<double>;

}  // namespace boulder::kernels::cpu

#endif  // BOULDER_KERNELS_CPU_CPU_BACKEND_H_
