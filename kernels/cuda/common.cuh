// Device helpers shared by the kernel files: 16-byte vectors of BF16, warp reductions, GELU.
#ifndef BOULDER_KERNELS_CUDA_COMMON_CUH_
#define BOULDER_KERNELS_CUDA_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace boulder::kernels::cuda {

// Eight BF16 values moved as one 16-byte load/store.
struct alignas(16) Bf16x8 {
  __nv_bfloat16 v[8];
};

__device__ __forceinline__ Bf16x8 Load8(const __nv_bfloat16* p) {
  Bf16x8 r;
  *reinterpret_cast<int4*>(&r) = *reinterpret_cast<const int4*>(p);
  return r;
}
__device__ __forceinline__ void Store8(__nv_bfloat16* p, const Bf16x8& r) {
  *reinterpret_cast<int4*>(p) = *reinterpret_cast<const int4*>(&r);
}

__device__ __forceinline__ float WarpSum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float WarpMax(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// GPT-2's tanh approximation of GELU and its derivative.
// GeluTanh: 0.5·x·(1 + tanh(u)), u = sqrt(2/pi)·(x + 0.044715·x³), computed as the equal
// x / (1 + e^(−2u)) with the hardware exp2 and reciprocal (ex2.approx, rcp.approx: a few FP32
// ulps over the whole range, no cancellation where tanh(u) nears −1, which tanhf's form has),
// seven instructions where tanhf takes about twenty. (Measured on the H200, run 18 of
// bench/fp8-gemm-2026-12-04.md: no step or kernel got measurably faster, the fused GEMM
// epilogue it was meant for included; it stays for its accuracy.) Large negative x give ±0
// (e^(−2u) past 2^126), +inf gives +inf, NaN stays NaN. (Host C++, as the emulation tests
// compile the epilogues: the same formula with exp2f and a division.)
__device__ __forceinline__ float GeluTanh(float x) {
  constexpr float kA = -2.f * 0.7978845608028654f * 1.4426950408889634f;  // −2·sqrt(2/pi)·log2(e)
  constexpr float kB = kA * 0.044715f;
  const float t = x * fmaf(kB, x * x, kA);  // −2u·log2(e)
#if defined(__CUDA_ARCH__)
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(t));
  return __fdividef(x, 1.f + e);
#else
  return x / (1.f + exp2f(t));
#endif
}
__device__ __forceinline__ float GeluTanhGrad(float x) {
  constexpr float kS = 0.7978845608028654f;
  float u = kS * (x + 0.044715f * x * x * x);
  float th = tanhf(u);
  float sech2 = 1.f - th * th;
  return 0.5f * (1.f + th) + 0.5f * x * sech2 * kS * (1.f + 3.f * 0.044715f * x * x);
}

inline unsigned CeilDiv(size_t a, size_t b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace boulder::kernels::cuda

#endif  // BOULDER_KERNELS_CUDA_COMMON_CUH_
