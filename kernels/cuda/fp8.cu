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
// Rows and columns that are multiples of 8 take CastTilesKernel (vectorised,
// fp8_cast_tiles.cuh).
//
// Scale update: one thread per tensor running kernels/fp8_recipe.h. This file is compiled
// without --use_fast_math (see CMakeLists.txt) so the division and reciprocal are IEEE and
// subnormals are kept: the scales are bit-identical to the CPU backend's.
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_cast.cuh"
#include "kernels/cuda/fp8_cast_tiles.cuh"
#include "kernels/cuda/fp8_gelu_grad_op.cuh"
#include "kernels/cuda/fp8_ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/fp8_recipe.h"

namespace boulder::kernels::cuda {
namespace {

constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;

// The encoding and statistics (ToFp8, CastOne, Cast8, FlushCastStats): fp8_cast.cuh.

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
// multiples of 16), 16-byte-aligned inputs and 8-byte-aligned outputs: CastTilesKernel
// (fp8_cast_tiles.cuh), with no stage before the cast (CastOp) or with dGELU (GeluGradOp). Same
// encoding and counting rules as CastOne (bit-identical results), checked against the CPU
// emulation in fp8_test.cc.

// The dGELU stage (GeluGradOp) is in fp8_gelu_grad_op.cuh, shared with fp8_gelu.cu.

// No stage: the plain cast.
struct CastOp {
  static constexpr bool kReadsPre = false;
  static constexpr bool kRowCol = false;
  __device__ __forceinline__ static uint4 Apply(uint4 x, uint4) { return x; }
};

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
    if (e4m3) {
      const CastTileGrid g = PlanCastTiles(rows, cols, CastTilesMaxBlocks<true, CastOp, false>());
      return LaunchCastTiles<true, CastOp, false>(out, out_t, inp, nullptr, nullptr, rows, cols, g,
                                                  scale, amax, counts, s);
    }
    const CastTileGrid g = PlanCastTiles(rows, cols, CastTilesMaxBlocks<false, CastOp, false>());
    return LaunchCastTiles<false, CastOp, false>(out, out_t, inp, nullptr, nullptr, rows, cols, g,
                                                 scale, amax, counts, s);
  }
  const dim3 grid(CeilDiv(cols, kTile), CeilDiv(rows, kTile));
  const dim3 block(kTile, kRowsPerPass);
  CastFp8Kernel<<<grid, block, 0, s>>>(out, out_t, inp, rows, cols, e4m3, scale, amax, counts);
  return cudaGetLastError();
}

namespace {

// CastFp8Batch's launch: up to kCastBatchMax jobs in the kernel's parameters (__grid_constant__:
// read in place, not copied per thread); block b belongs to the job whose first_block is the
// last at or below b, and is that job's (strip, chunk) = (local % col_tiles, local / col_tiles).
constexpr int kCastBatchMax = 24;
constexpr int kCastBatchTilesPerBlock = 4;  // row tiles of 64 per block: 256 rows
struct CastBatchLaunch {
  struct Job {
    uint8_t* out;
    uint8_t* out_t;
    const bf16* inp;
    const float* scale;
    float* amax;
    unsigned long long* counts;
    int rows, cols, col_tiles, first_block;
  } job[kCastBatchMax];
  int n;
};

template <bool kE4M3>
__global__ void __launch_bounds__(kCastTileThreads, CastTilesMinBlocks(false, false))
    CastBatchKernel(const __grid_constant__ CastBatchLaunch launch) {
  int j = 0;
  while (j + 1 < launch.n && int(blockIdx.x) >= launch.job[j + 1].first_block) ++j;
  const CastBatchLaunch::Job& b = launch.job[j];
  const int local = blockIdx.x - b.first_block;
  CastTilesBlock<kE4M3, CastOp, false>(b.out, b.out_t, b.inp, nullptr, nullptr, b.rows, b.cols,
                                       kCastBatchTilesPerBlock, b.scale, b.amax, b.counts,
                                       CastOp{}, local % b.col_tiles, local / b.col_tiles);
}

}  // namespace

cudaError_t CastFp8Batch(const CastBatchJob* jobs, int n, bool e4m3, cudaStream_t s) {
  CastBatchLaunch launch;
  launch.n = 0;
  int blocks = 0;
  auto flush = [&]() -> cudaError_t {
    if (launch.n == 0) return cudaSuccess;
    if (e4m3) {
      CastBatchKernel<true><<<blocks, kCastTileThreads, 0, s>>>(launch);
    } else {
      CastBatchKernel<false><<<blocks, kCastTileThreads, 0, s>>>(launch);
    }
    launch.n = 0;
    blocks = 0;
    return cudaGetLastError();
  };
  for (int i = 0; i < n; ++i) {
    const CastBatchJob& j = jobs[i];
    if (j.rows <= 0 || j.cols <= 0) continue;
    if (j.rows % 8 != 0 || j.cols % 8 != 0 || !Aligned(j.inp, 16) || !Aligned(j.out, 8) ||
        !Aligned(j.out_t, 8)) {
      if (cudaError_t e = CastFp8(j.out, j.out_t, j.inp, j.rows, j.cols, e4m3, j.scale, j.amax,
                                  j.counts, s);
          e != cudaSuccess) {
        return e;
      }
      continue;
    }
    const int col_tiles = CeilDiv(j.cols, kCastTile);
    const int chunks = CeilDiv(CeilDiv(j.rows, kCastTile), kCastBatchTilesPerBlock);
    launch.job[launch.n++] = {j.out,    j.out_t, j.inp,  j.scale,   j.amax,
                              j.counts, j.rows,  j.cols, col_tiles, blocks};
    blocks += col_tiles * chunks;
    if (launch.n == kCastBatchMax) {
      if (cudaError_t e = flush(); e != cudaSuccess) return e;
    }
  }
  return flush();
}

namespace {

// TransposeFp8 on shapes the wide kernel below does not take (TransposeFp8AnyKernel): a
// 64 x 64 byte tile per block of 256 threads. Thread t reads 16 bytes of tile
// row t/4 (one 16-byte load where `vec`: rows and cols multiples of 16, 16-byte-aligned
// pointers; else byte by byte within bounds) into shared memory (row pitch 68: 4-byte stores,
// few bank conflicts), then writes 16 bytes of output row t/4 (input column c0 + t/4): input
// rows r0 + 16·(t%4) .. + 15 gathered from the tile.
constexpr int kTransposeTile = 64;
__global__ void __launch_bounds__(256)
    TransposeFp8AnyKernel(uint8_t* out, const uint8_t* in, int rows, int cols, bool vec) {
  __shared__ __align__(16) uint8_t tile[kTransposeTile][kTransposeTile + 4];
  const int r0 = blockIdx.y * kTransposeTile, c0 = blockIdx.x * kTransposeTile;
  const int i = threadIdx.x / 4, k = (threadIdx.x % 4) * 16;
  {
    const int r = r0 + i, c = c0 + k;
    if (vec) {
      if (r < rows && c < cols) {
        const uint4 v = *reinterpret_cast<const uint4*>(in + size_t(r) * cols + c);
        uint32_t* row = reinterpret_cast<uint32_t*>(&tile[i][k]);
        row[0] = v.x, row[1] = v.y, row[2] = v.z, row[3] = v.w;
      }
    } else {
      for (int j = 0; j < 16; ++j) {
        if (r < rows && c + j < cols) tile[i][k + j] = in[size_t(r) * cols + c + j];
      }
    }
  }
  __syncthreads();
  const int oc = c0 + i, orow = r0 + k;  // output row oc, columns orow .. orow + 15
  if (oc >= cols) return;
  if (vec) {
    if (orow < rows) {
      uint32_t w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        w[q] = uint32_t(tile[k + 4 * q][i]) | uint32_t(tile[k + 4 * q + 1][i]) << 8 |
               uint32_t(tile[k + 4 * q + 2][i]) << 16 | uint32_t(tile[k + 4 * q + 3][i]) << 24;
      }
      *reinterpret_cast<uint4*>(out + size_t(oc) * rows + orow) =
          make_uint4(w[0], w[1], w[2], w[3]);
    }
  } else {
    for (int j = 0; j < 16; ++j) {
      if (orow + j < rows) out[size_t(oc) * rows + orow + j] = tile[k + j][i];
    }
  }
}

// TransposeFp8 where rows and cols are multiples of 16 and both pointers 16-byte aligned (every
// weight of the benchmark models): a 128 x 128 byte tile per block of 256 threads, 4 16-byte
// loads in flight per thread (the 64 x 64 kernel had one: at ~1.8 TB/s on hidden-2048's
// weights it was bound by its blocks' short lives, not by DRAM). Shared memory holds the tile
// as 32-bit words, row R's word w at column w ^ 4·((R / 16) % 8): the loads' 16-byte stores and
// the gathers below are then free of bank conflicts. Thread (cw, rg) reads the words of column
// group cw (input columns 4·cw .. 4·cw + 3) in input rows 16·rg .. 16·rg + 15, transposes them
// 4 x 4 bytes at a time (TransposeBytes4x4), and writes 16 bytes to each of output rows
// c0 + 4·cw .. + 3 (input rows r0 + 16·rg ..): lanes run over rg first, so each store of a
// warp is four whole 128-byte rows.
constexpr int kWideTile = 128;
__global__ void __launch_bounds__(256)
    TransposeFp8WideKernel(uint8_t* out, const uint8_t* in, int rows, int cols) {
  __shared__ __align__(16) uint32_t tile[kWideTile][kWideTile / 4];
  const int r0 = blockIdx.y * kWideTile, c0 = blockIdx.x * kWideTile;
  {
    const int c = threadIdx.x % 8;  // 16-byte chunk of a row: words 4c .. 4c + 3
    uint4 v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = r0 + threadIdx.x / 8 + 32 * j;
      v[j] = make_uint4(0, 0, 0, 0);
      if (r < rows && c0 + 16 * c < cols) {
        v[j] = *reinterpret_cast<const uint4*>(in + size_t(r) * cols + c0 + 16 * c);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int R = threadIdx.x / 8 + 32 * j;
      *reinterpret_cast<uint4*>(&tile[R][4 * (c ^ ((R / 16) % 8))]) = v[j];
    }
  }
  __syncthreads();
  const int rg = threadIdx.x % 8, cw = threadIdx.x / 8;  // input rows 16·rg.., columns 4·cw..
  const int orow = r0 + 16 * rg;                        // the output rows' first column
  if (orow >= rows) return;
  uint32_t y[4][4];  // y[b][q]: output row c0 + 4·cw + b, its word q
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t x[4], t[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) x[m] = tile[16 * rg + 4 * q + m][cw ^ (4 * rg)];
    TransposeBytes4x4(x, t);
#pragma unroll
    for (int b = 0; b < 4; ++b) y[b][q] = t[b];
  }
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const int oc = c0 + 4 * cw + b;
    if (oc < cols) {
      *reinterpret_cast<uint4*>(out + size_t(oc) * rows + orow) =
          make_uint4(y[b][0], y[b][1], y[b][2], y[b][3]);
    }
  }
}

}  // namespace

namespace {
bool g_rows_only_kernels = true;
bool g_fused_cast_grid = true;  // SetFp8GeluGradFusedGrid
bool g_wide_transpose = true;   // SetFp8WideTranspose
}  // namespace

void SetFp8CastRowsOnlyKernels(bool on) { g_rows_only_kernels = on; }
void SetFp8GeluGradFusedGrid(bool on) { g_fused_cast_grid = on; }
void SetFp8WideTranspose(bool on) { g_wide_transpose = on; }
bool Fp8CastRowsOnlyKernels() { return g_rows_only_kernels; }

cudaError_t TransposeFp8(uint8_t* out, const uint8_t* in, int rows, int cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const bool vec = rows % 16 == 0 && cols % 16 == 0 && Aligned(in, 16) && Aligned(out, 16);
  if (vec && g_wide_transpose) {
    const dim3 grid(CeilDiv(cols, kWideTile), CeilDiv(rows, kWideTile));
    TransposeFp8WideKernel<<<grid, 256, 0, s>>>(out, in, rows, cols);
    return cudaGetLastError();
  }
  const dim3 grid(CeilDiv(cols, kTransposeTile), CeilDiv(rows, kTransposeTile));
  TransposeFp8AnyKernel<<<grid, 256, 0, s>>>(out, in, rows, cols, vec);
  return cudaGetLastError();
}

bool CastFp8GradFusable(const void* out, const void* out_t, const void* dout, const void* pre,
                        int rows, int cols) {
  return rows > 0 && cols > 0 && rows % 8 == 0 && cols % 8 == 0 && Aligned(dout, 16) &&
         Aligned(pre, 16) && Aligned(out, 8) && Aligned(out_t, 8);
}

namespace {

// CastFp8Grad for one combination of format, dGELU and bias gradient.
template <bool kE4M3, class Op, bool kSums>
cudaError_t CastGrad(uint8_t* out, uint8_t* out_t, const bf16* dout, const bf16* pre, bf16* dbias,
                     int rows, int cols, const float* scale, float* amax,
                     unsigned long long* counts, Scratch& scratch, cudaStream_t s) {
  // The grid GeluCastFp8AndGrad (fp8_gelu.cu) takes too, so its bias partials are these.
  const CastTileGrid g =
      CastFp8GradGrid(rows, cols, kE4M3, std::is_same_v<Op, GeluGradOp>, kSums);
  float* partial = nullptr;
  if (kSums) {
    partial = static_cast<float*>(scratch.Get(sizeof(float) * size_t(g.chunks) * cols));
    if (partial == nullptr) return scratch.last_error();
  }
  cudaError_t err = LaunchCastTiles<kE4M3, Op, kSums>(out, out_t, dout, pre, partial, rows, cols, g,
                                                      scale, amax, counts, s);
  if (err != cudaSuccess || !kSums) return err;
  return ColumnFinish(dbias, partial, g.chunks, cols, s);  // dbias += Σ chunks, in a fixed order
}

template <bool kE4M3>
CastTileGrid GradGrid(int rows, int cols, bool dgelu, bool sums) {
  int max_blocks = dgelu ? (sums ? CastTilesMaxBlocks<kE4M3, GeluGradOp, true>()
                                 : CastTilesMaxBlocks<kE4M3, GeluGradOp, false>())
                         : (sums ? CastTilesMaxBlocks<kE4M3, CastOp, true>()
                                 : CastTilesMaxBlocks<kE4M3, CastOp, false>());
  // The fused GELU + gradient cast fits 3 blocks per SM to this kernel's 4: planned for 4, a
  // third of its grid ran as a second, one-block-per-SM wave.
  if (dgelu && g_fused_cast_grid) {
    max_blocks = std::min(max_blocks, GeluCastAndGradMaxBlocks(kE4M3, sums));
  }
  return PlanCastTiles(rows, cols, max_blocks);
}

template <bool kE4M3>
cudaError_t CastGradFormat(uint8_t* out, uint8_t* out_t, const bf16* dout, const bf16* pre,
                           bf16* dbias, int rows, int cols, const float* scale, float* amax,
                           unsigned long long* counts, Scratch& scratch, cudaStream_t s) {
  if (pre != nullptr) {
    return dbias != nullptr
               ? CastGrad<kE4M3, GeluGradOp, true>(out, out_t, dout, pre, dbias, rows, cols, scale,
                                                   amax, counts, scratch, s)
               : CastGrad<kE4M3, GeluGradOp, false>(out, out_t, dout, pre, dbias, rows, cols, scale,
                                                    amax, counts, scratch, s);
  }
  return dbias != nullptr ? CastGrad<kE4M3, CastOp, true>(out, out_t, dout, pre, dbias, rows, cols,
                                                          scale, amax, counts, scratch, s)
                          : CastGrad<kE4M3, CastOp, false>(out, out_t, dout, pre, dbias, rows, cols,
                                                           scale, amax, counts, scratch, s);
}

}  // namespace

CastTileGrid CastFp8GradGrid(int rows, int cols, bool e4m3, bool dgelu, bool sums) {
  return e4m3 ? GradGrid<true>(rows, cols, dgelu, sums) : GradGrid<false>(rows, cols, dgelu, sums);
}

cudaError_t CastFp8Grad(uint8_t* out, uint8_t* out_t, const bf16* dout, const bf16* pre,
                        bf16* dbias, int rows, int cols, bool e4m3, const float* scale, float* amax,
                        unsigned long long* counts, Scratch& scratch, cudaStream_t s) {
  if (!CastFp8GradFusable(out, out_t, dout, pre, rows, cols)) return cudaErrorInvalidValue;
  return e4m3 ? CastGradFormat<true>(out, out_t, dout, pre, dbias, rows, cols, scale, amax, counts,
                                     scratch, s)
              : CastGradFormat<false>(out, out_t, dout, pre, dbias, rows, cols, scale, amax, counts,
                                      scratch, s);
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
