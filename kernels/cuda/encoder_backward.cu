// Embedding backward without atomics, so two runs give bit-identical gradients.
//
// dwpe[t] += Σ_b dout[b, t]: one thread per (t, 8 channels), batch summed in order.
// dwte[v] += Σ_{n: tokens[n] = v} dout[n]: the positions are stably radix-sorted by token
// (cub), then each run of equal tokens is summed by the block that starts the run, in a fixed
// order (TokenGradKernel).
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace boulder::kernels::cuda {
namespace {

__global__ void IotaKernel(int32_t* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i;
}

__global__ void PositionGradKernel(bf16* dwpe, const bf16* dout, int B, int T, int C) {
  int c8 = C / 8;
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= T * c8) return;
  int t = idx / c8, c = (idx % c8) * 8;
  float acc[8] = {};
  // Unrolled so that several rows' loads are in flight (the sum keeps its order).
#pragma unroll 4
  for (int b = 0; b < B; ++b) {
    Bf16x8 d = Load8(dout + (size_t(b) * T + t) * C + c);
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] += __bfloat162float(d.v[k]);
  }
  Bf16x8 g = Load8(dwpe + size_t(t) * C + c), r;
#pragma unroll
  for (int k = 0; k < 8; ++k) r.v[k] = __float2bfloat16(__bfloat162float(g.v[k]) + acc[k]);
  Store8(dwpe + size_t(t) * C + c, r);
}

// Row lanes of TokenGradKernel's blocks.
constexpr int kTokenLanes = 4;

// Block x = one sorted position; only the block at the first position of each run of equal
// tokens works. Its threads first find where the run ends (a window of the block's size at a
// time: the run's positions are the window's first ones), then row lane y (threadIdx.y) sums
// the run's rows y, y + kTokenLanes, ... in sorted (= position) order for 8 channels per
// thread, and the lanes are added in lane order: deterministic, with several rows in flight
// per thread however long the run (a small vocabulary gives runs of hundreds of rows).
__global__ void TokenGradKernel(bf16* dwte, const bf16* dout, const int32_t* sorted_tokens,
                                const int32_t* sorted_pos, int N, int C) {
  __shared__ float lanes[kTokenLanes][128 * 8];
  const int i = blockIdx.x;
  const int tok = sorted_tokens[i];
  if (i > 0 && sorted_tokens[i - 1] == tok) return;  // the whole block: not a run's start
  const int nthreads = blockDim.x * blockDim.y, tid = threadIdx.y * blockDim.x + threadIdx.x;
  int end = i;
  for (;;) {
    const int j = end + tid;
    const int in_run = __syncthreads_count(j < N && sorted_tokens[j] == tok);
    end += in_run;
    if (in_run < nthreads) break;
  }
  const int c = (blockIdx.y * blockDim.x + threadIdx.x) * 8;
  float acc[8] = {};
  if (c < C) {
#pragma unroll 4
    for (int j = i + threadIdx.y; j < end; j += kTokenLanes) {
      Bf16x8 d = Load8(dout + size_t(sorted_pos[j]) * C + c);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] += __bfloat162float(d.v[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) lanes[threadIdx.y][threadIdx.x * 8 + k] = acc[k];
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    float sum = lanes[0][threadIdx.x * 8 + k];
    for (int y = 1; y < kTokenLanes; ++y) sum += lanes[y][threadIdx.x * 8 + k];
    acc[k] = sum;
  }
  Bf16x8 g = Load8(dwte + size_t(tok) * C + c), r;
#pragma unroll
  for (int k = 0; k < 8; ++k) r.v[k] = __float2bfloat16(__bfloat162float(g.v[k]) + acc[k]);
  Store8(dwte + size_t(tok) * C + c, r);
}

size_t Align256(size_t x) { return (x + 255) / 256 * 256; }

}  // namespace

cudaError_t EncoderBackward(bf16* dwte, bf16* dwpe, const bf16* dout, const int32_t* tokens,
                            int B, int T, int C, Scratch& scratch, cudaStream_t s) {
  int N = B * T;
  size_t temp_bytes = 0;
  cudaError_t err = cub::DeviceRadixSort::SortPairs(
      nullptr, temp_bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), N, 0, 32, s);
  if (err != cudaSuccess) return err;
  size_t arr = Align256(sizeof(int32_t) * N);
  char* base = static_cast<char*>(scratch.Get(3 * arr + temp_bytes));
  if (!base) return scratch.last_error();
  int32_t* pos_in = reinterpret_cast<int32_t*>(base);
  int32_t* keys_out = reinterpret_cast<int32_t*>(base + arr);
  int32_t* pos_out = reinterpret_cast<int32_t*>(base + 2 * arr);
  void* temp = base + 3 * arr;

  IotaKernel<<<CeilDiv(N, 256), 256, 0, s>>>(pos_in, N);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  // Tokens are non-negative: sorting the low 31 bits orders them as unsigned values.
  err = cub::DeviceRadixSort::SortPairs(temp, temp_bytes, tokens, keys_out, pos_in, pos_out, N,
                                        0, 31, s);
  if (err != cudaSuccess) return err;
  int c8 = C / 8;
  int threads = c8 < 128 ? c8 : 128;
  TokenGradKernel<<<dim3(N, CeilDiv(c8, threads)), dim3(threads, kTokenLanes), 0, s>>>(
      dwte, dout, keys_out, pos_out, N, C);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  PositionGradKernel<<<CeilDiv(size_t(T) * c8, 256), 256, 0, s>>>(dwpe, dout, B, T, C);
  return cudaGetLastError();
}

}  // namespace boulder::kernels::cuda
