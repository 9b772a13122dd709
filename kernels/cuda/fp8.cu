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
// Rows and columns that are multiples of 8 take CastTilesKernel (vectorised, below).
//
// Scale update: one thread per tensor running kernels/fp8_recipe.h. This file is compiled
// without --use_fast_math (see CMakeLists.txt) so the division and reciprocal are IEEE and
// subnormals are kept: the scales are bit-identical to the CPU backend's.
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_cast.cuh"
#include "kernels/cuda/fp8_ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/fp8_recipe.h"

namespace boulder::kernels::cuda {
namespace {

constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;

// The encoding and statistics (ToFp8, CastOne, FlushCastStats): fp8_cast.cuh.

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
// multiples of 16), 16-byte-aligned inputs and 8-byte-aligned outputs: 64x64 tiles, 256
// threads. Thread t owns columns 8·(t%8).. +7 of the tile's rows 2·(t/8) and 2·(t/8)+1: it
// loads 16 bytes per row, casts 8 values per instruction group (Cast8: paired conversions,
// amax over the packed BF16 patterns, the saturation test only where the block of 8 can
// saturate, underflow as a count of zero codes less zero inputs), stores 8 codes per row, and
// writes each column's two codes (2 bytes) into a transposed shared tile whose 8-byte chunks
// are swizzled by column so that neither these writes nor the 8-byte reads that store the
// transpose collide in banks. Same encoding and counting rules as CastOne (bit-identical
// results), checked against the CPU emulation in fp8_test.cc.
//
// Block (x, y) owns the 64-column strip x and the row tiles of chunk y; with column sums
// (CastFp8Grad's bias gradient) each block writes its strip's sums over its chunk into
// partial[y, cols] (FP32, summed in a fixed order: deterministic).
constexpr int kVecTile = 64;
constexpr int kVecThreads = 256;

// Row r of column c of the transposed tile (the code of tile row r, column c) sits at byte
// SwizzledRow(c, r) of the tile's row c: chunk r/8 exchanged with chunk (r/8) ^ (c/8 % 8).
__device__ __forceinline__ int SwizzledRow(int c, int r) {
  return (((r >> 3) ^ ((c >> 3) & 7)) << 3) | (r & 7);
}

// Two FP32 values -> two FP8 codes (a in the low byte), as ToFp8 does each.
template <bool kE4M3>
__device__ __forceinline__ unsigned ToFp8x2(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kE4M3 ? __NV_E4M3 : __NV_E5M2);
}

// 8 BF16 values packed in g (value j in half j%2 of word j/2, low half first) -> their FP8
// codes (code j in byte j of the result) and the values as FP32 in x, counted into st exactly
// as CastOne counts each.
template <bool kE4M3>
__device__ __forceinline__ uint2 Cast8(uint4 g, float scale, CastStats& st, float (&x)[8]) {
  constexpr float kMax = kE4M3 ? kFp8E4M3Max : kFp8E5M2Max;
  const unsigned w[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    x[2 * k] = __uint_as_float(w[k] << 16);
    x[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
  // max |x| over the BF16 patterns (unsigned order: NaN beats inf, as for the FP32 patterns).
  const unsigned m2 = __vmaxu2(__vmaxu2(w[0] & 0x7fff7fffu, w[1] & 0x7fff7fffu),
                               __vmaxu2(w[2] & 0x7fff7fffu, w[3] & 0x7fff7fffu));
  const unsigned m = max(m2 & 0xffffu, m2 >> 16) << 16;
  st.amax = max(st.amax, m);
  uint2 q;
  q.x = ToFp8x2<kE4M3>(__fmul_rn(x[0], scale), __fmul_rn(x[1], scale)) |
        (ToFp8x2<kE4M3>(__fmul_rn(x[2], scale), __fmul_rn(x[3], scale)) << 16);
  q.y = ToFp8x2<kE4M3>(__fmul_rn(x[4], scale), __fmul_rn(x[5], scale)) |
        (ToFp8x2<kE4M3>(__fmul_rn(x[6], scale), __fmul_rn(x[7], scale)) << 16);
  // |x·scale| is monotonic in |x|: nothing saturates or is non-finite unless the largest does.
  if (!(__fmul_rn(__uint_as_float(m), scale) <= kMax)) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (!isfinite(x[j])) {
        ++st.non_finite;
      } else if (fabsf(__fmul_rn(x[j], scale)) > kMax) {
        ++st.saturated;
      }
    }
  }
  // Underflow: codes of magnitude 0 from non-zero inputs. Only ±0 inputs give such codes
  // otherwise (inf and NaN never do), so count the zero codes and take away the zero inputs.
  const unsigned zero_codes =
      __popc(__vcmpeq4(q.x & 0x7f7f7f7fu, 0u)) + __popc(__vcmpeq4(q.y & 0x7f7f7f7fu, 0u));
  const unsigned zero_inputs =
      __popc(__vcmpeq2(w[0] & 0x7fff7fffu, 0u)) + __popc(__vcmpeq2(w[1] & 0x7fff7fffu, 0u)) +
      __popc(__vcmpeq2(w[2] & 0x7fff7fffu, 0u)) + __popc(__vcmpeq2(w[3] & 0x7fff7fffu, 0u));
  st.underflow += zero_codes / 8 - zero_inputs / 16;
  return q;
}

// gelu_tanh'(x) with the hardware tanh (tanh.approx.f32, relative error about 2^-11: far below
// the BF16 rounding of g that follows).
__device__ __forceinline__ float GeluTanhGradApprox(float x) {
  constexpr float kS = 0.7978845608028654f;
  const float u = kS * (x + 0.044715f * x * x * x);
  float th;
  asm("tanh.approx.f32 %0, %1;" : "=f"(th) : "f"(u));
  return 0.5f * (1.f + th) + 0.5f * x * (1.f - th * th) * kS * (1.f + 3.f * 0.044715f * x * x);
}

// The 8 values d ⊙ gelu'(p), each rounded to BF16, packed like Cast8's input.
__device__ __forceinline__ uint4 GeluGrad8(uint4 d, uint4 p) {
  const unsigned dw[4] = {d.x, d.y, d.z, d.w}, pw[4] = {p.x, p.y, p.z, p.w};
  unsigned gw[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float lo =
        __uint_as_float(dw[k] << 16) * GeluTanhGradApprox(__uint_as_float(pw[k] << 16));
    const float hi = __uint_as_float(dw[k] & 0xffff0000u) *
                     GeluTanhGradApprox(__uint_as_float(pw[k] & 0xffff0000u));
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);  // lo in the low half
    gw[k] = *reinterpret_cast<const unsigned*>(&h);
  }
  return make_uint4(gw[0], gw[1], gw[2], gw[3]);
}

// Casts (and with kGelu, computes g = dout ⊙ gelu'(pre) first) the tiles of strip blockIdx.x,
// chunk blockIdx.y; see above.
template <bool kE4M3, bool kGelu, bool kSums>
__global__ void __launch_bounds__(kVecThreads)
    CastTilesKernel(uint8_t* out, uint8_t* out_t, const bf16* __restrict__ inp,
                    const bf16* __restrict__ pre, float* partial, int rows, int cols,
                    int tiles_per_chunk, const float* scale_p, float* amax,
                    unsigned long long* counts) {
  __shared__ __align__(16) uint8_t tile_t[kVecTile][kVecTile];
  __shared__ float col_sums[kSums ? kVecThreads / 8 : 1][kSums ? kVecTile : 1];
  __shared__ BlockCastStats s_stats;
  InitBlockCastStats(s_stats, threadIdx.x);
  const float scale = *scale_p;
  const int lane_c = (threadIdx.x % 8) * 8;  // this thread's first column of the tile
  const int rp = threadIdx.x / 8;            // its rows 2·rp and 2·rp + 1
  const int c0 = blockIdx.x * kVecTile, c = c0 + lane_c;
  const int row_tiles = (rows + kVecTile - 1) / kVecTile;
  const int t_begin = blockIdx.y * tiles_per_chunk;
  const int t_end = min(row_tiles, t_begin + tiles_per_chunk);
  float sums[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  CastStats st;
  // The next tile's loads are issued before this tile's arithmetic and stores (in flight
  // across them); rows and cols are multiples of 8: a thread's two rows and 8 columns are all
  // in range or none.
  uint4 next_g[2], next_p[2];
  auto load = [&](int t) {
    const int r = t * kVecTile + 2 * rp;
    if (r < rows && c < cols) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        next_g[k] = *reinterpret_cast<const uint4*>(inp + size_t(r + k) * cols + c);
        if (kGelu) next_p[k] = *reinterpret_cast<const uint4*>(pre + size_t(r + k) * cols + c);
      }
    }
  };
  if (t_begin < t_end) load(t_begin);
  for (int t = t_begin; t < t_end; ++t) {
    const int r0 = t * kVecTile, r = r0 + 2 * rp;
    const bool in_range = r < rows && c < cols;
    uint4 g[2] = {next_g[0], next_g[1]};
    if (kGelu && in_range) {
#pragma unroll
      for (int k = 0; k < 2; ++k) g[k] = GeluGrad8(g[k], next_p[k]);
    }
    if (t + 1 < t_end) load(t + 1);
    __syncthreads();  // the previous tile's transpose has been read out of tile_t
    if (in_range) {
      uint2 q[2];
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        float x[8];
        q[k] = Cast8<kE4M3>(g[k], scale, st, x);
        if (kSums) {
#pragma unroll
          for (int j = 0; j < 8; ++j) sums[j] += x[j];
        }
        if (out != nullptr) *reinterpret_cast<uint2*>(out + size_t(r + k) * cols + c) = q[k];
      }
      // Column lane_c + j gets the two rows' codes j: bytes j of q[0] and q[1].
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const unsigned lo = j < 4 ? q[0].x : q[0].y, hi = j < 4 ? q[1].x : q[1].y;
        const unsigned pair = __byte_perm(lo, hi, (j % 4) | ((4 + j % 4) << 4));
        *reinterpret_cast<uint16_t*>(&tile_t[lane_c + j][SwizzledRow(lane_c + j, 2 * rp)]) =
            static_cast<uint16_t>(pair);
      }
    }
    __syncthreads();
    if (out_t != nullptr) {
      // Row i of the transposed tile (input column c0 + i), rows r0 + 8·(t%8) .. + 7.
      const int chunk = (threadIdx.x % 8) * 8;
#pragma unroll
      for (int pass = 0; pass < 2; ++pass) {
        const int i = threadIdx.x / 8 + 32 * pass;
        const int cc = c0 + i, rr = r0 + chunk;
        if (cc < cols && rr < rows) {
          *reinterpret_cast<uint2*>(out_t + size_t(cc) * rows + rr) =
              *reinterpret_cast<const uint2*>(&tile_t[i][SwizzledRow(i, chunk)]);
        }
      }
    }
  }
  if (kSums) {
#pragma unroll
    for (int j = 0; j < 8; ++j) col_sums[rp][lane_c + j] = sums[j];
    __syncthreads();
    if (threadIdx.x < kVecTile && c0 + threadIdx.x < cols) {
      float acc = 0.f;
      for (int l = 0; l < kVecThreads / 8; ++l) acc += col_sums[l][threadIdx.x];
      partial[size_t(blockIdx.y) * cols + c0 + threadIdx.x] = acc;
    }
  }
  FlushCastStats(st, s_stats, threadIdx.x, amax, counts);
}

template <bool kE4M3, bool kGelu, bool kSums>
int CastTilesMaxBlocks() {
  static const int max_blocks = [] {
    int dev = 0, sms = 0, per_sm = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, CastTilesKernel<kE4M3, kGelu, kSums>,
                                                  kVecThreads, 0);
    return std::max(1, sms * std::max(1, per_sm));
  }();
  return max_blocks;
}

// Launches CastTilesKernel over about one wave of blocks: chunks of row tiles per column
// strip. Returns the chunks used (the rows of partial).
template <bool kE4M3, bool kGelu, bool kSums>
cudaError_t LaunchCastTiles(uint8_t* out, uint8_t* out_t, const bf16* inp, const bf16* pre,
                            float* partial, int rows, int cols, int chunks, int per_chunk,
                            const float* scale, float* amax, unsigned long long* counts,
                            cudaStream_t s) {
  const int col_tiles = (cols + kVecTile - 1) / kVecTile;
  CastTilesKernel<kE4M3, kGelu, kSums><<<dim3(col_tiles, chunks), kVecThreads, 0, s>>>(
      out, out_t, inp, pre, partial, rows, cols, per_chunk, scale, amax, counts);
  return cudaGetLastError();
}

// The grid for rows x cols: {chunks, tiles per chunk} filling about max_blocks blocks.
struct TileGrid {
  int chunks, per_chunk;
};
TileGrid PlanTiles(int rows, int cols, int max_blocks) {
  const int col_tiles = (cols + kVecTile - 1) / kVecTile;
  const int row_tiles = (rows + kVecTile - 1) / kVecTile;
  const int want = std::max(1, std::min(row_tiles, max_blocks / col_tiles));
  const int per_chunk = (row_tiles + want - 1) / want;
  return {(row_tiles + per_chunk - 1) / per_chunk, per_chunk};
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
    if (e4m3) {
      const TileGrid g = PlanTiles(rows, cols, CastTilesMaxBlocks<true, false, false>());
      return LaunchCastTiles<true, false, false>(out, out_t, inp, nullptr, nullptr, rows, cols,
                                                 g.chunks, g.per_chunk, scale, amax, counts, s);
    }
    const TileGrid g = PlanTiles(rows, cols, CastTilesMaxBlocks<false, false, false>());
    return LaunchCastTiles<false, false, false>(out, out_t, inp, nullptr, nullptr, rows, cols,
                                                g.chunks, g.per_chunk, scale, amax, counts, s);
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

namespace {

// CastFp8Grad for one combination of format, dGELU and bias gradient.
template <bool kE4M3, bool kGelu, bool kSums>
cudaError_t CastGrad(uint8_t* out, uint8_t* out_t, const bf16* dout, const bf16* pre, bf16* dbias,
                     int rows, int cols, const float* scale, float* amax,
                     unsigned long long* counts, Scratch& scratch, cudaStream_t s) {
  const TileGrid g = PlanTiles(rows, cols, CastTilesMaxBlocks<kE4M3, kGelu, kSums>());
  float* partial = nullptr;
  if (kSums) {
    partial = static_cast<float*>(scratch.Get(sizeof(float) * size_t(g.chunks) * cols));
    if (partial == nullptr) return scratch.last_error();
  }
  cudaError_t err = LaunchCastTiles<kE4M3, kGelu, kSums>(
      out, out_t, dout, pre, partial, rows, cols, g.chunks, g.per_chunk, scale, amax, counts, s);
  if (err != cudaSuccess || !kSums) return err;
  return ColumnFinish(dbias, partial, g.chunks, cols, s);  // dbias += Σ chunks, in chunk order
}

template <bool kE4M3>
cudaError_t CastGradFormat(uint8_t* out, uint8_t* out_t, const bf16* dout, const bf16* pre,
                           bf16* dbias, int rows, int cols, const float* scale, float* amax,
                           unsigned long long* counts, Scratch& scratch, cudaStream_t s) {
  if (pre != nullptr) {
    return dbias != nullptr ? CastGrad<kE4M3, true, true>(out, out_t, dout, pre, dbias, rows, cols,
                                                          scale, amax, counts, scratch, s)
                            : CastGrad<kE4M3, true, false>(out, out_t, dout, pre, dbias, rows, cols,
                                                           scale, amax, counts, scratch, s);
  }
  return dbias != nullptr ? CastGrad<kE4M3, false, true>(out, out_t, dout, pre, dbias, rows, cols,
                                                         scale, amax, counts, scratch, s)
                          : CastGrad<kE4M3, false, false>(out, out_t, dout, pre, dbias, rows, cols,
                                                          scale, amax, counts, scratch, s);
}

}  // namespace

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
