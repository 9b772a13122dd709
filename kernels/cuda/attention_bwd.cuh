// Causal flash attention, backward (FlashAttention-2 structure), BF16 tensor cores through
// mma.sync.m16n8k16 with FP32 accumulators in registers; head size 64 or 128, any T >= 1.
//
// With P = softmax(scale·Q·Kᵀ) recomputed from Q, K and the forward's log-sum-exp:
//   dV = Pᵀ·dO,  dP = dO·Vᵀ,  dS = P ∘ (dP − D) with D = rowsum(dO ∘ O),
//   dQ = scale·dS·K,  dK = scale·dSᵀ·Q.
// Every element of dqkv is written (=); reductions accumulate in FP32.
//
// 1. Preprocess: D and the log-sum-exp in base 2 per (batch, head, query), into arrays padded
//    to a multiple of 128 queries with zeros, so tiles copy them without bounds checks.
// 2. KV kernel: one block of 8 warps per (128-key tile, head, batch row); warp w owns key rows
//    [16w, 16w + 16), whose dK and dV stay in registers while the block walks the query tiles
//    from the diagonal to T (Q, dO, lse and D tiles double-buffered with cp.async). The warp
//    computes Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, so Pᵀ and dSᵀ come out of the product in the A-operand
//    layout of dV += Pᵀ·dO and dK += dSᵀ·Q. Query tiles wholly before a warp's keys are skipped;
//    the mask is applied only where a tile crosses the diagonal (or passes T).
// 3. dQ, chosen by `deterministic`:
//    - false: the KV kernel also writes dSᵀ to shared memory and the block computes its
//      contribution dS·K to the query tile, added with FP32 atomics into a zeroed workspace;
//      a last kernel scales it and writes BF16. The summation order across key tiles varies.
//    - true: a second kernel, one block per 128-query tile, recomputes S and dP and
//      accumulates dQ in registers over the key tiles in a fixed order: bit-reproducible, at
//      the cost of recomputing two of the five products.
#ifndef BOULDER_KERNELS_CUDA_ATTENTION_BWD_CUH_
#define BOULDER_KERNELS_CUDA_ATTENTION_BWD_CUH_

#include "kernels/cuda/attention_common.cuh"

namespace boulder::kernels::cuda::attn {

constexpr int kBwdThreads = 256, kBwdWarps = kBwdThreads / 32;
constexpr int kTPad = 128;  // the preprocess arrays' query padding (a multiple of every tile)

inline int PaddedT(int T) { return (T + kTPad - 1) / kTPad * kTPad; }

// ---- 1. preprocess -------------------------------------------------------------------------

// Dp[bh, t] = Σ_c dout[b,t,h,c]·out[b,t,h,c] and lse2[bh, t] = stats[bh, t]·log2(e) for t < T;
// both 0 for T <= t < Tp. One warp per (b, h, t).
template <int HS>
__global__ void PreprocessKernel(float* __restrict__ Dp, float* __restrict__ lse2,
                                 const bf16* __restrict__ dout, const bf16* __restrict__ out,
                                 const float* __restrict__ stats, int B, int T, int Tp, int C,
                                 int NH) {
  const size_t idx = size_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (idx >= size_t(B) * NH * Tp) return;
  const int t = int(idx % Tp);
  const size_t bh = idx / Tp;
  if (t >= T) {
    if (lane == 0) Dp[idx] = lse2[idx] = 0.f;
    return;
  }
  const int h = int(bh % NH), b = int(bh / NH);
  const size_t off = (size_t(b) * T + t) * C + h * HS;
  float acc = 0.f;
  constexpr int kPer = HS / 32;  // 2 or 4 contiguous elements per lane
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int c = lane * kPer + i;
    acc += __bfloat162float(dout[off + c]) * __bfloat162float(out[off + c]);
  }
  acc = WarpSum(acc);
  if (lane == 0) {
    Dp[idx] = acc;
    lse2[idx] = stats[bh * T + t] * kLog2e;
  }
}

// p[0] += a, p[1] += b atomically per element (p 8-byte aligned); one vector atomic on sm_90.
__device__ __forceinline__ void AtomicAdd2(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(a, b));
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

// ---- 2. the KV kernel ----------------------------------------------------------------------

template <int HS, bool kAtomicDQ>
struct KVCfg {
  static constexpr int kBkv = 16 * kBwdWarps;     // 128 keys
  static constexpr int kBq = HS == 64 ? 64 : 32;  // queries per step (register budget)
  static constexpr int kLd = HS + kPad, kSLd = kBq + kPad;
  static constexpr int kKVElems = kBkv * kLd, kQElems = kBq * kLd;
  // K, V, Q[2], dO[2] (BF16); lse2[2], D[2] (FP32); dSᵀ (BF16, atomic dQ only).
  static constexpr int kBf16Elems = 2 * kKVElems + 4 * kQElems + (kAtomicDQ ? kBkv * kSLd : 0);
  static constexpr int kSmemBytes = kBf16Elems * 2 + 4 * kBq * 4;
  // dQ tile (kBq × HS) work split: kMT row strips of 16 × kNG column groups of kCols.
  static constexpr int kMT = kBq / 16, kNG = kBwdWarps / kMT, kCols = HS / kNG;
  static_assert(kBwdWarps % kMT == 0 && kCols % 16 == 0, "dQ work split");
};

template <int HS, bool kAtomicDQ>
__global__ void __launch_bounds__(kBwdThreads)
    FlashBackwardKVKernel(bf16* __restrict__ dqkv, float* __restrict__ dq_acc,
                          const bf16* __restrict__ dout, const bf16* __restrict__ qkv,
                          const float* __restrict__ lse2, const float* __restrict__ Dp, int T,
                          int Tp, int C, int NH, float scale, float scale_log2) {
  using Cfg = KVCfg<HS, kAtomicDQ>;
  constexpr int kBkv = Cfg::kBkv, kBq = Cfg::kBq, kLd = Cfg::kLd, kSLd = Cfg::kSLd;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);
  bf16* sV = sK + Cfg::kKVElems;
  bf16* sQ = sV + Cfg::kKVElems;                                     // [2][kBq][kLd]
  bf16* sdO = sQ + 2 * Cfg::kQElems;                                 // [2][kBq][kLd]
  bf16* sdS = sdO + 2 * Cfg::kQElems;                                // [kBkv][kSLd], atomic dQ only
  float* sL = reinterpret_cast<float*>(smem + Cfg::kBf16Elems * 2);  // [2][kBq]
  float* sD = sL + 2 * kBq;                                          // [2][kBq]

  // Grid (B·NH, key tiles): blocks start in x-then-y order, so every head's first key tile,
  // which has the most queries, starts before any shorter one.
  const int kt = blockIdx.y;
  const int h = blockIdx.x % NH, b = blockIdx.x / NH;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;
  const size_t stride = 3 * size_t(C);
  const bf16* qbase = qkv + size_t(b) * T * stride + h * HS;
  const bf16* dobase = dout + size_t(b) * T * C + h * HS;
  const float* lrow = lse2 + (size_t(b) * NH + h) * Tp;
  const float* drow = Dp + (size_t(b) * NH + h) * Tp;
  const int kv0 = kt * kBkv;
  const int qt_begin = kv0 / kBq, n_qt = (T + kBq - 1) / kBq;

  auto load_q_tile = [&](int qt, int stage) {
    LoadTileAsync<kBq, HS, kBwdThreads>(sQ + stage * Cfg::kQElems, qbase, stride, qt * kBq, T);
    LoadTileAsync<kBq, HS, kBwdThreads>(sdO + stage * Cfg::kQElems, dobase, size_t(C), qt * kBq, T);
    LoadFloatsAsync<kBq>(sL + stage * kBq, lrow + qt * kBq);
    LoadFloatsAsync<kBq>(sD + stage * kBq, drow + qt * kBq);
  };
  LoadTileAsync<kBkv, HS, kBwdThreads>(sK, qbase + C, stride, kv0, T);
  LoadTileAsync<kBkv, HS, kBwdThreads>(sV, qbase + 2 * C, stride, kv0, T);
  load_q_tile(qt_begin, 0);
  CpAsyncCommit();

  const int kvw = kv0 + warp * 16;  // this warp's first key row
  const bf16* sKw = sK + warp * 16 * kLd;
  const bf16* sVw = sV + warp * 16 * kLd;
  float dk[HS / 8][4], dv[HS / 8][4];
  Zero(dk);
  Zero(dv);

  for (int qt = qt_begin; qt < n_qt; ++qt) {
    const int stage = (qt - qt_begin) & 1;
    if (qt + 1 < n_qt) load_q_tile(qt + 1, stage ^ 1);
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();

    const int q0 = qt * kBq;
    const bf16* sQs = sQ + stage * Cfg::kQElems;
    const bf16* sdOs = sdO + stage * Cfg::kQElems;
    const float* sLs = sL + stage * kBq;
    const float* sDs = sD + stage * kBq;
    if (kvw <= q0 + kBq - 1) {  // some (query, key) pair of the tile is visible
      float st[kBq / 8][4];     // Sᵀ, then Pᵀ: rows = this warp's keys, columns = queries
      Zero(st);
      WarpGemm<HS, kBq, false>(st, sKw, kLd, sQs, kLd, lane);
      const bool mask = kvw + 15 > q0 || q0 + kBq > T;
#pragma unroll
      for (int j = 0; j < kBq / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int ql = 8 * j + 2 * t4 + (e & 1);
          float p = exp2f(fmaf(st[j][e], scale_log2, -sLs[ql]));
          if (mask) {
            const int kv = kvw + g + (e >> 1) * 8, q = q0 + ql;
            if (kv > q || q >= T) p = 0.f;
          }
          st[j][e] = p;
        }
      }
      float dpt[kBq / 8][4];  // dPᵀ, then dSᵀ
      Zero(dpt);
      WarpGemm<HS, kBq, false>(dpt, sVw, kLd, sdOs, kLd, lane);
#pragma unroll
      for (int j = 0; j < kBq / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          dpt[j][e] = st[j][e] * (dpt[j][e] - sDs[8 * j + 2 * t4 + (e & 1)]);
      }
      WarpGemmRegA<kBq, HS>(dv, st, sdOs, kLd, lane);
      WarpGemmRegA<kBq, HS>(dk, dpt, sQs, kLd, lane);
      if constexpr (kAtomicDQ) {
        bf16* row = sdS + (warp * 16) * kSLd;
#pragma unroll
        for (int j = 0; j < kBq / 8; ++j) {
          *reinterpret_cast<uint32_t*>(row + g * kSLd + 8 * j + 2 * t4) =
              PackBf16(dpt[j][0], dpt[j][1]);
          *reinterpret_cast<uint32_t*>(row + (g + 8) * kSLd + 8 * j + 2 * t4) =
              PackBf16(dpt[j][2], dpt[j][3]);
        }
      }
    } else if constexpr (kAtomicDQ) {
      // Every key of this warp is after every query of the tile: dS is zero.
      bf16* row = sdS + (warp * 16) * kSLd;
      for (int i = lane; i < 16 * kBq / 2; i += 32) {
        const int r = i / (kBq / 2), c = (i % (kBq / 2)) * 2;
        *reinterpret_cast<uint32_t*>(row + r * kSLd + c) = 0u;
      }
    }
    if constexpr (kAtomicDQ) {
      __syncthreads();  // the block's dSᵀ [kBkv × kBq] is complete
      // dQ[q0 + 16mt .., ng·kCols ..] += dS · K over this block's keys.
      const int mt = warp % Cfg::kMT, ng = warp / Cfg::kMT;
      float acc[Cfg::kCols / 8][4];
      Zero(acc);
      const int q_last = q0 + mt * 16 + 15;  // keys past it contribute zero
#pragma unroll
      for (int kk = 0; kk < kBkv / 16; ++kk) {
        if (kv0 + kk * 16 > q_last) break;
        uint32_t af[4];
        LoadAT(af, sdS + kk * 16 * kSLd + mt * 16, kSLd, lane);
#pragma unroll
        for (int jj = 0; jj < Cfg::kCols / 16; ++jj) {
          uint32_t bf[4];
          LoadBT(bf, sK + kk * 16 * kLd + ng * Cfg::kCols + jj * 16, kLd, lane);
          Mma(acc[2 * jj], af, bf[0], bf[1]);
          Mma(acc[2 * jj + 1], af, bf[2], bf[3]);
        }
      }
      const int qa = q0 + mt * 16 + g;
      float* base = dq_acc + size_t(b) * T * C + h * HS + ng * Cfg::kCols + 2 * t4;
#pragma unroll
      for (int j = 0; j < Cfg::kCols / 8; ++j) {
        if (qa < T) AtomicAdd2(base + size_t(qa) * C + 8 * j, acc[j][0], acc[j][1]);
        if (qa + 8 < T) AtomicAdd2(base + size_t(qa + 8) * C + 8 * j, acc[j][2], acc[j][3]);
      }
    }
    __syncthreads();  // every warp is done with this stage (and dSᵀ) before they are refilled
  }
  CpAsyncWait<0>();

  // Each warp's K and V rows stage its dK and dV (nothing reads K or V any more).
  bf16* dst = dqkv + size_t(b) * T * stride + h * HS;
  StoreStrip<HS>(dst + C, stride, kvw, T, dk, scale, scale, sK + warp * 16 * kLd, lane);
  StoreStrip<HS>(dst + 2 * C, stride, kvw, T, dv, 1.f, 1.f, sV + warp * 16 * kLd, lane);
}

// dqkv[b, t, 0:C] = scale · dq_acc[b, t, :] in BF16, 8 elements per thread.
static __global__ void ConvertDQKernel(bf16* __restrict__ dqkv, const float* __restrict__ dq_acc,
                                       size_t n8, int C, float scale) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n8) return;
  const size_t e = i * 8, row = e / C, c = e % C;
  const float4 x0 = *reinterpret_cast<const float4*>(dq_acc + e);
  const float4 x1 = *reinterpret_cast<const float4*>(dq_acc + e + 4);
  Bf16x8 v;
  v.v[0] = __float2bfloat16(x0.x * scale);
  v.v[1] = __float2bfloat16(x0.y * scale);
  v.v[2] = __float2bfloat16(x0.z * scale);
  v.v[3] = __float2bfloat16(x0.w * scale);
  v.v[4] = __float2bfloat16(x1.x * scale);
  v.v[5] = __float2bfloat16(x1.y * scale);
  v.v[6] = __float2bfloat16(x1.z * scale);
  v.v[7] = __float2bfloat16(x1.w * scale);
  Store8(dqkv + row * 3 * size_t(C) + c, v);
}

// ---- 3. the deterministic dQ kernel --------------------------------------------------------

template <int HS>
struct QCfg {
  static constexpr int kBq = 16 * kBwdWarps, kBkv = 64, kLd = HS + kPad;
  static constexpr int kQElems = kBq * kLd, kKVElems = kBkv * kLd;
  // Q, dO, K[2], V[2].
  static constexpr int kSmemBytes = (2 * kQElems + 4 * kKVElems) * 2;
};

// Head size 64 fits two blocks per multiprocessor in 128 registers; 128 would spill.
template <int HS>
__global__ void __launch_bounds__(kBwdThreads, HS == 64 ? 2 : 1)
    FlashBackwardQKernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout,
                         const bf16* __restrict__ qkv, const float* __restrict__ lse2,
                         const float* __restrict__ Dp, int T, int Tp, int C, int NH, float scale,
                         float scale_log2) {
  using Cfg = QCfg<HS>;
  constexpr int kBq = Cfg::kBq, kBkv = Cfg::kBkv, kLd = Cfg::kLd;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sdO = sQ + Cfg::kQElems;
  bf16* sK = sdO + Cfg::kQElems;      // [2][kBkv][kLd]
  bf16* sV = sK + 2 * Cfg::kKVElems;  // [2][kBkv][kLd]

  const int qt = gridDim.y - 1 - blockIdx.y;  // grid (B·NH, query tiles): longest first
  const int h = blockIdx.x % NH, b = blockIdx.x / NH;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;
  const size_t stride = 3 * size_t(C);
  const bf16* qbase = qkv + size_t(b) * T * stride + h * HS;
  const bf16* kbase = qbase + C;
  const bf16* vbase = qbase + 2 * C;
  const int q0 = qt * kBq;
  const int n_kv = (min(q0 + kBq, T) - 1) / kBkv + 1;

  LoadTileAsync<kBq, HS, kBwdThreads>(sQ, qbase, stride, q0, T);
  LoadTileAsync<kBq, HS, kBwdThreads>(sdO, dout + size_t(b) * T * C + h * HS, size_t(C), q0, T);
  LoadTileAsync<kBkv, HS, kBwdThreads>(sK, kbase, stride, 0, T);
  LoadTileAsync<kBkv, HS, kBwdThreads>(sV, vbase, stride, 0, T);
  CpAsyncCommit();

  const int qw = q0 + warp * 16;
  const bf16* sQw = sQ + warp * 16 * kLd;
  const bf16* sdOw = sdO + warp * 16 * kLd;
  // Rows qw + g and qw + g + 8 (the arrays are padded to Tp >= q0 + kBq).
  const size_t bh = size_t(b) * NH + h;
  const float lse0 = lse2[bh * Tp + qw + g], lse1 = lse2[bh * Tp + qw + g + 8];
  const float D0 = Dp[bh * Tp + qw + g], D1 = Dp[bh * Tp + qw + g + 8];
  float dq[HS / 8][4];
  Zero(dq);

  for (int kb = 0; kb < n_kv; ++kb) {
    const int stage = kb & 1;
    if (kb + 1 < n_kv) {
      LoadTileAsync<kBkv, HS, kBwdThreads>(sK + (stage ^ 1) * Cfg::kKVElems, kbase, stride,
                                           (kb + 1) * kBkv, T);
      LoadTileAsync<kBkv, HS, kBwdThreads>(sV + (stage ^ 1) * Cfg::kKVElems, vbase, stride,
                                           (kb + 1) * kBkv, T);
    }
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();

    const int kv0 = kb * kBkv;
    if (kv0 <= qw + 15) {
      const bf16* sKs = sK + stage * Cfg::kKVElems;
      const bf16* sVs = sV + stage * Cfg::kKVElems;
      float s[kBkv / 8][4];  // S, then P
      Zero(s);
      WarpGemm<HS, kBkv, false>(s, sQw, kLd, sKs, kLd, lane);
      const bool mask = kv0 + kBkv - 1 > qw || qw + 16 > T;
#pragma unroll
      for (int j = 0; j < kBkv / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float p = exp2f(fmaf(s[j][e], scale_log2, -((e >> 1) ? lse1 : lse0)));
          if (mask) {
            const int kv = kv0 + 8 * j + 2 * t4 + (e & 1), q = qw + g + (e >> 1) * 8;
            if (kv > q || q >= T) p = 0.f;
          }
          s[j][e] = p;
        }
      }
      float dp[kBkv / 8][4];  // dP, then dS
      Zero(dp);
      WarpGemm<HS, kBkv, false>(dp, sdOw, kLd, sVs, kLd, lane);
#pragma unroll
      for (int j = 0; j < kBkv / 8; ++j) {
        dp[j][0] = s[j][0] * (dp[j][0] - D0);
        dp[j][1] = s[j][1] * (dp[j][1] - D0);
        dp[j][2] = s[j][2] * (dp[j][2] - D1);
        dp[j][3] = s[j][3] * (dp[j][3] - D1);
      }
      WarpGemmRegA<kBkv, HS>(dq, dp, sKs, kLd, lane);
    }
    __syncthreads();
  }
  CpAsyncWait<0>();
  StoreStrip<HS>(dqkv + size_t(b) * T * stride + h * HS, stride, qw, T, dq, scale, scale,
                 sQ + warp * 16 * kLd, lane);
}

}  // namespace boulder::kernels::cuda::attn

#endif  // BOULDER_KERNELS_CUDA_ATTENTION_BWD_CUH_
