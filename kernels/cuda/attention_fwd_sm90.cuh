// Causal flash attention, forward, on Hopper's warpgroup tensor-core instructions (wgmma,
// sm_90a only; attention_fwd.cuh is the mma.sync kernel every other GPU runs, and this one
// computes the same thing: same online softmax in base 2, same outputs and statistics).
//
// One block of two warpgroups (256 threads) per (128-query tile, head, batch row); warpgroup w
// owns query rows [64w, 64w + 64) of the tile. Q (128 rows) and the K and V tiles of 64 keys sit
// in shared memory in wgmma's 128-byte-swizzled layout (wgmma.cuh), K and V double-buffered with
// cp.async (tile j+1 is copied during tile j's products). Per warpgroup and key tile:
//   S = Q·Kᵀ: HS/16 wgmma m64n64k16, both operands from shared memory, FP32 accumulators
//     (32 per thread);
//   causal mask on tiles crossing the warpgroup's diagonal (tiles wholly above it skipped),
//     online softmax on the accumulators as in attention_fwd.cuh;
//   O += P·V: 4 wgmma m64nHSk16, P rounded to BF16 straight from S's registers, V from
//     shared memory read MN-major (no transpose copy).
// At the end out = O / l, staged through the warpgroup's own Q rows so every global store is a
// whole 16-byte chunk of a row, and stats = (m + log2 l)·ln 2 as the backward expects.
// kFp8 (Backend::AttentionForwardFp8Cast): each stored chunk of 8 BF16 values is also cast to
// E4M3 with the projection's input scale into fp8_out (the same [B·T, C] layout), with Cast8
// (fp8_cast.cuh: CastFp8's codes and statistics), the block's statistics added once at the end
// (FlushCastStats) from a BlockCastStats after the V buffers.
#ifndef BOULDER_KERNELS_CUDA_ATTENTION_FWD_SM90_CUH_
#define BOULDER_KERNELS_CUDA_ATTENTION_FWD_SM90_CUH_

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/fp8_cast.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace boulder::kernels::cuda::attn {

template <int HS>
struct Sm90FwdCfg {
  static constexpr int kWarpGroups = 2, kThreads = 128 * kWarpGroups;
  static constexpr int kBq = 64 * kWarpGroups, kBkv = 64;
  static constexpr int kQBytes = HS / 64 * kBq * 128, kKVBytes = HS / 64 * kBkv * 128;
  // Q, K[2], V[2], and room to align the start to 1024 bytes (the swizzle's period).
  static constexpr int kSmemBytes = kQBytes + 4 * kKVBytes + 1024;
  // With the FP8 cast: a BlockCastStats after V[2] (at least 1 byte of the alignment room is
  // left after it, so 16 more bytes hold it).
  static constexpr int kFp8SmemBytes = kSmemBytes + 16;
};

// The pieces of a tile's work and of the end that attention_fwd_sm90_pipelined.cuh's kernel
// shares with this one (the same operations in both, so the same bits).
//
// S's online softmax for a thread's two rows (row and row + 8 of its fragment; masked scores
// already -inf): the new maxima (base 2, scaled) into m0/m1, s becomes P = exp2(s·scale - m)
// in FP32, l0/l1 corrected and given P's row sums; alpha0/alpha1: O's corrections
// exp2(m_old - m_new).
__device__ __forceinline__ void OnlineSoftmaxTile(float (&s)[32], float scale_log2, float& m0,
                                                  float& m1, float& l0, float& l1, float& alpha0,
                                                  float& alpha1) {
  float r0 = -INFINITY, r1 = -INFINITY;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    r0 = fmaxf(r0, fmaxf(s[4 * j], s[4 * j + 1]));
    r1 = fmaxf(r1, fmaxf(s[4 * j + 2], s[4 * j + 3]));
  }
  r0 = fmaxf(r0, __shfl_xor_sync(0xffffffffu, r0, 1));
  r0 = fmaxf(r0, __shfl_xor_sync(0xffffffffu, r0, 2));
  r1 = fmaxf(r1, __shfl_xor_sync(0xffffffffu, r1, 1));
  r1 = fmaxf(r1, __shfl_xor_sync(0xffffffffu, r1, 2));
  const float mn0 = fmaxf(m0, r0 * scale_log2), mn1 = fmaxf(m1, r1 * scale_log2);
  alpha0 = exp2f(m0 - mn0);
  alpha1 = exp2f(m1 - mn1);
  m0 = mn0;
  m1 = mn1;
  float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    s[4 * j] = exp2f(fmaf(s[4 * j], scale_log2, -mn0));
    s[4 * j + 1] = exp2f(fmaf(s[4 * j + 1], scale_log2, -mn0));
    s[4 * j + 2] = exp2f(fmaf(s[4 * j + 2], scale_log2, -mn1));
    s[4 * j + 3] = exp2f(fmaf(s[4 * j + 3], scale_log2, -mn1));
    sum0 += s[4 * j] + s[4 * j + 1];
    sum1 += s[4 * j + 2] + s[4 * j + 3];
  }
  l0 = l0 * alpha0 + sum0;
  l1 = l1 * alpha1 + sum1;
}

// O's correction by the softmax's alphas, then P rounded to BF16 into the A fragments of the
// P·V product (p[kk]: keys 16kk..16kk+15).
template <int kO>
__device__ __forceinline__ void RescaleAndPackP(float (&o)[kO], uint32_t (&p)[4][4],
                                                const float (&s)[32], float alpha0,
                                                float alpha1) {
#pragma unroll
  for (int j = 0; j < kO / 4; ++j) {
    o[4 * j] *= alpha0;
    o[4 * j + 1] *= alpha0;
    o[4 * j + 2] *= alpha1;
    o[4 * j + 3] *= alpha1;
  }
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    p[kk][0] = attn::PackBf16(s[8 * kk], s[8 * kk + 1]);
    p[kk][1] = attn::PackBf16(s[8 * kk + 2], s[8 * kk + 3]);
    p[kk][2] = attn::PackBf16(s[8 * kk + 4], s[8 * kk + 5]);
    p[kk][3] = attn::PackBf16(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// The end of the forward for this thread's warpgroup (rows q0 + 64·wg ..., its products
// finished): out = O / l, staged through the warpgroup's own Q rows in sQ so every global store
// is a whole 16-byte chunk of a row (with kFp8 also cast to E4M3 into fp8_out, the block's
// statistics flushed from fp8_stats), and stats = (m + log2 l)·ln 2 as the backward expects.
template <int HS, bool kFp8>
__device__ __forceinline__ void StoreForwardOutput(
    const float (&o)[HS / 2], float m0, float m1, float l0, float l1, unsigned char* sQ,
    BlockCastStats& fp8_stats, bf16* __restrict__ out, float* __restrict__ stats,
    uint8_t* __restrict__ fp8_out, const float* __restrict__ fp8_scale, float* fp8_amax,
    unsigned long long* fp8_counts, int b, int h, int T, int C, int NH, int q0) {
  constexpr int kBq = Sm90FwdCfg<HS>::kBq;
  const int wg = threadIdx.x / 128, wq = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int qw = q0 + 64 * wg, row = qw + 16 * wq + g;
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = 1.f / l0, inv1 = 1.f / l1;
  // The warpgroup's Q rows (read only by its own, finished, products) stage its output.
  attn::StageAccumulators<kBq, HS>(sQ, 64 * wg + 16 * wq + g, o, inv0, inv1);
  attn::WarpgroupBarrier(wg);
  if constexpr (kFp8) {
    CastStats st;
    const float s = *fp8_scale;
    uint8_t* dst8 = fp8_out + size_t(b) * T * C + h * HS;
    attn::StoreWarpgroupRows<kBq, HS>(out + size_t(b) * T * C + h * HS, size_t(C), qw, T, sQ,
                                      64 * wg, [&](int r, int c, uint4 v) {
                                        float unused[8];
                                        *reinterpret_cast<uint2*>(dst8 + size_t(r) * C + c * 8) =
                                            Cast8<true>(v, s, st, unused);
                                      });
    FlushCastStats(st, fp8_stats, threadIdx.x, fp8_amax, fp8_counts);
  } else {
    attn::StoreWarpgroupRows<kBq, HS>(out + size_t(b) * T * C + h * HS, size_t(C), qw, T, sQ,
                                      64 * wg);
  }
  if (t4 == 0) {
    float* st = stats + (size_t(b) * NH + h) * T;
    if (row < T) st[row] = (m0 + log2f(l0)) * attn::kLn2;
    if (row + 8 < T) st[row + 8] = (m1 + log2f(l1)) * attn::kLn2;
  }
}

// Two blocks per multiprocessor at both head sizes: at 128 that caps registers at 128 and ptxas
// spills 92 bytes, and it still runs faster than one block of 161 registers (H200, hidden-2048
// shape: 0.109 against 0.122 ms per call; the spare warps hide the wgmma and softmax latency).
template <int HS, bool kFp8 = false>
__global__ void __launch_bounds__(Sm90FwdCfg<HS>::kThreads, 2)
    FlashForwardSm90Kernel(bf16* __restrict__ out, float* __restrict__ stats,
                           const bf16* __restrict__ qkv, int T, int C, int NH, float scale_log2,
                           uint8_t* __restrict__ fp8_out, const float* __restrict__ fp8_scale,
                           float* fp8_amax, unsigned long long* fp8_counts) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(BOULDER_ATTENTION_EMULATION)
  using Cfg = Sm90FwdCfg<HS>;
  constexpr int kBq = Cfg::kBq, kBkv = Cfg::kBkv, kO = HS / 2;
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* sQ = attn::AlignSwizzled(smem);
  unsigned char* sK = sQ + Cfg::kQBytes;
  unsigned char* sV = sK + 2 * Cfg::kKVBytes;
  BlockCastStats& fp8_stats = *reinterpret_cast<BlockCastStats*>(sV + 2 * Cfg::kKVBytes);
  if constexpr (kFp8) InitBlockCastStats(fp8_stats, threadIdx.x);  // the loop's barriers order it

  // Grid (B·NH, query tiles), the longest query tiles first (as attention_fwd.cuh).
  const int qt = gridDim.y - 1 - blockIdx.y;
  const int h = blockIdx.x % NH, b = blockIdx.x / NH;
  const int wg = threadIdx.x / 128, wq = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;
  const size_t stride = 3 * size_t(C);
  const bf16* qbase = qkv + size_t(b) * T * stride + h * HS;
  const bf16* kbase = qbase + C;
  const bf16* vbase = qbase + 2 * C;
  const int q0 = qt * kBq;
  const int n_kv = (min(q0 + kBq, T) - 1) / kBkv + 1;

  attn::LoadSwizzledAsync<kBq, HS, Cfg::kThreads>(sQ, qbase, stride, q0, T);
  attn::LoadSwizzledAsync<kBkv, HS, Cfg::kThreads>(sK, kbase, stride, 0, T);
  attn::LoadSwizzledAsync<kBkv, HS, Cfg::kThreads>(sV, vbase, stride, 0, T);
  attn::CpAsyncCommit();

  const int qw = q0 + 64 * wg;       // the warpgroup's first query row
  const int row = qw + 16 * wq + g;  // this thread's rows: row and row + 8
  const uint32_t q_addr = attn::SmemAddr(sQ) + wg * 64 * 128;
  float o[kO];
#pragma unroll
  for (int i = 0; i < kO; ++i) o[i] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  for (int kb = 0; kb < n_kv; ++kb) {
    const int stage = kb & 1;
    if (kb + 1 < n_kv) {
      attn::LoadSwizzledAsync<kBkv, HS, Cfg::kThreads>(sK + (stage ^ 1) * Cfg::kKVBytes, kbase,
                                                       stride, (kb + 1) * kBkv, T);
      attn::LoadSwizzledAsync<kBkv, HS, Cfg::kThreads>(sV + (stage ^ 1) * Cfg::kKVBytes, vbase,
                                                       stride, (kb + 1) * kBkv, T);
    }
    attn::CpAsyncCommit();
    attn::CpAsyncWait<1>();  // tile kb (and Q) have landed for this thread
    wgmma::FenceProxyAsync();
    __syncthreads();  // ... and for every thread

    const int kv0 = kb * kBkv;
    // Tiles start at multiples of 64 and so do warpgroups: a processed tile starts at or
    // before the warpgroup's first row, so every row sees key kv0 and its maximum is finite.
    if (kv0 <= qw + 63) {
      const uint32_t k_addr = attn::SmemAddr(sK + stage * Cfg::kKVBytes);
      const uint32_t v_addr = attn::SmemAddr(sV + stage * Cfg::kKVBytes);
      float s[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = 0.f;
      wgmma::FenceOperand(s);
      wgmma::Fence();
#pragma unroll
      for (int kk = 0; kk < HS / 16; ++kk) {
        const uint32_t step = (kk % 4) * 32u;  // within the atom
        wgmma::WgmmaSS64<0, 0>(s, wgmma::Desc(q_addr + (kk / 4) * kBq * 128 + step, 16, 1024),
                               wgmma::Desc(k_addr + (kk / 4) * kBkv * 128 + step, 16, 1024),
                               kk > 0);
      }
      wgmma::Commit();
      wgmma::Wait<0>();
      wgmma::FenceOperand(s);

      if (kv0 + kBkv - 1 > qw) {  // crosses the warpgroup's diagonal: mask key > query
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (kv0 + 8 * j + 2 * t4 + (e & 1) > row + (e >> 1) * 8) s[4 * j + e] = -INFINITY;
          }
        }
      }
      float alpha0, alpha1;
      OnlineSoftmaxTile(s, scale_log2, m0, m1, l0, l1, alpha0, alpha1);
      uint32_t p[4][4];
      RescaleAndPackP(o, p, s, alpha0, alpha1);
      wgmma::FenceOperand(o);
      wgmma::Fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint64_t dv = wgmma::Desc(v_addr + kk * 16 * 128, kBkv * 128, 1024);
        if constexpr (HS == 64) {
          wgmma::WgmmaRS64<1>(o, p[kk], dv);
        } else {
          wgmma::WgmmaRS128<1>(o, p[kk], dv);
        }
      }
      wgmma::Commit();
      wgmma::Wait<0>();
      wgmma::FenceOperand(o);
    }
    __syncthreads();  // every warpgroup is done with this stage before it is refilled
  }
  attn::CpAsyncWait<0>();
  StoreForwardOutput<HS, kFp8>(o, m0, m1, l0, l1, sQ, fp8_stats, out, stats, fp8_out, fp8_scale,
                               fp8_amax, fp8_counts, b, h, T, C, NH, q0);
#else
  __trap();  // launched only where AttentionWgmmaAvailable() holds
#endif
}

}  // namespace boulder::kernels::cuda::attn

#endif  // BOULDER_KERNELS_CUDA_ATTENTION_FWD_SM90_CUH_
