// FP8 kernels: the cast(-transpose) with amax and saturation/underflow counts, and the fused
// delayed-scaling update of every FP8 tensor.
//
// Cast: one 32x32 tile per block (32x8 threads). Each element is scaled in FP32 and converted
// with cvt.rn.satfinite (round to nearest even, finite overflow and ±inf clamp to ±max,
// NaN stays NaN) — the encoding kernels/cpu/fp8.cc emulates. The row-major output is written
// as the tile is read; the transposed output goes through shared memory so both writes stay
// coalesced along rows. amax is a max over |x| as unsigned bit patterns (valid for
// non-negative floats; NaN beats inf), reduced per warp, per block, then one atomicMax per
// block; the counters likewise (one 64-bit atomicAdd per block and counter).
//
// Rows and columns that are multiples of 8 take CastFp8VecKernel (vectorised, below).
//
// Scale update: one thread per tensor running kernels/fp8_recipe.h. This file is compiled
// without --use_fast_math (see CMakeLists.txt) so the division and reciprocal are IEEE and
// subnormals are kept: the scales are bit-identical to the CPU backend's.
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/fp8_recipe.h"

namespace boulder::kernels::cuda {
namespace {

constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;

__device__ __forceinline__ uint8_t ToFp8(float y, bool e4m3) {
  return e4m3 ? __nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3)
              : __nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E5M2);
}

// One thread's statistics of a cast (see Backend::CastFp8): amax as the bit pattern of |x|.
struct CastStats {
  unsigned int amax = 0, saturated = 0, underflow = 0, non_finite = 0;
};

// q = fp8(x · scale), counted into st.
__device__ __forceinline__ uint8_t CastOne(float x, float scale, float fp8_max, bool e4m3,
                                           CastStats& st) {
  const float y = __fmul_rn(x, scale);
  const uint8_t q = ToFp8(y, e4m3);
  st.amax = max(st.amax, __float_as_uint(fabsf(x)));
  if (!isfinite(x)) {
    ++st.non_finite;
  } else {
    if (fabsf(y) > fp8_max) ++st.saturated;
    if (x != 0.0f && (q & 0x7F) == 0) ++st.underflow;
  }
  return q;
}

// A block's statistics in shared memory.
struct BlockCastStats {
  unsigned int amax;
  unsigned int counts[3];  // saturated, underflow, non-finite
};

// Thread tid 0 zeroes s; the block must synchronise before anyone adds to it.
__device__ __forceinline__ void InitBlockCastStats(BlockCastStats& s, int tid) {
  if (tid == 0) s.amax = 0, s.counts[0] = s.counts[1] = s.counts[2] = 0;
}

// Every thread of the block calls this (it synchronises the block; tid is the thread's linear
// index, warps are 32 consecutive tids): a reduction per warp, one shared atomic per warp,
// then one global atomicMax for amax and one atomicAdd per non-zero counter per block.
__device__ __forceinline__ void FlushCastStats(CastStats st, BlockCastStats& s, int tid,
                                               float* amax, unsigned long long* counts) {
  st.amax = __reduce_max_sync(0xffffffffu, st.amax);
  st.saturated = __reduce_add_sync(0xffffffffu, st.saturated);
  st.underflow = __reduce_add_sync(0xffffffffu, st.underflow);
  st.non_finite = __reduce_add_sync(0xffffffffu, st.non_finite);
  if (tid % 32 == 0) {
    atomicMax(&s.amax, st.amax);
    if (st.saturated) atomicAdd(&s.counts[0], st.saturated);
    if (st.underflow) atomicAdd(&s.counts[1], st.underflow);
    if (st.non_finite) atomicAdd(&s.counts[2], st.non_finite);
  }
  __syncthreads();
  if (tid == 0) {
    if (s.amax) atomicMax(reinterpret_cast<unsigned int*>(amax), s.amax);
    for (int k = 0; k < 3; ++k) {
      if (s.counts[k]) atomicAdd(&counts[k], static_cast<unsigned long long>(s.counts[k]));
    }
  }
}

__global__ void CastFp8Kernel(uint8_t* out, uint8_t* out_t, const bf16* inp, int rows, int cols,
                              bool e4m3, const float* scale_p, float* amax,
                              unsigned long long* counts) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  __shared__ BlockCastStats s_stats;
  const int tid = threadIdx.y * kTile + threadIdx.x;
  InitBlockCastStats(s_stats, tid);
  __syncthreads();
  const float scale = *scale_p;
  const float fp8_max = e4m3 ? kFp8E4M3Max : kFp8E5M2Max;
  const int c0 = blockIdx.x * kTile, r0 = blockIdx.y * kTile;
  CastStats st;
  for (int i = threadIdx.y; i < kTile; i += kRowsPerPass) {
    const int r = r0 + i, c = c0 + threadIdx.x;
    uint8_t q = 0;
    if (r < rows && c < cols) {
      q = CastOne(__bfloat162float(inp[size_t(r) * cols + c]), scale, fp8_max, e4m3, st);
      if (out != nullptr) out[size_t(r) * cols + c] = q;
    }
    tile[i][threadIdx.x] = q;
  }
  __syncthreads();
  if (out_t != nullptr) {
    for (int i = threadIdx.y; i < kTile; i += kRowsPerPass) {
      const int c = c0 + i, r = r0 + threadIdx.x;  // row c, column r of the transpose
      if (c < cols && r < rows) out_t[size_t(c) * rows + r] = tile[threadIdx.x][i];
    }
  }
  FlushCastStats(st, s_stats, tid, amax, counts);
}

// The fast path for rows and cols multiples of 8 (every FP8 GEMM operand: their dims are
// multiples of 16) and 16-byte-aligned input, 8-byte-aligned outputs: 64x64 tiles, each
// thread loading 8 BF16 (16 bytes) and storing 8 FP8 codes (8 bytes) per access; the
// transpose goes through a shared tile written transposed, so its rows are read back as
// 8-byte words. A grid of at most a few blocks per SM strides over the tiles, so amax and the
// counters meet the global atomics once per block, not once per tile. Same encoding and
// same counting rules as CastFp8Kernel.
constexpr int kVecTile = 64;
constexpr int kVecThreads = 256;  // 8 threads per 64-column row, 32 rows per pass
constexpr int kVecRowsPerPass = kVecThreads / 8;
constexpr int kVecPitch = kVecTile + 8;

// Row i of a 64x64 tile, this thread's 8 values x (columns lane_c..lane_c+7): cast into
// out_row (8 bytes, unless null) and into column lane_c.. of the transposed shared tile.
// A thread out of range passes in_range false and writes zeros into the tile only.
__device__ __forceinline__ void CastRow8(const float (&x)[8], bool in_range, float scale,
                                         float fp8_max, bool e4m3, CastStats& st, uint8_t* out_row,
                                         uint8_t (&tile_t)[kVecTile][kVecPitch], int i,
                                         int lane_c) {
  uint8_t q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (in_range) {
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j] = CastOne(x[j], scale, fp8_max, e4m3, st);
    if (out_row != nullptr) {
      uint2 packed;
      uint8_t* pb = reinterpret_cast<uint8_t*>(&packed);
#pragma unroll
      for (int j = 0; j < 8; ++j) pb[j] = q[j];
      *reinterpret_cast<uint2*>(out_row) = packed;
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) tile_t[lane_c + j][i] = q[j];
}

// The transposed tile (rows r0.., columns c0..) into out_t: row cc of the transpose holds
// input column cc; 8 threads write its 64 bytes. rows % 8 == 0: all 8 rows are in range.
__device__ __forceinline__ void StoreTransposedTile(uint8_t* out_t,
                                                    const uint8_t (&tile_t)[kVecTile][kVecPitch],
                                                    int r0, int c0, int rows, int cols, int lane_r,
                                                    int lane_c) {
  for (int i = lane_r; i < kVecTile; i += kVecRowsPerPass) {
    const int cc = c0 + i, rr = r0 + lane_c;
    if (cc < cols && rr < rows) {
      *reinterpret_cast<uint2*>(out_t + size_t(cc) * rows + rr) =
          *reinterpret_cast<const uint2*>(&tile_t[i][lane_c]);
    }
  }
}

__global__ void __launch_bounds__(kVecThreads)
    CastFp8VecKernel(uint8_t* out, uint8_t* out_t, const bf16* inp, int rows, int cols, bool e4m3,
                     const float* scale_p, float* amax, unsigned long long* counts) {
  __shared__ __align__(8) uint8_t tile_t[kVecTile][kVecPitch];  // [column][row] of the tile
  __shared__ BlockCastStats s_stats;
  InitBlockCastStats(s_stats, threadIdx.x);
  const float scale = *scale_p;
  const float fp8_max = e4m3 ? kFp8E4M3Max : kFp8E5M2Max;
  const int tiles_c = (cols + kVecTile - 1) / kVecTile;
  const int tiles = tiles_c * ((rows + kVecTile - 1) / kVecTile);
  const int lane_c = (threadIdx.x % 8) * 8;  // first of this thread's 8 columns
  const int lane_r = threadIdx.x / 8;        // 0..31
  CastStats st;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int r0 = (t / tiles_c) * kVecTile, c0 = (t % tiles_c) * kVecTile;
    const int c = c0 + lane_c;
    for (int i = lane_r; i < kVecTile; i += kVecRowsPerPass) {
      const int r = r0 + i;
      const bool in_range = r < rows && c < cols;  // cols % 8 == 0: all 8 columns are in range
      float x[8];
      if (in_range) {
        const uint4 raw = *reinterpret_cast<const uint4*>(inp + size_t(r) * cols + c);
        const bf16* x8 = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
        for (int j = 0; j < 8; ++j) x[j] = __bfloat162float(x8[j]);
      }
      CastRow8(x, in_range, scale, fp8_max, e4m3, st,
               out != nullptr ? out + size_t(r) * cols + c : nullptr, tile_t, i, lane_c);
    }
    __syncthreads();
    if (out_t != nullptr) StoreTransposedTile(out_t, tile_t, r0, c0, rows, cols, lane_r, lane_c);
    __syncthreads();
  }
  FlushCastStats(st, s_stats, threadIdx.x, amax, counts);
}

// The backward's cast of a Linear's output gradient, fused (the fast path's conditions):
// g = dout, or dout ⊙ gelu'(pre) rounded to BF16 when pre is given (fc1: the unfused
// GeluBackward's rounding); q = fp8(g · scale) into out and out_t with CastFp8's statistics;
// and when partial is given, each block's column sums of g over its chunk of rows into
// partial[chunk, cols] (FP32, summed in a fixed order: deterministic). Block (x, y) owns the
// 64-column strip x and the row tiles of chunk y.
__global__ void __launch_bounds__(kVecThreads)
    CastFp8GradKernel(uint8_t* out, uint8_t* out_t, const bf16* dout, const bf16* pre,
                      float* partial, int rows, int cols, int tiles_per_chunk, bool e4m3,
                      const float* scale_p, float* amax, unsigned long long* counts) {
  __shared__ __align__(8) uint8_t tile_t[kVecTile][kVecPitch];
  __shared__ float col_sums[kVecRowsPerPass][kVecTile];
  __shared__ BlockCastStats s_stats;
  InitBlockCastStats(s_stats, threadIdx.x);
  const float scale = *scale_p;
  const float fp8_max = e4m3 ? kFp8E4M3Max : kFp8E5M2Max;
  const int lane_c = (threadIdx.x % 8) * 8;
  const int lane_r = threadIdx.x / 8;
  const int c0 = blockIdx.x * kVecTile, c = c0 + lane_c;
  const int row_tiles = (rows + kVecTile - 1) / kVecTile;
  const int t_begin = blockIdx.y * tiles_per_chunk;
  const int t_end = min(row_tiles, t_begin + tiles_per_chunk);
  float sums[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  CastStats st;
  constexpr int kPasses = kVecTile / kVecRowsPerPass;  // rows of a tile per thread
  for (int t = t_begin; t < t_end; ++t) {
    const int r0 = t * kVecTile;
    // Every load of the tile first (memory-level parallelism), then the arithmetic.
    uint4 raws[kPasses], praws[kPasses];
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int r = r0 + lane_r + p * kVecRowsPerPass;
      raws[p] = praws[p] = make_uint4(0, 0, 0, 0);
      if (r < rows && c < cols) {
        raws[p] = *reinterpret_cast<const uint4*>(dout + size_t(r) * cols + c);
        if (pre != nullptr) praws[p] = *reinterpret_cast<const uint4*>(pre + size_t(r) * cols + c);
      }
    }
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int i = lane_r + p * kVecRowsPerPass;
      const int r = r0 + i;
      const bool in_range = r < rows && c < cols;
      float x[8];
      if (in_range) {
        const bf16* d8 = reinterpret_cast<const bf16*>(&raws[p]);
        const bf16* p8 = reinterpret_cast<const bf16*>(&praws[p]);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          x[j] = __bfloat162float(d8[j]);
          if (pre != nullptr) {
            x[j] = __bfloat162float(__float2bfloat16(x[j] * GeluTanhGrad(__bfloat162float(p8[j]))));
          }
          sums[j] += x[j];
        }
      }
      CastRow8(x, in_range, scale, fp8_max, e4m3, st,
               out != nullptr ? out + size_t(r) * cols + c : nullptr, tile_t, i, lane_c);
    }
    __syncthreads();
    if (out_t != nullptr) StoreTransposedTile(out_t, tile_t, r0, c0, rows, cols, lane_r, lane_c);
    __syncthreads();
  }
  if (partial != nullptr) {
#pragma unroll
    for (int j = 0; j < 8; ++j) col_sums[lane_r][lane_c + j] = sums[j];
    __syncthreads();
    if (threadIdx.x < kVecTile && c0 + threadIdx.x < cols) {
      float acc = 0.f;
      for (int l = 0; l < kVecRowsPerPass; ++l) acc += col_sums[l][threadIdx.x];
      partial[size_t(blockIdx.y) * cols + c0 + threadIdx.x] = acc;
    }
  }
  FlushCastStats(st, s_stats, threadIdx.x, amax, counts);
}

int CastMaxBlocks() {
  static int max_blocks = [] {
    int dev = 0, sms = 0, per_sm = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, CastFp8VecKernel, kVecThreads, 0);
    return std::max(1, sms * std::max(1, per_sm));
  }();
  return max_blocks;
}

bool Aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) % bytes) == 0;
}

__global__ void Fp8ScaleUpdateKernel(float* scale, float* scale_inv, int scale_inv_stride,
                                     float* history, float* amax, const float* fp8_max, int n,
                                     int len, bool use_history_max, int margin,
                                     const float* skip_if_non_finite) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  // A skipped step: scales and histories stay, the amaxes are the caller's to discard.
  if (skip_if_non_finite != nullptr && !isfinite(*skip_if_non_finite)) return;
  if (i < n)
    Fp8UpdateOne(i, scale, scale_inv, scale_inv_stride, history, amax, fp8_max, len,
                 use_history_max, margin);
}

}  // namespace

cudaError_t CastFp8(uint8_t* out, uint8_t* out_t, const bf16* inp, int rows, int cols, bool e4m3,
                    const float* scale, float* amax, unsigned long long* counts, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (rows % 8 == 0 && cols % 8 == 0 && Aligned(inp, 16) && Aligned(out, 8) && Aligned(out_t, 8)) {
    const int tiles = CeilDiv(cols, kVecTile) * CeilDiv(rows, kVecTile);
    CastFp8VecKernel<<<std::min(tiles, CastMaxBlocks()), kVecThreads, 0, s>>>(
        out, out_t, inp, rows, cols, e4m3, scale, amax, counts);
    return cudaGetLastError();
  }
  const dim3 grid(CeilDiv(cols, kTile), CeilDiv(rows, kTile));
  const dim3 block(kTile, kRowsPerPass);
  CastFp8Kernel<<<grid, block, 0, s>>>(out, out_t, inp, rows, cols, e4m3, scale, amax, counts);
  return cudaGetLastError();
}

bool CastFp8GradFusable(const void* out, const void* out_t, const void* dout, const void* pre,
                        int rows, int cols) {
  return rows > 0 && cols > 0 && rows % 8 == 0 && cols % 8 == 0 && Aligned(dout, 16) &&
         Aligned(pre, 16) && Aligned(out, 8) && Aligned(out_t, 8);
}

cudaError_t CastFp8Grad(uint8_t* out, uint8_t* out_t, const bf16* dout, const bf16* pre,
                        bf16* dbias, int rows, int cols, bool e4m3, const float* scale, float* amax,
                        unsigned long long* counts, Scratch& scratch, cudaStream_t s) {
  if (!CastFp8GradFusable(out, out_t, dout, pre, rows, cols)) return cudaErrorInvalidValue;
  const int col_tiles = CeilDiv(cols, kVecTile), row_tiles = CeilDiv(rows, kVecTile);
  // About CastMaxBlocks() blocks in all: chunks of row tiles per column strip.
  const int chunks = std::max(1, std::min(row_tiles, CastMaxBlocks() / col_tiles));
  const int per_chunk = CeilDiv(row_tiles, chunks);
  const int used = CeilDiv(row_tiles, per_chunk);
  float* partial = nullptr;
  if (dbias != nullptr) {
    partial = static_cast<float*>(scratch.Get(sizeof(float) * size_t(used) * cols));
    if (partial == nullptr) return scratch.last_error();
  }
  CastFp8GradKernel<<<dim3(col_tiles, used), kVecThreads, 0, s>>>(
      out, out_t, dout, pre, partial, rows, cols, per_chunk, e4m3, scale, amax, counts);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || dbias == nullptr) return err;
  return ColumnFinish(dbias, partial, used, cols, s);  // dbias += Σ chunks, in chunk order
}

cudaError_t Fp8ScaleUpdate(float* scale, float* scale_inv, int scale_inv_stride, float* history,
                           float* amax, const float* fp8_max, int n, int history_len,
                           bool use_history_max, int margin, const float* skip_if_non_finite,
                           cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  Fp8ScaleUpdateKernel<<<CeilDiv(n, 128), 128, 0, s>>>(scale, scale_inv, scale_inv_stride, history,
                                                       amax, fp8_max, n, history_len,
                                                       use_history_max, margin, skip_if_non_finite);
  return cudaGetLastError();
}

}  // namespace boulder::kernels::cuda
