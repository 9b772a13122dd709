// Launcher of the causal flash attention forward (the kernel and its algorithm:
// attention_fwd.cuh).
#include <atomic>

#include "kernels/cuda/attention_fwd.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace boulder::kernels::cuda {
namespace {

using namespace attn;

template <int HS>
cudaError_t Forward(bf16* out, float* stats, const bf16* qkv, int B, int T, int C, int NH,
                    cudaStream_t s) {
  using Cfg = FwdCfg<HS>;
  cudaError_t err = cudaFuncSetAttribute(
      FlashForwardKernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  dim3 grid(B * NH, CeilDiv(T, Cfg::kBq));
  FlashForwardKernel<HS><<<grid, Cfg::kThreads, Cfg::kSmemBytes, s>>>(out, stats, qkv, T, C, NH,
                                                                      kLog2e / sqrtf(float(HS)));
  return cudaGetLastError();
}

}  // namespace

bool AttentionUsesWgmma(AttentionKernel kernel) {
  if (kernel == AttentionKernel::kMmaSync) return false;
  // Asked once per device (the query goes to the driver): 0 not yet asked, 1 no, 2 yes.
  static std::atomic<int> known[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  int v = known[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    v = AttentionWgmmaAvailable() ? 2 : 1;
    known[dev].store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

cudaError_t AttentionForward(bf16* out, float* stats, const bf16* qkv, int B, int T, int C, int NH,
                             cudaStream_t s, AttentionKernel kernel,
                             AttentionFwdVariant variant) {
  if (B < 1 || T < 1 || T > kMaxAttentionT || NH < 1 || C % NH != 0 ||
      int64_t(B) * NH > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (reinterpret_cast<uintptr_t>(qkv) % 16 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0) {
    return cudaErrorMisalignedAddress;
  }
  const int hs = C / NH;
  if (hs != 64 && hs != 128) return cudaErrorInvalidValue;
  if (AttentionUsesWgmma(kernel)) {
    return AttentionForwardSm90(out, stats, qkv, B, T, C, NH, s, nullptr, variant);
  }
  if (kernel == AttentionKernel::kWgmma) return cudaErrorNotSupported;
  if (hs == 64) return Forward<64>(out, stats, qkv, B, T, C, NH, s);
  if (hs == 128) return Forward<128>(out, stats, qkv, B, T, C, NH, s);
  return cudaErrorInvalidValue;
}

}  // namespace boulder::kernels::cuda
