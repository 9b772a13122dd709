// The per-row pieces of the LayerNorm forward shared by layernorm.cu (BF16) and
// layernorm_fp8.cu (LayerNorm + FP8 cast): the same functions, compiled with the same flags
// (kernels/cuda/CMakeLists.txt), give the FP8 kernels the BF16 forward's residual, statistics
// and y bit for bit. eps 1e-5, as GPT-2 and PyTorch.
#ifndef BOULDER_KERNELS_CUDA_LAYERNORM_ROWS_CUH_
#define BOULDER_KERNELS_CUDA_LAYERNORM_ROWS_CUH_

#include <cuda_bf16.h>

#include "kernels/cuda/common.cuh"

namespace boulder::kernels::cuda {

using bf16 = __nv_bfloat16;

inline constexpr float kLayerNormEps = 1e-5f;

// Whether the LayerNorm forwards run their current kernels (rows held in registers for C = 768
// and 2048; the FP8 forward without a transpose on a row kernel; the FP8 recompute on the
// cast-transpose tile kernel) or the ones those replaced: SetLayerNormReferenceKernels (ops.h).
bool LayerNormNewKernels();

// The register-held row instance for C (kCols: C = 256 * kCols): the benchmark models' widths,
// 768 and 2048; 0 (the chunk loop) for any other C, or with the reference kernels.
inline int LayerNormHeldCols(int C) {
  return !LayerNormNewKernels() ? 0 : C == 768 ? 3 : C == 2048 ? 8 : 0;
}

// One warp's row statistics. kResidual: the row is first formed as residual = bf16(a + b)
// (ResidualForward's rounding) and written out; the later passes read it back (each lane reads
// only what it wrote). The statistics see the same BF16 values in the same order as the
// unfused pair of kernels, so the results are bit-identical to ResidualForward followed by
// LayerNormForward. Returns the row to normalise (inp's or residual's).
template <bool kResidual>
__device__ __forceinline__ const bf16* LayerNormRowStats(int row, int lane, int C, const bf16* inp,
                                                         bf16* residual, const bf16* ra,
                                                         const bf16* rb, float& mean, float& rstd) {
  const bf16* x = (kResidual ? residual : inp) + size_t(row) * C;
  float sum = 0.f;
  for (int c = lane * 8; c < C; c += 256) {
    Bf16x8 v;
    if constexpr (kResidual) {
      const size_t i = size_t(row) * C + c;
      Bf16x8 av = Load8(ra + i), bv = Load8(rb + i);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        v.v[k] = __float2bfloat16(__bfloat162float(av.v[k]) + __bfloat162float(bv.v[k]));
      }
      Store8(residual + i, v);
    } else {
      v = Load8(x + c);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) sum += __bfloat162float(v.v[k]);
  }
  mean = WarpSum(sum) / C;
  float var = 0.f;
  for (int c = lane * 8; c < C; c += 256) {
    Bf16x8 v = Load8(x + c);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float d = __bfloat162float(v.v[k]) - mean;
      var += d * d;
    }
  }
  rstd = rsqrtf(WarpSum(var) / C + kLayerNormEps);
  return x;
}

// LayerNormRowStats for a row of C = 256 * kCols held in registers: lane l's chunk i is
// columns 8l + 256i, and every load of the row is issued before the sums (read once, not once
// per pass). The same sums in the same order as LayerNormRowStats (per lane chunk by chunk,
// then WarpSum, divided by the runtime C as there), so the same residual, mean and rstd.
template <bool kResidual, int kCols>
__device__ __forceinline__ void LayerNormRowHeld(int row, int lane, int C, const bf16* inp,
                                                 bf16* residual, const bf16* ra, const bf16* rb,
                                                 Bf16x8 (&v)[kCols], float& mean, float& rstd) {
  const size_t base = size_t(row) * (256 * kCols) + lane * 8;
  float sum = 0.f;
  if constexpr (kResidual) {
    Bf16x8 av[kCols], bv[kCols];
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      av[i] = Load8(ra + base + 256 * i);
      bv[i] = Load8(rb + base + 256 * i);
    }
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        v[i].v[k] = __float2bfloat16(__bfloat162float(av[i].v[k]) + __bfloat162float(bv[i].v[k]));
      }
      Store8(residual + base + 256 * i, v[i]);
#pragma unroll
      for (int k = 0; k < 8; ++k) sum += __bfloat162float(v[i].v[k]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kCols; ++i) v[i] = Load8(inp + base + 256 * i);
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
#pragma unroll
      for (int k = 0; k < 8; ++k) sum += __bfloat162float(v[i].v[k]);
    }
  }
  mean = WarpSum(sum) / C;
  float var = 0.f;
#pragma unroll
  for (int i = 0; i < kCols; ++i) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float d = __bfloat162float(v[i].v[k]) - mean;
      var += d * d;
    }
  }
  rstd = rsqrtf(WarpSum(var) / C + kLayerNormEps);
}

// Columns c..c+7 of a normalised row whose values there are v: bf16((v - mean) * rstd * w + b).
// (LayerNormFromStatsOp computes the same through this function: the same bits.)
__device__ __forceinline__ Bf16x8 LayerNormChunkOf(const Bf16x8& v, const Bf16x8& wv,
                                                   const Bf16x8& bv, float mean, float rstd) {
  Bf16x8 r;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    float n = (__bfloat162float(v.v[k]) - mean) * rstd;
    r.v[k] = __float2bfloat16(n * __bfloat162float(wv.v[k]) + __bfloat162float(bv.v[k]));
  }
  return r;
}
__device__ __forceinline__ Bf16x8 LayerNormChunkOf(const Bf16x8& v, const bf16* w, const bf16* b,
                                                   int c, float mean, float rstd) {
  return LayerNormChunkOf(v, Load8(w + c), Load8(b + c), mean, rstd);
}

// Columns c..c+7 of a normalised row x.
__device__ __forceinline__ Bf16x8 LayerNormChunk(const bf16* x, const bf16* w, const bf16* b, int c,
                                                 float mean, float rstd) {
  return LayerNormChunkOf(Load8(x + c), w, b, c, mean, rstd);
}

// One warp's row of the forward: its statistics (LayerNormRowHeld for C = 256 * kCols, else
// LayerNormRowStats) into mean and rstd, then emit(c, y) for each of the lane's 8-column chunks
// c of y = LayerNormChunk(row), in column order. The one walk of LayerNormForwardKernel's and
// LayerNormFp8RowsKernel's rows (they differ only in what emit does with y).
template <bool kResidual, int kCols, class Emit>
__device__ __forceinline__ void LayerNormRow(int row, int lane, int C, const bf16* inp,
                                             bf16* residual, const bf16* ra, const bf16* rb,
                                             const bf16* w, const bf16* b, float& mean,
                                             float& rstd, Emit&& emit) {
  if constexpr (kCols > 0) {
    Bf16x8 v[kCols];
    LayerNormRowHeld<kResidual, kCols>(row, lane, C, inp, residual, ra, rb, v, mean, rstd);
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const int c = lane * 8 + 256 * i;
      emit(c, LayerNormChunkOf(v[i], w, b, c, mean, rstd));
    }
  } else {
    const bf16* x = LayerNormRowStats<kResidual>(row, lane, C, inp, residual, ra, rb, mean, rstd);
    for (int c = lane * 8; c < C; c += 256) emit(c, LayerNormChunk(x, w, b, c, mean, rstd));
  }
}

}  // namespace boulder::kernels::cuda

#endif  // BOULDER_KERNELS_CUDA_LAYERNORM_ROWS_CUH_
