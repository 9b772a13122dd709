// Internals of reduce.cu shared with layernorm.cu: the chunking of rows for deterministic
// column reductions, and the stage-2 kernel.
#ifndef BOULDER_KERNELS_CUDA_REDUCE_CUH_
#define BOULDER_KERNELS_CUDA_REDUCE_CUH_

#include "kernels/cuda/ops.h"

namespace boulder::kernels::cuda {

// Row lanes of the 16-byte column-partial kernels (reduce.cu, layernorm.cu): a block
// (32, kColLanes) covers 256 columns, 8 per thread, and row lane y sums rows r0 + y,
// r0 + y + kColLanes, ... of its chunk.
constexpr int kColLanes = 8;

// The end of such a block: out[c] = the kColLanes lanes' sums of column c (acc: this thread's
// 8 columns, (blockIdx.x · 32 + threadIdx.x) · 8 + k) added in lane order (deterministic), for
// the block's columns c < C. Every thread of the block calls it; `lanes` may be reused by the
// next call (it synchronises first).
__device__ __forceinline__ void StoreColumnLaneSums(float (&lanes)[kColLanes][32 * 8],
                                                    const float (&acc)[8], float* out, int C) {
  __syncthreads();  // an earlier call's readers are done with lanes
#pragma unroll
  for (int k = 0; k < 8; ++k) lanes[threadIdx.y][threadIdx.x * 8 + k] = acc[k];
  __syncthreads();
  const int t = threadIdx.y * 32 + threadIdx.x;  // 256 threads, the block's 256 columns
  const int c = blockIdx.x * 256 + t;
  if (c < C) {
    float sum = 0.f;
#pragma unroll
    for (int l = 0; l < kColLanes; ++l) sum += lanes[l][t];
    out[c] = sum;
  }
}

// Number of row chunks for an N-row column reduction (a function of N only).
int ColumnChunks(int N);
// out[c] += Σ_k partial[k, c] for k in [0, chunks), in a fixed order (deterministic).
cudaError_t ColumnFinish(bf16* out, const float* partial, int chunks, int C, cudaStream_t s);
// ColumnFinish(out_a, partial) and ColumnFinish(out_b, partial + chunks·C) in one launch (the
// LayerNorm backward's weight and bias gradients); the same sums.
cudaError_t ColumnFinishPair(bf16* out_a, bf16* out_b, const float* partial, int chunks, int C,
                             cudaStream_t s);

}  // namespace boulder::kernels::cuda

#endif  // BOULDER_KERNELS_CUDA_REDUCE_CUH_
