// Launcher of the wgmma attention backward's dK/dV and dQ kernels, dQ recomputed or from the
// stored dS (the kernels and their algorithm: attention_bwd_sm90.cuh; the preprocess before
// them: attention_bwd.cu).
#include "kernels/cuda/attention_bwd_sm90.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace boulder::kernels::cuda {
namespace {

using attn::bf16;
using attn::FlashBackwardDqFromDsSm90Kernel;
using attn::FlashBackwardKVSm90Kernel;
using attn::FlashBackwardQSm90Kernel;
using attn::Sm90BwdCfg;
using attn::Sm90DqCfg;
using attn::Sm90QCfg;

template <int HS>
cudaError_t Launch(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse2,
                   const float* Dp, int B, int T, int Tp, int C, int NH, cudaStream_t s,
                   unsigned char* ds) {
  const float scale = 1.f / sqrtf(float(HS)), scale_log2 = scale * attn::kLog2e;
  using KV = Sm90BwdCfg<HS>;
  const dim3 kv_grid(B * NH, CeilDiv(T, KV::kBkv));
  cudaError_t err;
  if (ds) {
    err = cudaFuncSetAttribute(FlashBackwardKVSm90Kernel<HS, true>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, KV::kSmemBytesStoreDs);
    if (err != cudaSuccess) return err;
    FlashBackwardKVSm90Kernel<HS, true><<<kv_grid, KV::kThreads, KV::kSmemBytesStoreDs, s>>>(
        dqkv, dout, qkv, lse2, Dp, T, Tp, C, NH, scale, scale_log2, ds);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    using D = Sm90DqCfg<HS>;
    err = cudaFuncSetAttribute(FlashBackwardDqFromDsSm90Kernel<HS>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, D::kSmemBytes);
    if (err != cudaSuccess) return err;
    FlashBackwardDqFromDsSm90Kernel<HS>
        <<<dim3(B * NH, CeilDiv(T, D::kBq)), D::kThreads, D::kSmemBytes, s>>>(dqkv, qkv, ds, T, C,
                                                                            NH, scale);
    return cudaGetLastError();
  }
  err = cudaFuncSetAttribute(FlashBackwardKVSm90Kernel<HS>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, KV::kSmemBytes);
  if (err != cudaSuccess) return err;
  FlashBackwardKVSm90Kernel<HS><<<kv_grid, KV::kThreads, KV::kSmemBytes, s>>>(
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
                                  const float* Dp, int B, int T, int Tp, int C, int NH,
                                  cudaStream_t s, unsigned char* ds) {
  const int hs = C / NH;
  if (hs == 64) return Launch<64>(dqkv, dout, qkv, lse2, Dp, B, T, Tp, C, NH, s, ds);
  if (hs == 128) return Launch<128>(dqkv, dout, qkv, lse2, Dp, B, T, Tp, C, NH, s, ds);
  return cudaErrorInvalidValue;
}

}  // namespace boulder::kernels::cuda
