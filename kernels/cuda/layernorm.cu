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
// Backward: one warp per row computes the input gradient and ADDS it to dinp (the residual
// stream's gradient: +=); the weight and bias gradients (+=) are deterministic column sums of
// dout * xhat and dout over the rows (see reduce.cu). For C = 256, 512, 768 one kernel does
// both in a single pass over the rows (LayerNormBackwardFusedKernel); otherwise a column-sum
// kernel (16-byte loads where aligned) and a row kernel. (A row kernel holding C = 2048 in
// registers between its two passes, 158 registers, measured no faster on the H200.)
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
  int chunks = ColumnChunks(N);
  int rows_per = (N + chunks - 1) / chunks;
  float* partial = static_cast<float*>(scratch.Get(sizeof(float) * 2 * size_t(chunks) * C));
  if (!partial) return scratch.last_error();
  const bool fused = C % 256 == 0 && C <= 768 && reinterpret_cast<uintptr_t>(dinp) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(dout) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(inp) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(weight) % 16 == 0;
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
