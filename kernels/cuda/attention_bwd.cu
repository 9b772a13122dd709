// Launcher of the causal flash attention backward (the kernels and the algorithm:
// attention_bwd.cuh).
#include "kernels/cuda/attention_bwd.cuh"
#include "kernels/cuda/attention_bwd_sm90.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace boulder::kernels::cuda {
namespace {

using namespace attn;

template <typename Kernel>
cudaError_t AllowSmem(Kernel k, int bytes) {
  return cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

template <int HS>
cudaError_t Backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                     const float* stats, int B, int T, int C, int NH, bool deterministic,
                     bool wgmma, bool stored_ds, Scratch& scratch, cudaStream_t s) {
  const int Tp = PaddedT(T);
  const size_t n_rows = size_t(B) * NH * Tp;
  const size_t n_dq = deterministic || wgmma ? 0 : size_t(B) * T * C;
  const size_t ds_bytes = wgmma && stored_ds ? DsBufferBytes(B, NH, T) : 0;
  float* Dp = static_cast<float*>(scratch.Get(sizeof(float) * (2 * n_rows + n_dq) + ds_bytes));
  if (!Dp) return scratch.last_error();
  float* lse2 = Dp + n_rows;
  float* dq_acc = lse2 + n_rows;  // 16-byte aligned: n_rows is a multiple of 128
  // After lse2 (n_dq is 0 with wgmma): 512-byte aligned, as cp.async's 16 bytes need.
  unsigned char* ds = ds_bytes ? reinterpret_cast<unsigned char*>(dq_acc) : nullptr;
  const float scale = 1.f / sqrtf(float(HS)), scale_log2 = scale * kLog2e;

  PreprocessKernel<HS>
      <<<CeilDiv(n_rows, 8), 256, 0, s>>>(Dp, lse2, dout, out, stats, B, T, Tp, C, NH);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if (wgmma) return AttentionBackwardSm90(dqkv, dout, qkv, lse2, Dp, B, T, Tp, C, NH, s, ds);
  const dim3 kv_grid(B * NH, CeilDiv(T, KVCfg<HS, true>::kBkv));
  if (!deterministic) {
    using Cfg = KVCfg<HS, true>;
    if ((err = cudaMemsetAsync(dq_acc, 0, sizeof(float) * n_dq, s)) != cudaSuccess) return err;
    if ((err = AllowSmem(FlashBackwardKVKernel<HS, true>, Cfg::kSmemBytes)) != cudaSuccess)
      return err;
    FlashBackwardKVKernel<HS, true><<<kv_grid, kBwdThreads, Cfg::kSmemBytes, s>>>(
        dqkv, dq_acc, dout, qkv, lse2, Dp, T, Tp, C, NH, scale, scale_log2);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    ConvertDQKernel<<<CeilDiv(n_dq / 8, 256), 256, 0, s>>>(dqkv, dq_acc, n_dq / 8, C, scale);
    return cudaGetLastError();
  }
  using Cfg = KVCfg<HS, false>;
  if ((err = AllowSmem(FlashBackwardKVKernel<HS, false>, Cfg::kSmemBytes)) != cudaSuccess)
    return err;
  FlashBackwardKVKernel<HS, false><<<kv_grid, kBwdThreads, Cfg::kSmemBytes, s>>>(
      dqkv, nullptr, dout, qkv, lse2, Dp, T, Tp, C, NH, scale, scale_log2);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  using QC = QCfg<HS>;
  if ((err = AllowSmem(FlashBackwardQKernel<HS>, QC::kSmemBytes)) != cudaSuccess) return err;
  FlashBackwardQKernel<HS><<<dim3(B * NH, CeilDiv(T, QC::kBq)), kBwdThreads, QC::kSmemBytes, s>>>(
      dqkv, dout, qkv, lse2, Dp, T, Tp, C, NH, scale, scale_log2);
  return cudaGetLastError();
}

}  // namespace

cudaError_t AttentionBackward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                              const float* stats, int B, int T, int C, int NH, bool deterministic,
                              Scratch& scratch, cudaStream_t s, AttentionKernel kernel,
                              AttentionDq dq) {
  if (B < 1 || T < 1 || T > kMaxAttentionT || NH < 1 || C % NH != 0 ||
      int64_t(B) * NH > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  for (const void* p : {static_cast<const void*>(dqkv), static_cast<const void*>(dout),
                        static_cast<const void*>(qkv)}) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return cudaErrorMisalignedAddress;
  }
  const int hs = C / NH;
  if (hs != 64 && hs != 128) return cudaErrorInvalidValue;
  const bool wgmma = AttentionUsesWgmma(kernel);
  if (kernel == AttentionKernel::kWgmma && !wgmma) return cudaErrorNotSupported;
  if (dq == AttentionDq::kAuto) dq = AttentionDqDefault(hs);
  const bool stored = dq == AttentionDq::kStoredDs;
  if (hs == 64) {
    return Backward<64>(dqkv, dout, qkv, out, stats, B, T, C, NH, deterministic, wgmma, stored,
                        scratch, s);
  }
  return Backward<128>(dqkv, dout, qkv, out, stats, B, T, C, NH, deterministic, wgmma, stored,
                       scratch, s);
}

// Measured on an H100 (bench/attention-dq-2026-12-07.md, attention_bench per layer call):
// hidden-2048's head size 128, stored 0.339 against 0.367 ms; GPT-2's 64, 0.371 against 0.326
// (the head-64 dK/dV kernel with the staging spills 64 bytes at 255 registers).
AttentionDq AttentionDqDefault(int head_size) {
  return head_size == 128 ? AttentionDq::kStoredDs : AttentionDq::kRecompute;
}

}  // namespace boulder::kernels::cuda
