// Causal flash attention (online softmax; no T×T matrix in global memory), BF16 tensor cores
// through WMMA, head size 64 or 128. Scores are scaled by 1/sqrt(HS).
//
// Tiles of 64 queries × 64 keys; a block of 4 warps, each warp owning 16 rows of a tile, so
// the softmax and most products need only warp-level synchronisation.
//   Forward: per query tile, loop over key tiles up to the diagonal; S = Q·Kᵀ, running row
//     max m and sum l, O = O·e^(m_old-m_new) + P·V in FP32 shared memory; out = O / l,
//     stats = m + log l (log-sum-exp of the scaled scores, saved for the backward).
//   Backward (deterministic: no atomics): D = rowsum(dO ∘ O); then one kernel per key tile
//     accumulates dK, dV over the query tiles at or after it, and one kernel per query tile
//     accumulates dQ over the key tiles up to it. P is recomputed from Q, K and the stats.
//     dK, dV and dQ accumulate in registers (WMMA fragments), so a head size of 64 fits two
//     blocks per multiprocessor.
//     dS = P ∘ (dP − D), dQ = scale·dS·K, dK = scale·dSᵀ·Q, dV = Pᵀ·dO. Every element of
//     dqkv is written (=).
#include <mma.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace boulder::kernels::cuda {
namespace {

using namespace nvcuda;

constexpr int kTile = 64;
constexpr int kThreads = 128;
constexpr int kSLd = kTile + 4;  // FP32 score tile row stride
constexpr int kPLd = kTile + 8;  // BF16 probability tile row stride

template <int HS>
struct Dims {
  static constexpr int kLd = HS + 8;   // BF16 Q/K/V tile row stride
  static constexpr int kOLd = HS + 4;  // FP32 accumulator row stride
  static constexpr int kTileBytes = kTile * kLd * 2;
  static constexpr int kSBytes = kTile * kSLd * 4;
  static constexpr int kPBytes = kTile * kPLd * 2;
  static constexpr int kOBytes = kTile * kOLd * 4;
};

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Loads rows [row0, row0 + 64) of one head's q, k or v (or of a [B,T,C] tensor when
// row_stride == C) into a shared tile; rows at or past T are zero.
template <int HS>
__device__ void LoadTile(bf16* tile, const bf16* base, int row0, int T, size_t row_stride) {
  constexpr int kVecs = HS / 8;
  for (int i = threadIdx.x; i < kTile * kVecs; i += kThreads) {
    int r = i / kVecs, c = (i % kVecs) * 8;
    int4 v = make_int4(0, 0, 0, 0);
    if (row0 + r < T) v = *reinterpret_cast<const int4*>(base + size_t(row0 + r) * row_stride + c);
    *reinterpret_cast<int4*>(tile + r * Dims<HS>::kLd + c) = v;
  }
}

// out_strip[16 × 64] (FP32, ld kSLd) = a_strip[16 × HS] · bᵀ where b is a [64 × HS] tile.
template <int HS>
__device__ void StripTimesTileT(float* out, const bf16* a, const bf16* b) {
  constexpr int kLd = Dims<HS>::kLd;
#pragma unroll
  for (int j = 0; j < kTile / 16; ++j) {
    FragC acc;
    wmma::fill_fragment(acc, 0.f);
#pragma unroll
    for (int k = 0; k < HS / 16; ++k) {
      FragA fa;
      FragBT fb;
      wmma::load_matrix_sync(fa, a + k * 16, kLd);
      wmma::load_matrix_sync(fb, b + j * 16 * kLd + k * 16, kLd);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + j * 16, acc, kSLd, wmma::mem_row_major);
  }
}

// acc_strip[16 × HS] (FP32, ld kOLd, in shared memory: the forward rescales its rows between
// key tiles) += p_strip[16 × 64] (BF16, ld kPLd) · v[64 × HS].
template <int HS>
__device__ void AccumulatePV(float* acc_strip, const bf16* p, const bf16* v) {
  constexpr int kLd = Dims<HS>::kLd, kOLd = Dims<HS>::kOLd;
#pragma unroll
  for (int j = 0; j < HS / 16; ++j) {
    FragC acc;
    wmma::load_matrix_sync(acc, acc_strip + j * 16, kOLd, wmma::mem_row_major);
#pragma unroll
    for (int k = 0; k < kTile / 16; ++k) {
      FragA fa;
      FragB fb;
      wmma::load_matrix_sync(fa, p + k * 16, kPLd);
      wmma::load_matrix_sync(fb, v + k * 16 * kLd + j * 16, kLd);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(acc_strip + j * 16, acc, kOLd, wmma::mem_row_major);
  }
}

// acc[j] (16 × 16 FP32 fragments covering a 16 × HS strip, kept in registers across the loop)
// += a · b, a a 16 × 64 BF16 strip (or, with kTransposeA, the transpose of a 64 × 16 column
// block of a [64 × 64] tile, ld kPLd), b a [64 × HS] tile.
template <int HS, bool kTransposeA>
__device__ void AccumulateInRegisters(FragC (&acc)[HS / 16], const bf16* a, const bf16* b) {
  constexpr int kLd = Dims<HS>::kLd;
#pragma unroll
  for (int k = 0; k < kTile / 16; ++k) {
    if constexpr (kTransposeA) {
      FragAT fa;
      wmma::load_matrix_sync(fa, a + k * 16 * kPLd, kPLd);
#pragma unroll
      for (int j = 0; j < HS / 16; ++j) {
        FragB fb;
        wmma::load_matrix_sync(fb, b + k * 16 * kLd + j * 16, kLd);
        wmma::mma_sync(acc[j], fa, fb, acc[j]);
      }
    } else {
      FragA fa;
      wmma::load_matrix_sync(fa, a + k * 16, kPLd);
#pragma unroll
      for (int j = 0; j < HS / 16; ++j) {
        FragB fb;
        wmma::load_matrix_sync(fb, b + k * 16 * kLd + j * 16, kLd);
        wmma::mma_sync(acc[j], fa, fb, acc[j]);
      }
    }
  }
}

// Writes a warp's 16 × HS register strip, times `scale`, as BF16 rows [row0, row0 + 16) (rows
// at or past T skipped) of a tensor with row stride `stride`, through the warp's part of a
// shared staging area (16 × kOLd floats).
template <int HS>
__device__ void StoreStrip(bf16* dst, size_t stride, int row0, int T, FragC (&acc)[HS / 16],
                           float* staging, float scale) {
  constexpr int kOLd = Dims<HS>::kOLd, kVecs = HS / 8;
#pragma unroll
  for (int j = 0; j < HS / 16; ++j)
    wmma::store_matrix_sync(staging + j * 16, acc[j], kOLd, wmma::mem_row_major);
  __syncwarp();
  const int lane = threadIdx.x % 32;
  for (int i = lane; i < 16 * kVecs; i += 32) {
    int row = i / kVecs, c = (i % kVecs) * 8;
    if (row0 + row >= T) continue;
    Bf16x8 v;
#pragma unroll
    for (int k = 0; k < 8; ++k) v.v[k] = __float2bfloat16(staging[row * kOLd + c + k] * scale);
    Store8(dst + size_t(row0 + row) * stride + c, v);
  }
  __syncwarp();
}

template <int HS>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(bf16* out, float* stats, const bf16* qkv, int T, int C, int NH,
                       float scale) {
  using D = Dims<HS>;
  extern __shared__ __align__(128) char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = reinterpret_cast<bf16*>(smem + D::kTileBytes);
  bf16* Vs = reinterpret_cast<bf16*>(smem + 2 * D::kTileBytes);
  float* S = reinterpret_cast<float*>(smem + 3 * D::kTileBytes);
  bf16* P = reinterpret_cast<bf16*>(smem + 3 * D::kTileBytes + D::kSBytes);
  float* O = reinterpret_cast<float*>(smem + 3 * D::kTileBytes + D::kSBytes + D::kPBytes);

  const int qb = gridDim.x - 1 - blockIdx.x;  // longest tiles first
  const int h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t stride = 3 * size_t(C);
  const bf16* base = qkv + size_t(b) * T * stride + h * HS;

  LoadTile<HS>(Qs, base, qb * kTile, T, stride);
  for (int i = threadIdx.x; i < kTile * D::kOLd; i += kThreads) O[i] = 0.f;

  const int r = warp * 16 + lane / 2;  // the row this lane pair owns
  const int half = lane % 2;
  const int q = qb * kTile + r;
  float m = -INFINITY, l = 0.f;

  for (int kb = 0; kb <= qb; ++kb) {
    __syncthreads();
    LoadTile<HS>(Ks, base + C, kb * kTile, T, stride);
    LoadTile<HS>(Vs, base + 2 * C, kb * kTile, T, stride);
    __syncthreads();
    StripTimesTileT<HS>(S + warp * 16 * kSLd, Qs + warp * 16 * D::kLd, Ks);
    __syncwarp();
    float* srow = S + r * kSLd + half * 32;
    float mloc = -INFINITY;
    for (int c = 0; c < 32; ++c) {
      int kv = kb * kTile + half * 32 + c;
      float s = (kv <= q && kv < T) ? srow[c] * scale : -INFINITY;
      srow[c] = s;
      mloc = fmaxf(mloc, s);
    }
    mloc = fmaxf(mloc, __shfl_xor_sync(0xffffffffu, mloc, 1));
    float m_new = fmaxf(m, mloc);
    float alpha = (m == -INFINITY) ? 0.f : __expf(m - m_new);
    float lsum = 0.f;
    bf16* prow = P + r * kPLd + half * 32;
    for (int c = 0; c < 32; ++c) {
      float p = (srow[c] == -INFINITY) ? 0.f : __expf(srow[c] - m_new);
      bf16 pb = __float2bfloat16(p);
      prow[c] = pb;
      lsum += __bfloat162float(pb);
    }
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
    l = l * alpha + lsum;
    m = m_new;
    float* orow = O + r * D::kOLd + half * (HS / 2);
    for (int c = 0; c < HS / 2; ++c) orow[c] *= alpha;
    __syncwarp();
    AccumulatePV<HS>(O + warp * 16 * D::kOLd, P + warp * 16 * kPLd, Vs);
    __syncwarp();
  }
  if (q < T) {
    float inv = l > 0.f ? 1.f / l : 0.f;
    const float* orow = O + r * D::kOLd + half * (HS / 2);
    bf16* dst = out + (size_t(b) * T + q) * C + h * HS + half * (HS / 2);
    for (int c = 0; c < HS / 2; c += 8) {
      Bf16x8 v;
#pragma unroll
      for (int k = 0; k < 8; ++k) v.v[k] = __float2bfloat16(orow[c + k] * inv);
      Store8(dst + c, v);
    }
    if (half == 0) stats[(size_t(b) * NH + h) * T + q] = m + logf(l);
  }
}

// D[b,h,t] = Σ_c dout[b,t,h,c] · out[b,t,h,c]; one warp per (b, t, h).
template <int HS>
__global__ void RowDotKernel(float* Dout, const bf16* dout, const bf16* out, int B, int T, int C,
                             int NH) {
  int idx = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (idx >= B * T * NH) return;
  int h = idx % NH, t = (idx / NH) % T, b = idx / (NH * T);
  size_t off = (size_t(b) * T + t) * C + h * HS;
  float acc = 0.f;
  for (int c = lane * 2; c < HS; c += 64)
    acc += __bfloat162float(dout[off + c]) * __bfloat162float(out[off + c]) +
           __bfloat162float(dout[off + c + 1]) * __bfloat162float(out[off + c + 1]);
  acc = WarpSum(acc);
  if (lane == 0) Dout[(size_t(b) * NH + h) * T + t] = acc;
}

// Recomputes P (into pb) and dS = P ∘ (dP − D) (into dsb) for this lane pair's row half.
// s, dp: FP32 strips already holding Q·Kᵀ and dO·Vᵀ.
__device__ void ProbsAndDs(bf16* pb, bf16* dsb, const float* s, const float* dp, int q, int kb,
                           int half, int T, float scale, float lse, float Dq) {
  for (int c = 0; c < 32; ++c) {
    int col = half * 32 + c;
    int kv = kb * kTile + col;
    float p = (kv <= q && kv < T && q < T) ? __expf(s[col] * scale - lse) : 0.f;
    if (pb) pb[col] = __float2bfloat16(p);
    dsb[col] = __float2bfloat16(p * (dp[col] - Dq));
  }
}

template <int HS>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardKVKernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* stats,
                          const float* Drow, int T, int C, int NH, float scale) {
  using D = Dims<HS>;
  extern __shared__ __align__(128) char smem[];
  char* p = smem;
  bf16* Ks = reinterpret_cast<bf16*>(p); p += D::kTileBytes;
  bf16* Vs = reinterpret_cast<bf16*>(p); p += D::kTileBytes;
  bf16* Qs = reinterpret_cast<bf16*>(p); p += D::kTileBytes;
  bf16* dOs = reinterpret_cast<bf16*>(p); p += D::kTileBytes;
  float* S = reinterpret_cast<float*>(p); p += D::kSBytes;
  float* dP = reinterpret_cast<float*>(p); p += D::kSBytes;
  bf16* Pb = reinterpret_cast<bf16*>(p); p += D::kPBytes;
  bf16* dSb = reinterpret_cast<bf16*>(p); p += D::kPBytes;

  const int kb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int nqb = gridDim.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t stride = 3 * size_t(C);
  const bf16* base = qkv + size_t(b) * T * stride + h * HS;
  const bf16* dobase = dout + size_t(b) * T * C + h * HS;
  const float* lse = stats + (size_t(b) * NH + h) * T;
  const float* Dv = Drow + (size_t(b) * NH + h) * T;

  LoadTile<HS>(Ks, base + C, kb * kTile, T, stride);
  LoadTile<HS>(Vs, base + 2 * C, kb * kTile, T, stride);
  // This warp's 16 key rows of dK and dV, accumulated in registers over the query tiles.
  FragC dK[HS / 16], dV[HS / 16];
#pragma unroll
  for (int j = 0; j < HS / 16; ++j) {
    wmma::fill_fragment(dK[j], 0.f);
    wmma::fill_fragment(dV[j], 0.f);
  }
  const int r = warp * 16 + lane / 2, half = lane % 2;

  for (int qb = kb; qb < nqb; ++qb) {
    __syncthreads();
    LoadTile<HS>(Qs, base, qb * kTile, T, stride);
    LoadTile<HS>(dOs, dobase, qb * kTile, T, C);
    __syncthreads();
    StripTimesTileT<HS>(S + warp * 16 * kSLd, Qs + warp * 16 * D::kLd, Ks);
    StripTimesTileT<HS>(dP + warp * 16 * kSLd, dOs + warp * 16 * D::kLd, Vs);
    __syncwarp();
    int q = qb * kTile + r;
    float l = q < T ? lse[q] : 0.f, dq = q < T ? Dv[q] : 0.f;
    ProbsAndDs(Pb + r * kPLd, dSb + r * kPLd, S + r * kSLd, dP + r * kSLd, q, kb, half, T, scale,
               l, dq);
    __syncthreads();
    // This warp's 16 key rows: dV += Pᵀ·dO, dK += dSᵀ·Q.
    AccumulateInRegisters<HS, true>(dV, Pb + warp * 16, dOs);
    AccumulateInRegisters<HS, true>(dK, dSb + warp * 16, Qs);
  }
  // S and dP (contiguous) become the staging area: every warp must be done with them.
  __syncthreads();
  float* staging = S + warp * 16 * D::kOLd;
  bf16* dst = dqkv + size_t(b) * T * stride + h * HS;
  StoreStrip<HS>(dst + C, stride, kb * kTile + warp * 16, T, dK, staging, scale);
  StoreStrip<HS>(dst + 2 * C, stride, kb * kTile + warp * 16, T, dV, staging, 1.f);
}

template <int HS>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardQKernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* stats,
                         const float* Drow, int T, int C, int NH, float scale) {
  using D = Dims<HS>;
  extern __shared__ __align__(128) char smem[];
  char* p = smem;
  bf16* Qs = reinterpret_cast<bf16*>(p); p += D::kTileBytes;
  bf16* dOs = reinterpret_cast<bf16*>(p); p += D::kTileBytes;
  bf16* Ks = reinterpret_cast<bf16*>(p); p += D::kTileBytes;
  bf16* Vs = reinterpret_cast<bf16*>(p); p += D::kTileBytes;
  float* S = reinterpret_cast<float*>(p); p += D::kSBytes;
  float* dP = reinterpret_cast<float*>(p); p += D::kSBytes;
  bf16* dSb = reinterpret_cast<bf16*>(p); p += D::kPBytes;

  const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t stride = 3 * size_t(C);
  const bf16* base = qkv + size_t(b) * T * stride + h * HS;
  const bf16* dobase = dout + size_t(b) * T * C + h * HS;
  const int r = warp * 16 + lane / 2, half = lane % 2;
  const int q = qb * kTile + r;
  const float l = q < T ? stats[(size_t(b) * NH + h) * T + q] : 0.f;
  const float dq = q < T ? Drow[(size_t(b) * NH + h) * T + q] : 0.f;

  LoadTile<HS>(Qs, base, qb * kTile, T, stride);
  LoadTile<HS>(dOs, dobase, qb * kTile, T, C);
  FragC dQ[HS / 16];  // this warp's 16 query rows, in registers
#pragma unroll
  for (int j = 0; j < HS / 16; ++j) wmma::fill_fragment(dQ[j], 0.f);

  for (int kb = 0; kb <= qb; ++kb) {
    __syncthreads();
    LoadTile<HS>(Ks, base + C, kb * kTile, T, stride);
    LoadTile<HS>(Vs, base + 2 * C, kb * kTile, T, stride);
    __syncthreads();
    StripTimesTileT<HS>(S + warp * 16 * kSLd, Qs + warp * 16 * D::kLd, Ks);
    StripTimesTileT<HS>(dP + warp * 16 * kSLd, dOs + warp * 16 * D::kLd, Vs);
    __syncwarp();
    ProbsAndDs(nullptr, dSb + r * kPLd, S + r * kSLd, dP + r * kSLd, q, kb, half, T, scale, l,
               dq);
    __syncwarp();
    AccumulateInRegisters<HS, false>(dQ, dSb + warp * 16 * kPLd, Ks);
  }
  __syncthreads();  // S and dP become the staging area
  StoreStrip<HS>(dqkv + size_t(b) * T * stride + h * HS, stride, qb * kTile + warp * 16, T, dQ,
                 S + warp * 16 * D::kOLd, scale);
}

template <int HS>
constexpr int ForwardSmem() {
  using D = Dims<HS>;
  return 3 * D::kTileBytes + D::kSBytes + D::kPBytes + D::kOBytes;
}
// The backward kernels keep their accumulators in registers and stage the final strips
// through the S and dP tiles, which must be large enough.
template <int HS>
constexpr int BackwardKVSmem() {
  using D = Dims<HS>;
  static_assert(2 * D::kSBytes >= D::kOBytes, "staging does not fit in S and dP");
  return 4 * D::kTileBytes + 2 * D::kSBytes + 2 * D::kPBytes;
}
template <int HS>
constexpr int BackwardQSmem() {
  using D = Dims<HS>;
  return 4 * D::kTileBytes + 2 * D::kSBytes + D::kPBytes;
}

template <int HS>
cudaError_t Forward(bf16* out, float* stats, const bf16* qkv, int B, int T, int C, int NH,
                    cudaStream_t s) {
  constexpr int kSmem = ForwardSmem<HS>();
  cudaError_t err = cudaFuncSetAttribute(FlashForwardKernel<HS>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  dim3 grid(CeilDiv(T, kTile), NH, B);
  FlashForwardKernel<HS><<<grid, kThreads, kSmem, s>>>(out, stats, qkv, T, C, NH,
                                                       1.f / sqrtf(float(HS)));
  return cudaGetLastError();
}

template <int HS>
cudaError_t Backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                     const float* stats, int B, int T, int C, int NH, Scratch& scratch,
                     cudaStream_t s) {
  float* Drow = static_cast<float*>(scratch.Get(sizeof(float) * size_t(B) * NH * T));
  if (!Drow) return scratch.last_error();
  RowDotKernel<HS><<<CeilDiv(size_t(B) * T * NH, 8), 256, 0, s>>>(Drow, dout, out, B, T, C, NH);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  constexpr int kKV = BackwardKVSmem<HS>(), kQ = BackwardQSmem<HS>();
  if ((err = cudaFuncSetAttribute(FlashBackwardKVKernel<HS>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, kKV)) != cudaSuccess)
    return err;
  if ((err = cudaFuncSetAttribute(FlashBackwardQKernel<HS>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, kQ)) != cudaSuccess)
    return err;
  dim3 grid(CeilDiv(T, kTile), NH, B);
  float scale = 1.f / sqrtf(float(HS));
  FlashBackwardKVKernel<HS><<<grid, kThreads, kKV, s>>>(dqkv, dout, qkv, stats, Drow, T, C, NH,
                                                        scale);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  FlashBackwardQKernel<HS><<<grid, kThreads, kQ, s>>>(dqkv, dout, qkv, stats, Drow, T, C, NH,
                                                      scale);
  return cudaGetLastError();
}

}  // namespace

cudaError_t AttentionForward(bf16* out, float* stats, const bf16* qkv, int B, int T, int C,
                             int NH, cudaStream_t s) {
  int hs = C / NH;
  if (hs == 64) return Forward<64>(out, stats, qkv, B, T, C, NH, s);
  if (hs == 128) return Forward<128>(out, stats, qkv, B, T, C, NH, s);
  return cudaErrorInvalidValue;
}

cudaError_t AttentionBackward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                              const float* stats, int B, int T, int C, int NH, Scratch& scratch,
                              cudaStream_t s) {
  int hs = C / NH;
  if (hs == 64) return Backward<64>(dqkv, dout, qkv, out, stats, B, T, C, NH, scratch, s);
  if (hs == 128) return Backward<128>(dqkv, dout, qkv, out, stats, B, T, C, NH, scratch, s);
  return cudaErrorInvalidValue;
}

}  // namespace boulder::kernels::cuda
