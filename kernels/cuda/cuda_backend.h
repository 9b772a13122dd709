// The CUDA backend: BF16 activations, weights and gradients, FP32 master weights and AdamW
// moments, fused kernels (kernels/cuda/*.cu) and cuBLASLt GEMMs on one stream.
//
// Errors: ops are void (they enqueue work); the first failed launch or cuBLASLt call is kept
// as a sticky status and returned by Synchronize(), after which further ops are skipped.
// Not thread-safe: one thread drives a backend.
#ifndef BOULDER_KERNELS_CUDA_CUDA_BACKEND_H_
#define BOULDER_KERNELS_CUDA_CUDA_BACKEND_H_

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cuda/bf16_gemm_sm90.h"
#include "kernels/cuda/fp8_gemm_sm90.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/ops.h"

namespace boulder::kernels::cuda {

class CudaBackend final : public Backend {
 public:
  // FAILED_PRECONDITION when `device` does not exist or has compute capability below 8.0.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(int device);
  ~CudaBackend() override;

  std::string Fp8Settings() const override;
  std::string name() const override { return "cuda"; }
  DType compute_dtype() const override { return DType::kBF16; }
  DType state_dtype() const override { return DType::kF32; }
  // kBf16LowHalves by default; kStateDtype (an FP32 copy) with BOULDER_MASTER_WEIGHTS=fp32
  // (common/env.h) or set_split_master(false).
  MasterLayout master_layout() const override {
    return split_master_ ? MasterLayout::kBf16LowHalves : MasterLayout::kStateDtype;
  }
  // For tests and benchmarks; before the first allocation of master weights.
  void set_split_master(bool on) { split_master_ = on; }
  const std::string& device_name() const { return device_name_; }
  cudaStream_t stream() const { return stream_; }

  absl::StatusOr<void*> Alloc(size_t bytes) override;
  void Free(void* ptr) override;
  void Memset0(void* ptr, size_t bytes) override;
  void Memset0Ranges(void* base, const std::vector<ByteRange>& ranges) override;
  void CopyFromHostF32(void* dst, DType dtype, const float* src, size_t n) override;
  void CopyToHostF32(float* dst, const void* src, DType dtype, size_t n) override;
  void CopyFromHost(void* dst, const void* src, size_t bytes) override;
  void CopyToHost(void* dst, const void* src, size_t bytes) override;
  absl::Status Synchronize() override;
  absl::StatusOr<uint64_t> Checksum(const void* data, size_t bytes) override;
  MemoryStats GetMemoryStats() const override;

  void EncoderForward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B,
                      int T, int C) override;
  void EncoderBackward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B,
                       int T, int C) override;
  void LayerNormForward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                        const void* bias, int N, int C) override;
  void ResidualLayerNormForward(void* residual, void* out, float* mean, float* rstd, const void* a,
                                const void* b, const void* weight, const void* bias, int N,
                                int C) override;
  void LayerNormBackward(void* dinp, void* dweight, void* dbias, const void* dout,
                         const void* inp, const void* weight, const float* mean,
                         const float* rstd, int N, int C) override;
  void MatmulForward(void* out, void* pre_gelu, const void* inp, const void* weight,
                     const void* bias, int N, int C, int OC, Epilogue epilogue) override;
  void MatmulBackward(void* dinp, void* dweight, void* dbias, void* dout, const void* pre_gelu,
                      const void* inp, const void* weight, int N, int C, int OC) override;
  // One GEMM for dpre (cuBLASLt's DGELU_BGRAD epilogue, or DGELU without dpre_bias) and the
  // weight gradient with dbias from its BGRADB epilogue; the unfused kernels where cuBLASLt has
  // no algorithm for an epilogue.
  void MatmulBackwardGelu(void* dpre, void* dpre_bias, const void* pre, void* dweight, void* dbias,
                          void* dout, const void* inp, const void* weight, int N, int C,
                          int OC) override;
  // The wgmma forward casting its output (AttentionFp8Cast, ops.h) where set_fp8_attention_cast
  // is on, the wgmma forward runs (AttentionWgmmaAvailable) and the format is E4M3; else false.
  bool AttentionForwardFp8Cast(void* out, float* stats, const void* qkv, int B, int T, int C,
                               int NH, uint8_t* fp8_out, Fp8Format format, const float* scale,
                               float* amax, uint64_t* counts) override;
  // On by default (measured on the H200, bench/fp8-gemm-2026-12-04.md run 17: 0.102 -> 0.096
  // ms per GPT-2 call, about 0.03 ms per step); the environment turns it off
  // (common::kEnvFp8AttentionCast). Applies to later ops.
  void set_fp8_attention_cast(bool on) { fp8_attention_cast_ = on; }
  void AttentionForward(void* out, float* stats, const void* qkv, int B, int T, int C,
                        int NH) override;
  void AttentionBackward(void* dqkv, const void* dout, const void* qkv, const void* out,
                         const float* stats, int B, int T, int C, int NH) override;
  // How the wgmma backward gets dQ (cuda::AttentionDq, ops.h); kAuto by default
  // (cuda::AttentionDqDefault: stored dS at head size 128), common::kEnvAttentionDq in the
  // environment. Applies to later ops.
  void set_attention_dq(cuda::AttentionDq dq) { attention_dq_ = dq; }
  // Which wgmma forward runs (cuda::AttentionFwdVariant, ops.h); kPlain by default,
  // common::kEnvAttentionFwd in the environment. Applies to later ops.
  void set_attention_fwd(cuda::AttentionFwdVariant v) { attention_fwd_ = v; }
  void ResidualForward(void* out, const void* a, const void* b, size_t n) override;
  void SoftmaxCrossEntropy(float* losses, void* logits, const int32_t* targets, int N, int V,
                           int Vp, float dloss) override;
  void NormSquared(float* out, const void* x, size_t n) override;
  // On norm_stream_ (forked from stream() at each call; with per-op profiling on, on stream()
  // itself so the profile times it), its partial sums in a scratch of its own.
  void NormSquaredBeside(float* out, const void* x, size_t n, bool accumulate) override;
  void JoinNormSquared() override;
  void AdamW(void* params, void* master, const void* grads, void* m, void* v, DecayBits decay,
             size_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int t,
             float grad_scale, const float* norm_sq, float max_norm) override;
  void SetAdamWStep(float* step, float lr, int t, float beta1, float beta2,
                    bool skip_non_finite) override;
  void AdamWDeviceStep(void* params, void* master, const void* grads, void* m, void* v,
                       DecayBits decay, size_t n, const float* step, float beta1, float beta2,
                       float eps, float weight_decay, float grad_scale, const float* norm_sq,
                       float max_norm) override;
  void Argmax(int32_t* out, const void* logits, int N, int V, int Vp) override;
  void SetDeterministic(bool on) override {
    deterministic_ = on;
    matmul_->set_autotune(!on);
  }
  bool deterministic() const { return deterministic_; }
  // The backward's fused GEMM epilogues (DGELU_BGRAD, BGRADB: dGELU and bias gradients), off by
  // default (slower on the H200, see fused_epilogues_); off runs the bias gradients as column-sum
  // kernels instead (tests compare the two). Applies to later ops.
  void set_fused_epilogues(bool on) { fused_epilogues_ = on; }
  // With the fused epilogues off: fc2's data gradient with cuBLASLt's DGELU epilogue (no bias
  // gradient) and fc1's bias gradient a column sum of it (on by default); off: the plain GEMM
  // and GeluBackwardColumnSum (dGELU and the column sum in one pass). Applies to later ops.
  void set_dgelu_epilogue(bool on) { dgelu_epilogue_ = on; }
  // On (the default): MatmulBackward and MatmulBackwardGelu run the weight gradient's GEMM on a
  // second stream beside the data gradient's (forked from and joined back into stream(), so
  // also inside a captured graph), from the second call of a shape on (the first tunes both
  // GEMMs alone); one GEMM's last wave of tiles then shares the SMs with the other's. The same
  // kernels and operands: bit-identical results. Off: one stream. Applies to later ops.
  void set_concurrent_weight_gradient(bool on) { concurrent_wgrad_ = on; }
  // Fused-epilogue GEMMs cuBLASLt had no algorithm for (each ran unfused instead).
  int unfused_fallbacks() const { return matmul_->unsupported(); }
  // FP8 (cuda_backend_fp8.cc): cast-transpose and scale update in fp8.cu, GEMMs in cuBLASLt.
  absl::Status Fp8Supported() const override;
  void ResidualLayerNormFp8Forward(void* residual, void* out, float* mean, float* rstd,
                                   const void* a, const void* b, const void* weight,
                                   const void* bias, int N, int C, uint8_t* fp8_out,
                                   uint8_t* fp8_out_t, Fp8Format format, const float* scale,
                                   float* amax, uint64_t* counts) override;
  void LayerNormFp8FromStats(uint8_t* fp8_out, uint8_t* fp8_out_t, void* scratch, const void* inp,
                             const float* mean, const float* rstd, const void* weight,
                             const void* bias, int N, int C, Fp8Format format, const float* scale,
                             float* amax, uint64_t* counts) override;
  // Off: ResidualLayerNormFp8Forward and LayerNormFp8FromStats run the unfused LayerNorm then
  // CastFp8 (benchmarks, tests).
  void set_fused_layernorm_fp8(bool on) { fused_layernorm_fp8_ = on; }
  void CastFp8Grad(uint8_t* out, uint8_t* out_t, void* dout, const void* pre, void* dbias, int rows,
                   int cols, Fp8Format format, const float* scale, float* amax,
                   uint64_t* counts) override;
  void CastFp8(uint8_t* out, uint8_t* out_t, const void* inp, int rows, int cols, Fp8Format format,
               const float* scale, float* amax, uint64_t* counts) override;
  void CastFp8Batch(const std::vector<Fp8CastJob>& jobs, Fp8Format format) override;
  void TransposeFp8(uint8_t* out, const uint8_t* in, int rows, int cols) override;
  void MatmulFp8(void* out, const uint8_t* a, Fp8Format a_format, const float* a_scale_inv,
                 const uint8_t* b, Fp8Format b_format, const float* b_scale_inv, const void* bias,
                 int M, int N, int K, bool accumulate, bool fast_accum) override;
  // Which BF16 GEMM MatmulForward runs: cuBLASLt's, our own Hopper kernel (bf16_gemm_sm90.h)
  // wherever it takes the call, ours on fc1's GELU forwards only, or kAuto: ours where
  // Bf16GemmSm90Preferred says it was measured faster (the default). Calls our kernel does not
  // take, and GPUs it does not run on, go to cuBLASLt. The tile is for benchmarks and tests.
  enum class Bf16Gemm { kCublasLt, kSm90, kSm90Gelu, kAuto };
  void set_bf16_gemm(Bf16Gemm g, Bf16GemmTile tile = Bf16GemmTile::kAuto) {
    bf16_gemm_ = g;
    bf16_gemm_tile_ = tile;
  }
  // Which FP8 GEMM MatmulFp8 runs: cuBLASLt's, our own Hopper kernel (fp8_gemm_sm90.h) wherever
  // it takes the shape, or kAuto: our own where Fp8GemmSm90Preferred says it is faster (the
  // default). Shapes our kernel does not take, and GPUs it does not run on, go to cuBLASLt.
  // The tile is for benchmarks and tests (kAuto: the kernel's own choice).
  enum class Fp8Gemm { kCublasLt, kSm90, kAuto };
  void set_fp8_gemm(Fp8Gemm g, Fp8GemmTile tile = Fp8GemmTile::kAuto) {
    fp8_gemm_ = g;
    fp8_gemm_tile_ = tile;
  }
  void GeluCastFp8(uint8_t* out, uint8_t* out_t, void* scratch, const void* pre, int rows, int cols,
                   Fp8Format format, const float* scale, float* amax, uint64_t* counts) override;
  // Our Hopper GEMM with fc2's input cast in its epilogue (Fp8GemmGeluCast, fp8_gemm_sm90.h),
  // where set_fp8_gemm_gelu is on and MatmulFp8 would run our kernel on this shape, with E4M3
  // operands and output; else false (the caller runs MatmulFp8, then GeluCastFp8).
  bool MatmulFp8GeluCast(void* pre, uint8_t* gelu_out, const uint8_t* a, Fp8Format a_format,
                         const float* a_scale_inv, const uint8_t* b, Fp8Format b_format,
                         const float* b_scale_inv, const void* bias, int M, int N, int K,
                         Fp8Format gelu_format, const float* gelu_scale, float* gelu_amax,
                         uint64_t* gelu_counts) override;
  // Off by default: measured slower on the H200 than MatmulFp8 + GeluCastFp8 (run 17, GPT-2's
  // fc1 0.183 against 0.131 ms per call); the environment turns it on (common::kEnvFp8GemmGelu).
  // Applies to later ops.
  void set_fp8_gemm_gelu(bool on) { fp8_gemm_gelu_ = on; }
  // One kernel where GeluCastFp8AndGradFusable (fp8_gelu_ops.h) and set_fused_gelu_grad (on
  // by default), else the default's two calls.
  void GeluCastFp8AndGrad(uint8_t* in_t, Fp8Format in_format, const float* in_scale,
                          float* in_amax, uint64_t* in_counts, uint8_t* g_out, uint8_t* g_out_t,
                          void* dout, const void* pre, void* dbias, int rows, int cols,
                          Fp8Format g_format, const float* g_scale, float* g_amax,
                          uint64_t* g_counts, void* scratch) override;
  // Off: GeluCastFp8AndGrad runs the two casts (fp8_cast_bench, tests). Applies to later ops.
  void set_fused_gelu_grad(bool on) { fused_gelu_grad_ = on; }
  void GeluForward(void* out, const void* inp, size_t n) override;
  void GeluBackward(void* dout, const void* pre, size_t n) override;
  void BiasBackward(void* dbias, const void* dout, int N, int OC) override;
  void Fp8ScaleUpdate(float* scale, float* scale_inv, int scale_inv_stride, float* history,
                      float* amax, const float* fp8_max, int n, int history_len,
                      bool use_history_max, int margin, const float* skip_if_non_finite) override;
  void EnableProfiling(bool on) override { profiling_ = on; }
  std::string ProfileReport() override;
  // Graph capture (cuda_graph.cc): stream capture in thread-local mode, so a forbidden call
  // from this thread (a sync, cudaMalloc) fails the capture instead of running.
  absl::Status BeginCapture() override;
  absl::StatusOr<std::unique_ptr<Graph>> EndCapture() override;
  void Replay(const Graph& graph) override;

 private:
  // Times one op between two events when profiling is on.
  class ProfileScope {
   public:
    ProfileScope(CudaBackend* b, std::string name);
    ~ProfileScope();

   private:
    CudaBackend* b_;
    std::string name_;
    cudaEvent_t start_ = nullptr;
  };
  struct Timed {
    std::string name;
    cudaEvent_t start, end;
  };
  cudaEvent_t NewEvent();

  CudaBackend() = default;
  // Records the first failure; true when the op may proceed.
  bool Ok() const { return sticky_.ok(); }
  // Whether MatmulForward runs our Hopper BF16 kernel on this call (set_bf16_gemm, the device
  // and the call's shape and pointers).
  bool RoutesToOwnBf16Gemm(int N, int C, int OC, bool gelu, const void* out, const void* pre_gelu,
                           const void* inp, const void* weight, const void* bias) const;
  // Whether MatmulFp8 runs our Hopper kernel (fp8_gemm_sm90.h) on this call: set_fp8_gemm
  // allows it, the device and shape take it, and (kAuto) it was measured faster there.
  bool RoutesToOwnFp8Gemm(int M, int N, int K, bool a_e4m3, bool b_e4m3, const void* a,
                          const void* b, const void* out, const void* bias, bool fast_accum) const;
  void Check(cudaError_t err, const char* what);
  void Check(const absl::Status& s);
  void Fail(absl::Status s);
  // dweight += doutᵀ·inp (the weight gradient's GEMM) and dbias += Σ_rows dout when dbias is
  // non-null: from the GEMM's BGRADB epilogue into bgrad_, then added (the epilogue writes with
  // '=', a parameter gradient accumulates over micro-batches), else by a column sum.
  void WeightGradient(void* dweight, void* dbias, const bf16* dy, const void* inp, int N, int C,
                      int OC);
  // The GEMM of WeightGradient alone, on `stream` with LtMatmul workspace `workspace`.
  void WeightGradientGemm(void* dweight, const bf16* dy, const void* inp, int N, int C, int OC,
                          cudaStream_t stream, int workspace);
  // Whether this backward's weight-gradient GEMM goes to side_stream_ (see
  // set_concurrent_weight_gradient); if so, side_stream_ now waits for stream_'s work so far.
  // The caller then ends with FinishWeightGradient(forked, ...): WeightGradient where it did
  // not fork; where it did, the bias gradient on stream_ and stream_ waiting for side_stream_.
  bool ForkWeightGradient(const void* dweight, int N, int C, int OC, bool gelu);
  void FinishWeightGradient(bool forked, void* dweight, void* dbias, const bf16* dy,
                            const void* inp, int N, int C, int OC);
  // dbias += Σ_rows dy on stream_ (a column sum through scratch_); nothing when dbias is null.
  void BiasGradient(void* dbias, const bf16* dy, int N, int OC);
  // bgrad_ with room for n BF16 values, or null after recording the failure.
  bf16* BiasGradScratch(size_t n);

  int device_ = 0;
  int cc_major_ = 0, cc_minor_ = 0;  // compute capability
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t side_stream_ = nullptr;                 // the concurrent weight gradients'
  cudaEvent_t fork_ = nullptr, join_ = nullptr;       // no timing
  cudaStream_t norm_stream_ = nullptr;  // NormSquaredBeside's
  cudaEvent_t norm_fork_ = nullptr, norm_join_ = nullptr;
  bool norm_forked_ = false;  // work on norm_stream_ that stream_ has not joined
  bool concurrent_wgrad_ = true;                      // see set_concurrent_weight_gradient
  // (N, C, OC, gelu, overwrite)
  absl::flat_hash_set<std::tuple<int, int, int, bool, bool>> wgrad_seen_;
  std::unique_ptr<LtMatmul> matmul_;
  DeviceBytes memory_;  // Alloc's buffers and the two Scratch below (declared before them)
  Scratch scratch_{&memory_};
  Scratch norm_scratch_{&memory_};  // NormSquaredBeside's partial sums (on norm_stream_)
  Scratch bgrad_{&memory_};  // a GEMM epilogue's bias gradient on its way into the parameter's
  // Off by default: on the H200 (fusion_bench, 2026-12-02) the DGELU_BGRAD GEMM took 0.566 ms
  // against 0.344 ms for the GEMM + dGELU + column sum on GPT-2's shape (1.65x slower), and
  // BGRADB was 2-4% slower than GEMM + column sum.
  bool fused_epilogues_ = false;
  // On by default: on the H200 (fusion_bench, 2026-12-03) fc2's backward took 0.815 ms against
  // 0.832 with GeluBackwardColumnSum on hidden-2048's shape, 0.331 against 0.333 on GPT-2's and
  // 0.179 against 0.179 on the seed model's.
  bool dgelu_epilogue_ = true;  // see set_dgelu_epilogue
  bool fused_gelu_grad_ = true;  // see set_fused_gelu_grad
  bool fp8_gemm_gelu_ = false;   // see set_fp8_gemm_gelu
  bool fp8_attention_cast_ = true;   // see set_fp8_attention_cast
  cuda::AttentionDq attention_dq_ = cuda::AttentionDq::kAuto;  // see set_attention_dq
  cuda::AttentionFwdVariant attention_fwd_ = cuda::AttentionFwdVariant::kPlain;  // set_attention_fwd
  bool split_master_ = true;  // see master_layout
  cuda::AdamWMaster MasterOf(void* master) const {
    cuda::AdamWMaster m;
    if (split_master_) {
      m.low = static_cast<uint16_t*>(master);
    } else {
      m.f32 = static_cast<float*>(master);
    }
    return m;
  }
  bool fused_layernorm_fp8_ = true;  // see set_fused_layernorm_fp8
  Fp8Gemm fp8_gemm_ = Fp8Gemm::kAuto;  // see set_fp8_gemm
  Bf16Gemm bf16_gemm_ = Bf16Gemm::kAuto;  // see set_bf16_gemm
  Bf16GemmTile bf16_gemm_tile_ = Bf16GemmTile::kAuto;
  Fp8GemmTile fp8_gemm_tile_ = Fp8GemmTile::kAuto;
  absl::Status sticky_;
  absl::flat_hash_map<void*, size_t> allocations_;
  int64_t device_total_ = 0;
  bool deterministic_ = false;
  bool profiling_ = false;
  bool capturing_ = false;
  std::vector<Timed> timed_;
  std::vector<cudaEvent_t> event_pool_;
};

}  // namespace boulder::kernels::cuda

#endif  // BOULDER_KERNELS_CUDA_CUDA_BACKEND_H_
