// The vectorised FP8 cast-transpose tile kernel, shared by fp8.cu (CastFp8, CastFp8Grad) and
// fp8_gelu.cu (GeluCastFp8). An element-wise stage (the Op) runs on each 8 BF16 values before
// the cast: none, dGELU, GELU.
//
// For rows and cols multiples of 8, 16-byte-aligned inputs and 8-byte-aligned outputs: 64x64
// tiles, 256 threads. Thread t owns columns 8·(t%8).. +7 of the tile's rows 2·(t/8) and
// 2·(t/8)+1: it loads 16 bytes per row, applies the Op, casts 8 values per instruction group
// (Cast8, fp8_cast.cuh), stores 8 codes per row, and writes each column's two codes (2 bytes)
// into a transposed shared tile whose 8-byte chunks are swizzled by column so that neither
// these writes nor the 8-byte reads that store the transpose collide in banks. A cast without a
// transposed output (out_t null) and without column sums runs an instance without the shared
// tile and its two barriers per tile (kRowsOnly).
//
// Block (x, y) owns the 64-column strip x and the row tiles of chunk y, about one wave of
// blocks in all; the next tile's loads are issued before this tile's arithmetic and stores (in
// flight across them). With column sums (CastFp8Grad's bias gradient) each block writes its
// strip's sums over its chunk into partial[y, cols] (FP32, summed in a fixed order:
// deterministic).
//
// The kernel is a template over the Op; each .cu file instantiates it with its own Op types
// (declared in that file's anonymous namespace, so instantiations compiled with different
// flags never share a symbol). Nothing in the cast depends on -ftz (see fp8_cast.cuh).
#ifndef BOULDER_KERNELS_CUDA_FP8_CAST_TILES_CUH_
#define BOULDER_KERNELS_CUDA_FP8_CAST_TILES_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/fp8_cast.cuh"

namespace boulder::kernels::cuda {

// SetFp8CastRowsOnlyKernels (fp8_ops.h; defined in fp8.cu): whether LaunchCastTiles may run
// the kRowsOnly instance.
bool Fp8CastRowsOnlyKernels();

inline constexpr int kCastTile = 64;
inline constexpr int kCastTileThreads = 256;

// Row r of column c of the transposed tile (the code of tile row r, column c) sits at byte
// SwizzledRow(c, r) of the tile's row c: chunk r/8 exchanged with chunk (r/8) ^ (c/8 % 8).
__device__ __forceinline__ int SwizzledRow(int c, int r) {
  return (((r >> 3) ^ ((c >> 3) & 7)) << 3) | (r & 7);
}

// The 4 x 4 bytes of x (word m: a row, byte b: a column) transposed: y[b] holds column b, row
// m in byte m. Four byte permutes pair the rows' bytes, four more gather each column: the
// word-wise transposes of TransposeFp8 (fp8.cu) and of the LayerNorm + FP8 tile
// (layernorm_fp8.cu).
__device__ __forceinline__ void TransposeBytes4x4(const uint32_t (&x)[4], uint32_t (&y)[4]) {
  const uint32_t lo01 = __byte_perm(x[0], x[1], 0x5140), lo23 = __byte_perm(x[2], x[3], 0x5140);
  const uint32_t hi01 = __byte_perm(x[0], x[1], 0x7362), hi23 = __byte_perm(x[2], x[3], 0x7362);
  y[0] = __byte_perm(lo01, lo23, 0x5410);
  y[1] = __byte_perm(lo01, lo23, 0x7632);
  y[2] = __byte_perm(hi01, hi23, 0x5410);
  y[3] = __byte_perm(hi01, hi23, 0x7632);
}

// The pieces of a tile both tile kernels use (CastTilesBlock here, fp8_gelu.cu's fused GELU +
// gradient cast), so the two form the same transposes and the same column sums. A thread of
// kCastTileThreads owns columns lane_c .. lane_c + 7 of the tile's rows 2·rp and 2·rp + 1.

// Puts this thread's codes of its two rows (q0: row 2·rp, q1: row 2·rp + 1; code j in byte j)
// into the swizzled transposed tile: column lane_c + j gets bytes j of q0 and q1.
__device__ __forceinline__ void PutTransposedCodes(uint8_t (&tile)[kCastTile][kCastTile],
                                                   uint2 q0, uint2 q1, int lane_c, int rp) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const unsigned lo = j < 4 ? q0.x : q0.y, hi = j < 4 ? q1.x : q1.y;
    const unsigned pair = __byte_perm(lo, hi, (j % 4) | ((4 + j % 4) << 4));
    *reinterpret_cast<uint16_t*>(&tile[lane_c + j][SwizzledRow(lane_c + j, 2 * rp)]) =
        static_cast<uint16_t>(pair);
  }
}

// Stores the transposed tile of rows r0.. and columns c0.. into out_t [cols, rows]: row i of
// the tile (input column c0 + i), rows r0 + 8·(t%8) .. + 7, two rows i per thread; and, where
// out_u is not null, tile_u likewise into out_u in the same pass (the fused GELU + gradient
// cast's second tile).
__device__ __forceinline__ void StoreTransposedTile(uint8_t* out_t,
                                                    const uint8_t (&tile)[kCastTile][kCastTile],
                                                    int r0, int c0, int rows, int cols,
                                                    uint8_t* out_u = nullptr,
                                                    const uint8_t (*tile_u)[kCastTile] = nullptr) {
  const int chunk = (threadIdx.x % 8) * 8;
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
    const int i = threadIdx.x / 8 + 32 * pass;
    const int cc = c0 + i, rr = r0 + chunk;
    if (cc < cols && rr < rows) {
      const int sw = SwizzledRow(i, chunk);
      *reinterpret_cast<uint2*>(out_t + size_t(cc) * rows + rr) =
          *reinterpret_cast<const uint2*>(&tile[i][sw]);
      if (out_u != nullptr) {
        *reinterpret_cast<uint2*>(out_u + size_t(cc) * rows + rr) =
            *reinterpret_cast<const uint2*>(&tile_u[i][sw]);
      }
    }
  }
}

// partial[by, c0 + c] = the block's sum of column c0 + c: each thread's 8 column sums (over its
// rows of the block's tiles) added over the threads in rp order (a fixed order). Every thread
// calls it; col_sums is the block's scratch.
__device__ __forceinline__ void StoreColumnSums(float (&col_sums)[kCastTileThreads / 8][kCastTile],
                                                const float (&sums)[8], float* partial, int lane_c,
                                                int rp, int c0, int cols, int by) {
#pragma unroll
  for (int j = 0; j < 8; ++j) col_sums[rp][lane_c + j] = sums[j];
  __syncthreads();
  if (threadIdx.x < kCastTile && c0 + threadIdx.x < cols) {
    float acc = 0.f;
    for (int l = 0; l < kCastTileThreads / 8; ++l) acc += col_sums[l][threadIdx.x];
    partial[size_t(by) * cols + c0 + threadIdx.x] = acc;
  }
}

// The Op concept (8 BF16 values packed in a uint4, value j in half j%2 of word j/2):
//   static constexpr bool kReadsPre;  // whether it needs pre (same shape as inp)
//   static constexpr bool kRowCol;    // whether it needs where the values are (and state)
//   __device__ static uint4 Apply(uint4 x, uint4 p);  // 8 of inp (and of pre) -> 8 to cast
// or, with kRowCol, members of the Op object the launch passes (its state, e.g. pointers) that
// see where the values are: what a row needs, loaded with the row's values (the next tile's
// before this tile's arithmetic), and what a thread's 8 columns need, loaded once:
//   struct Row; struct Cols;
//   __device__ Row LoadRow(int row) const;
//   __device__ Cols LoadCols(int col) const;
//   __device__ uint4 Apply(uint4 x, const Row&, const Cols&) const;  // inp[row, col .. + 7]

// The row and column state of an Op without kRowCol: nothing.
template <class Op, bool = Op::kRowCol>
struct CastOpState {
  struct Row {};
  struct Cols {};
  __device__ static Row LoadRow(const Op&, int) { return {}; }
  __device__ static Cols LoadCols(const Op&, int) { return {}; }
};
template <class Op>
struct CastOpState<Op, true> {
  using Row = typename Op::Row;
  using Cols = typename Op::Cols;
  __device__ static Row LoadRow(const Op& op, int row) { return op.LoadRow(row); }
  __device__ static Cols LoadCols(const Op& op, int col) { return op.LoadCols(col); }
};

template <class Op>
__device__ __forceinline__ uint4 ApplyCastOp(const Op& op, uint4 x, uint4 p,
                                             const typename CastOpState<Op>::Row& row,
                                             const typename CastOpState<Op>::Cols& cols) {
  if constexpr (Op::kRowCol) {
    return op.Apply(x, row, cols);
  } else {
    return Op::Apply(x, p);
  }
}

// Blocks per SM the register allocation must allow: 5 (at most 51 registers) for the plain
// and GELU casts, 4 (64) with a second input, a row/column Op or column sums. Without the
// bound ptxas gives some sm_90 variants 72-80 registers (3 blocks per SM: fewer loads in
// flight). On sm_80 (FP8 only on sm_89 GPUs, converting in software) the column sums keep 3:
// 64 registers spill.
constexpr int CastTilesMinBlocks(bool reads_pre, bool sums) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  if (sums) return 3;
#endif
  return reads_pre || sums ? 4 : 5;
}

// Casts Op(inp, pre) for the tiles of column strip bx, chunk by (a block of
// kCastTileThreads threads: CastTilesKernel's blockIdx.x and .y); see above.
// REQUIRES: rows, cols multiples of 8; inp, pre 16-byte aligned; out, out_t 8-byte aligned;
// with kRowsOnly, out_t null and no kSums.
template <bool kE4M3, class Op, bool kSums, bool kRowsOnly = false>
__device__ __forceinline__ void CastTilesBlock(uint8_t* out, uint8_t* out_t,
                                               const __nv_bfloat16* __restrict__ inp,
                                               const __nv_bfloat16* __restrict__ pre,
                                               float* partial, int rows, int cols,
                                               int tiles_per_chunk, const float* scale_p,
                                               float* amax, unsigned long long* counts,
                                               const Op& op, int bx, int by) {
  __shared__ __align__(16) uint8_t tile_t[kCastTile][kCastTile];
  __shared__ float col_sums[kSums ? kCastTileThreads / 8 : 1][kSums ? kCastTile : 1];
  __shared__ BlockCastStats s_stats;
  InitBlockCastStats(s_stats, threadIdx.x);
  __syncthreads();
  const float scale = *scale_p;
  const int lane_c = (threadIdx.x % 8) * 8;  // this thread's first column of the tile
  const int rp = threadIdx.x / 8;            // its rows 2·rp and 2·rp + 1
  const int c0 = bx * kCastTile, c = c0 + lane_c;
  const int row_tiles = (rows + kCastTile - 1) / kCastTile;
  const int t_begin = by * tiles_per_chunk;
  const int t_end = min(row_tiles, t_begin + tiles_per_chunk);
  float sums[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  CastStats st;
  // Rows and cols are multiples of 8: a thread's two rows and 8 columns are all in range or
  // none.
  uint4 next_x[2], next_p[2];
  using State = CastOpState<Op>;
  typename State::Row next_row[2];
  typename State::Cols col_state;
  if (c < cols) col_state = State::LoadCols(op, c);
  auto load = [&](int t) {
    const int r = t * kCastTile + 2 * rp;
    if (r < rows && c < cols) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        next_x[k] = *reinterpret_cast<const uint4*>(inp + size_t(r + k) * cols + c);
        if (Op::kReadsPre) {
          next_p[k] = *reinterpret_cast<const uint4*>(pre + size_t(r + k) * cols + c);
        }
        next_row[k] = State::LoadRow(op, r + k);
      }
    }
  };
  if (t_begin < t_end) load(t_begin);
  for (int t = t_begin; t < t_end; ++t) {
    const int r0 = t * kCastTile, r = r0 + 2 * rp;
    const bool in_range = r < rows && c < cols;
    uint4 g[2] = {next_x[0], next_x[1]};
    const typename State::Row row_state[2] = {next_row[0], next_row[1]};
    // Without pre the next tile's loads go out before the stage's arithmetic (GELU's); with it
    // (dGELU) after, when next_p is free again.
    if (!Op::kReadsPre && t + 1 < t_end) load(t + 1);
    if (in_range) {
#pragma unroll
      for (int k = 0; k < 2; ++k) g[k] = ApplyCastOp(op, g[k], next_p[k], row_state[k], col_state);
    }
    if (Op::kReadsPre && t + 1 < t_end) load(t + 1);
    if (!kRowsOnly) __syncthreads();  // the previous tile's transpose has been read out of tile_t
    if (in_range) {
      uint2 q[2];
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        float v[8];
        q[k] = Cast8<kE4M3>(g[k], scale, st, v);
        if (kSums) {
#pragma unroll
          for (int j = 0; j < 8; ++j) sums[j] += v[j];
        }
        if (out != nullptr) *reinterpret_cast<uint2*>(out + size_t(r + k) * cols + c) = q[k];
      }
      if (!kRowsOnly) PutTransposedCodes(tile_t, q[0], q[1], lane_c, rp);
    }
    if (kRowsOnly) continue;
    __syncthreads();
    if (out_t != nullptr) StoreTransposedTile(out_t, tile_t, r0, c0, rows, cols);
  }
  if constexpr (kSums) StoreColumnSums(col_sums, sums, partial, lane_c, rp, c0, cols, by);
  FlushCastStats(st, s_stats, threadIdx.x, amax, counts);  // synchronises before it reads
}

template <bool kE4M3, class Op, bool kSums, bool kRowsOnly = false>
__global__ void __launch_bounds__(kCastTileThreads,
                                  CastTilesMinBlocks(Op::kReadsPre || Op::kRowCol, kSums))
    CastTilesKernel(uint8_t* out, uint8_t* out_t, const __nv_bfloat16* __restrict__ inp,
                    const __nv_bfloat16* __restrict__ pre, float* partial, int rows, int cols,
                    int tiles_per_chunk, const float* scale_p, float* amax,
                    unsigned long long* counts, const Op op) {
  CastTilesBlock<kE4M3, Op, kSums, kRowsOnly>(out, out_t, inp, pre, partial, rows, cols,
                                              tiles_per_chunk, scale_p, amax, counts, op,
                                              blockIdx.x, blockIdx.y);
}

// How many blocks of kernel, kCastTileThreads threads each, fill the current device once (at
// least 1).
inline int CastTileBlocksFillingDevice(const void* kernel) {
  int dev = 0, sms = 0, per_sm = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kCastTileThreads, 0);
  return std::max(1, sms * std::max(1, per_sm));
}

// How many blocks of CastTilesKernel<kE4M3, Op, kSums> fill the current device once.
template <bool kE4M3, class Op, bool kSums>
int CastTilesMaxBlocks() {
  static const int max_blocks = CastTileBlocksFillingDevice(
      reinterpret_cast<const void*>(CastTilesKernel<kE4M3, Op, kSums>));
  return max_blocks;
}

// The grid for rows x cols: {chunks, tiles per chunk} filling about max_blocks blocks.
struct CastTileGrid {
  int chunks, per_chunk;
};
inline CastTileGrid PlanCastTiles(int rows, int cols, int max_blocks) {
  const int col_tiles = (cols + kCastTile - 1) / kCastTile;
  const int row_tiles = (rows + kCastTile - 1) / kCastTile;
  const int want = std::max(1, std::min(row_tiles, max_blocks / col_tiles));
  const int per_chunk = (row_tiles + want - 1) / want;
  return {(row_tiles + per_chunk - 1) / per_chunk, per_chunk};
}

// The grid CastFp8Grad plans for rows x cols (fp8.cu), in the format (e4m3) with or without
// dGELU and column sums: one wave of its kernel, and with dGELU one wave of the fused GELU +
// gradient cast (GeluCastAndGradMaxBlocks: fewer blocks fit per SM), which the MLP backward
// runs in its place. A kernel that must give CastFp8Grad's column sums bit for bit (the same
// chunks of rows) uses it.
CastTileGrid CastFp8GradGrid(int rows, int cols, bool e4m3, bool dgelu, bool sums);
// How many blocks of GeluCastFp8AndGrad's kernel (fp8_gelu.cu) fill the current device once,
// the fewest over its input formats, for the gradient format (e4m3) with or without sums.
int GeluCastAndGradMaxBlocks(bool e4m3, bool sums);

// Launches CastTilesKernel over about one wave of blocks: chunks of row tiles per column
// strip, g.chunks of them (the rows of partial), with op (for an Op with kRowCol); its
// kRowsOnly instance where there is neither a transposed output nor column sums. Returns the
// launch's error.
template <bool kE4M3, class Op, bool kSums>
cudaError_t LaunchCastTiles(uint8_t* out, uint8_t* out_t, const __nv_bfloat16* inp,
                            const __nv_bfloat16* pre, float* partial, int rows, int cols,
                            const CastTileGrid& g, const float* scale, float* amax,
                            unsigned long long* counts, cudaStream_t s, const Op& op = Op{}) {
  const int col_tiles = (cols + kCastTile - 1) / kCastTile;
  const dim3 grid(col_tiles, g.chunks);
  if constexpr (!kSums) {
    if (out_t == nullptr && Fp8CastRowsOnlyKernels()) {
      CastTilesKernel<kE4M3, Op, false, true><<<grid, kCastTileThreads, 0, s>>>(
          out, out_t, inp, pre, partial, rows, cols, g.per_chunk, scale, amax, counts, op);
      return cudaGetLastError();
    }
  }
  CastTilesKernel<kE4M3, Op, kSums><<<grid, kCastTileThreads, 0, s>>>(
      out, out_t, inp, pre, partial, rows, cols, g.per_chunk, scale, amax, counts, op);
  return cudaGetLastError();
}

}  // namespace boulder::kernels::cuda

#endif  // BOULDER_KERNELS_CUDA_FP8_CAST_TILES_CUH_
