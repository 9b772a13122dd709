// Causal flash attention, forward (FlashAttention-2 structure), BF16 tensor cores through
// mma.sync.m16n8k16 with FP32 accumulators in registers; head size 64 or 128, any T >= 1.
//
// One block of 4 warps per (128-query tile, head, batch row); warp w owns query rows
// [32w, 32w + 32) of the tile, as two 16-row strips that share every K and V fragment it
// loads from shared memory (half the ldmatrix traffic per product of 16-row warps). The block walks the key/value tiles of 64 rows from 0 to the
// diagonal; K and V tiles are double-buffered in shared memory with cp.async (the copy of
// tile j+1 overlaps the products of tile j). Per warp and tile:
//   S = Q·Kᵀ (registers), causal mask only on tiles that cross this warp's diagonal, tiles
//   wholly above it skipped; online softmax in base 2: m = max(m, rowmax(S)·c) with
//   c = log2(e)/sqrt(HS), P = 2^(S·c − m), l = l·2^(m_old − m) + rowsum(P),
//   O = O·2^(m_old − m) + P·V (P rounded to BF16, straight from the S registers).
// At the end out = O / l (BF16, written =) and stats = (m + log2 l)·ln 2, the natural
// log-sum-exp of the row's scaled scores, which the backward uses to recompute P.
#ifndef BOULDER_KERNELS_CUDA_ATTENTION_FWD_CUH_
#define BOULDER_KERNELS_CUDA_ATTENTION_FWD_CUH_

#include "kernels/cuda/attention_common.cuh"

namespace boulder::kernels::cuda::attn {

template <int HS>
struct FwdCfg {
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kStrips = 2;  // 16-row strips per warp
  static constexpr int kBq = 16 * kStrips * kWarps, kBkv = HS == 128 ? 32 : 64, kLd = HS + kPad;
  static constexpr int kQElems = kBq * kLd, kKVElems = kBkv * kLd;
  // Q, then K[2], then V[2].
  static constexpr int kSmemBytes = (kQElems + 4 * kKVElems) * int(sizeof(bf16));
};

// Two blocks of 4 warps per multiprocessor: 255 registers per thread at most (head size 128
// holds 2 × 16 output fragments and 2 × 8 score fragments).
template <int HS>
__global__ void __launch_bounds__(FwdCfg<HS>::kThreads, 2)
    FlashForwardKernel(bf16* __restrict__ out, float* __restrict__ stats,
                       const bf16* __restrict__ qkv, int T, int C, int NH, float scale_log2) {
  using Cfg = FwdCfg<HS>;
  constexpr int kBq = Cfg::kBq, kBkv = Cfg::kBkv, kLd = Cfg::kLd, kS = Cfg::kStrips;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sK = sQ + Cfg::kQElems;
  bf16* sV = sK + 2 * Cfg::kKVElems;

  // Grid (B·NH, query tiles): blocks start in x-then-y order, so every head's longest (last)
  // query tile starts before any shorter one and the short ones fill the tail.
  const int qt = gridDim.y - 1 - blockIdx.y;
  const int h = blockIdx.x % NH, b = blockIdx.x / NH;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;
  const size_t stride = 3 * size_t(C);
  const bf16* qbase = qkv + size_t(b) * T * stride + h * HS;
  const bf16* kbase = qbase + C;
  const bf16* vbase = qbase + 2 * C;
  const int q0 = qt * kBq;
  const int n_kv = (min(q0 + kBq, T) - 1) / kBkv + 1;  // key tiles up to the last valid row

  LoadTileAsync<kBq, HS, Cfg::kThreads>(sQ, qbase, stride, q0, T);
  LoadTileAsync<kBkv, HS, Cfg::kThreads>(sK, kbase, stride, 0, T);
  LoadTileAsync<kBkv, HS, Cfg::kThreads>(sV, vbase, stride, 0, T);
  CpAsyncCommit();

  const int qw = q0 + warp * 16 * kS;  // this warp's first query row
  const bf16* sQw = sQ + warp * 16 * kS * kLd;
  float o[kS][HS / 8][4];
#pragma unroll
  for (int i = 0; i < kS; ++i) Zero(o[i]);
  // Rows g and g + 8 of each strip: running max (base-2 scaled units) and this thread's part
  // of the running sum (its columns only; the quad's parts are added at the end).
  float m[kS][2], l[kS][2];
#pragma unroll
  for (int i = 0; i < kS; ++i) m[i][0] = m[i][1] = -INFINITY, l[i][0] = l[i][1] = 0.f;

  for (int kb = 0; kb < n_kv; ++kb) {
    const int stage = kb & 1;
    if (kb + 1 < n_kv) {
      LoadTileAsync<kBkv, HS, Cfg::kThreads>(sK + (stage ^ 1) * Cfg::kKVElems, kbase, stride,
                                             (kb + 1) * kBkv, T);
      LoadTileAsync<kBkv, HS, Cfg::kThreads>(sV + (stage ^ 1) * Cfg::kKVElems, vbase, stride,
                                             (kb + 1) * kBkv, T);
    }
    CpAsyncCommit();
    CpAsyncWait<1>();  // tile kb (and Q) have landed for this thread
    __syncthreads();   // ... and for every thread

    const int kv0 = kb * kBkv;
    // Not wholly above this warp's diagonal. kv0 is a multiple of 64 and qw of 32, so a tile
    // the warp processes starts at or before qw: key kv0 is visible to every row of both
    // strips, and every row's maximum is finite.
    if (kv0 <= qw + 16 * kS - 1) {
      const bf16* sKs = sK + stage * Cfg::kKVElems;
      const bf16* sVs = sV + stage * Cfg::kKVElems;
      float s[kS][kBkv / 8][4];
#pragma unroll
      for (int i = 0; i < kS; ++i) Zero(s[i]);
      // S = Q·Kᵀ for both strips: each K fragment feeds both.
#pragma unroll
      for (int kk = 0; kk < HS / 16; ++kk) {
        uint32_t af[kS][4];
#pragma unroll
        for (int i = 0; i < kS; ++i) LoadA(af[i], sQw + i * 16 * kLd + kk * 16, kLd, lane);
#pragma unroll
        for (int jj = 0; jj < kBkv / 16; ++jj) {
          uint32_t bf[4];
          LoadB(bf, sKs + jj * 16 * kLd + kk * 16, kLd, lane);
#pragma unroll
          for (int i = 0; i < kS; ++i) {
            Mma(s[i][2 * jj], af[i], bf[0], bf[1]);
            Mma(s[i][2 * jj + 1], af[i], bf[2], bf[3]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kS; ++i) {
        const int qs = qw + 16 * i;  // the strip's first row
        if (kv0 + kBkv - 1 > qs) {   // crosses the strip's diagonal: mask key > query
#pragma unroll
          for (int j = 0; j < kBkv / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int kv = kv0 + 8 * j + 2 * t4 + (e & 1);
              const int q = qs + g + (e >> 1) * 8;
              if (kv > q) s[i][j][e] = -INFINITY;
            }
          }
        }
        float r0 = -INFINITY, r1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < kBkv / 8; ++j) {
          r0 = fmaxf(r0, fmaxf(s[i][j][0], s[i][j][1]));
          r1 = fmaxf(r1, fmaxf(s[i][j][2], s[i][j][3]));
        }
        // The four threads of a quad hold the same two rows.
        r0 = fmaxf(r0, __shfl_xor_sync(0xffffffffu, r0, 1));
        r0 = fmaxf(r0, __shfl_xor_sync(0xffffffffu, r0, 2));
        r1 = fmaxf(r1, __shfl_xor_sync(0xffffffffu, r1, 1));
        r1 = fmaxf(r1, __shfl_xor_sync(0xffffffffu, r1, 2));
        // exp2f(-inf) = 0 rescales the empty initial state.
        const float mn0 = fmaxf(m[i][0], r0 * scale_log2), mn1 = fmaxf(m[i][1], r1 * scale_log2);
        const float alpha0 = exp2f(m[i][0] - mn0), alpha1 = exp2f(m[i][1] - mn1);
        m[i][0] = mn0;
        m[i][1] = mn1;
        float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
        for (int j = 0; j < kBkv / 8; ++j) {
          s[i][j][0] = exp2f(fmaf(s[i][j][0], scale_log2, -mn0));
          s[i][j][1] = exp2f(fmaf(s[i][j][1], scale_log2, -mn0));
          s[i][j][2] = exp2f(fmaf(s[i][j][2], scale_log2, -mn1));
          s[i][j][3] = exp2f(fmaf(s[i][j][3], scale_log2, -mn1));
          sum0 += s[i][j][0] + s[i][j][1];
          sum1 += s[i][j][2] + s[i][j][3];
        }
        l[i][0] = l[i][0] * alpha0 + sum0;
        l[i][1] = l[i][1] * alpha1 + sum1;
#pragma unroll
        for (int j = 0; j < HS / 8; ++j) {
          o[i][j][0] *= alpha0;
          o[i][j][1] *= alpha0;
          o[i][j][2] *= alpha1;
          o[i][j][3] *= alpha1;
        }
      }
      // O += P·V for both strips: each V fragment feeds both.
#pragma unroll
      for (int kk = 0; kk < kBkv / 16; ++kk) {
        uint32_t af[kS][4];
#pragma unroll
        for (int i = 0; i < kS; ++i) AFromC(af[i], s[i], kk);
#pragma unroll
        for (int jj = 0; jj < HS / 16; ++jj) {
          uint32_t bf[4];
          LoadBT(bf, sVs + kk * 16 * kLd + jj * 16, kLd, lane);
#pragma unroll
          for (int i = 0; i < kS; ++i) {
            Mma(o[i][2 * jj], af[i], bf[0], bf[1]);
            Mma(o[i][2 * jj + 1], af[i], bf[2], bf[3]);
          }
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  CpAsyncWait<0>();

#pragma unroll
  for (int i = 0; i < kS; ++i) {
    float l0 = l[i][0], l1 = l[i][1];
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const int qs = qw + 16 * i;
    // The strip's Q rows in shared memory are read by this warp only: they stage its output.
    StoreStrip<HS>(out + size_t(b) * T * C + h * HS, size_t(C), qs, T, o[i], 1.f / l0, 1.f / l1,
                   sQ + (warp * kS + i) * 16 * kLd, lane);
    if (t4 == 0) {
      float* st = stats + (size_t(b) * NH + h) * T;
      if (qs + g < T) st[qs + g] = (m[i][0] + log2f(l0)) * kLn2;
      if (qs + g + 8 < T) st[qs + g + 8] = (m[i][1] + log2f(l1)) * kLn2;
    }
  }
}

}  // namespace boulder::kernels::cuda::attn

#endif  // BOULDER_KERNELS_CUDA_ATTENTION_FWD_CUH_
