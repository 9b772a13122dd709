// Element-wise and row-wise kernels: embedding forward, residual add, FP32<->BF16 conversion,
// GELU and dGELU, accumulation of a bias gradient, argmax, zeroing byte ranges. One pass over memory each; 16-byte
// vectors where the row length allows (C % 8 == 0 is a precondition the backend checks).
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace boulder::kernels::cuda {
namespace {

__global__ void EncoderForwardKernel(bf16* out, const int32_t* tokens, const bf16* wte,
                                     const bf16* wpe, int N, int T, int C) {
  int c8 = C / 8;
  size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (idx >= size_t(N) * c8) return;
  int n = idx / c8, c = (idx % c8) * 8, t = n % T;
  Bf16x8 a = Load8(wte + size_t(tokens[n]) * C + c), b = Load8(wpe + size_t(t) * C + c), r;
#pragma unroll
  for (int i = 0; i < 8; ++i) r.v[i] = __float2bfloat16(__bfloat162float(a.v[i]) + __bfloat162float(b.v[i]));
  Store8(out + size_t(n) * C + c, r);
}

__global__ void ResidualKernel(bf16* out, const bf16* a, const bf16* b, size_t n) {
  size_t i = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * 8;
  if (i + 8 <= n) {
    Bf16x8 x = Load8(a + i), y = Load8(b + i), r;
#pragma unroll
    for (int k = 0; k < 8; ++k) r.v[k] = __float2bfloat16(__bfloat162float(x.v[k]) + __bfloat162float(y.v[k]));
    Store8(out + i, r);
  } else {
    for (; i < n; ++i) out[i] = __float2bfloat16(__bfloat162float(a[i]) + __bfloat162float(b[i]));
  }
}

__global__ void F32ToBF16Kernel(bf16* out, const float* in, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(in[i]);
}
__global__ void BF16ToF32Kernel(float* out, const bf16* in, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = __bfloat162float(in[i]);
}

__global__ void GeluBackwardKernel(bf16* dout, const bf16* pre, size_t n) {
  size_t i = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * 8;
  if (i + 8 <= n) {
    Bf16x8 d = Load8(dout + i), p = Load8(pre + i), r;
#pragma unroll
    for (int k = 0; k < 8; ++k)
      r.v[k] = __float2bfloat16(__bfloat162float(d.v[k]) * GeluTanhGrad(__bfloat162float(p.v[k])));
    Store8(dout + i, r);
  } else {
    for (; i < n; ++i)
      dout[i] = __float2bfloat16(__bfloat162float(dout[i]) * GeluTanhGrad(__bfloat162float(pre[i])));
  }
}

__global__ void GeluForwardKernel(bf16* out, const bf16* inp, size_t n) {
  size_t i = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * 8;
  if (i + 8 <= n) {
    Bf16x8 x = Load8(inp + i), r;
#pragma unroll
    for (int k = 0; k < 8; ++k) r.v[k] = __float2bfloat16(GeluTanh(__bfloat162float(x.v[k])));
    Store8(out + i, r);
  } else {
    for (; i < n; ++i) out[i] = __float2bfloat16(GeluTanh(__bfloat162float(inp[i])));
  }
}

__global__ void AccumulateKernel(bf16* dst, const bf16* src, size_t n) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) dst[i] = __float2bfloat16(__bfloat162float(dst[i]) + __bfloat162float(src[i]));
}

// One warp per row; ties go to the lowest index, as the CPU reference does.
__global__ void ArgmaxKernel(int32_t* out, const bf16* logits, int N, int V, int Vp) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= N) return;
  const bf16* x = logits + size_t(row) * Vp;
  float best = -INFINITY;
  int best_i = V;
  for (int i = lane; i < V; i += 32) {
    float v = __bfloat162float(x[i]);
    if (v > best) { best = v; best_i = i; }
  }
  for (int o = 16; o > 0; o >>= 1) {
    float ob = __shfl_xor_sync(0xffffffffu, best, o);
    int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (ob > best || (ob == best && oi < best_i)) { best = ob; best_i = oi; }
  }
  if (lane == 0) out[row] = best_i < V ? best_i : 0;
}

// Block (x, y) zeroes its grid-stride share of range y: bytes up to the first 16-byte boundary
// and after the last one singly, the 16-byte chunks between with one store each.
__global__ void ZeroRangesKernel(unsigned char* base, ZeroRangeList list) {
  const ZeroRangeList::Range r = list.ranges[blockIdx.y];
  unsigned char* p = base + r.offset;
  const size_t head = min(r.bytes, (16 - reinterpret_cast<uintptr_t>(p) % 16) % 16);
  const size_t chunks = (r.bytes - head) / 16, tail = head + chunks * 16;
  const size_t tid = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  const size_t threads = size_t(gridDim.x) * blockDim.x;
  if (tid < head) p[tid] = 0;
  if (tid < r.bytes - tail) p[tail + tid] = 0;
  uint4* v = reinterpret_cast<uint4*>(p + head);
  for (size_t i = tid; i < chunks; i += threads) v[i] = make_uint4(0, 0, 0, 0);
}

}  // namespace

cudaError_t ZeroRanges(void* base, const ZeroRangeList& list, cudaStream_t s) {
  if (list.count <= 0) return cudaSuccess;
  size_t most = 0;
  for (int i = 0; i < list.count; ++i) most = std::max(most, list.ranges[i].bytes);
  const size_t blocks = std::min<size_t>(std::max<size_t>(CeilDiv(most / 16, 256), 1), 1024);
  ZeroRangesKernel<<<dim3(unsigned(blocks), unsigned(list.count)), 256, 0, s>>>(
      static_cast<unsigned char*>(base), list);
  return cudaGetLastError();
}

cudaError_t EncoderForward(bf16* out, const int32_t* tokens, const bf16* wte, const bf16* wpe,
                           int B, int T, int C, cudaStream_t s) {
  size_t work = size_t(B) * T * (C / 8);
  EncoderForwardKernel<<<CeilDiv(work, 256), 256, 0, s>>>(out, tokens, wte, wpe, B * T, T, C);
  return cudaGetLastError();
}

cudaError_t ResidualForward(bf16* out, const bf16* a, const bf16* b, size_t n, cudaStream_t s) {
  ResidualKernel<<<CeilDiv(CeilDiv(n, 8), 256), 256, 0, s>>>(out, a, b, n);
  return cudaGetLastError();
}

cudaError_t F32ToBF16(bf16* out, const float* in, size_t n, cudaStream_t s) {
  F32ToBF16Kernel<<<std::min<unsigned>(CeilDiv(n, 256), 4096), 256, 0, s>>>(out, in, n);
  return cudaGetLastError();
}

cudaError_t BF16ToF32(float* out, const bf16* in, size_t n, cudaStream_t s) {
  BF16ToF32Kernel<<<std::min<unsigned>(CeilDiv(n, 256), 4096), 256, 0, s>>>(out, in, n);
  return cudaGetLastError();
}

cudaError_t GeluForward(bf16* out, const bf16* inp, size_t n, cudaStream_t s) {
  GeluForwardKernel<<<CeilDiv(CeilDiv(n, 8), 256), 256, 0, s>>>(out, inp, n);
  return cudaGetLastError();
}

cudaError_t GeluBackwardInPlace(bf16* dout, const bf16* pre, size_t n, cudaStream_t s) {
  GeluBackwardKernel<<<CeilDiv(CeilDiv(n, 8), 256), 256, 0, s>>>(dout, pre, n);
  return cudaGetLastError();
}

cudaError_t Accumulate(bf16* dst, const bf16* src, size_t n, cudaStream_t s) {
  AccumulateKernel<<<CeilDiv(n, 256), 256, 0, s>>>(dst, src, n);
  return cudaGetLastError();
}

cudaError_t Argmax(int32_t* out, const bf16* logits, int N, int V, int Vp, cudaStream_t s) {
  ArgmaxKernel<<<CeilDiv(N, 8), 256, 0, s>>>(out, logits, N, V, Vp);
  return cudaGetLastError();
}

}  // namespace boulder::kernels::cuda
