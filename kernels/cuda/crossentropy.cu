// Fused softmax + cross-entropy, one block per row of Vp logits (Vp % 8 == 0): pass 1 finds
// the row's max and sum of exponentials online (FP32), pass 2 overwrites the logits in place
// with dlogits = (softmax - onehot) * dloss; padding columns [V, Vp) get 0. losses[row] =
// logsumexp - logit[target]; an out-of-range target gives a NaN loss (the engine checks).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace boulder::kernels::cuda {
namespace {

__device__ __forceinline__ void MergeMaxSum(float& m, float& s, float om, float os) {
  float nm = fmaxf(m, om);
  if (nm == -INFINITY) return;
  s = s * __expf(m - nm) + os * __expf(om - nm);
  m = nm;
}

__global__ void SoftmaxCrossEntropyKernel(float* losses, bf16* logits, const int32_t* targets,
                                          int V, int Vp, float dloss) {
  int row = blockIdx.x;
  bf16* x = logits + size_t(row) * Vp;
  float m = -INFINITY, sum = 0.f;
  for (int c = threadIdx.x * 8; c < Vp; c += blockDim.x * 8) {
    Bf16x8 v = Load8(x + c);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if (c + k >= V) break;
      float f = __bfloat162float(v.v[k]);
      if (f > m) {
        sum = sum * __expf(m - f) + 1.f;
        m = f;
      } else {
        sum += __expf(f - m);
      }
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    float om = __shfl_xor_sync(0xffffffffu, m, o), os = __shfl_xor_sync(0xffffffffu, sum, o);
    MergeMaxSum(m, sum, om, os);
  }
  __shared__ float sm[32], ss[32];
  __shared__ float lse_shared;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) { sm[warp] = m; ss[warp] = sum; }
  __syncthreads();
  if (warp == 0) {
    int nw = blockDim.x / 32;
    m = lane < nw ? sm[lane] : -INFINITY;
    sum = lane < nw ? ss[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) {
      float om = __shfl_xor_sync(0xffffffffu, m, o), os = __shfl_xor_sync(0xffffffffu, sum, o);
      MergeMaxSum(m, sum, om, os);
    }
    if (lane == 0) lse_shared = m + logf(sum);
  }
  __syncthreads();
  float lse = lse_shared;
  int target = targets[row];
  bool valid = target >= 0 && target < V;
  if (threadIdx.x == 0)
    losses[row] = valid ? lse - __bfloat162float(x[target]) : __int_as_float(0x7fc00000);
  __syncthreads();  // x[target] is read above before being overwritten below.
  for (int c = threadIdx.x * 8; c < Vp; c += blockDim.x * 8) {
    Bf16x8 v = Load8(x + c), r;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      int i = c + k;
      float g = 0.f;
      if (i < V) g = (__expf(__bfloat162float(v.v[k]) - lse) - (i == target ? 1.f : 0.f)) * dloss;
      r.v[k] = __float2bfloat16(g);
    }
    Store8(x + c, r);
  }
}

}  // namespace

cudaError_t SoftmaxCrossEntropy(float* losses, bf16* logits, const int32_t* targets, int N,
                                int V, int Vp, float dloss, cudaStream_t s) {
  SoftmaxCrossEntropyKernel<<<N, Vp >= 4096 ? 512 : 128, 0, s>>>(losses, logits, targets, V, Vp,
                                                                 dloss);
  return cudaGetLastError();
}

}  // namespace boulder::kernels::cuda
