// The fused GELU + FP8 cast(-transpose) of fc2's input (Backend::GeluCastFp8): one read of
// fc1's BF16 pre-activation, one FP8 write (row-major and/or transposed), no BF16 GELU output.
//
// Bit-exact with the default path (GeluForward, then CastFp8): this file is compiled with the
// same flags as elementwise.cu (kernels_cuda, --use_fast_math) and calls the same GeluTanh, so
// g = bf16(GeluTanh(pre)) is GeluForward's value; the scaling multiply is an explicit
// mul.rn.f32 without .ftz (fp8.cu's __fmul_rn is compiled without fast math), then the same
// cvt.rn.satfinite conversion. The statistics are CastFp8's: amax as the largest bit pattern
// of |g| (NaN beats inf), saturated / underflow / non-finite counts.
//
// One 64x64 tile per block of 256 threads: each thread converts 8 consecutive columns of 2
// rows (one 16-byte load each where the row is 8-aligned), the tile goes through shared
// memory, and each thread writes 8 consecutive rows of 2 transposed rows (8-byte stores where
// aligned). Partial tiles and unaligned shapes take per-element paths.
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_gelu_ops.h"
#include "kernels/fp8_recipe.h"

namespace boulder::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kTile = 64;
constexpr int kThreads = 256;
constexpr int kGroup = 8;                                  // columns (rows) per thread and pass
constexpr int kRowsPerPass = kThreads / (kTile / kGroup);  // 32

struct Stats {
  unsigned int amax = 0, saturated = 0, underflow = 0, non_finite = 0;
};

__device__ __forceinline__ float MulRn(float a, float b) {
  float y;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b));  // IEEE: no flush to zero
  return y;
}

// q = fp8(bf16(gelu(p)) · scale), counted into st.
__device__ __forceinline__ uint8_t GeluCastOne(bf16 p, float scale, float fp8_max, bool e4m3,
                                               Stats& st) {
  const float g = __bfloat162float(__float2bfloat16(GeluTanh(__bfloat162float(p))));
  const float y = MulRn(g, scale);
  const uint8_t q = e4m3 ? __nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3)
                         : __nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E5M2);
  const unsigned int bits = __float_as_uint(g) & 0x7FFFFFFFu;  // |g|
  st.amax = max(st.amax, bits);
  if (bits >= 0x7F800000u) {
    ++st.non_finite;
  } else {
    if (fabsf(y) > fp8_max) ++st.saturated;
    if (bits != 0 && (q & 0x7F) == 0) ++st.underflow;
  }
  return q;
}

__global__ void __launch_bounds__(kThreads)
    GeluCastFp8Kernel(uint8_t* out, uint8_t* out_t, const bf16* pre, int rows, int cols, bool e4m3,
                      const float* scale_p, float* amax, unsigned long long* counts, bool vec_in,
                      bool vec_out, bool vec_out_t) {
  // Rows padded to 72 bytes: 8-byte aligned for the uint2 writes.
  __shared__ __align__(8) uint8_t tile[kTile][kTile + kGroup];
  __shared__ unsigned int s_amax, s_counts[3];
  const int tid = threadIdx.x;
  if (tid == 0) s_amax = 0, s_counts[0] = s_counts[1] = s_counts[2] = 0;
  __syncthreads();
  const float scale = *scale_p;
  const float fp8_max = e4m3 ? kFp8E4M3Max : kFp8E5M2Max;
  const int c0 = blockIdx.x * kTile, r0 = blockIdx.y * kTile;
  const int group = tid % (kTile / kGroup), lane_row = tid / (kTile / kGroup);
  Stats st;
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
  // Statistics: per warp, per block (shared atomics), one global atomic each per block.
  st.amax = __reduce_max_sync(0xffffffffu, st.amax);
  st.saturated = __reduce_add_sync(0xffffffffu, st.saturated);
  st.underflow = __reduce_add_sync(0xffffffffu, st.underflow);
  st.non_finite = __reduce_add_sync(0xffffffffu, st.non_finite);
  if (tid % 32 == 0) {
    atomicMax(&s_amax, st.amax);
    if (st.saturated) atomicAdd(&s_counts[0], st.saturated);
    if (st.underflow) atomicAdd(&s_counts[1], st.underflow);
    if (st.non_finite) atomicAdd(&s_counts[2], st.non_finite);
  }
  __syncthreads();
  if (tid == 0) {
    if (s_amax) atomicMax(reinterpret_cast<unsigned int*>(amax), s_amax);
    for (int k = 0; k < 3; ++k) {
      if (s_counts[k]) atomicAdd(&counts[k], static_cast<unsigned long long>(s_counts[k]));
    }
  }
}

bool Aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

cudaError_t GeluCastFp8(uint8_t* out, uint8_t* out_t, const bf16* pre, int rows, int cols,
                        bool e4m3, const float* scale, float* amax, unsigned long long* counts,
                        cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const bool vec_in = cols % kGroup == 0 && Aligned(pre, 16);
  const bool vec_out = vec_in && Aligned(out, 8);
  const bool vec_out_t = rows % kGroup == 0 && Aligned(out_t, 8);
  const dim3 grid(CeilDiv(cols, kTile), CeilDiv(rows, kTile));
  GeluCastFp8Kernel<<<grid, kThreads, 0, s>>>(out, out_t, pre, rows, cols, e4m3, scale, amax,
                                              counts, vec_in, vec_out, vec_out_t);
  return cudaGetLastError();
}

}  // namespace boulder::kernels::cuda
