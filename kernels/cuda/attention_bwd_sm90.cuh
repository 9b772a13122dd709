// Causal flash attention, backward KV kernel, on Hopper's warpgroup tensor-core instructions
// (wgmma, sm_90a only). Same algorithm, inputs and outputs as attention_bwd.cuh's
// FlashBackwardKVKernel (read its header for the math and the preprocess/dQ kernels around
// it); attention_bwd.cu picks this one where AttentionWgmmaAvailable().
//
// One block of two warpgroups (256 threads) per (128-key tile, head, batch row); warpgroup w
// owns key rows [64w, 64w + 64), whose dK and dV accumulate in registers while the block walks
// the query tiles (kBq = 128 at head size 64, 64 at 128) from the diagonal to T. K, V and the
// double-buffered Q and dO tiles sit in 128-byte-swizzled shared tiles (wgmma.cuh). Per
// warpgroup and query tile:
//   Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: m64n{kBq}k16 products, both operands from shared memory, both
//     issued before one wait;
//   Pᵀ = 2^(Sᵀ·c − lse2) (masked where the tile crosses the diagonal or passes T) and
//     dSᵀ = Pᵀ ∘ (dPᵀ − D), in the accumulators;
//   dV += Pᵀ·dO and dK += dSᵀ·Q with Pᵀ and dSᵀ from registers, dO and Q read MN-major;
// dK (times the softmax scale) and dV are written (=) at the end through the K and V tiles.
//
// dQ comes from a second kernel, FlashBackwardQSm90Kernel, in both modes of `deterministic`:
// on the H200 it is faster than adding dS·K with atomics from this kernel (attention_bench,
// per layer call: GPT-2 0.325 against 0.330 ms, hidden-2048 0.357 against 0.388; the atomic
// variant, verified and then removed, is in the history at 1945aab) and it is bit-reproducible.
// It runs one block of two warpgroups per 128-query tile, warpgroup w owning query rows [64w, 64w +
// 64) and their dQ in registers while the block walks the 64-key tiles from 0 to the diagonal in a
// fixed order (K and V double-buffered): S = Q·Kᵀ and dP = dO·Vᵀ issued together, P and
// dS = P ∘ (dP − D) in the accumulators, dQ += dS·K with dS from registers and K read MN-major.
// Bit-reproducible: no atomics, the same order every run. dQ times the scale is written (=).
//
// The stored-dS variant (AttentionDq::kStoredDs) removes the dQ kernel's two recomputed products
// (S and dP): the dK/dV kernel (kStoreDs) also writes the BF16 dSᵀ it already holds for dK's
// product into a packed buffer (DsBlockOffset: per (batch, head) the 64 × 64 blocks on and below
// the diagonal, each [64 keys][64 queries] in the 128-byte-swizzled layout of a shared tile), and
// FlashBackwardDqFromDsSm90Kernel computes dQ = scale · dS·K from those blocks and K alone:
// one product instead of three, for B·NH·nb(nb+1)/2·8 KiB written and read again (nb = ⌈T/64⌉).
// The same dS values as dK's (the recomputing kernel rounds its own S = Q·Kᵀ), a fixed key order,
// no atomics: bit-reproducible as well.
#ifndef BOULDER_KERNELS_CUDA_ATTENTION_BWD_SM90_CUH_
#define BOULDER_KERNELS_CUDA_ATTENTION_BWD_SM90_CUH_

#include "kernels/cuda/attention_bwd.cuh"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace boulder::kernels::cuda::attn {

template <int HS>
struct Sm90BwdCfg {
  static constexpr int kThreads = 256, kBkv = 128, kBq = HS == 64 ? 128 : 64;
  static constexpr int kKVBytes = HS / 64 * kBkv * 128;  // K or V
  static constexpr int kQBytes = HS / 64 * kBq * 128;    // Q or dO, one stage
  // K, V, Q[2], dO[2], lse2[2], D[2], and room to align the start to 1024 bytes.
  static constexpr int kSmemBytes = 2 * kKVBytes + 4 * kQBytes + 4 * kBq * 4 + 1024;
  // With kStoreDs also the dSᵀ staging: [2 stages][2 warpgroups][kBq / 64 blocks of 8 KiB].
  static constexpr int kDsStageBytes = 2 * (kBq / 64) * 64 * 64 * 2;
  static constexpr int kSmemBytesStoreDs = kSmemBytes + 2 * kDsStageBytes;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(BOULDER_ATTENTION_EMULATION)
// d (m64nN) = or += A·B, N = 64 or 128, A and B from shared memory.
template <int N, int kTransA, int kTransB>
__device__ __forceinline__ void WgmmaSS(float (&d)[N / 2], uint64_t a, uint64_t b, int scale_d) {
  if constexpr (N == 64) {
    wgmma::WgmmaSS64<kTransA, kTransB>(d, a, b, scale_d);
  } else {
    wgmma::WgmmaSS128<kTransA, kTransB>(d, a, b, scale_d);
  }
}
// d (m64nN) += A·B, A from registers, B MN-major.
template <int N>
__device__ __forceinline__ void WgmmaRSMN(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (N == 64) {
    wgmma::WgmmaRS64<1>(d, a, b);
  } else {
    wgmma::WgmmaRS128<1>(d, a, b);
  }
}
#endif

// The stored-dS buffer: per (batch, head) bh, the nb(nb+1)/2 blocks (query block qb, key block
// kb), kb <= qb < nb = ⌈T/64⌉, in the order (qb, kb) → qb(qb+1)/2 + kb, 8 KiB each: [64 keys][64
// queries] BF16, key row r at r·128 bytes, its 16-byte chunk c (queries 8c..8c+7) at chunk
// position c ^ (r % 8) — a shared tile's swizzled layout (wgmma.cuh), so the dQ kernel copies a
// block byte for byte and reads it as its product's MN-major A operand. Entries past T are 0.
constexpr int kDsBlockBytes = 64 * 64 * 2;
__host__ __device__ __forceinline__ size_t DsBlocksPerHead(int T) {
  const size_t nb = (size_t(T) + 63) / 64;
  return nb * (nb + 1) / 2;
}
__host__ __device__ __forceinline__ size_t DsBlockOffset(size_t bh, int T, int qb, int kb) {
  return (bh * DsBlocksPerHead(T) + size_t(qb) * (qb + 1) / 2 + kb) * kDsBlockBytes;
}
__host__ __device__ __forceinline__ size_t DsBufferBytes(int B, int NH, int T) {
  return size_t(B) * NH * DsBlocksPerHead(T) * kDsBlockBytes;
}

// kStoreDs: also writes dSᵀ into `ds` (the stored-dS buffer above) for FlashBackwardDqFromDsSm90Kernel.
template <int HS, bool kStoreDs = false>
__global__ void __launch_bounds__(Sm90BwdCfg<HS>::kThreads, 1)
    FlashBackwardKVSm90Kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout,
                              const bf16* __restrict__ qkv, const float* __restrict__ lse2,
                              const float* __restrict__ Dp, int T, int Tp, int C, int NH,
                              float scale, float scale_log2, unsigned char* __restrict__ ds = nullptr) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(BOULDER_ATTENTION_EMULATION)
  using Cfg = Sm90BwdCfg<HS>;
  constexpr int kBkv = Cfg::kBkv, kBq = Cfg::kBq, kThreads = Cfg::kThreads;
  constexpr int kN = kBq / 2, kO = HS / 2;  // accumulators per thread: Sᵀ (and dPᵀ), dK (and dV)
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* sK = attn::AlignSwizzled(smem);
  unsigned char* sV = sK + Cfg::kKVBytes;
  unsigned char* sQ = sV + Cfg::kKVBytes;                        // [2]
  unsigned char* sdO = sQ + 2 * Cfg::kQBytes;                    // [2]
  float* sL = reinterpret_cast<float*>(sdO + 2 * Cfg::kQBytes);  // [2][kBq]
  float* sD = sL + 2 * kBq;                                      // [2][kBq]
  // kStoreDs: the dSᵀ staging, 1024-byte aligned (the swizzle's period; kSmemBytes - 1024 is a
  // multiple of 1024).
  unsigned char* sS = sK + (Cfg::kSmemBytes - 1024);

  const int kt = blockIdx.y;  // grid (B·NH, key tiles), as the mma.sync kernel
  const int h = blockIdx.x % NH, b = blockIdx.x / NH;
  const int wg = threadIdx.x / 128, wq = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;
  const size_t stride = 3 * size_t(C);
  const bf16* qbase = qkv + size_t(b) * T * stride + h * HS;
  const bf16* dobase = dout + size_t(b) * T * C + h * HS;
  const float* lrow = lse2 + (size_t(b) * NH + h) * Tp;
  const float* drow = Dp + (size_t(b) * NH + h) * Tp;
  const int kv0 = kt * kBkv;
  const int qt_begin = kv0 / kBq, n_qt = (T + kBq - 1) / kBq;

  auto load_q_tile = [&](int qt, int stage) {
    attn::LoadSwizzledAsync<kBq, HS, kThreads>(sQ + stage * Cfg::kQBytes, qbase, stride, qt * kBq,
                                               T);
    attn::LoadSwizzledAsync<kBq, HS, kThreads>(sdO + stage * Cfg::kQBytes, dobase, size_t(C),
                                               qt * kBq, T);
    attn::LoadFloatsAsync<kBq>(sL + stage * kBq, lrow + qt * kBq);
    attn::LoadFloatsAsync<kBq>(sD + stage * kBq, drow + qt * kBq);
  };
  attn::LoadSwizzledAsync<kBkv, HS, kThreads>(sK, qbase + C, stride, kv0, T);
  attn::LoadSwizzledAsync<kBkv, HS, kThreads>(sV, qbase + 2 * C, stride, kv0, T);
  load_q_tile(qt_begin, 0);
  attn::CpAsyncCommit();

  const int kvw = kv0 + 64 * wg;       // the warpgroup's first key
  const int krow = kvw + 16 * wq + g;  // this thread's keys: krow and krow + 8
  const uint32_t k_addr = attn::SmemAddr(sK) + wg * 64 * 128;
  const uint32_t v_addr = attn::SmemAddr(sV) + wg * 64 * 128;
  float dk[kO], dv[kO];
#pragma unroll
  for (int i = 0; i < kO; ++i) dk[i] = dv[i] = 0.f;

  for (int qt = qt_begin; qt < n_qt; ++qt) {
    const int stage = (qt - qt_begin) & 1;
    if (qt + 1 < n_qt) load_q_tile(qt + 1, stage ^ 1);
    attn::CpAsyncCommit();
    attn::CpAsyncWait<1>();
    wgmma::FenceProxyAsync();
    __syncthreads();

    const int q0 = qt * kBq;
    const uint32_t q_addr = attn::SmemAddr(sQ + stage * Cfg::kQBytes);
    const uint32_t do_addr = attn::SmemAddr(sdO + stage * Cfg::kQBytes);
    const float* sLs = sL + stage * kBq;
    const float* sDs = sD + stage * kBq;
    if (kvw <= q0 + kBq - 1) {  // some (query, key) pair of the warpgroup's is visible
      // Three commit groups in flight order: Sᵀ, dPᵀ, then dV once Pᵀ is known; each wait
      // retires the oldest, so the softmax overlaps dPᵀ and the dSᵀ arithmetic overlaps dV.
      float st[kN], dpt[kN];  // Sᵀ then Pᵀ, dPᵀ then dSᵀ: rows keys, columns queries
#pragma unroll
      for (int i = 0; i < kN; ++i) st[i] = dpt[i] = 0.f;
      wgmma::FenceOperand(st);
      wgmma::FenceOperand(dpt);
      wgmma::Fence();
#pragma unroll
      for (int kk = 0; kk < HS / 16; ++kk) {
        const uint32_t step = (kk % 4) * 32u;  // within the atom
        WgmmaSS<kBq, 0, 0>(st, wgmma::Desc(k_addr + (kk / 4) * kBkv * 128 + step, 16, 1024),
                           wgmma::Desc(q_addr + (kk / 4) * kBq * 128 + step, 16, 1024), kk > 0);
      }
      wgmma::Commit();
#pragma unroll
      for (int kk = 0; kk < HS / 16; ++kk) {
        const uint32_t step = (kk % 4) * 32u;
        WgmmaSS<kBq, 0, 0>(dpt, wgmma::Desc(v_addr + (kk / 4) * kBkv * 128 + step, 16, 1024),
                           wgmma::Desc(do_addr + (kk / 4) * kBq * 128 + step, 16, 1024), kk > 0);
      }
      wgmma::Commit();
      wgmma::Wait<1>();  // Sᵀ
      wgmma::FenceOperand(st);

      const bool mask = kvw + 63 > q0 || q0 + kBq > T;
#pragma unroll
      for (int j = 0; j < kBq / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int ql = 8 * j + 2 * t4 + (e & 1);
          float p = exp2f(fmaf(st[4 * j + e], scale_log2, -sLs[ql]));
          if (mask) {
            const int kv = krow + (e >> 1) * 8, q = q0 + ql;
            if (kv > q || q >= T) p = 0.f;
          }
          st[4 * j + e] = p;
        }
      }
      uint32_t pa[kBq / 16][4];
#pragma unroll
      for (int kk = 0; kk < kBq / 16; ++kk) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          pa[kk][r] = attn::PackBf16(st[8 * kk + 2 * r], st[8 * kk + 2 * r + 1]);
        }
      }
      wgmma::FenceOperand(dv);
      wgmma::Fence();
#pragma unroll
      for (int kk = 0; kk < kBq / 16; ++kk) {
        WgmmaRSMN<HS>(dv, pa[kk], wgmma::Desc(do_addr + kk * 16 * 128, kBq * 128, 1024));
      }
      wgmma::Commit();
      wgmma::Wait<1>();  // dPᵀ
      wgmma::FenceOperand(dpt);

      uint32_t da[kBq / 16][4];
#pragma unroll
      for (int kk = 0; kk < kBq / 16; ++kk) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int j = 2 * kk + r / 2, e = 2 * (r % 2);  // accumulators 4j + e, 4j + e + 1
          const int ql = 8 * j + 2 * t4;
          da[kk][r] = attn::PackBf16(st[4 * j + e] * (dpt[4 * j + e] - sDs[ql]),
                                     st[4 * j + e + 1] * (dpt[4 * j + e + 1] - sDs[ql + 1]));
        }
      }
      wgmma::FenceOperand(dk);
      wgmma::Fence();
#pragma unroll
      for (int kk = 0; kk < kBq / 16; ++kk) {
        WgmmaRSMN<HS>(dk, da[kk], wgmma::Desc(q_addr + kk * 16 * 128, kBq * 128, 1024));
      }
      wgmma::Commit();
      wgmma::Wait<0>();
      wgmma::FenceOperand(dv);
      wgmma::FenceOperand(dk);
      if constexpr (kStoreDs) {
        // dSᵀ rows r = 16wq + g and r + 8 of key block kb, query blocks q0 / 64 + i, into this
        // stage's staging of the warpgroup (the stored layout, byte for byte: block j of 8
        // queries is chunk j % 8 of block j / 8, da[j / 2][2 (j % 2)] in row r and
        // da[j / 2][2 (j % 2) + 1] in row r + 8), then one thread copies each kept block
        // (not above the diagonal, not past T) to the buffer with a bulk copy. Its group is
        // committed below; the staging is rewritten two query tiles later, after the wait there.
        const int kb = kvw / 64, nb = (T + 63) / 64, r = 16 * wq + g;
        unsigned char* stg = sS + stage * Cfg::kDsStageBytes + wg * (kBq / 64) * kDsBlockBytes;
        uint32_t row = attn::SmemAddr(stg) + r * 128 + 4 * t4;
        asm volatile("" : "+r"(row));  // made here, not kept live across the loop
#pragma unroll
        for (int j = 0; j < kBq / 8; ++j) {
          const uint32_t at = row + (j / 8) * kDsBlockBytes + (((j % 8) ^ g) << 4);
          wgmma::StoreShared32(at, da[j / 2][2 * (j % 2)]);
          wgmma::StoreShared32(at + 8 * 128, da[j / 2][2 * (j % 2) + 1]);
        }
        wgmma::FenceProxyAsync();
        attn::WarpgroupBarrier(wg);
        if (threadIdx.x % 128 == 0) {
#pragma unroll
          for (int i = 0; i < kBq / 64; ++i) {
            const int qb = q0 / 64 + i;
            if (qb >= kb && qb < nb) {
              wgmma::BulkStore(ds + DsBlockOffset(blockIdx.x, T, qb, kb),
                              attn::SmemAddr(stg + i * kDsBlockBytes), kDsBlockBytes);
            }
          }
        }
      }
    }
    if constexpr (kStoreDs) {
      // One group per query tile (empty where nothing was copied), so that after this wait the
      // group two tiles back (the same staging) has read it.
      if (threadIdx.x % 128 == 0) {
        wgmma::BulkCommit();
        wgmma::BulkWaitRead<1>();
      }
    }
    __syncthreads();  // every warpgroup is done with this stage before a refill
  }
  attn::CpAsyncWait<0>();
  if constexpr (kStoreDs) {
    if (threadIdx.x % 128 == 0) wgmma::BulkWaitAll();
  }

  // The warpgroup's K and V rows (read by nothing any more) stage its dK and dV.
  const int kr = 64 * wg + 16 * wq + g;
  attn::StageAccumulators<kBkv, HS>(sK, kr, dk, scale, scale);
  attn::StageAccumulators<kBkv, HS>(sV, kr, dv, 1.f, 1.f);
  attn::WarpgroupBarrier(wg);
  bf16* dst = dqkv + size_t(b) * T * stride + h * HS;
  attn::StoreWarpgroupRows<kBkv, HS>(dst + C, stride, kvw, T, sK, 64 * wg);
  attn::StoreWarpgroupRows<kBkv, HS>(dst + 2 * C, stride, kvw, T, sV, 64 * wg);
#else
  __trap();  // launched only where AttentionWgmmaAvailable() holds
#endif
}

template <int HS>
struct Sm90QCfg {
  static constexpr int kThreads = 256, kBq = 128, kBkv = 64;
  static constexpr int kQBytes = HS / 64 * kBq * 128;    // Q or dO
  static constexpr int kKVBytes = HS / 64 * kBkv * 128;  // K or V, one stage
  // Q, dO, K[2], V[2], and room to align the start to 1024 bytes.
  static constexpr int kSmemBytes = 2 * kQBytes + 4 * kKVBytes + 1024;
};

template <int HS>
__global__ void __launch_bounds__(Sm90QCfg<HS>::kThreads, HS == 64 ? 2 : 1)
    FlashBackwardQSm90Kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout,
                             const bf16* __restrict__ qkv, const float* __restrict__ lse2,
                             const float* __restrict__ Dp, int T, int Tp, int C, int NH,
                             float scale, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(BOULDER_ATTENTION_EMULATION)
  using Cfg = Sm90QCfg<HS>;
  constexpr int kBq = Cfg::kBq, kBkv = Cfg::kBkv, kThreads = Cfg::kThreads, kO = HS / 2;
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* sQ = attn::AlignSwizzled(smem);
  unsigned char* sdO = sQ + Cfg::kQBytes;
  unsigned char* sK = sdO + Cfg::kQBytes;      // [2]
  unsigned char* sV = sK + 2 * Cfg::kKVBytes;  // [2]

  const int qt = gridDim.y - 1 - blockIdx.y;  // grid (B·NH, query tiles): longest first
  const int h = blockIdx.x % NH, b = blockIdx.x / NH;
  const int wg = threadIdx.x / 128, wq = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;
  const size_t stride = 3 * size_t(C);
  const bf16* qbase = qkv + size_t(b) * T * stride + h * HS;
  const bf16* kbase = qbase + C;
  const bf16* vbase = qbase + 2 * C;
  const int q0 = qt * kBq;
  const int n_kv = (min(q0 + kBq, T) - 1) / kBkv + 1;

  attn::LoadSwizzledAsync<kBq, HS, kThreads>(sQ, qbase, stride, q0, T);
  attn::LoadSwizzledAsync<kBq, HS, kThreads>(sdO, dout + size_t(b) * T * C + h * HS, size_t(C), q0,
                                             T);
  attn::LoadSwizzledAsync<kBkv, HS, kThreads>(sK, kbase, stride, 0, T);
  attn::LoadSwizzledAsync<kBkv, HS, kThreads>(sV, vbase, stride, 0, T);
  attn::CpAsyncCommit();

  const int qw = q0 + 64 * wg;       // the warpgroup's first query row
  const int row = qw + 16 * wq + g;  // this thread's rows: row and row + 8
  // The preprocess arrays are padded to Tp >= q0 + kBq.
  const size_t bh = size_t(b) * NH + h;
  const float lse0 = lse2[bh * Tp + row], lse1 = lse2[bh * Tp + row + 8];
  const float D0 = Dp[bh * Tp + row], D1 = Dp[bh * Tp + row + 8];
  const uint32_t q_addr = attn::SmemAddr(sQ) + wg * 64 * 128;
  const uint32_t do_addr = attn::SmemAddr(sdO) + wg * 64 * 128;
  float dq[kO];
#pragma unroll
  for (int i = 0; i < kO; ++i) dq[i] = 0.f;

  for (int kb = 0; kb < n_kv; ++kb) {
    const int stage = kb & 1;
    if (kb + 1 < n_kv) {
      attn::LoadSwizzledAsync<kBkv, HS, kThreads>(sK + (stage ^ 1) * Cfg::kKVBytes, kbase, stride,
                                                  (kb + 1) * kBkv, T);
      attn::LoadSwizzledAsync<kBkv, HS, kThreads>(sV + (stage ^ 1) * Cfg::kKVBytes, vbase, stride,
                                                  (kb + 1) * kBkv, T);
    }
    attn::CpAsyncCommit();
    attn::CpAsyncWait<1>();
    wgmma::FenceProxyAsync();
    __syncthreads();

    const int kv0 = kb * kBkv;
    if (kv0 <= qw + 63) {  // as in the forward: every row sees key kv0
      const uint32_t k_addr = attn::SmemAddr(sK + stage * Cfg::kKVBytes);
      const uint32_t v_addr = attn::SmemAddr(sV + stage * Cfg::kKVBytes);
      float s[32], dp[32];  // S then P, dP
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = dp[i] = 0.f;
      wgmma::FenceOperand(s);
      wgmma::FenceOperand(dp);
      wgmma::Fence();
#pragma unroll
      for (int kk = 0; kk < HS / 16; ++kk) {
        const uint32_t step = (kk % 4) * 32u;  // within the atom
        wgmma::WgmmaSS64<0, 0>(s, wgmma::Desc(q_addr + (kk / 4) * kBq * 128 + step, 16, 1024),
                               wgmma::Desc(k_addr + (kk / 4) * kBkv * 128 + step, 16, 1024),
                               kk > 0);
      }
      wgmma::Commit();
#pragma unroll
      for (int kk = 0; kk < HS / 16; ++kk) {
        const uint32_t step = (kk % 4) * 32u;
        wgmma::WgmmaSS64<0, 0>(dp, wgmma::Desc(do_addr + (kk / 4) * kBq * 128 + step, 16, 1024),
                               wgmma::Desc(v_addr + (kk / 4) * kBkv * 128 + step, 16, 1024),
                               kk > 0);
      }
      wgmma::Commit();
      wgmma::Wait<1>();  // S
      wgmma::FenceOperand(s);
      const bool mask = kv0 + kBkv - 1 > qw || qw + 64 > T;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int q = row + (e >> 1) * 8;
          float p = exp2f(fmaf(s[4 * j + e], scale_log2, -((e >> 1) ? lse1 : lse0)));
          if (mask && (kv0 + 8 * j + 2 * t4 + (e & 1) > q || q >= T)) p = 0.f;
          s[4 * j + e] = p;
        }
      }
      wgmma::Wait<0>();  // dP
      wgmma::FenceOperand(dp);
      uint32_t da[4][4];  // dS as the A operand of dS·K, one 16-key step each
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int j = 2 * kk + r / 2, e = 2 * (r % 2);  // accumulators 4j + e, 4j + e + 1
          const float d = e ? D1 : D0;
          da[kk][r] = attn::PackBf16(s[4 * j + e] * (dp[4 * j + e] - d),
                                     s[4 * j + e + 1] * (dp[4 * j + e + 1] - d));
        }
      }
      wgmma::FenceOperand(dq);
      wgmma::Fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        WgmmaRSMN<HS>(dq, da[kk], wgmma::Desc(k_addr + kk * 16 * 128, kBkv * 128, 1024));
      }
      wgmma::Commit();
      wgmma::Wait<0>();
      wgmma::FenceOperand(dq);
    }
    __syncthreads();  // every warpgroup is done with this stage before it is refilled
  }
  attn::CpAsyncWait<0>();

  // The warpgroup's Q rows (read only by its own, finished, products) stage its dQ.
  attn::StageAccumulators<kBq, HS>(sQ, 64 * wg + 16 * wq + g, dq, scale, scale);
  attn::WarpgroupBarrier(wg);
  attn::StoreWarpgroupRows<kBq, HS>(dqkv + size_t(b) * T * stride + h * HS, stride, qw, T, sQ,
                                    64 * wg);
#else
  __trap();  // launched only where AttentionWgmmaAvailable() holds
#endif
}

// dQ = scale · dS·K from the stored dS (FlashBackwardKVSm90Kernel<HS, true>). One block of two
// warpgroups per 128-query tile (longest first), warpgroup w owning query block qb = 2·tile + w
// (rows [64w, 64w + 64) of the tile) and its dQ in registers; the block walks the key blocks
// 0..(its last query block) in order with a 3-stage cp.async ring of (K rows [64 kb, 64 kb + 64),
// both warpgroups' dSᵀ blocks), and each warpgroup adds dS·K_kb for kb <= qb: 4 m64n{HS}k16
// products, dS MN-major (the stored [key][query] block) and K MN-major, both from shared memory.
template <int HS>
struct Sm90DqCfg {
  static constexpr int kThreads = 256, kBq = 128, kBkv = 64, kStages = 3;
  static constexpr int kKBytes = HS / 64 * kBkv * 128;         // K rows of one key block
  static constexpr int kStageBytes = kKBytes + 2 * kDsBlockBytes;  // K, dS of warpgroups 0 and 1
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;
  static_assert(kStageBytes >= kBq * HS * 2, "stage 0 also stages the 128 × HS dQ tile");
};

template <int HS>
__global__ void __launch_bounds__(Sm90DqCfg<HS>::kThreads, HS == 64 ? 3 : 2)
    FlashBackwardDqFromDsSm90Kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ qkv,
                                    const unsigned char* __restrict__ ds, int T, int C, int NH,
                                    float scale) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(BOULDER_ATTENTION_EMULATION)
  using Cfg = Sm90DqCfg<HS>;
  constexpr int kThreads = Cfg::kThreads, kStages = Cfg::kStages, kO = HS / 2;
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* base = attn::AlignSwizzled(smem);

  const int qt = gridDim.y - 1 - blockIdx.y;  // grid (B·NH, query tiles): longest first
  const int h = blockIdx.x % NH, b = blockIdx.x / NH;
  const int wg = threadIdx.x / 128, wq = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane / 4;
  const size_t stride = 3 * size_t(C);
  const bf16* kbase = qkv + size_t(b) * T * stride + h * HS + C;
  const int nb = (T + 63) / 64;
  const int qb = 2 * qt + wg;                    // this warpgroup's query block
  const int n_kb = min(2 * qt + 2, nb);          // key blocks 0..the block's last query block
  const bool rows = qb < nb;                     // the warpgroup has rows below T

  auto load = [&](int kb, int stage) {
    unsigned char* st = base + stage * Cfg::kStageBytes;
    attn::LoadSwizzledAsync<Cfg::kBkv, HS, kThreads>(st, kbase, stride, kb * 64, T);
    // Both warpgroups' dS blocks: 2 × 512 chunks of 16 bytes, 4 per thread; a block above the
    // diagonal or past T is not read (its warpgroup skips this key block).
#pragma unroll
    for (int it = 0; it < 2 * kDsBlockBytes / 16 / kThreads; ++it) {
      const int i = it * kThreads + threadIdx.x;
      const int w = i / (kDsBlockBytes / 16), chunk = i % (kDsBlockBytes / 16);
      const int qbw = 2 * qt + w;
      if (kb <= qbw && qbw < nb) {
        attn::CpAsync16(st + Cfg::kKBytes + w * kDsBlockBytes + chunk * 16,
                        ds + DsBlockOffset(blockIdx.x, T, qbw, kb) + chunk * 16, true);
      }
    }
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_kb) load(s, s);
    attn::CpAsyncCommit();
  }

  float dq[kO];
#pragma unroll
  for (int i = 0; i < kO; ++i) dq[i] = 0.f;
  for (int kb = 0; kb < n_kb; ++kb) {
    const int stage = kb % kStages;
    if (kb + kStages - 1 < n_kb) load(kb + kStages - 1, (kb + kStages - 1) % kStages);
    attn::CpAsyncCommit();
    attn::CpAsyncWait<kStages - 1>();
    wgmma::FenceProxyAsync();
    __syncthreads();
    if (rows && kb <= qb) {
      const uint32_t k_addr = attn::SmemAddr(base + stage * Cfg::kStageBytes);
      const uint32_t ds_addr = k_addr + Cfg::kKBytes + wg * kDsBlockBytes;
      wgmma::FenceOperand(dq);
      wgmma::Fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {  // 16 keys each
        WgmmaSS<HS, 1, 1>(dq, wgmma::Desc(ds_addr + kk * 16 * 128, 64 * 128, 1024),
                          wgmma::Desc(k_addr + kk * 16 * 128, Cfg::kBkv * 128, 1024), 1);
      }
      wgmma::Commit();
      wgmma::Wait<0>();
      wgmma::FenceOperand(dq);
    }
    __syncthreads();  // every warpgroup is done with this stage before it is refilled
  }
  attn::CpAsyncWait<0>();  // (every load was consumed; nothing is in flight)

  // Stage 0 (every warpgroup is past its last product: the loop's final barrier) stages the
  // 128 × HS dQ tile, warpgroup w its rows [64w, 64w + 64).
  attn::StageAccumulators<Cfg::kBq, HS>(base, 64 * wg + 16 * wq + g, dq, scale, scale);
  attn::WarpgroupBarrier(wg);
  attn::StoreWarpgroupRows<Cfg::kBq, HS>(dqkv + size_t(b) * T * stride + h * HS, stride,
                                         qt * Cfg::kBq + 64 * wg, T, base, 64 * wg);
#else
  __trap();  // launched only where AttentionWgmmaAvailable() holds
#endif
}

}  // namespace boulder::kernels::cuda::attn

#endif  // BOULDER_KERNELS_CUDA_ATTENTION_BWD_SM90_CUH_
