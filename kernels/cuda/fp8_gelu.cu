// The fused GELU + FP8 cast(-transpose) of fc2's input (Backend::GeluCastFp8): one read of
// fc1's BF16 pre-activation, one FP8 write (row-major and/or transposed), no BF16 GELU output.
//
// Bit-exact with the default path (GeluForward, then CastFp8): this file is compiled with the
// same flags as elementwise.cu (kernels_cuda, --use_fast_math: tanhf is tanh.approx.f32, the
// multiplies flush subnormals) and calls the same GeluTanh, so g = bf16(GeluTanh(pre)) is
// GeluForward's value (the pairs rounded by cvt.rn.bf16x2.f32, the same rounding as
// GeluForward's cvt.rn.bf16.f32). The cast is CastFp8's own code (fp8_cast.cuh, independent
// of -ftz): a non-flushing mul.rn.f32 by the scale, cvt.rn.satfinite, amax as the largest bit
// pattern of |g| (NaN beats inf), saturated / underflow / non-finite counts.
//
// Rows and cols multiples of 8 with aligned pointers (every FP8 GEMM operand) take CastFp8's
// tile kernel (fp8_cast_tiles.cuh) with GELU as its stage: 16-byte loads, 8 values per
// instruction group, a swizzled transpose tile, the next tile's loads in flight, about one wave
// of blocks. Other shapes take a per-element 64x64 tile kernel (GeluCastFp8AnyShape).
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_cast.cuh"
#include "kernels/cuda/fp8_cast_tiles.cuh"
#include "kernels/cuda/fp8_gelu_ops.h"
#include "kernels/fp8_recipe.h"

namespace boulder::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;

// The stage before the cast: g = bf16(GeluTanh(x)) for 8 packed BF16 values.
struct GeluOp {
  static constexpr bool kReadsPre = false;
  static constexpr bool kRowCol = false;
  __device__ __forceinline__ static uint4 Apply(uint4 x, uint4) {
    const unsigned w[4] = {x.x, x.y, x.z, x.w};
    unsigned g[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(GeluTanh(__uint_as_float(w[k] << 16)),
                                                     GeluTanh(__uint_as_float(w[k] & 0xffff0000u)));
      g[k] = *reinterpret_cast<const unsigned*>(&h);  // the low half from the low input
    }
    return make_uint4(g[0], g[1], g[2], g[3]);
  }
};

template <bool kE4M3>
cudaError_t LaunchGeluTiles(uint8_t* out, uint8_t* out_t, const bf16* pre, int rows, int cols,
                            const float* scale, float* amax, unsigned long long* counts,
                            cudaStream_t s) {
  const CastTileGrid g = PlanCastTiles(rows, cols, CastTilesMaxBlocks<kE4M3, GeluOp, false>());
  return LaunchCastTiles<kE4M3, GeluOp, false>(out, out_t, pre, nullptr, nullptr, rows, cols, g,
                                               scale, amax, counts, s);
}

// Any shape: one 64x64 tile per block of 256 threads; each thread converts 8 consecutive
// columns of 2 rows (one 16-byte load each where the row is 8-aligned), the tile goes through
// shared memory, and each thread writes 8 consecutive rows of 2 transposed rows (8-byte stores
// where aligned). Partial tiles and unaligned shapes take per-element paths.
constexpr int kTile = 64;
constexpr int kThreads = 256;
constexpr int kGroup = 8;                                  // columns (rows) per thread and pass
constexpr int kRowsPerPass = kThreads / (kTile / kGroup);  // 32

// q = fp8(bf16(gelu(p)) · scale), counted into st.
__device__ __forceinline__ uint8_t GeluCastOne(bf16 p, float scale, float fp8_max, bool e4m3,
                                               CastStats& st) {
  const float g = __bfloat162float(__float2bfloat16(GeluTanh(__bfloat162float(p))));
  return CastOne(g, scale, fp8_max, e4m3, st);
}

__global__ void __launch_bounds__(kThreads)
    GeluCastFp8Kernel(uint8_t* out, uint8_t* out_t, const bf16* pre, int rows, int cols, bool e4m3,
                      const float* scale_p, float* amax, unsigned long long* counts, bool vec_in,
                      bool vec_out, bool vec_out_t) {
  // Rows padded to 72 bytes: 8-byte aligned for the uint2 writes.
  __shared__ __align__(8) uint8_t tile[kTile][kTile + kGroup];
  __shared__ BlockCastStats s_stats;
  const int tid = threadIdx.x;
  InitBlockCastStats(s_stats, tid);
  __syncthreads();
  const float scale = *scale_p;
  const float fp8_max = e4m3 ? kFp8E4M3Max : kFp8E5M2Max;
  const int c0 = blockIdx.x * kTile, r0 = blockIdx.y * kTile;
  const int group = tid % (kTile / kGroup), lane_row = tid / (kTile / kGroup);
  CastStats st;
  for (int i = lane_row; i < kTile; i += kRowsPerPass) {
    const int r = r0 + i, c = c0 + group * kGroup;
    union {
      uint8_t b[kGroup];
      uint2 v;
    } q;
    q.v = make_uint2(0, 0);
    if (r < rows) {
      const size_t at = size_t(r) * cols + c;
      if (vec_in && c + kGroup <= cols) {
        const Bf16x8 x = Load8(pre + at);
#pragma unroll
        for (int k = 0; k < kGroup; ++k) q.b[k] = GeluCastOne(x.v[k], scale, fp8_max, e4m3, st);
        if (out != nullptr) {
          if (vec_out) {
            *reinterpret_cast<uint2*>(out + at) = q.v;
          } else {
            for (int k = 0; k < kGroup; ++k) out[at + k] = q.b[k];
          }
        }
      } else {
        for (int k = 0; k < kGroup && c + k < cols; ++k) {
          q.b[k] = GeluCastOne(pre[at + k], scale, fp8_max, e4m3, st);
          if (out != nullptr) out[at + k] = q.b[k];
        }
      }
    }
    *reinterpret_cast<uint2*>(&tile[i][group * kGroup]) = q.v;
  }
  __syncthreads();
  if (out_t != nullptr) {
    // Thread: 8 consecutive rows (group) of transposed rows j = lane_row, lane_row + 32.
    for (int j = lane_row; j < kTile; j += kRowsPerPass) {
      const int c = c0 + j, r = r0 + group * kGroup;
      if (c >= cols || r >= rows) continue;
      union {
        uint8_t b[kGroup];
        uint2 v;
      } t;
#pragma unroll
      for (int k = 0; k < kGroup; ++k) t.b[k] = tile[group * kGroup + k][j];
      const size_t at = size_t(c) * rows + r;
      if (vec_out_t && r + kGroup <= rows) {
        *reinterpret_cast<uint2*>(out_t + at) = t.v;
      } else {
        for (int k = 0; k < kGroup && r + k < rows; ++k) out_t[at + k] = t.b[k];
      }
    }
  }
  FlushCastStats(st, s_stats, tid, amax, counts);
}

bool Aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

cudaError_t GeluCastFp8AnyShape(uint8_t* out, uint8_t* out_t, const bf16* pre, int rows, int cols,
                                bool e4m3, const float* scale, float* amax,
                                unsigned long long* counts, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const bool vec_in = cols % kGroup == 0 && Aligned(pre, 16);
  const bool vec_out = vec_in && Aligned(out, 8);
  const bool vec_out_t = rows % kGroup == 0 && Aligned(out_t, 8);
  const dim3 grid(CeilDiv(cols, kTile), CeilDiv(rows, kTile));
  GeluCastFp8Kernel<<<grid, kThreads, 0, s>>>(out, out_t, pre, rows, cols, e4m3, scale, amax,
                                              counts, vec_in, vec_out, vec_out_t);
  return cudaGetLastError();
}

cudaError_t GeluCastFp8(uint8_t* out, uint8_t* out_t, const bf16* pre, int rows, int cols,
                        bool e4m3, const float* scale, float* amax, unsigned long long* counts,
                        cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (rows % 8 == 0 && cols % 8 == 0 && Aligned(pre, 16) && Aligned(out, 8) && Aligned(out_t, 8)) {
    return e4m3 ? LaunchGeluTiles<true>(out, out_t, pre, rows, cols, scale, amax, counts, s)
                : LaunchGeluTiles<false>(out, out_t, pre, rows, cols, scale, amax, counts, s);
  }
  return GeluCastFp8AnyShape(out, out_t, pre, rows, cols, e4m3, scale, amax, counts, s);
}

}  // namespace boulder::kernels::cuda
