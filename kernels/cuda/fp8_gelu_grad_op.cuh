// The dGELU stage of the FP8 gradient cast (CastFp8Grad's fc1 cast, fp8.cu) for the cast-transpose
// tile kernel (fp8_cast_tiles.cuh), shared with the fused GELU recomputation + gradient cast
// (GeluCastFp8AndGrad, fp8_gelu.cu). Declared in an anonymous namespace: each .cu file that
// includes it compiles its own copy with its own flags (fp8.cu without --use_fast_math,
// fp8_gelu.cu with it). The code uses the hardware tanh explicitly and no division or square
// root, so the two compilations differ only in flushing subnormal intermediates (-ftz), which
// gradients in BF16 never reach in practice; the GPU tests compare the two bit for bit.
#ifndef BOULDER_KERNELS_CUDA_FP8_GELU_GRAD_OP_CUH_
#define BOULDER_KERNELS_CUDA_FP8_GELU_GRAD_OP_CUH_

#include <cuda_bf16.h>

#include <cstdint>

namespace boulder::kernels::cuda {
namespace {

// gelu_tanh'(x) with the hardware tanh (tanh.approx.f32, relative error about 2^-11: far below
// the BF16 rounding of g that follows).
__device__ __forceinline__ float GeluTanhGradApprox(float x) {
  constexpr float kS = 0.7978845608028654f;
  const float u = kS * (x + 0.044715f * x * x * x);
  float th;
  asm("tanh.approx.f32 %0, %1;" : "=f"(th) : "f"(u));
  return 0.5f * (1.f + th) + 0.5f * x * (1.f - th * th) * kS * (1.f + 3.f * 0.044715f * x * x);
}

// The stage of CastFp8Grad's fused dGELU: the 8 values d ⊙ gelu'(p), each rounded to BF16.
struct GeluGradOp {
  static constexpr bool kReadsPre = true;
  static constexpr bool kRowCol = false;
  __device__ __forceinline__ static uint4 Apply(uint4 d, uint4 p) {
    const unsigned dw[4] = {d.x, d.y, d.z, d.w}, pw[4] = {p.x, p.y, p.z, p.w};
    unsigned gw[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float lo =
          __uint_as_float(dw[k] << 16) * GeluTanhGradApprox(__uint_as_float(pw[k] << 16));
      const float hi = __uint_as_float(dw[k] & 0xffff0000u) *
                       GeluTanhGradApprox(__uint_as_float(pw[k] & 0xffff0000u));
      const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);  // lo in the low half
      gw[k] = *reinterpret_cast<const unsigned*>(&h);
    }
    return make_uint4(gw[0], gw[1], gw[2], gw[3]);
  }
};

}  // namespace
}  // namespace boulder::kernels::cuda

#endif  // BOULDER_KERNELS_CUDA_FP8_GELU_GRAD_OP_CUH_
