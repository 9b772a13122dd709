// The FP8 cast's encoding and statistics (Backend::CastFp8), shared by every kernel that
// writes FP8: fp8.cu's cast-transposes and layernorm.cu's fused LayerNorm + cast.
//
// Each element is scaled in FP32 and converted with cvt.rn.satfinite (round to nearest even,
// finite overflow and ±inf clamp to ±max, NaN stays NaN) — the encoding kernels/cpu/fp8.cc
// emulates. amax is a max over |x| as unsigned bit patterns (valid for non-negative floats;
// NaN beats inf), reduced per warp, per block, then one atomicMax per block; the counters
// likewise (one 64-bit atomicAdd per block and counter).
//
// Independent of the compile flags: fp8.cu is built without --use_fast_math, layernorm.cu
// with it (-ftz=true, which flushes subnormal operands of float multiplies and comparisons).
// The scale multiply is an explicit non-flushing mul.rn.f32 and the zero test a bit test, so
// the bytes and counts are the same in both.
#ifndef BOULDER_KERNELS_CUDA_FP8_CAST_CUH_
#define BOULDER_KERNELS_CUDA_FP8_CAST_CUH_

#include <cuda_fp8.h>

#include <cstdint>

namespace boulder::kernels::cuda {

__device__ __forceinline__ uint8_t ToFp8(float y, bool e4m3) {
  return e4m3 ? __nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3)
              : __nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E5M2);
}

// x · scale rounded to nearest even, subnormals kept whatever -ftz says.
__device__ __forceinline__ float MulRnNoFtz(float x, float scale) {
  float y;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(y) : "f"(x), "f"(scale));
  return y;
}

// One thread's statistics of a cast (see Backend::CastFp8): amax as the bit pattern of |x|.
struct CastStats {
  unsigned int amax = 0, saturated = 0, underflow = 0, non_finite = 0;
};

// q = fp8(x · scale), counted into st.
__device__ __forceinline__ uint8_t CastOne(float x, float scale, float fp8_max, bool e4m3,
                                           CastStats& st) {
  const float y = MulRnNoFtz(x, scale);
  const uint8_t q = ToFp8(y, e4m3);
  const unsigned int abs_x = __float_as_uint(x) & 0x7FFFFFFFu;
  st.amax = max(st.amax, abs_x);
  if (abs_x >= 0x7F800000u) {  // inf or NaN
    ++st.non_finite;
  } else {
    // |y| > max: y is finite or inf here, never a subnormal, so -ftz cannot change this.
    if (fabsf(y) > fp8_max) ++st.saturated;
    if (abs_x != 0 && (q & 0x7F) == 0) ++st.underflow;
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

}  // namespace boulder::kernels::cuda

#endif  // BOULDER_KERNELS_CUDA_FP8_CAST_CUH_
