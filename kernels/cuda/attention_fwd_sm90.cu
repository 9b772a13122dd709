// Launcher and availability check of the wgmma attention forward (the kernels and their
// algorithms: attention_fwd_sm90.cuh, attention_fwd_sm90_pipelined.cuh).
#include "kernels/cuda/attention_fwd_sm90.cuh"
#include "kernels/cuda/attention_fwd_sm90_pipelined.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace boulder::kernels::cuda {
namespace {

using attn::bf16;
using attn::FlashForwardSm90Kernel;
using attn::FlashForwardSm90PipelinedKernel;
using attn::Sm90FwdCfg;

template <int HS, bool kFp8, typename Kernel>
cudaError_t LaunchForwardSm90(Kernel kernel, bf16* out, float* stats, const bf16* qkv, int B,
                              int T, int C, int NH, cudaStream_t s, const AttentionFp8Cast* fp8) {
  using Cfg = Sm90FwdCfg<HS>;
  constexpr int kSmem = kFp8 ? Cfg::kFp8SmemBytes : Cfg::kSmemBytes;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  dim3 grid(B * NH, CeilDiv(T, Cfg::kBq));
  kernel<<<grid, Cfg::kThreads, kSmem, s>>>(
      out, stats, qkv, T, C, NH, attn::kLog2e / sqrtf(float(HS)), kFp8 ? fp8->out : nullptr,
      kFp8 ? fp8->scale : nullptr, kFp8 ? fp8->amax : nullptr, kFp8 ? fp8->counts : nullptr);
  return cudaGetLastError();
}

template <int HS, bool kFp8>
cudaError_t ForwardSm90(bf16* out, float* stats, const bf16* qkv, int B, int T, int C, int NH,
                        cudaStream_t s, const AttentionFp8Cast* fp8, AttentionFwdVariant variant) {
  switch (variant) {
    case AttentionFwdVariant::kPipelined:
      // Two blocks per multiprocessor where the registers allow it without ptxas serialising
      // the products (head size 64; at 128 the 128-register cap does: ptxas C7520).
      return LaunchForwardSm90<HS, kFp8>(
          FlashForwardSm90PipelinedKernel<HS, kFp8, HS == 64 ? 2 : 1>, out, stats, qkv, B, T, C, NH,
          s, fp8);
    case AttentionFwdVariant::kPipelinedOneBlock:
      return LaunchForwardSm90<HS, kFp8>(FlashForwardSm90PipelinedKernel<HS, kFp8, 1>, out, stats,
                                         qkv, B, T, C, NH, s, fp8);
    case AttentionFwdVariant::kPlain:
      break;
  }
  return LaunchForwardSm90<HS, kFp8>(FlashForwardSm90Kernel<HS, kFp8>, out, stats, qkv, B, T, C,
                                     NH, s, fp8);
}

}  // namespace

bool AttentionWgmmaAvailable() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    return false;
  }
  if (major != 9 || minor != 0) return false;
  // The build must carry sm_90a machine code (CMAKE_CUDA_ARCHITECTURES 90a-real): sm_90a code
  // runs on compute capability 9.0 only, and no other build of this kernel does anything.
  cudaFuncAttributes attr;
  if (cudaFuncGetAttributes(&attr, FlashForwardSm90Kernel<64>) != cudaSuccess) return false;
  return attr.binaryVersion == 90;
}

cudaError_t AttentionForwardSm90(bf16* out, float* stats, const bf16* qkv, int B, int T, int C,
                                 int NH, cudaStream_t s, const AttentionFp8Cast* fp8,
                                 AttentionFwdVariant variant) {
  const int hs = C / NH;
  if (fp8 != nullptr && (fp8->out == nullptr || reinterpret_cast<uintptr_t>(fp8->out) % 8 != 0 ||
                         fp8->scale == nullptr || fp8->amax == nullptr || fp8->counts == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (hs == 64) {
    return fp8 ? ForwardSm90<64, true>(out, stats, qkv, B, T, C, NH, s, fp8, variant)
               : ForwardSm90<64, false>(out, stats, qkv, B, T, C, NH, s, nullptr, variant);
  }
  if (hs == 128) {
    return fp8 ? ForwardSm90<128, true>(out, stats, qkv, B, T, C, NH, s, fp8, variant)
               : ForwardSm90<128, false>(out, stats, qkv, B, T, C, NH, s, nullptr, variant);
  }
  return cudaErrorInvalidValue;
}

}  // namespace boulder::kernels::cuda
