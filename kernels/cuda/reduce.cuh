// Internals of reduce.cu shared with layernorm.cu: the chunking of rows for deterministic
// column reductions, and the stage-2 kernel.
#ifndef BOULDER_KERNELS_CUDA_REDUCE_CUH_
#define BOULDER_KERNELS_CUDA_REDUCE_CUH_

#include "kernels/cuda/ops.h"

namespace boulder::kernels::cuda {

// Number of row chunks for an N-row column reduction (a function of N only).
int ColumnChunks(int N);
// out[c] += Σ_k partial[k, c] for k in [0, chunks), in k order.
cudaError_t ColumnFinish(bf16* out, const float* partial, int chunks, int C, cudaStream_t s);

}  // namespace boulder::kernels::cuda

#endif  // BOULDER_KERNELS_CUDA_REDUCE_CUH_
