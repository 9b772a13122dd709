// Deterministic reductions: column sums over rows (bias gradients, LayerNorm weight/bias
// gradients) and the global sum of squares (gradient norm).
//
// Determinism without atomics: stage 1 splits the rows into a fixed number of chunks (a
// function of the shape only, never of the device) and sums each column of each chunk in a
// fixed order into a partial; stage 2 sums the partials of each column in a fixed order.
// Parameter gradients accumulate (+=) into BF16.
#include <algorithm>
#include <cstdint>

#include "kernels/checksum.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace boulder::kernels::cuda {
namespace {

// Stage 1 of the column sum: block (32, kColLanes) covers 256 columns (8 per thread, one
// 16-byte load per row) of one chunk of rows; the row lanes of a column group sum rows r0+ty,
// r0+ty+kColLanes, ... and are then added in lane order (StoreColumnLaneSums) — a fixed order,
// so deterministic. kGeluGrad: each element of x first becomes bf16(x · gelu'(pre))
// (GeluBackwardInPlace's expression, elementwise.cu, same compiler flags), written to dgelu
// (x itself: in place), and the rounded values are summed: the same bits as
// GeluBackwardInPlace followed by the plain kernel, one read of x fewer.
// REQUIRES: C % 8 == 0 and x (and pre) 16-byte aligned (checked by the launchers).
template <bool kGeluGrad>
__global__ void ColumnPartialVec8Kernel(float* partial, const bf16* x, bf16* dgelu,
                                        const bf16* pre, int N, int C, int rows_per) {
  __shared__ float lanes[kColLanes][32 * 8];
  const int c0 = (blockIdx.x * 32 + threadIdx.x) * 8;
  const int chunk = blockIdx.y;
  const int r0 = chunk * rows_per, r1 = min(N, r0 + rows_per);
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (c0 < C) {
    for (int r = r0 + threadIdx.y; r < r1; r += kColLanes) {
      const size_t off = size_t(r) * C + c0;
      Bf16x8 v = Load8(x + off);
      if constexpr (kGeluGrad) {
        const Bf16x8 p = Load8(pre + off);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          v.v[k] = __float2bfloat16(__bfloat162float(v.v[k]) *
                                    GeluTanhGrad(__bfloat162float(p.v[k])));
        }
        Store8(dgelu + off, v);
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] += __bfloat162float(v.v[k]);
    }
  }
  StoreColumnLaneSums(lanes, acc, partial + size_t(chunk) * C, C);
}

// The scalar form for shapes the vectorised kernel does not take.
__global__ void ColumnPartialKernel(float* partial, const bf16* x, int N, int C, int rows_per) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  int chunk = blockIdx.y;
  if (c >= C) return;
  int r0 = chunk * rows_per, r1 = min(N, r0 + rows_per);
  float acc = 0.f;
  for (int r = r0; r < r1; ++r) acc += __bfloat162float(x[size_t(r) * C + c]);
  partial[size_t(chunk) * C + c] = acc;
}

// out_a[c] += Σ_k partial[k, c] and, when out_b is not null, out_b[c] += Σ_k partial[chunks + k,
// c]. A block (32, kFinishLanes) takes 32 columns of the two; lane y of a column adds chunks
// y, y + kFinishLanes, ... in order, with up to kFinishLoads loads in flight, and lane 0 then
// adds the lanes' sums in lane order: a fixed order (deterministic). Before, one thread added a
// column's chunks (up to 512) alone, mostly waiting on memory: ~10 us per call on the H200
// for GPT-2's LayerNorm backward, whose main kernel takes 31.
constexpr int kFinishLanes = 8, kFinishLoads = 8;
__global__ void __launch_bounds__(32 * kFinishLanes)
    ColumnFinishKernel(bf16* out_a, bf16* out_b, const float* partial, int chunks, int C) {
  __shared__ float lanes[kFinishLanes][32];
  int c = blockIdx.x * 32 + threadIdx.x;
  const bool valid = c < (out_b != nullptr ? 2 * C : C);
  bf16* out = out_a;
  const float* p = partial;
  if (c >= C) {
    out = out_b;
    c -= C;
    p = partial + size_t(chunks) * C;
  }
  float acc = 0.f;
  if (valid) {
    int k = threadIdx.y;
    for (; k + (kFinishLoads - 1) * kFinishLanes < chunks; k += kFinishLoads * kFinishLanes) {
      float v[kFinishLoads];
#pragma unroll
      for (int j = 0; j < kFinishLoads; ++j) v[j] = p[size_t(k + j * kFinishLanes) * C + c];
#pragma unroll
      for (int j = 0; j < kFinishLoads; ++j) acc += v[j];
    }
    for (; k < chunks; k += kFinishLanes) acc += p[size_t(k) * C + c];
  }
  lanes[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && valid) {
    float sum = 0.f;
#pragma unroll
    for (int l = 0; l < kFinishLanes; ++l) sum += lanes[l][threadIdx.x];
    out[c] = __float2bfloat16(__bfloat162float(out[c]) + sum);
  }
}

constexpr int kNormBlocks = 1024;

// The sum of acc over the block's threads (a multiple of 32, at most 1024), warps first, then
// the warps' sums in warp order: deterministic. Valid on thread 0.
__device__ __forceinline__ float BlockSum(float acc) {
  __shared__ float warp_sums[32];
  acc = WarpSum(acc);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  float v = 0.f;
  if (threadIdx.x < 32) {
    v = threadIdx.x < blockDim.x / 32 ? warp_sums[threadIdx.x] : 0.f;
    v = WarpSum(v);
  }
  return v;
}

// Stage 1 of the sum of squares: a fixed grid (kNormBlocks x 256) strides over the vector,
// each thread holding kNormLoads 16-byte loads in flight per pass; each thread's sum runs in a
// fixed order, then the block sums its threads in a fixed order. REQUIRES: x 16-byte aligned
// (the launcher checks; an unaligned x takes the scalar kernel below).
constexpr int kNormLoads = 4;
__global__ void __launch_bounds__(256) SumSquaresPartialVec8Kernel(float* partial, const bf16* x,
                                                                   size_t n) {
  const size_t n8 = n / 8;  // whole 16-byte groups
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t tid = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  float acc = 0.f;
  size_t i = tid;
  for (; i + (kNormLoads - 1) * stride < n8; i += kNormLoads * stride) {
    Bf16x8 v[kNormLoads];
#pragma unroll
    for (int k = 0; k < kNormLoads; ++k) v[k] = Load8(x + (i + k * stride) * 8);
#pragma unroll
    for (int k = 0; k < kNormLoads; ++k) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float f = __bfloat162float(v[k].v[j]);
        acc = fmaf(f, f, acc);
      }
    }
  }
  for (; i < n8; i += stride) {
    Bf16x8 v = Load8(x + i * 8);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float f = __bfloat162float(v.v[j]);
      acc = fmaf(f, f, acc);
    }
  }
  if (tid < n - n8 * 8) {  // the tail, fewer than 8 values
    const float f = __bfloat162float(x[n8 * 8 + tid]);
    acc = fmaf(f, f, acc);
  }
  const float sum = BlockSum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

__global__ void SumSquaresPartialKernel(float* partial, const bf16* x, size_t n) {
  float acc = 0.f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    float v = __bfloat162float(x[i]);
    acc += v * v;
  }
  const float sum = BlockSum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// *out = the partials' sum (accumulate: *out plus it), in a fixed order.
__global__ void SumFinishKernel(float* out, const float* partial, int n, bool accumulate) {
  float acc = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
  const float sum = BlockSum(acc);
  if (threadIdx.x == 0) *out = accumulate ? *out + sum : sum;
}

}  // namespace

int ColumnChunks(int N) { return std::max(1, std::min(256, (N + 63) / 64)); }

cudaError_t ColumnFinish(bf16* out, const float* partial, int chunks, int C, cudaStream_t s) {
  ColumnFinishKernel<<<CeilDiv(C, 32), dim3(32, kFinishLanes), 0, s>>>(out, nullptr, partial,
                                                                      chunks, C);
  return cudaGetLastError();
}

cudaError_t ColumnFinishPair(bf16* out_a, bf16* out_b, const float* partial, int chunks, int C,
                             cudaStream_t s) {
  ColumnFinishKernel<<<CeilDiv(2 * C, 32), dim3(32, kFinishLanes), 0, s>>>(out_a, out_b, partial,
                                                                          chunks, C);
  return cudaGetLastError();
}

namespace {

__global__ void ChecksumKernel(const uint8_t* data, size_t bytes, unsigned long long* sum) {
  const size_t words = (bytes + 3) / 4, full = bytes / 4;
  const uint32_t* w32 = reinterpret_cast<const uint32_t*>(data);
  uint64_t acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += stride) {
    uint32_t w = 0;
    if (i < full) {
      w = __ldg(w32 + i);
    } else {  // the last, partial word, zero-padded
      for (size_t k = 0; 4 * i + k < bytes; ++k) w |= static_cast<uint32_t>(data[4 * i + k]) << (8 * k);
    }
    acc += kernels::ChecksumTerm(w, i);
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(sum, static_cast<unsigned long long>(acc));
}

}  // namespace

cudaError_t Checksum(const void* data, size_t bytes, unsigned long long* sum, cudaStream_t s) {
  if (cudaError_t e = cudaMemsetAsync(sum, 0, sizeof(*sum), s); e != cudaSuccess) return e;
  const size_t words = (bytes + 3) / 4;
  if (words == 0) return cudaSuccess;
  const int threads = 256;
  const size_t blocks = std::min<size_t>((words + threads - 1) / threads, 4096);
  ChecksumKernel<<<static_cast<unsigned>(blocks), threads, 0, s>>>(
      static_cast<const uint8_t*>(data), bytes, sum);
  return cudaGetLastError();
}

cudaError_t ColumnSumAccumulate(bf16* dbias, const bf16* x, int N, int C, Scratch& scratch,
                                cudaStream_t s) {
  int chunks = ColumnChunks(N);
  int rows_per = (N + chunks - 1) / chunks;
  float* partial = static_cast<float*>(scratch.Get(sizeof(float) * size_t(chunks) * C));
  if (!partial) return scratch.last_error();
  if (C % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    ColumnPartialVec8Kernel<false><<<dim3(CeilDiv(C, 256), chunks), dim3(32, kColLanes), 0, s>>>(
        partial, x, nullptr, nullptr, N, C, rows_per);
  } else {
    ColumnPartialKernel<<<dim3(CeilDiv(C, 128), chunks), 128, 0, s>>>(partial, x, N, C,
                                                                       rows_per);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return ColumnFinish(dbias, partial, chunks, C, s);
}

cudaError_t GeluBackwardColumnSum(bf16* x, const bf16* pre, bf16* dbias, int N, int C,
                                  Scratch& scratch, cudaStream_t s) {
  if (C % 8 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(pre) % 16 != 0) {
    cudaError_t err = GeluBackwardInPlace(x, pre, size_t(N) * C, s);
    if (err != cudaSuccess) return err;
    return ColumnSumAccumulate(dbias, x, N, C, scratch, s);
  }
  const int chunks = ColumnChunks(N);
  const int rows_per = (N + chunks - 1) / chunks;
  float* partial = static_cast<float*>(scratch.Get(sizeof(float) * size_t(chunks) * C));
  if (!partial) return scratch.last_error();
  ColumnPartialVec8Kernel<true><<<dim3(CeilDiv(C, 256), chunks), dim3(32, kColLanes), 0, s>>>(
      partial, x, x, pre, N, C, rows_per);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return ColumnFinish(dbias, partial, chunks, C, s);
}

size_t NormSquaredScratchBytes() { return sizeof(float) * kNormBlocks; }

cudaError_t NormSquared(float* out, const bf16* x, size_t n, Scratch& scratch, cudaStream_t s) {
  return NormSquared(out, x, n, /*accumulate=*/false, scratch, s);
}

cudaError_t NormSquared(float* out, const bf16* x, size_t n, bool accumulate, Scratch& scratch,
                        cudaStream_t s) {
  float* partial = static_cast<float*>(scratch.Get(NormSquaredScratchBytes()));
  if (!partial) return scratch.last_error();
  if (reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    SumSquaresPartialVec8Kernel<<<kNormBlocks, 256, 0, s>>>(partial, x, n);
  } else {
    SumSquaresPartialKernel<<<kNormBlocks, 256, 0, s>>>(partial, x, n);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  SumFinishKernel<<<1, 1024, 0, s>>>(out, partial, kNormBlocks, accumulate);
  return cudaGetLastError();
}

}  // namespace boulder::kernels::cuda
