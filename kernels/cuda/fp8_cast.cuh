// The FP8 cast's encoding and statistics (Backend::CastFp8), shared by every kernel that
// writes FP8: fp8.cu's cast-transposes, fp8_gelu.cu's GELU + cast and layernorm_fp8.cu's
// fused LayerNorm + cast. CastOne does one value, Cast8 eight packed BF16 values
// (bit-identical).
//
// Each element is scaled in FP32 and converted with cvt.rn.satfinite (round to nearest even,
// finite overflow and ±inf clamp to ±max, NaN stays NaN) — the encoding kernels/cpu/fp8.cc
// emulates. amax is a max over |x| as unsigned bit patterns (valid for non-negative floats;
// NaN beats inf), reduced per warp, per block, then one atomicMax per block; the counters
// likewise (one 64-bit atomicAdd per block and counter).
//
// Independent of the compile flags: fp8.cu is built without --use_fast_math,
// layernorm_fp8.cu with it (-ftz=true, which flushes subnormal operands of float multiplies
// and comparisons). The scale multiply is an explicit non-flushing mul.rn.f32 and the zero
// and non-finite tests bit tests, so the bytes and counts are the same in both.
#ifndef BOULDER_KERNELS_CUDA_FP8_CAST_CUH_
#define BOULDER_KERNELS_CUDA_FP8_CAST_CUH_

#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/fp8_recipe.h"

namespace boulder::kernels::cuda {

__device__ __forceinline__ uint8_t ToFp8(float y, bool e4m3) {
  return e4m3 ? __nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3)
              : __nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E5M2);
}

// x · scale rounded to nearest even, subnormals kept whatever -ftz says. (In host C++, as the
// emulation tests (emulated_gpu.h) compile the FP8 GEMM's and the attention's epilogues: a
// plain multiply, which flushes nothing there.)
__device__ __forceinline__ float MulRnNoFtz(float x, float scale) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(y) : "f"(x), "f"(scale));
  return y;
#else
  return x * scale;
#endif
}

// One thread's statistics of a cast (see Backend::CastFp8): amax as the bit pattern of |x|.
struct CastStats {
  unsigned int amax = 0, saturated = 0, underflow = 0, non_finite = 0;
};

// The statistics of one value x cast as code q from y = x · scale.
__device__ __forceinline__ void CountOne(float x, float y, unsigned q, float fp8_max,
                                         CastStats& st) {
  const unsigned int abs_x = __float_as_uint(x) & 0x7FFFFFFFu;
  st.amax = max(st.amax, abs_x);
  if (abs_x >= 0x7F800000u) {  // inf or NaN
    ++st.non_finite;
  } else {
    // |y| > max: y is finite or inf here, never a subnormal, so -ftz cannot change this.
    if (fabsf(y) > fp8_max) ++st.saturated;
    if (abs_x != 0 && (q & 0x7F) == 0) ++st.underflow;
  }
}

// q = fp8(x · scale), counted into st.
__device__ __forceinline__ uint8_t CastOne(float x, float scale, float fp8_max, bool e4m3,
                                           CastStats& st) {
  const float y = MulRnNoFtz(x, scale);
  const uint8_t q = ToFp8(y, e4m3);
  CountOne(x, y, q, fp8_max, st);
  return q;
}

// Two FP32 values -> two FP8 codes (a in the low byte), as ToFp8 does each.
template <bool kE4M3>
__device__ __forceinline__ unsigned ToFp8x2(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kE4M3 ? __NV_E4M3 : __NV_E5M2);
}

// Two values -> their FP8 codes (x0's in the low byte), counted into st exactly as CastOne
// counts each, the per-value tests only where the pair needs them: saturation and non-finite
// values where the larger magnitude's product passes the format's max (|x·scale| grows with
// |x|; NaN fails every comparison), underflow where a code has magnitude 0.
template <bool kE4M3>
__device__ __forceinline__ unsigned Cast2(float x0, float x1, float scale, CastStats& st) {
  constexpr float kMax = kE4M3 ? kFp8E4M3Max : kFp8E5M2Max;
  const float y0 = MulRnNoFtz(x0, scale), y1 = MulRnNoFtz(x1, scale);
  const unsigned q = ToFp8x2<kE4M3>(y0, y1);
  const unsigned m = max(__float_as_uint(x0) & 0x7FFFFFFFu, __float_as_uint(x1) & 0x7FFFFFFFu);
  st.amax = max(st.amax, m);
  if (!(MulRnNoFtz(__uint_as_float(m), scale) <= kMax) || (q & 0x7Fu) == 0 || (q & 0x7F00u) == 0) {
    CastStats one;  // CastOne's counts of each (amax is counted above)
    CountOne(x0, y0, q & 0xFFu, kMax, one);
    CountOne(x1, y1, q >> 8, kMax, one);
    st.saturated += one.saturated;
    st.underflow += one.underflow;
    st.non_finite += one.non_finite;
  }
  return q;
}

// 8 BF16 values packed in g (value j in half j%2 of word j/2, low half first) -> their FP8
// codes (code j in byte j of the result) and the values as FP32 in x, counted into st exactly
// as CastOne counts each: amax over the packed BF16 patterns, paired conversions, the
// saturation test only where the group can saturate, underflow only where a code is zero.
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
  q.x = ToFp8x2<kE4M3>(MulRnNoFtz(x[0], scale), MulRnNoFtz(x[1], scale)) |
        (ToFp8x2<kE4M3>(MulRnNoFtz(x[2], scale), MulRnNoFtz(x[3], scale)) << 16);
  q.y = ToFp8x2<kE4M3>(MulRnNoFtz(x[4], scale), MulRnNoFtz(x[5], scale)) |
        (ToFp8x2<kE4M3>(MulRnNoFtz(x[6], scale), MulRnNoFtz(x[7], scale)) << 16);
  // |x·scale| is monotonic in |x|: nothing saturates or is non-finite unless the largest does.
  // (A flushed subnormal product compares as 0 <= kMax, as the product itself does.)
  if (!(MulRnNoFtz(__uint_as_float(m), scale) <= kMax)) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if ((__float_as_uint(x[j]) & 0x7fffffffu) >= 0x7f800000u) {  // inf or NaN
        ++st.non_finite;
      } else if (fabsf(MulRnNoFtz(x[j], scale)) > kMax) {
        ++st.saturated;
      }
    }
  }
  // Underflow: codes of magnitude 0 from non-zero inputs. Only ±0 inputs give such codes
  // otherwise (inf and NaN never do), so count the zero codes and take away the zero inputs.
  // Magnitudes are below 0x80, so a byte of m - 0x01010101 has its top bit set only where
  // that byte or one below it is zero: any zero code shows, and most groups have none.
  const unsigned mx = q.x & 0x7f7f7f7fu, my = q.y & 0x7f7f7f7fu;
  if (((mx - 0x01010101u) | (my - 0x01010101u)) & 0x80808080u) {
    const unsigned zero_codes = __popc(__vcmpeq4(mx, 0u)) + __popc(__vcmpeq4(my, 0u));
    const unsigned zero_inputs =
        __popc(__vcmpeq2(w[0] & 0x7fff7fffu, 0u)) + __popc(__vcmpeq2(w[1] & 0x7fff7fffu, 0u)) +
        __popc(__vcmpeq2(w[2] & 0x7fff7fffu, 0u)) + __popc(__vcmpeq2(w[3] & 0x7fff7fffu, 0u));
    st.underflow += zero_codes / 8 - zero_inputs / 16;
  }
  return q;
}

// One warp's statistics into amax and counts (saturated, underflow, non-finite): a reduction
// over the warp, then lane 0's atomics where non-zero. Every lane of the warp calls it.
__device__ __forceinline__ void FlushWarpCastStats(CastStats st, float* amax,
                                                   unsigned long long* counts, int lane) {
  st.amax = __reduce_max_sync(0xffffffffu, st.amax);
  st.saturated = __reduce_add_sync(0xffffffffu, st.saturated);
  st.underflow = __reduce_add_sync(0xffffffffu, st.underflow);
  st.non_finite = __reduce_add_sync(0xffffffffu, st.non_finite);
  if (lane == 0) {
    if (st.amax) atomicMax(reinterpret_cast<unsigned int*>(amax), st.amax);
    const unsigned int n[3] = {st.saturated, st.underflow, st.non_finite};
    for (int k = 0; k < 3; ++k) {
      if (n[k]) atomicAdd(&counts[k], static_cast<unsigned long long>(n[k]));
    }
  }
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
