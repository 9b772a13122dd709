// Launcher and availability check of the wgmma attention forward (the kernel and its
// algorithm: attention_fwd_sm90.cuh).
#include "kernels/cuda/attention_fwd_sm90.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace boulder::kernels::cuda {
namespace {

using attn::bf16;
using attn::FlashForwardSm90Kernel;
using attn::Sm90FwdCfg;

template <int HS>
cudaError_t ForwardSm90(bf16* out, float* stats, const bf16* qkv, int B, int T, int C, int NH,
                        cudaStream_t s) {
  using Cfg = Sm90FwdCfg<HS>;
  cudaError_t err = cudaFuncSetAttribute(
      FlashForwardSm90Kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  dim3 grid(B * NH, CeilDiv(T, Cfg::kBq));
  FlashForwardSm90Kernel<HS><<<grid, Cfg::kThreads, Cfg::kSmemBytes, s>>>(
      out, stats, qkv, T, C, NH, attn::kLog2e / sqrtf(float(HS)));
  return cudaGetLastError();
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
                                 int NH, cudaStream_t s) {
  const int hs = C / NH;
  if (hs == 64) return ForwardSm90<64>(out, stats, qkv, B, T, C, NH, s);
  if (hs == 128) return ForwardSm90<128>(out, stats, qkv, B, T, C, NH, s);
  return cudaErrorInvalidValue;
}

}  // namespace boulder::kernels::cuda
