// Causal flash attention, forward, on wgmma with each warpgroup's products software-pipelined
// across key tiles (FlashAttention-3's intra-warpgroup overlap), a variant of
// attention_fwd_sm90.cuh's kernel: the same block shape (two warpgroups of 64 query rows, 64-key
// tiles of K and V in 128-byte-swizzled shared memory), the same online softmax in base 2 and
// the same outputs and statistics, in a different order of work.
//
// attention_fwd_sm90.cuh waits for S = Q·Kⱼᵀ before its softmax and for O += Pⱼ·Vⱼ before the
// next tile, so a warpgroup's tensor cores idle during its softmax. Here iteration j issues
//   S_j = Q·K_jᵀ, then O += P_{j-1}·V_{j-1} (P_{j-1} in registers from iteration j-1),
// waits for S_j only (wgmma.wait_group 1), runs S_j's softmax while the P·V product runs, then
// waits for it, rescales O by the new maximum's correction exp2(m_{j-1} - m_j) and rounds P_j
// into the registers the finished product read. Iteration 0 issues S_0 alone, one iteration
// past the last tile the last P·V alone. Both warpgroups run all of the block's key tiles (the
// plain kernel's first warpgroup skips the one past its rows, here wholly masked, which leaves
// O and l as they were): with a wgmma under a branch on the warpgroup, or a branch between a
// product's issue and its wait, ptxas serialises the products (its C7520 report). For the same
// reason the causal mask is applied to every tile without a branch.
//
// Shared memory: K_j and V_{j-1} are read in iteration j, so V is copied one iteration after
// K: at iteration j (after its one block barrier) K_{j+1} goes into the slot of K_{j-1} and V_j
// into the slot of V_{j-2}, both released by every warpgroup's waits in iteration j-1. The copy
// of iteration j is awaited at the start of iteration j+1 (cp.async.wait_group 0), so it has a
// whole iteration to land.
//
// Registers: P_{j-1} (16) stays live during S_j's softmax, on top of S_j (32) and O (HS/2).
// kMinBlocks: the blocks per multiprocessor the launch bounds ask for (2 caps registers at 128
// per thread, 1 at 255). ptxas (CUDA 13.0, sm_90a): head size 64 119 registers at 2 (134 at
// 1), no spills; head size 128 194 at 1, no spills, while at 2 it spills ~300 bytes and
// serialises the products, so the launcher never runs that one.
#ifndef BOULDER_KERNELS_CUDA_ATTENTION_FWD_SM90_PIPELINED_CUH_
#define BOULDER_KERNELS_CUDA_ATTENTION_FWD_SM90_PIPELINED_CUH_

#include "kernels/cuda/attention_fwd_sm90.cuh"

namespace boulder::kernels::cuda::attn {

template <int HS, bool kFp8, int kMinBlocks>
__global__ void __launch_bounds__(Sm90FwdCfg<HS>::kThreads, kMinBlocks)
    FlashForwardSm90PipelinedKernel(bf16* __restrict__ out, float* __restrict__ stats,
                                    const bf16* __restrict__ qkv, int T, int C, int NH,
                                    float scale_log2, uint8_t* __restrict__ fp8_out,
                                    const float* __restrict__ fp8_scale, float* fp8_amax,
                                    unsigned long long* fp8_counts) {
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
  const int n_kv = (min(q0 + kBq, T) - 1) / kBkv + 1;  // the block's key tiles
  const int qw = q0 + 64 * wg;                          // the warpgroup's first query row
  const int row = qw + 16 * wq + g;  // this thread's rows: row and row + 8

  attn::LoadSwizzledAsync<kBq, HS, Cfg::kThreads>(sQ, qbase, stride, q0, T);
  attn::LoadSwizzledAsync<kBkv, HS, Cfg::kThreads>(sK, kbase, stride, 0, T);
  attn::CpAsyncCommit();

  const uint32_t q_addr = attn::SmemAddr(sQ) + wg * 64 * 128;
  float o[kO];
#pragma unroll
  for (int i = 0; i < kO; ++i) o[i] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  uint32_t p[4][4] = {};  // P_{j-1}, BF16 pairs in the A-fragment layout of the P·V product
  // Iteration j's start: K_j and V_{j-1} have landed for every thread (and at j = 0 Q), and
  // every warpgroup is done with K_{j-1} and V_{j-2}, whose slots then take K_{j+1} and V_j.
  auto sync_and_load = [&](int j) {
    attn::CpAsyncWait<0>();
    wgmma::FenceProxyAsync();
    __syncthreads();
    if (j + 1 < n_kv) {
      attn::LoadSwizzledAsync<kBkv, HS, Cfg::kThreads>(sK + ((j + 1) & 1) * Cfg::kKVBytes, kbase,
                                                       stride, (j + 1) * kBkv, T);
    }
    if (j < n_kv) {
      attn::LoadSwizzledAsync<kBkv, HS, Cfg::kThreads>(sV + (j & 1) * Cfg::kKVBytes, vbase,
                                                       stride, j * kBkv, T);
    }
    attn::CpAsyncCommit();
  };
  auto issue_s = [&](int j, float(&s)[32]) {  // S_j = Q·K_jᵀ, one group
    const uint32_t k_addr = attn::SmemAddr(sK + (j & 1) * Cfg::kKVBytes);
#pragma unroll
    for (int kk = 0; kk < HS / 16; ++kk) {
      const uint32_t step = (kk % 4) * 32u;  // within the atom
      wgmma::WgmmaSS64<0, 0>(s, wgmma::Desc(q_addr + (kk / 4) * kBq * 128 + step, 16, 1024),
                             wgmma::Desc(k_addr + (kk / 4) * kBkv * 128 + step, 16, 1024),
                             kk > 0);
    }
    wgmma::Commit();
  };
  auto issue_pv = [&](int j) {  // O += P_{j-1}·V_{j-1}, one group
    const uint32_t v_addr = attn::SmemAddr(sV + ((j - 1) & 1) * Cfg::kKVBytes);
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
  };
  // S_j's causal mask, then its online softmax (OnlineSoftmaxTile: s becomes P_j in FP32). The
  // mask is applied to every tile without a branch (it changes nothing below the diagonal): a
  // branch on the warpgroup here, with P·V in flight, makes ptxas serialise the products.
  auto mask_and_softmax = [&](int j, float(&s)[32], float& alpha0, float& alpha1) {
    const int kv0 = j * kBkv;
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool masked = kv0 + 8 * jj + 2 * t4 + (e & 1) > row + (e >> 1) * 8;
        s[4 * jj + e] = masked ? -INFINITY : s[4 * jj + e];
      }
    }
    OnlineSoftmaxTile(s, scale_log2, m0, m1, l0, l1, alpha0, alpha1);
  };
  // Both warpgroups run every one of the block's n_kv tiles, so no wgmma sits under a branch on
  // the warpgroup. The first one's last tile (past its rows when the second has rows there) is
  // then wholly masked: its maximum stays, its correction is 1 and its P is 0, so O and l keep
  // their values (the plain kernel skips that tile).
  {  // j = 0: S_0 alone
    sync_and_load(0);
    float s[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.f;
    wgmma::FenceOperand(s);
    wgmma::Fence();
    issue_s(0, s);
    wgmma::Wait<0>();
    wgmma::FenceOperand(s);
    float alpha0, alpha1;
    mask_and_softmax(0, s, alpha0, alpha1);
    RescaleAndPackP(o, p, s, alpha0, alpha1);
  }
  for (int j = 1; j < n_kv; ++j) {  // S_j, with P_{j-1}·V_{j-1} under its softmax
    sync_and_load(j);
    float s[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.f;
    wgmma::FenceOperand(s);
    wgmma::FenceOperand(o);
    wgmma::Fence();
    issue_s(j, s);
    issue_pv(j);
    wgmma::Wait<1>();  // S_j; P_{j-1}·V_{j-1} may still run
    wgmma::FenceOperand(s);
    float alpha0, alpha1;
    mask_and_softmax(j, s, alpha0, alpha1);
    wgmma::Wait<0>();  // O holds P_{j-1}·V_{j-1}; p is free
    wgmma::FenceOperand(o);
    RescaleAndPackP(o, p, s, alpha0, alpha1);  // after the P·V reading p has retired
  }
  sync_and_load(n_kv);  // V_{n_kv - 1} has landed
  wgmma::FenceOperand(o);
  wgmma::Fence();
  issue_pv(n_kv);  // the last P·V
  wgmma::Wait<0>();
  wgmma::FenceOperand(o);
  attn::CpAsyncWait<0>();
  StoreForwardOutput<HS, kFp8>(o, m0, m1, l0, l1, sQ, fp8_stats, out, stats, fp8_out, fp8_scale,
                               fp8_amax, fp8_counts, b, h, T, C, NH, q0);
#else
  __trap();  // launched only where AttentionWgmmaAvailable() holds
#endif
}

}  // namespace boulder::kernels::cuda::attn

#endif  // BOULDER_KERNELS_CUDA_ATTENTION_FWD_SM90_PIPELINED_CUH_
