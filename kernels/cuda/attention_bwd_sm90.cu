// Launchers of the wgmma attention backward's dK/dV and deterministic dQ kernels (the kernels
// and their algorithm: attention_bwd_sm90.cuh; the preprocess and the rest: attention_bwd.cu).
#include "kernels/cuda/attention_bwd_sm90.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace boulder::kernels::cuda {
namespace {

using attn::bf16;
using attn::FlashBackwardKVSm90Kernel;
using attn::FlashBackwardQSm90Kernel;
using attn::Sm90BwdCfg;
using attn::Sm90QCfg;

template <int HS, bool kAtomicDQ>
cudaError_t LaunchKV(bf16* dqkv, float* dq_acc, const bf16* dout, const bf16* qkv,
                     const float* lse2, const float* Dp, int B, int T, int Tp, int C, int NH,
                     cudaStream_t s) {
  using Cfg = Sm90BwdCfg<HS>;
  cudaError_t err =
      cudaFuncSetAttribute(FlashBackwardKVSm90Kernel<HS, kAtomicDQ>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const float scale = 1.f / sqrtf(float(HS));
  FlashBackwardKVSm90Kernel<HS, kAtomicDQ>
      <<<dim3(B * NH, CeilDiv(T, Cfg::kBkv)), Cfg::kThreads, Cfg::kSmemBytes, s>>>(
          dqkv, dq_acc, dout, qkv, lse2, Dp, T, Tp, C, NH, scale, scale * attn::kLog2e);
  return cudaGetLastError();
}

template <int HS>
cudaError_t LaunchQ(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse2,
                    const float* Dp, int B, int T, int Tp, int C, int NH, cudaStream_t s) {
  using Cfg = Sm90QCfg<HS>;
  cudaError_t err = cudaFuncSetAttribute(
      FlashBackwardQSm90Kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const float scale = 1.f / sqrtf(float(HS));
  FlashBackwardQSm90Kernel<HS>
      <<<dim3(B * NH, CeilDiv(T, Cfg::kBq)), Cfg::kThreads, Cfg::kSmemBytes, s>>>(
          dqkv, dout, qkv, lse2, Dp, T, Tp, C, NH, scale, scale * attn::kLog2e);
  return cudaGetLastError();
}

}  // namespace

cudaError_t AttentionBackwardQSm90(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse2,
                                   const float* Dp, int B, int T, int Tp, int C, int NH,
                                   cudaStream_t s) {
  const int hs = C / NH;
  if (hs == 64) return LaunchQ<64>(dqkv, dout, qkv, lse2, Dp, B, T, Tp, C, NH, s);
  if (hs == 128) return LaunchQ<128>(dqkv, dout, qkv, lse2, Dp, B, T, Tp, C, NH, s);
  return cudaErrorInvalidValue;
}

cudaError_t AttentionBackwardKVSm90(bf16* dqkv, float* dq_acc, const bf16* dout, const bf16* qkv,
                                    const float* lse2, const float* Dp, int B, int T, int Tp, int C,
                                    int NH, cudaStream_t s) {
  const int hs = C / NH;
  if (hs == 64) {
    return dq_acc ? LaunchKV<64, true>(dqkv, dq_acc, dout, qkv, lse2, Dp, B, T, Tp, C, NH, s)
                  : LaunchKV<64, false>(dqkv, dq_acc, dout, qkv, lse2, Dp, B, T, Tp, C, NH, s);
  }
  if (hs == 128) {
    return dq_acc ? LaunchKV<128, true>(dqkv, dq_acc, dout, qkv, lse2, Dp, B, T, Tp, C, NH, s)
                  : LaunchKV<128, false>(dqkv, dq_acc, dout, qkv, lse2, Dp, B, T, Tp, C, NH, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace boulder::kernels::cuda
