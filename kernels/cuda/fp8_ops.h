// Launchers of the FP8 kernels (fp8.cu), behind CudaBackend::CastFp8 and Fp8ScaleUpdate; the
// contracts are those of kernels/backend.h. Each takes an explicit stream, checks the launch
// and returns its error; none synchronises.
#ifndef BOULDER_KERNELS_CUDA_FP8_OPS_H_
#define BOULDER_KERNELS_CUDA_FP8_OPS_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/ops.h"

namespace boulder::kernels::cuda {

// inp [rows, cols] BF16 -> out [rows, cols] and/or out_t [cols, rows] FP8 (E4M3 when e4m3,
// else E5M2); *amax max-accumulated, counts[3] (saturated, underflow, non-finite) added to.
cudaError_t CastFp8(uint8_t* out, uint8_t* out_t, const __nv_bfloat16* inp, int rows, int cols,
                    bool e4m3, const float* scale, float* amax, unsigned long long* counts,
                    cudaStream_t s);

// On (the default), a tile cast without a transposed output or column sums runs the tile
// kernel's instance without the shared transpose tile and its barriers (kRowsOnly,
// fp8_cast_tiles.cuh); off, the instance that forms the tile anyway (what ran before): the
// same bytes and statistics, for fp8_cast_bench's comparison. Not thread-safe: set it before
// launching.
void SetFp8CastRowsOnlyKernels(bool on);

// On (the default), CastFp8GradGrid plans a dGELU cast's grid for one wave of the fused GELU +
// gradient cast (fp8_cast_tiles.cuh), which fits fewer blocks per SM; off, for one wave of
// CastFp8Grad's own kernel (what ran before). Either way CastFp8Grad and GeluCastFp8AndGrad
// take the same grid, so their bias sums agree bit for bit; the sums differ between the two
// settings (other chunks of rows). For fp8_cast_bench's comparison; not thread-safe.
void SetFp8GeluGradFusedGrid(bool on);

// Backend::TransposeFp8: out[cols, rows] = in[rows, cols]ᵀ, bytes.
cudaError_t TransposeFp8(uint8_t* out, const uint8_t* in, int rows, int cols, cudaStream_t s);
// On (the default), TransposeFp8 runs its 128 x 128 tile kernel where rows and cols are
// multiples of 16 and the pointers 16-byte aligned; off, the 64 x 64 kernel it keeps for other
// shapes (what ran before): the same bytes, for fp8_cast_bench and the tests. Not thread-safe.
void SetFp8WideTranspose(bool on);

// Backend::CastFp8Batch: CastFp8 of each job in as few launches as the kernel-parameter space
// allows (kCastBatchMax jobs per launch, one block per 64-column strip and chunk of row tiles
// of each job; every job in one format). Jobs whose shapes or pointers the tile kernel does not
// take (dims not multiples of 8, unaligned) run CastFp8 on their own. Same bytes and
// statistics as CastFp8 per job.
struct CastBatchJob {
  uint8_t* out;
  uint8_t* out_t;
  const __nv_bfloat16* inp;
  int rows, cols;
  const float* scale;
  float* amax;
  unsigned long long* counts;
};
cudaError_t CastFp8Batch(const CastBatchJob* jobs, int n, bool e4m3, cudaStream_t s);

// The fused backward cast (Backend::CastFp8Grad): g = dout (⊙ gelu'(pre) when pre is not
// null), cast like CastFp8, and dbias += column sums of g when dbias is not null (partial sums
// in scratch, fixed order). Only when CastFp8GradFusable (dims multiples of 8, aligned
// pointers); otherwise cudaErrorInvalidValue without launching.
bool CastFp8GradFusable(const void* out, const void* out_t, const void* dout, const void* pre,
                        int rows, int cols);
cudaError_t CastFp8Grad(uint8_t* out, uint8_t* out_t, const __nv_bfloat16* dout,
                        const __nv_bfloat16* pre, __nv_bfloat16* dbias, int rows, int cols,
                        bool e4m3, const float* scale, float* amax, unsigned long long* counts,
                        Scratch& scratch, cudaStream_t s);

cudaError_t Fp8ScaleUpdate(float* scale, float* scale_inv, int scale_inv_stride, float* history,
                           float* amax, const float* fp8_max, int n, int history_len,
                           bool use_history_max, int margin, const float* skip_if_non_finite,
                           cudaStream_t s);

}  // namespace boulder::kernels::cuda

#endif  // BOULDER_KERNELS_CUDA_FP8_OPS_H_
