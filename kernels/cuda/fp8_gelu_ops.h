// Launchers of the fused GELU + FP8 cast(-transpose) (fp8_gelu.cu), behind
// CudaBackend::GeluCastFp8; the contract is Backend::GeluCastFp8's (kernels/backend.h). Checks
// the launch and returns its error; does not synchronise.
#ifndef BOULDER_KERNELS_CUDA_FP8_GELU_OPS_H_
#define BOULDER_KERNELS_CUDA_FP8_GELU_OPS_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/ops.h"

namespace boulder::kernels::cuda {

// pre [rows, cols] BF16 -> g = bf16(gelu_tanh(pre)) (GeluForward's values) -> out [rows, cols]
// and/or out_t [cols, rows] FP8 (E4M3 when e4m3, else E5M2) with CastFp8's encoding; *amax
// max-accumulated over |g|, counts[3] (saturated, underflow, non-finite) added to.
cudaError_t GeluCastFp8(uint8_t* out, uint8_t* out_t, const __nv_bfloat16* pre, int rows, int cols,
                        bool e4m3, const float* scale, float* amax, unsigned long long* counts,
                        cudaStream_t s);

// The MLP backward's two casts over fc1's pre-activation in one pass (Backend::
// GeluCastFp8AndGrad): in_t [cols, rows] = GeluCastFp8's transposed output (in_e4m3, in_scale;
// no statistics), and g_out [rows, cols], g_out_t [cols, rows] (either may be null),
// g_amax, g_counts and dbias (+=, when not null) = CastFp8Grad(dout, pre)'s (g_e4m3,
// g_scale) — the same bytes, statistics and sums. REQUIRES GeluCastFp8AndGradFusable (else
// cudaErrorInvalidValue, nothing launched).
bool GeluCastFp8AndGradFusable(const void* in_t, const void* g_out, const void* g_out_t,
                               const void* dout, const void* pre, int rows, int cols);
cudaError_t GeluCastFp8AndGrad(uint8_t* in_t, bool in_e4m3, const float* in_scale,
                               uint8_t* g_out, uint8_t* g_out_t, const __nv_bfloat16* dout,
                               const __nv_bfloat16* pre, __nv_bfloat16* dbias, int rows, int cols,
                               bool g_e4m3, const float* g_scale, float* g_amax,
                               unsigned long long* g_counts, Scratch& scratch, cudaStream_t s);

// The same with the per-element kernel that GeluCastFp8 uses for shapes its tile kernel does
// not take (rows or cols not multiples of 8, unaligned pointers); the same results on every
// shape. Exposed so that the tests and fp8_cast_bench can run it on the fast path's shapes.
cudaError_t GeluCastFp8AnyShape(uint8_t* out, uint8_t* out_t, const __nv_bfloat16* pre, int rows,
                                int cols, bool e4m3, const float* scale, float* amax,
                                unsigned long long* counts, cudaStream_t s);

}  // namespace boulder::kernels::cuda

#endif  // BOULDER_KERNELS_CUDA_FP8_GELU_OPS_H_
