// LayerNorm writing its Linear's FP8 input (Backend::ResidualLayerNormFp8Forward) and the FP8
// backward's recomputation of it (Backend::LayerNormFp8FromStats). The rows are normalised by
// layernorm_rows.cuh's functions, as LayerNormForward's (layernorm.cu) are, and cast as CastFp8
// casts (fp8_cast.cuh), so the bytes and statistics are those of LayerNormForward followed by
// CastFp8:
//   - with a transpose (the layouts that keep it): LayerNormFp8Kernel, 32-row tiles in shared
//     memory, both layouts written;
//   - without (training's forward where the backward recomputes it): LayerNormFp8RowsKernel, a
//     warp per row, no shared tile;
//   - the recomputation, from the kept input, mean and rstd: the cast-transpose tile kernel
//     (fp8_cast_tiles.cuh) with LayerNormFromStatsOp.
// SetLayerNormReferenceKernels(true) sends all of them through LayerNormFp8Kernel with its chunk
// loop (the kernels the others replaced), for the tests' and fusion_bench's comparisons.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_cast.cuh"
#include "kernels/cuda/fp8_cast_tiles.cuh"
#include "kernels/cuda/layernorm_rows.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/fp8_recipe.h"

namespace boulder::kernels::cuda {
namespace {

// LayerNorm + FP8 cast (Backend::ResidualLayerNormFp8Forward). A block of kWarps warps owns a
// tile of kFp8Rows rows x all C columns; each warp normalises its rows exactly as
// LayerNormForwardKernel (same functions, same order: bit-identical residual, mean, rstd and
// BF16 y), casts y with CastOne (fp8_cast.cuh: CastFp8's encoding and statistics) and writes
// the row-major FP8 as 8-byte words. The tile's FP8 rows also go to shared memory
// ([kFp8Rows][C + 4] bytes, dynamic: an odd number of 32-bit words per row), from which the
// block writes the transpose: a thread takes one 32-bit word (4 columns) of 8 rows, transposes
// the 8 x 4 bytes (TransposeBytes4x4, twice) and writes 8 bytes to each of the 4 columns'
// out_t rows; the 4 row groups of a word go to adjacent lanes (32-byte runs per column) and,
// with the odd pitch, the lanes' word reads fall in 32 different banks. (The byte-per-row
// gather this replaced measured about 2% slower: fusion_bench, GPT-2, 0.0437 against 0.0427
// ms per call; the transpose still costs 0.043 against 0.033 ms without it, the row kernel's.)
// The BF16 y is never written. kWarps is 8
// (4 rows per warp), or 16 where 8-warp blocks would leave the GPU short of warps (see
// Fp8BlockWarps). kFromStats (Backend::LayerNormFp8FromStats):
// the rows are inp's as they stand and their mean and rstd are read from kept_mean and
// kept_rstd (nothing is written but the FP8 outputs and the statistics of the cast).
constexpr int kFp8Rows = 32;

__host__ __device__ constexpr int Fp8TilePitch(int C) { return C + 4; }

template <bool kResidual, bool kFromStats, int kWarps>
__global__ void __launch_bounds__(32 * kWarps)
    LayerNormFp8Kernel(uint8_t* q_out, uint8_t* q_out_t, float* mean_out, float* rstd_out,
                       const float* kept_mean, const float* kept_rstd, const bf16* inp,
                       const bf16* w, const bf16* b, int N, int C, bf16* residual, const bf16* ra,
                       const bf16* rb, bool e4m3, const float* scale_p, float* amax,
                       unsigned long long* counts) {
  static_assert(!(kResidual && kFromStats), "the kept rows are already the residual");
  extern __shared__ __align__(16) uint8_t tile[];  // [kFp8Rows][Fp8TilePitch(C)]
  __shared__ BlockCastStats s_stats;
  InitBlockCastStats(s_stats, threadIdx.x);
  const int pitch = Fp8TilePitch(C);
  const float scale = *scale_p;
  const float fp8_max = e4m3 ? kFp8E4M3Max : kFp8E5M2Max;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r0 = blockIdx.x * kFp8Rows;
  CastStats st;
  for (int i = warp; i < kFp8Rows && r0 + i < N; i += kWarps) {
    const int row = r0 + i;
    float mean, rstd;
    const bf16* x;
    if constexpr (kFromStats) {
      mean = kept_mean[row];
      rstd = kept_rstd[row];
      x = inp + size_t(row) * C;
    } else {
      x = LayerNormRowStats<kResidual>(row, lane, C, inp, residual, ra, rb, mean, rstd);
    }
    for (int c = lane * 8; c < C; c += 256) {
      const Bf16x8 y = LayerNormChunk(x, w, b, c, mean, rstd);
      uint2 packed;
      uint8_t* q = reinterpret_cast<uint8_t*>(&packed);
#pragma unroll
      for (int k = 0; k < 8; ++k)
        q[k] = CastOne(__bfloat162float(y.v[k]), scale, fp8_max, e4m3, st);
      if (q_out != nullptr) *reinterpret_cast<uint2*>(q_out + size_t(row) * C + c) = packed;
      uint32_t* t = reinterpret_cast<uint32_t*>(tile + i * pitch + c);  // 4-byte aligned
      t[0] = packed.x;
      t[1] = packed.y;
    }
    if (!kFromStats && lane == 0) {
      mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
  }
  __syncthreads();
  if (q_out_t != nullptr) {
    constexpr int kGroups = kFp8Rows / 8;  // 8-row groups per column
    const uint32_t* words = reinterpret_cast<const uint32_t*>(tile);
    const int pitch_w = pitch / 4;
    for (int idx = threadIdx.x; idx < (C / 4) * kGroups; idx += 32 * kWarps) {
      const int cw = idx / kGroups, g = idx % kGroups;  // columns 4·cw .., rows 8·g ..
      const int rr = r0 + g * 8;
      if (rr < N) {  // N % 8 == 0: all 8 rows are in range
        uint32_t x[2][4];  // x[h][m]: row 8·g + 4·h + m
#pragma unroll
        for (int j = 0; j < 8; ++j) x[j / 4][j % 4] = words[(g * 8 + j) * pitch_w + cw];
        uint32_t y[4][2];  // y[b][h]: column 4·cw + b, rows 8·g + 4·h .. + 3
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t t[4];
          TransposeBytes4x4(x[h], t);
#pragma unroll
          for (int b = 0; b < 4; ++b) y[b][h] = t[b];
        }
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          *reinterpret_cast<uint2*>(q_out_t + size_t(4 * cw + b) * N + rr) =
              make_uint2(y[b][0], y[b][1]);
        }
      }
    }
  }
  FlushCastStats(st, s_stats, threadIdx.x, amax, counts);
}

// ResidualLayerNormFp8Forward without a transpose (what training's forward asks for): one warp
// per row as LayerNormForwardKernel (8 rows per block, no shared tile), each 8 outputs cast
// with Cast8 (fp8_cast.cuh: CastOne's bytes and counts) and written as an 8-byte word. The
// same functions in the same order as LayerNormFp8Kernel: the same residual, statistics and
// bytes.
template <bool kResidual, bool kE4M3, int kCols>
__global__ void __launch_bounds__(256)
    LayerNormFp8RowsKernel(uint8_t* q_out, float* mean_out, float* rstd_out, const bf16* inp,
                           const bf16* w, const bf16* b, int N, int C, bf16* residual,
                           const bf16* ra, const bf16* rb, const float* scale_p, float* amax,
                           unsigned long long* counts) {
  __shared__ BlockCastStats s_stats;
  InitBlockCastStats(s_stats, threadIdx.x);
  __syncthreads();
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  CastStats st;
  if (row < N) {  // no early return: FlushCastStats synchronises the block
    const float scale = *scale_p;
    float mean, rstd;
    uint8_t* q = q_out + size_t(row) * C;
    LayerNormRow<kResidual, kCols>(row, lane, C, inp, residual, ra, rb, w, b, mean, rstd,
                                   [&](int c, const Bf16x8& y) {
                                     float f[8];
                                     *reinterpret_cast<uint2*>(q + c) = Cast8<kE4M3>(
                                         *reinterpret_cast<const uint4*>(&y), scale, st, f);
                                   });
    if (lane == 0) {
      mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
  }
  FlushCastStats(st, s_stats, threadIdx.x, amax, counts);
}

template <bool kResidual, bool kE4M3>
auto Fp8RowsKernelFor(int held) {
  return held == 3   ? LayerNormFp8RowsKernel<kResidual, kE4M3, 3>
         : held == 8 ? LayerNormFp8RowsKernel<kResidual, kE4M3, 8>
                     : LayerNormFp8RowsKernel<kResidual, kE4M3, 0>;
}
template <bool kResidual>
auto Fp8RowsKernel(bool e4m3, int held) {
  return e4m3 ? Fp8RowsKernelFor<kResidual, true>(held) : Fp8RowsKernelFor<kResidual, false>(held);
}

// LayerNormFp8FromStats on the cast-transpose tile kernel (fp8_cast_tiles.cuh): the Op
// normalises 8 values of a kept row with its kept mean and rstd, LayerNormChunkOf's
// arithmetic: the forward's BF16 y, so the forward's bytes and statistics.
struct LayerNormFromStatsOp {
  static constexpr bool kReadsPre = false;
  static constexpr bool kRowCol = true;
  const float* mean;
  const float* rstd;
  const bf16* w;
  const bf16* b;
  struct Row {  // a row's kept statistics, loaded with the row's values
    float mean, rstd;
  };
  struct Cols {  // the weight and bias of a thread's 8 columns, loaded once
    Bf16x8 w, b;
  };
  __device__ __forceinline__ Row LoadRow(int row) const { return {mean[row], rstd[row]}; }
  __device__ __forceinline__ Cols LoadCols(int col) const {
    return {Load8(w + col), Load8(b + col)};
  }
  __device__ __forceinline__ uint4 Apply(uint4 x, const Row& r, const Cols& c) const {
    const Bf16x8 y =
        LayerNormChunkOf(*reinterpret_cast<const Bf16x8*>(&x), c.w, c.b, r.mean, r.rstd);
    return *reinterpret_cast<const uint4*>(&y);
  }
};

int MaxDynamicSmem() {
  static const int bytes = [] {
    int dev = 0, optin = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    // Leave room for the static shared memory (the block's statistics).
    return optin - 64;
  }();
  return bytes;
}

size_t Fp8TileBytes(int C) { return size_t(kFp8Rows) * Fp8TilePitch(C); }

// Warps per block: 8 unless that gives fewer than about 3 blocks per SM, as on 8192 rows (seed,
// hidden-2048: 256 blocks on the H200's 132 SMs, 16 warps per SM); then 16 (twice the warps on
// the same tiles: 2 rows per warp, the transpose still written in 32-byte runs). fusion_bench,
// ms per call at 8 / 16 / 32 warps (before the transpose's byte permutes): GPT-2 0.0422 /
// 0.0435 / 0.0497, hidden-2048 0.0721 / 0.0583 / 0.0624, seed 0.0297 / 0.0255 / 0.0272.
// SetLayerNormFp8BlockWarps overrides it.
int g_fp8_block_warps = 0;  // 0: Fp8BlockWarps chooses

int Fp8BlockWarps(int N) {
  if (g_fp8_block_warps != 0) return g_fp8_block_warps;
  static const int min_blocks = [] {
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    return 3 * sms;
  }();
  return CeilDiv(N, kFp8Rows) >= unsigned(min_blocks) ? 8 : 16;
}

// The LayerNormFp8Kernel instance for `warps` warps per block (Fp8BlockWarps: 8 or 16; 32 for
// fusion_bench's comparison).
template <bool kResidual, bool kFromStats>
auto Fp8Kernel(int warps) {
  return warps == 8    ? LayerNormFp8Kernel<kResidual, kFromStats, 8>
         : warps == 16 ? LayerNormFp8Kernel<kResidual, kFromStats, 16>
                       : LayerNormFp8Kernel<kResidual, kFromStats, 32>;
}

// Lets every LayerNormFp8Kernel take the device's whole opt-in shared memory (once).
cudaError_t AllowFp8TileSmem() {
  static const cudaError_t err = [] {
    const int bytes = MaxDynamicSmem();
    for (const int warps : {8, 16, 32}) {
      for (const void* k : {reinterpret_cast<const void*>(Fp8Kernel<true, false>(warps)),
                            reinterpret_cast<const void*>(Fp8Kernel<false, false>(warps)),
                            reinterpret_cast<const void*>(Fp8Kernel<false, true>(warps))}) {
        cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
        if (e != cudaSuccess) return e;
      }
    }
    return cudaSuccess;
  }();
  return err;
}

bool Aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) % bytes) == 0;
}

}  // namespace

void SetLayerNormFp8BlockWarps(int warps) {
  g_fp8_block_warps = (warps == 8 || warps == 16 || warps == 32) ? warps : 0;
}

bool LayerNormFp8Fusable(const void* residual, const void* a, const void* b, const void* weight,
                         const void* bias, const void* fp8_out, const void* fp8_out_t, int N,
                         int C) {
  return N > 0 && C > 0 && N % 8 == 0 && C % 8 == 0 &&
         (fp8_out != nullptr || fp8_out_t != nullptr) && Aligned(residual, 16) && Aligned(a, 16) &&
         Aligned(b, 16) && Aligned(weight, 16) && Aligned(bias, 16) && Aligned(fp8_out, 8) &&
         Aligned(fp8_out_t, 8) && Fp8TileBytes(C) <= size_t(MaxDynamicSmem());
}

cudaError_t ResidualLayerNormFp8Forward(bf16* residual, float* mean, float* rstd, const bf16* a,
                                        const bf16* b, const bf16* weight, const bf16* bias, int N,
                                        int C, uint8_t* fp8_out, uint8_t* fp8_out_t, bool e4m3,
                                        const float* scale, float* amax, unsigned long long* counts,
                                        cudaStream_t s) {
  if (!LayerNormFp8Fusable(residual, a, b, weight, bias, fp8_out, fp8_out_t, N, C)) {
    return cudaErrorInvalidValue;
  }
  if (fp8_out_t == nullptr && LayerNormNewKernels()) {
    const bool res = residual != nullptr;
    auto kernel = res ? Fp8RowsKernel<true>(e4m3, LayerNormHeldCols(C))
                      : Fp8RowsKernel<false>(e4m3, LayerNormHeldCols(C));
    kernel<<<CeilDiv(N, 8), 256, 0, s>>>(fp8_out, mean, rstd, res ? nullptr : a, weight, bias, N, C,
                                         residual, res ? a : nullptr, res ? b : nullptr, scale,
                                         amax, counts);
    return cudaGetLastError();
  }
  if (cudaError_t e = AllowFp8TileSmem(); e != cudaSuccess) return e;
  const size_t smem = Fp8TileBytes(C);
  const int blocks = CeilDiv(N, kFp8Rows), warps = Fp8BlockWarps(N);
  // With a residual the kernel forms the rows as a + b (ra, rb); else it reads a (inp).
  const bool res = residual != nullptr;
  auto kernel = res ? Fp8Kernel<true, false>(warps) : Fp8Kernel<false, false>(warps);
  kernel<<<blocks, 32 * warps, smem, s>>>(
      fp8_out, fp8_out_t, mean, rstd, nullptr, nullptr, res ? nullptr : a, weight, bias, N, C,
      residual, res ? a : nullptr, res ? b : nullptr, e4m3, scale, amax, counts);
  return cudaGetLastError();
}

cudaError_t LayerNormFp8FromStats(const bf16* inp, const float* mean, const float* rstd,
                                  const bf16* weight, const bf16* bias, int N, int C,
                                  uint8_t* fp8_out, uint8_t* fp8_out_t, bool e4m3,
                                  const float* scale, float* amax, unsigned long long* counts,
                                  cudaStream_t s) {
  if (!LayerNormFp8Fusable(nullptr, inp, nullptr, weight, bias, fp8_out, fp8_out_t, N, C)) {
    return cudaErrorInvalidValue;
  }
  if (LayerNormNewKernels()) {
    const LayerNormFromStatsOp op{mean, rstd, weight, bias};
    if (e4m3) {
      const CastTileGrid g =
          PlanCastTiles(N, C, CastTilesMaxBlocks<true, LayerNormFromStatsOp, false>());
      return LaunchCastTiles<true, LayerNormFromStatsOp, false>(
          fp8_out, fp8_out_t, inp, nullptr, nullptr, N, C, g, scale, amax, counts, s, op);
    }
    const CastTileGrid g =
        PlanCastTiles(N, C, CastTilesMaxBlocks<false, LayerNormFromStatsOp, false>());
    return LaunchCastTiles<false, LayerNormFromStatsOp, false>(
        fp8_out, fp8_out_t, inp, nullptr, nullptr, N, C, g, scale, amax, counts, s, op);
  }
  if (cudaError_t e = AllowFp8TileSmem(); e != cudaSuccess) return e;
  const int warps = Fp8BlockWarps(N);
  auto kernel = Fp8Kernel<false, true>(warps);
  kernel<<<CeilDiv(N, kFp8Rows), 32 * warps, Fp8TileBytes(C), s>>>(
      fp8_out, fp8_out_t, nullptr, nullptr, mean, rstd, inp, weight, bias, N, C, nullptr, nullptr,
      nullptr, e4m3, scale, amax, counts);
  return cudaGetLastError();
}

}  // namespace boulder::kernels::cuda
