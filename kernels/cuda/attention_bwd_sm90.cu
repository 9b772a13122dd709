// Launcher of the wgmma attention backward: the dK/dV and dQ kernels (deterministic; the
// kernels and their algorithm: attention_bwd_sm90.cuh) or the one-pass kernel and its dQ
// conversion (attention_bwd_fused_sm90.cuh); the preprocess before them: attention_bwd.cu.
#include "kernels/cuda/attention_bwd_fused_sm90.cuh"
#include "kernels/cuda/attention_bwd_sm90.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace boulder::kernels::cuda {
namespace {

using attn::bf16;
using attn::ConvertDQSm90Kernel;
using attn::FlashBackwardFusedSm90Kernel;
using attn::FlashBackwardKVSm90Kernel;
using attn::FlashBackwardQSm90Kernel;
using attn::Sm90BwdCfg;
using attn::Sm90FusedBwdCfg;
using attn::Sm90QCfg;

template <int HS>
cudaError_t LaunchOnePass(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse2,
                          const float* Dp, float* dq_acc, int B, int T, int Tp, int C, int NH,
                          cudaStream_t s) {
  const float scale = 1.f / sqrtf(float(HS)), scale_log2 = scale * attn::kLog2e;
  using Cfg = Sm90FusedBwdCfg<HS>;
  cudaError_t err = cudaFuncSetAttribute(FlashBackwardFusedSm90Kernel<HS>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  FlashBackwardFusedSm90Kernel<HS>
      <<<dim3(B * NH, CeilDiv(T, Cfg::kBkv)), Cfg::kThreads, Cfg::kSmemBytes, s>>>(
          dqkv, dq_acc, dout, qkv, lse2, Dp, T, Tp, C, NH, scale, scale_log2);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  const size_t n_groups = size_t(B) * NH * Tp * HS / 16;
  ConvertDQSm90Kernel<HS><<<CeilDiv(n_groups, 256), 256, 0, s>>>(dqkv, dq_acc, n_groups, T, Tp, C,
                                                                 NH, scale);
  return cudaGetLastError();
}

template <int HS>
cudaError_t Launch(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse2,
                   const float* Dp, float* dq_acc, int B, int T, int Tp, int C, int NH,
                   cudaStream_t s) {
  if (dq_acc) return LaunchOnePass<HS>(dqkv, dout, qkv, lse2, Dp, dq_acc, B, T, Tp, C, NH, s);
  const float scale = 1.f / sqrtf(float(HS)), scale_log2 = scale * attn::kLog2e;
  using KV = Sm90BwdCfg<HS>;
  cudaError_t err = cudaFuncSetAttribute(
      FlashBackwardKVSm90Kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, KV::kSmemBytes);
  if (err != cudaSuccess) return err;
  FlashBackwardKVSm90Kernel<HS>
      <<<dim3(B * NH, CeilDiv(T, KV::kBkv)), KV::kThreads, KV::kSmemBytes, s>>>(
          dqkv, dout, qkv, lse2, Dp, T, Tp, C, NH, scale, scale_log2);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  using Q = Sm90QCfg<HS>;
  err = cudaFuncSetAttribute(FlashBackwardQSm90Kernel<HS>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, Q::kSmemBytes);
  if (err != cudaSuccess) return err;
  FlashBackwardQSm90Kernel<HS><<<dim3(B * NH, CeilDiv(T, Q::kBq)), Q::kThreads, Q::kSmemBytes, s>>>(
      dqkv, dout, qkv, lse2, Dp, T, Tp, C, NH, scale, scale_log2);
  return cudaGetLastError();
}

}  // namespace

cudaError_t AttentionBackwardSm90(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse2,
                                  const float* Dp, float* dq_acc, int B, int T, int Tp, int C,
                                  int NH, cudaStream_t s) {
  const int hs = C / NH;
  if (hs == 64) return Launch<64>(dqkv, dout, qkv, lse2, Dp, dq_acc, B, T, Tp, C, NH, s);
  if (hs == 128) return Launch<128>(dqkv, dout, qkv, lse2, Dp, dq_acc, B, T, Tp, C, NH, s);
  return cudaErrorInvalidValue;
}

}  // namespace boulder::kernels::cuda
