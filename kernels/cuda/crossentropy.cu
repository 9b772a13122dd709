// Fused softmax + cross-entropy, one block per row of Vp logits (Vp % 8 == 0): pass 1 finds
// the row's max and sum of exponentials online (FP32), pass 2 overwrites the logits in place
// with dlogits = (softmax - onehot) * dloss; padding columns [V, Vp) get 0. losses[row] =
// logsumexp - logit[target]; an out-of-range target gives a NaN loss (the engine checks).
// Rows up to 200 KiB take SoftmaxCrossEntropySmemKernel (one read of the row from memory).
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
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = sum;
  }
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

// Block-wide max and sum of a per-thread value (every thread gets the result; both
// synchronise the block).
template <int kThreads>
__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  v = WarpMax(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch is free (a previous reduction has been read)
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return WarpMax(lane < kThreads / 32 ? scratch[lane] : -INFINITY);
}
template <int kThreads>
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  v = WarpSum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return WarpSum(lane < kThreads / 32 ? scratch[lane] : 0.f);
}

// The same result with the row copied into shared memory on its one read from global memory
// (rows up to kMaxSmemRow bytes): the max, the sum of exponentials and the gradient each pass
// over shared memory; columns at or past V hold -inf there (exp gives 0, the max ignores them),
// so the passes have no per-element conditions.
constexpr int kMaxSmemRow = 200 * 1024;

template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    SoftmaxCrossEntropySmemKernel(float* losses, bf16* logits, const int32_t* targets, int V,
                                  int Vp, float dloss) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* srow = reinterpret_cast<bf16*>(smem_raw);
  __shared__ float scratch[32];
  const int row = blockIdx.x;
  bf16* x = logits + size_t(row) * Vp;
  const bf16 ninf = __ushort_as_bfloat16(0xff80);
  float m = -INFINITY;
#pragma unroll 4
  for (int c = threadIdx.x * 8; c < Vp; c += kThreads * 8) {
    Bf16x8 v = Load8(x + c);
    if (c + 8 > V) {
#pragma unroll
      for (int k = 0; k < 8; ++k) v.v[k] = c + k < V ? v.v[k] : ninf;
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) m = fmaxf(m, __bfloat162float(v.v[k]));
    Store8(srow + c, v);  // each thread reads back only what it stored, until the reductions
  }
  m = BlockMax<kThreads>(m, scratch);
  float sum = 0.f;
  for (int c = threadIdx.x * 8; c < Vp; c += kThreads * 8) {
    const Bf16x8 v = Load8(srow + c);
#pragma unroll
    for (int k = 0; k < 8; ++k) sum += __expf(__bfloat162float(v.v[k]) - m);
  }
  sum = BlockSum<kThreads>(sum, scratch);  // synchronises: srow is complete from here on
  const float lse = m + logf(sum);
  const int target = targets[row];
  const bool valid = target >= 0 && target < V;
  if (threadIdx.x == 0) {
    losses[row] = valid ? lse - __bfloat162float(srow[target]) : __int_as_float(0x7fc00000);
  }
  for (int c = threadIdx.x * 8; c < Vp; c += kThreads * 8) {
    const Bf16x8 v = Load8(srow + c);
    const int t = target - c;  // the target's position in this group, if it is here
    Bf16x8 r;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float p = __expf(__bfloat162float(v.v[k]) - lse);  // 0 past V
      r.v[k] = __float2bfloat16((k == t ? p - 1.f : p) * dloss);
    }
    Store8(x + c, r);
  }
}

template <int kThreads>
cudaError_t LaunchSmem(float* losses, bf16* logits, const int32_t* targets, int N, int V, int Vp,
                       float dloss, cudaStream_t s) {
  static const cudaError_t attr =
      cudaFuncSetAttribute(SoftmaxCrossEntropySmemKernel<kThreads>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmemRow);
  if (attr != cudaSuccess) return attr;
  SoftmaxCrossEntropySmemKernel<kThreads>
      <<<N, kThreads, size_t(Vp) * sizeof(bf16), s>>>(losses, logits, targets, V, Vp, dloss);
  return cudaGetLastError();
}

}  // namespace

cudaError_t SoftmaxCrossEntropy(float* losses, bf16* logits, const int32_t* targets, int N, int V,
                                int Vp, float dloss, cudaStream_t s) {
  if (size_t(Vp) * sizeof(bf16) <= size_t(kMaxSmemRow)) {
    return Vp >= 4096 ? LaunchSmem<512>(losses, logits, targets, N, V, Vp, dloss, s)
                      : LaunchSmem<128>(losses, logits, targets, N, V, Vp, dloss, s);
  }
  SoftmaxCrossEntropyKernel<<<N, 512, 0, s>>>(losses, logits, targets, V, Vp, dloss);
  return cudaGetLastError();
}

}  // namespace boulder::kernels::cuda
