// Causal flash attention, forward (FlashAttention-2 structure), BF16 tensor cores through
// mma.sync.m16n8k16 with FP32 accumulators in registers; head size 64 or 128, any T >= 1.
//
// One block of 8 warps per (128-query tile, head, batch row); warp w owns query rows
// [16w, 16w + 16) of the tile. The block walks the key/value tiles of 64 rows from 0 to the
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
  static constexpr int kWarps = 8, kThreads = 32 * kWarps;
  static constexpr int kBq = 16 * kWarps, kBkv = 64, kLd = HS + kPad;
  static constexpr int kQElems = kBq * kLd, kKVElems = kBkv * kLd;
  // Q, then K[2], then V[2].
  static constexpr int kSmemBytes = (kQElems + 4 * kKVElems) * int(sizeof(bf16));
};

// Head size 64 fits two blocks per multiprocessor in 128 registers; 128 would spill.
template <int HS>
__global__ void __launch_bounds__(FwdCfg<HS>::kThreads, HS == 64 ? 2 : 1)
    FlashForwardKernel(bf16* __restrict__ out, float* __restrict__ stats,
                       const bf16* __restrict__ qkv, int T, int C, int NH, float scale_log2) {
  using Cfg = FwdCfg<HS>;
  constexpr int kBq = Cfg::kBq, kBkv = Cfg::kBkv, kLd = Cfg::kLd;
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

  const int qw = q0 + warp * 16;  // this warp's first query row
  const bf16* sQw = sQ + warp * 16 * kLd;
  float o[HS / 8][4];
  Zero(o);
  // Rows g and g + 8 of the warp's strip: running max (base-2 scaled units) and this
  // thread's part of the running sum (its columns only; the quad's parts are added at the end).
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

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
    if (kv0 <= qw + 15) {  // not wholly above this warp's diagonal
      const bf16* sKs = sK + stage * Cfg::kKVElems;
      const bf16* sVs = sV + stage * Cfg::kKVElems;
      float s[kBkv / 8][4];
      Zero(s);
      WarpGemm<HS, kBkv, false>(s, sQw, kLd, sKs, kLd, lane);
      if (kv0 + kBkv - 1 > qw) {  // crosses the diagonal: mask key > query
#pragma unroll
        for (int j = 0; j < kBkv / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int kv = kv0 + 8 * j + 2 * t4 + (e & 1);
            const int q = qw + g + (e >> 1) * 8;
            if (kv > q) s[j][e] = -INFINITY;
          }
        }
      }
      float r0 = -INFINITY, r1 = -INFINITY;
#pragma unroll
      for (int j = 0; j < kBkv / 8; ++j) {
        r0 = fmaxf(r0, fmaxf(s[j][0], s[j][1]));
        r1 = fmaxf(r1, fmaxf(s[j][2], s[j][3]));
      }
      // The four threads of a quad hold the same two rows.
      r0 = fmaxf(r0, __shfl_xor_sync(0xffffffffu, r0, 1));
      r0 = fmaxf(r0, __shfl_xor_sync(0xffffffffu, r0, 2));
      r1 = fmaxf(r1, __shfl_xor_sync(0xffffffffu, r1, 1));
      r1 = fmaxf(r1, __shfl_xor_sync(0xffffffffu, r1, 2));
      // Key 0 is visible to every row and the first tile is always processed, so the new
      // maxima are finite; exp2f(-inf) = 0 rescales the empty initial state.
      const float mn0 = fmaxf(m0, r0 * scale_log2), mn1 = fmaxf(m1, r1 * scale_log2);
      const float alpha0 = exp2f(m0 - mn0), alpha1 = exp2f(m1 - mn1);
      m0 = mn0;
      m1 = mn1;
      float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
      for (int j = 0; j < kBkv / 8; ++j) {
        s[j][0] = exp2f(fmaf(s[j][0], scale_log2, -mn0));
        s[j][1] = exp2f(fmaf(s[j][1], scale_log2, -mn0));
        s[j][2] = exp2f(fmaf(s[j][2], scale_log2, -mn1));
        s[j][3] = exp2f(fmaf(s[j][3], scale_log2, -mn1));
        sum0 += s[j][0] + s[j][1];
        sum1 += s[j][2] + s[j][3];
      }
      l0 = l0 * alpha0 + sum0;
      l1 = l1 * alpha1 + sum1;
#pragma unroll
      for (int j = 0; j < HS / 8; ++j) {
        o[j][0] *= alpha0;
        o[j][1] *= alpha0;
        o[j][2] *= alpha1;
        o[j][3] *= alpha1;
      }
      WarpGemmRegA<kBkv, HS>(o, s, sVs, kLd, lane);
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  CpAsyncWait<0>();

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  // The warp's Q rows in shared memory are read by this warp only: they stage its output.
  StoreStrip<HS>(out + size_t(b) * T * C + h * HS, size_t(C), qw, T, o, 1.f / l0, 1.f / l1,
                 sQ + warp * 16 * kLd, lane);
  if (t4 == 0) {
    float* st = stats + (size_t(b) * NH + h) * T;
    if (qw + g < T) st[qw + g] = (m0 + log2f(l0)) * kLn2;
    if (qw + g + 8 < T) st[qw + g + 8] = (m1 + log2f(l1)) * kLn2;
  }
}

}  // namespace boulder::kernels::cuda::attn

#endif  // BOULDER_KERNELS_CUDA_ATTENTION_FWD_CUH_
