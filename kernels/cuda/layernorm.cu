// LayerNorm forward and backward over rows of C channels (eps 1e-5, as GPT-2 and PyTorch).
// The forward optionally forms its input as the residual add a + b first (one kernel).
//
// Forward: one warp per row (layernorm_rows.cuh); mean and variance in FP32 from two passes
// over the row, out = (x - mean) * rstd * w + b in BF16; mean and rstd saved in FP32. For C =
// 768 and 2048 a lane holds its part of the row in registers (every load in flight at once,
// read once); other widths loop over 8-column chunks, the later passes reading again from
// L1/L2 — the same sums in the same order either way. The FP8 forward (layernorm_fp8.cu) runs
// the same per-row functions and casts y to FP8 instead of writing it; LayerNormFromStatsKernel
// recomputes y from the kept statistics (the FP8 backward's unfused path): the same floats
// through the same LayerNormChunk give the same BF16 y, so the same FP8 bytes.
// Backward: the input gradient is ADDED to dinp (the residual stream's gradient: +=), by a
// warp per row or, below, a block per row; the weight and bias gradients (+=) are deterministic column sums of
// dout * xhat and dout over the rows (see reduce.cu). For C = 1024, 2048 and 4096 one kernel
// does both in a single pass with a row spread over a block (LayerNormBackwardBlockKernel); for
// C = 256, 512 and 768 one kernel with a warp per row (LayerNormBackwardFusedKernel); otherwise
// a column-sum kernel (16-byte loads where aligned) and a row kernel (also
// SetLayerNormReferenceKernels' path for 1024, 2048 and 4096). (A warp-per-row kernel holding
// C = 2048 in registers between its two passes, 158 registers, measured no faster on the H200;
// the block kernel took hidden-2048's backward from 0.076 to 0.050 ms per call.)
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/layernorm_rows.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace boulder::kernels::cuda {
namespace {

// Off (SetLayerNormReferenceKernels(true)): the kernels before rows were held in registers
// and the FP8 forward without a transpose and the recomputation had their own kernels.
bool g_ln_new_kernels = true;

// LayerNormForwardKernel's out from the mean and rstd it saved (the FP8 backward's unfused
// recomputation): LayerNormChunk on the same floats, bit-identical.
__global__ void LayerNormFromStatsKernel(bf16* out, const bf16* inp, const float* mean_in,
                                         const float* rstd_in, const bf16* w, const bf16* b, int N,
                                         int C) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float mean = mean_in[row], rstd = rstd_in[row];
  const bf16* x = inp + size_t(row) * C;
  bf16* o = out + size_t(row) * C;
  for (int c = lane * 8; c < C; c += 256) Store8(o + c, LayerNormChunk(x, w, b, c, mean, rstd));
}

// kCols > 0: C == 256 * kCols, the row held in registers (LayerNormRowHeld); 0: any C.
template <bool kResidual, int kCols>
__global__ void LayerNormForwardKernel(bf16* out, float* mean_out, float* rstd_out, const bf16* inp,
                                       const bf16* w, const bf16* b, int N, int C, bf16* residual,
                                       const bf16* ra, const bf16* rb) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= N) return;
  float mean, rstd;
  bf16* o = out + size_t(row) * C;
  LayerNormRow<kResidual, kCols>(row, lane, C, inp, residual, ra, rb, w, b, mean, rstd,
                                 [&](int c, const Bf16x8& y) { Store8(o + c, y); });
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

bool Aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) % bytes) == 0;
}

__global__ void LayerNormBackwardInputKernel(bf16* dinp, const bf16* dout, const bf16* inp,
                                             const bf16* w, const float* mean_in,
                                             const float* rstd_in, int N, int C) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= N) return;
  const bf16* x = inp + size_t(row) * C;
  const bf16* dy = dout + size_t(row) * C;
  float mean = mean_in[row], rstd = rstd_in[row];
  float s1 = 0.f, s2 = 0.f;
  for (int c = lane * 8; c < C; c += 256) {
    Bf16x8 xv = Load8(x + c), dv = Load8(dy + c), wv = Load8(w + c);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float dn = __bfloat162float(wv.v[k]) * __bfloat162float(dv.v[k]);
      float xh = (__bfloat162float(xv.v[k]) - mean) * rstd;
      s1 += dn;
      s2 += dn * xh;
    }
  }
  float dn_mean = WarpSum(s1) / C, dn_xh_mean = WarpSum(s2) / C;
  bf16* dx = dinp + size_t(row) * C;
  for (int c = lane * 8; c < C; c += 256) {
    Bf16x8 xv = Load8(x + c), dv = Load8(dy + c), wv = Load8(w + c), gv = Load8(dx + c), r;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float dn = __bfloat162float(wv.v[k]) * __bfloat162float(dv.v[k]);
      float xh = (__bfloat162float(xv.v[k]) - mean) * rstd;
      float g = (dn - dn_mean - xh * dn_xh_mean) * rstd;
      r.v[k] = __float2bfloat16(__bfloat162float(gv.v[k]) + g);
    }
    Store8(dx + c, r);
  }
}

// partial[chunk][c] = Σ dout·xhat, partial[chunks + chunk][c] = Σ dout over the chunk's rows.
__global__ void LayerNormParamPartialKernel(float* partial, const bf16* dout, const bf16* inp,
                                            const float* mean, const float* rstd, int N, int C,
                                            int rows_per, int chunks) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  int chunk = blockIdx.y;
  if (c >= C) return;
  int r0 = chunk * rows_per, r1 = min(N, r0 + rows_per);
  float dw = 0.f, db = 0.f;
  for (int r = r0; r < r1; ++r) {
    float d = __bfloat162float(dout[size_t(r) * C + c]);
    float xh = (__bfloat162float(inp[size_t(r) * C + c]) - mean[r]) * rstd[r];
    dw += d * xh;
    db += d;
  }
  partial[size_t(chunk) * C + c] = dw;
  partial[size_t(chunks + chunk) * C + c] = db;
}

// The same partials with 16-byte loads: block (32, kColLanes) covers 256 columns (8 per
// thread) of one chunk of rows; row lane y sums rows r0 + y, r0 + y + kColLanes, ... and the
// lanes are added in lane order (StoreColumnLaneSums, reduce.cuh: deterministic).
// REQUIRES: C % 8 == 0, dout and inp 16-byte aligned (checked by the launcher).
__global__ void __launch_bounds__(32 * kColLanes)
    LayerNormParamPartialVec8Kernel(float* partial, const bf16* dout, const bf16* inp,
                                    const float* mean, const float* rstd, int N, int C,
                                    int rows_per, int chunks) {
  __shared__ float lanes[kColLanes][32 * 8];
  const int c0 = (blockIdx.x * 32 + threadIdx.x) * 8;
  const int chunk = blockIdx.y;
  const int r0 = chunk * rows_per, r1 = min(N, r0 + rows_per);
  float dw[8], db[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) dw[k] = db[k] = 0.f;
  if (c0 < C) {
    for (int r = r0 + threadIdx.y; r < r1; r += kColLanes) {
      const Bf16x8 dv = Load8(dout + size_t(r) * C + c0), xv = Load8(inp + size_t(r) * C + c0);
      const float m = mean[r], rs = rstd[r];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float d = __bfloat162float(dv.v[k]);
        const float xh = (__bfloat162float(xv.v[k]) - m) * rs;
        dw[k] += d * xh;
        db[k] += d;
      }
    }
  }
  StoreColumnLaneSums(lanes, dw, partial + size_t(chunk) * C, C);
  StoreColumnLaneSums(lanes, db, partial + size_t(chunks + chunk) * C, C);
}

// The backward in one pass for C = 256, 512 or 768 (GPT-2's and the seed's 768): one block
// of 8 warps per chunk of rows (the chunks of ColumnChunks), warp w taking the chunk's rows w,
// w + 8, ...; lane l owns columns 8l + 256i (i < kCols). Per row it reads x, dout and dinp
// once: the input gradient as LayerNormBackwardInputKernel computes it (the same sums in the
// same order), and dout·xhat and dout added into the lane's column accumulators in registers.
// At the end the block adds its warps' accumulators in warp order into partial[chunk] (weight)
// and partial[chunks + chunk] (bias), LayerNormParamPartialKernel's layout, for ColumnFinish:
// deterministic. (Wider rows need more accumulators than registers hold; with them in shared
// memory the kernel measured slower than the two-kernel path at C = 2048 on the H200.)
constexpr int kLnBwdWarps = 8;

template <int kCols>
__global__ void __launch_bounds__(32 * kLnBwdWarps, 2)
    LayerNormBackwardFusedKernel(bf16* dinp, float* partial, const bf16* dout, const bf16* inp,
                                 const bf16* w, const float* mean_in, const float* rstd_in, int N,
                                 int rows_per, int chunks) {
  constexpr int C = 256 * kCols;
  __shared__ float red[kLnBwdWarps][C];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r0 = blockIdx.x * rows_per, r1 = min(N, r0 + rows_per);
  float acc_w[8 * kCols], acc_b[8 * kCols];
#pragma unroll
  for (int j = 0; j < 8 * kCols; ++j) acc_w[j] = acc_b[j] = 0.f;
  for (int row = r0 + warp; row < r1; row += kLnBwdWarps) {
    const bf16* x = inp + size_t(row) * C;
    const bf16* dy = dout + size_t(row) * C;
    bf16* dx = dinp + size_t(row) * C;
    // The weight is reloaded per row (L1-resident) to leave registers to the accumulators.
    Bf16x8 xv[kCols], dv[kCols];
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      xv[i] = Load8(x + lane * 8 + 256 * i);
      dv[i] = Load8(dy + lane * 8 + 256 * i);
    }
    const float mean = mean_in[row], rstd = rstd_in[row];
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const Bf16x8 wv = Load8(w + lane * 8 + 256 * i);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        float dn = __bfloat162float(wv.v[k]) * __bfloat162float(dv[i].v[k]);
        float xh = (__bfloat162float(xv[i].v[k]) - mean) * rstd;
        s1 += dn;
        s2 += dn * xh;
      }
    }
    const float dn_mean = WarpSum(s1) / C, dn_xh_mean = WarpSum(s2) / C;
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const Bf16x8 wv = Load8(w + lane * 8 + 256 * i), gv = Load8(dx + lane * 8 + 256 * i);
      Bf16x8 r;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float d = __bfloat162float(dv[i].v[k]);
        float dn = __bfloat162float(wv.v[k]) * d;
        float xh = (__bfloat162float(xv[i].v[k]) - mean) * rstd;
        float g = (dn - dn_mean - xh * dn_xh_mean) * rstd;
        r.v[k] = __float2bfloat16(__bfloat162float(gv.v[k]) + g);
        acc_w[8 * i + k] += d * xh;
        acc_b[8 * i + k] += d;
      }
      Store8(dx + lane * 8 + 256 * i, r);
    }
  }
  // The block's sums over its warps, in warp order: weight, then bias.
  for (int which = 0; which < 2; ++which) {
    __syncthreads();  // the previous pass has read red
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        red[warp][lane * 8 + 256 * i + k] = which == 0 ? acc_w[8 * i + k] : acc_b[8 * i + k];
      }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += 32 * kLnBwdWarps) {
      float sum = 0.f;
      for (int v = 0; v < kLnBwdWarps; ++v) sum += red[v][c];
      partial[(size_t(which) * chunks + blockIdx.x) * C + c] = sum;
    }
  }
}

// The backward for C = 8 · kThreads with the row spread over a block (thread t owns columns
// 8t .. 8t + 7; 1024, 2048 and 4096 have instances): one block per chunk of kLnBlockRows
// rows, kRows rows in flight per pass (each thread's x, dout and dinp loads of those rows at
// once; x and dout read again from L1 after the sums). A row's two sums are added per thread
// (its 8 columns in order), per warp (WarpSum), then over the warps in warp order: a fixed
// order. Each thread adds its own columns' dout·xhat
// and dout over the chunk's rows, in row order, into partial[chunk] and partial[chunks + chunk]
// (no block reduction: one thread per column), for ColumnFinishPair: deterministic. One pass
// over x, dout and dinp at every width (the warp-per-row kernels above read x and dout twice
// for C > 768, or hold 8 columns per lane per 256 and run out of registers).
constexpr int kLnBlockRows = 32;

// 16 warps per SM at least (up to 128 registers): measured faster than 2 rows per pass with
// 24 warps per SM (h2048: 0.050 against 0.056 ms per call).
template <int kThreads, int kRows>
__global__ void __launch_bounds__(kThreads, kThreads >= 512 ? 1 : 512 / kThreads)
    LayerNormBackwardBlockKernel(bf16* dinp, float* partial, const bf16* dout, const bf16* inp,
                                 const bf16* w, const float* mean_in, const float* rstd_in, int N,
                                 int chunks) {
  constexpr int C = 8 * kThreads, kWarps = kThreads / 32;
  __shared__ float red[2][kWarps][2 * kRows];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, c = 8 * threadIdx.x;
  const int r0 = blockIdx.x * kLnBlockRows, r1 = min(N, r0 + kLnBlockRows);
  float wf[8], acc_w[8], acc_b[8];
  {
    const Bf16x8 wv = Load8(w + c);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      wf[k] = __bfloat162float(wv.v[k]);
      acc_w[k] = acc_b[k] = 0.f;
    }
  }
  int parity = 0;
#pragma unroll 1
  for (int row = r0; row < r1; row += kRows) {  // block-uniform bounds: the barrier is safe
    // Every load of the pass at once; dinp stays packed until it is added to, after the
    // barrier, and x and dout are read again there (from L1: the same thread just read them),
    // so the registers across the barrier are dinp's and the sums only.
    Bf16x8 gv[kRows];
    float s[2 * kRows];
    {
      Bf16x8 xv[kRows], dv[kRows];
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const size_t r = min(row + i, r1 - 1);  // past the chunk: its last row again, unused
        xv[i] = Load8(inp + r * C + c);
        dv[i] = Load8(dout + r * C + c);
        gv[i] = Load8(dinp + r * C + c);
      }
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const int r = min(row + i, r1 - 1);
        const float mean = mean_in[r], rstd = rstd_in[r];
        float s1 = 0.f, s2 = 0.f;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const float dn = wf[k] * __bfloat162float(dv[i].v[k]);
          const float xh = (__bfloat162float(xv[i].v[k]) - mean) * rstd;
          s1 += dn;
          s2 += dn * xh;
        }
        s[2 * i] = WarpSum(s1);
        s[2 * i + 1] = WarpSum(s2);
      }
    }
    // Two buffers: a warp writing the next pass's sums cannot overtake a slower warp still
    // reading this pass's (it would have to pass the next barrier first).
    if (lane == 0) {
#pragma unroll
      for (int j = 0; j < 2 * kRows; ++j) red[parity][warp][j] = s[j];
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 2 * kRows; ++j) {
      float v = 0.f;
#pragma unroll
      for (int u = 0; u < kWarps; ++u) v += red[parity][u][j];
      s[j] = v;
    }
    parity ^= 1;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = row + i;
      if (r >= r1) break;
      const Bf16x8 xv = Load8(inp + size_t(r) * C + c), dv = Load8(dout + size_t(r) * C + c);
      const float mean = mean_in[r], rstd = rstd_in[r];
      const float dn_mean = s[2 * i] / C, dn_xh_mean = s[2 * i + 1] / C;
      Bf16x8 out;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float d = __bfloat162float(dv.v[k]);
        const float dn = wf[k] * d;
        const float xh = (__bfloat162float(xv.v[k]) - mean) * rstd;
        const float g = (dn - dn_mean - xh * dn_xh_mean) * rstd;
        out.v[k] = __float2bfloat16(__bfloat162float(gv[i].v[k]) + g);
        acc_w[k] += d * xh;
        acc_b[k] += d;
      }
      Store8(dinp + size_t(r) * C + c, out);
    }
  }
  float4* pw = reinterpret_cast<float4*>(partial + size_t(blockIdx.x) * C + c);
  float4* pb = reinterpret_cast<float4*>(partial + size_t(chunks + blockIdx.x) * C + c);
  pw[0] = make_float4(acc_w[0], acc_w[1], acc_w[2], acc_w[3]);
  pw[1] = make_float4(acc_w[4], acc_w[5], acc_w[6], acc_w[7]);
  pb[0] = make_float4(acc_b[0], acc_b[1], acc_b[2], acc_b[3]);
  pb[1] = make_float4(acc_b[4], acc_b[5], acc_b[6], acc_b[7]);
}

// LayerNormBackwardBlockKernel's instance for C (null where it has none).
using LnBwdBlockKernel = void (*)(bf16*, float*, const bf16*, const bf16*, const bf16*,
                                  const float*, const float*, int, int);
// LayerNormBackwardBlockKernel's instance for C (null where it has none, and for the
// reference kernels). At C = 768 it measured slower than the warp-per-row kernel on the H200
// (seed 0.027 against 0.022 ms per call, GPT-2 equal), so 768 keeps that one.
LnBwdBlockKernel BackwardBlockKernelFor(int C) {
  if (!LayerNormNewKernels()) return nullptr;
  switch (C) {
    case 1024:
      return LayerNormBackwardBlockKernel<128, 4>;
    case 2048:
      return LayerNormBackwardBlockKernel<256, 4>;
    case 4096:
      return LayerNormBackwardBlockKernel<512, 4>;
    default:
      return nullptr;
  }
}

template <int kCols>
cudaError_t LaunchLayerNormBackwardFused(bf16* dinp, float* partial, const bf16* dout,
                                         const bf16* inp, const bf16* weight, const float* mean,
                                         const float* rstd, int N, int rows_per, int chunks,
                                         cudaStream_t s) {
  LayerNormBackwardFusedKernel<kCols><<<chunks, 32 * kLnBwdWarps, 0, s>>>(
      dinp, partial, dout, inp, weight, mean, rstd, N, rows_per, chunks);
  return cudaGetLastError();
}

// The LayerNormForwardKernel instance for C (LayerNormHeldCols: rows held for 768 and 2048).
template <bool kResidual>
auto ForwardKernelFor(int C) {
  const int held = LayerNormHeldCols(C);
  return held == 3   ? LayerNormForwardKernel<kResidual, 3>
         : held == 8 ? LayerNormForwardKernel<kResidual, 8>
                     : LayerNormForwardKernel<kResidual, 0>;
}

}  // namespace

cudaError_t LayerNormForward(bf16* out, float* mean, float* rstd, const bf16* inp,
                             const bf16* weight, const bf16* bias, int N, int C, cudaStream_t s) {
  ForwardKernelFor<false>(C)<<<CeilDiv(N, 8), 256, 0, s>>>(out, mean, rstd, inp, weight, bias, N,
                                                           C, nullptr, nullptr, nullptr);
  return cudaGetLastError();
}

cudaError_t ResidualLayerNormForward(bf16* residual, bf16* out, float* mean, float* rstd,
                                     const bf16* a, const bf16* b, const bf16* weight,
                                     const bf16* bias, int N, int C, cudaStream_t s) {
  ForwardKernelFor<true>(C)<<<CeilDiv(N, 8), 256, 0, s>>>(out, mean, rstd, nullptr, weight, bias,
                                                          N, C, residual, a, b);
  return cudaGetLastError();
}

void SetLayerNormReferenceKernels(bool on) { g_ln_new_kernels = !on; }
bool LayerNormNewKernels() { return g_ln_new_kernels; }

cudaError_t LayerNormFromStats(bf16* out, const bf16* inp, const float* mean, const float* rstd,
                               const bf16* weight, const bf16* bias, int N, int C, cudaStream_t s) {
  LayerNormFromStatsKernel<<<CeilDiv(N, 8), 256, 0, s>>>(out, inp, mean, rstd, weight, bias, N, C);
  return cudaGetLastError();
}

cudaError_t LayerNormBackward(bf16* dinp, bf16* dweight, bf16* dbias, const bf16* dout,
                              const bf16* inp, const bf16* weight, const float* mean,
                              const float* rstd, int N, int C, Scratch& scratch, cudaStream_t s) {
  const bool aligned = Aligned(dinp, 16) && Aligned(dout, 16) && Aligned(inp, 16) &&
                       Aligned(weight, 16);
  if (const LnBwdBlockKernel block = aligned ? BackwardBlockKernelFor(C) : nullptr) {
    const int chunks = std::max(1, static_cast<int>(CeilDiv(N, kLnBlockRows)));
    float* partial = static_cast<float*>(scratch.Get(sizeof(float) * 2 * size_t(chunks) * C));
    if (!partial) return scratch.last_error();
    block<<<chunks, C / 8, 0, s>>>(dinp, partial, dout, inp, weight, mean, rstd, N, chunks);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return ColumnFinishPair(dweight, dbias, partial, chunks, C, s);
  }
  int chunks = ColumnChunks(N);
  int rows_per = (N + chunks - 1) / chunks;
  float* partial = static_cast<float*>(scratch.Get(sizeof(float) * 2 * size_t(chunks) * C));
  if (!partial) return scratch.last_error();
  const bool fused = C % 256 == 0 && C <= 768 && aligned;
  if (fused) {
    cudaError_t err = C == 256 ? LaunchLayerNormBackwardFused<1>(dinp, partial, dout, inp, weight,
                                                                 mean, rstd, N, rows_per, chunks, s)
                      : C == 512
                          ? LaunchLayerNormBackwardFused<2>(dinp, partial, dout, inp, weight, mean,
                                                            rstd, N, rows_per, chunks, s)
                          : LaunchLayerNormBackwardFused<3>(dinp, partial, dout, inp, weight, mean,
                                                            rstd, N, rows_per, chunks, s);
    if (err != cudaSuccess) return err;
    return ColumnFinishPair(dweight, dbias, partial, chunks, C, s);
  }
  if (C % 8 == 0 && Aligned(dout, 16) && Aligned(inp, 16)) {
    LayerNormParamPartialVec8Kernel<<<dim3(CeilDiv(C, 256), chunks), dim3(32, kColLanes), 0, s>>>(
        partial, dout, inp, mean, rstd, N, C, rows_per, chunks);
  } else {
    LayerNormParamPartialKernel<<<dim3(CeilDiv(C, 128), chunks), 128, 0, s>>>(
        partial, dout, inp, mean, rstd, N, C, rows_per, chunks);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if ((err = ColumnFinishPair(dweight, dbias, partial, chunks, C, s)) != cudaSuccess) return err;
  LayerNormBackwardInputKernel<<<CeilDiv(N, 8), 256, 0, s>>>(dinp, dout, inp, weight, mean, rstd, N,
                                                             C);
  return cudaGetLastError();
}

}  // namespace boulder::kernels::cuda
