// Causal flash attention backward in one pass on Hopper (wgmma, sm_90a only): dK, dV and dQ
// from one kernel, where attention_bwd_sm90.cuh's two kernels recompute S = Q·Kᵀ and dP = dO·Vᵀ
// a second time to get dQ in a fixed order. The way FlashAttention-3 does it: dQ is added into
// an FP32 buffer by the L2 (bulk reductions), so its sums come in no set order and the last bits
// of dQ vary between runs; training.deterministic keeps the two-kernel path.
//
// FlashBackwardFusedSm90Kernel is FlashBackwardKVSm90Kernel (one block of two warpgroups per
// (128-key tile, head, batch row); warpgroup w owns keys [64w, 64w + 64) and their dK, dV in
// registers; the block walks the query tiles, kBq = 128 at head size 64, 64 at 128, from the
// diagonal to T) plus, per query tile, after dSᵀ is known:
//   each warpgroup writes its dSᵀ rows (BF16, as the dK product's A operand rounds them) into
//     a shared [128 keys][kBq queries] tile; the block meets;
//   warpgroup w computes one 64 × 64 part of the tile's dQ = dS·K over the block's 128 keys
//     (m64n64k16 × 8, dS read MN-major as A, K MN-major as B): at head size 64 query rows
//     [64w, 64w + 64) of the tile, at 128 all 64 rows and head columns [64w, 64w + 64);
//   the part goes to shared memory in the accumulators' fragment order (float4 j·128 + t holds
//     thread t's d[4j..4j+3]: conflict-free) and one thread adds it to dq_acc with a 16 KiB
//     bulk reduction (cp.reduce.async.bulk .add.f32), double-buffered so the block never waits
//     for one.
// dq_acc (B·NH·Tp·HS floats, zero before the kernel) holds per (b, h) units of 64 query rows ×
// 64 head columns, unit (r, c) at floats ((b·NH + h)·Tp/64·HS/64 + r·HS/64 + c)·4096, each in
// that fragment order; ConvertDQSm90Kernel writes dQ (× the softmax scale) from it as BF16.
//
// On the first query tile at head size 128 (64 queries, the diagonal) warpgroup 1's keys are
// all later than the tile's queries: it computes nothing and stores zeros as its dSᵀ.
#ifndef BOULDER_KERNELS_CUDA_ATTENTION_BWD_FUSED_SM90_CUH_
#define BOULDER_KERNELS_CUDA_ATTENTION_BWD_FUSED_SM90_CUH_

#include "kernels/cuda/attention_bwd_sm90.cuh"

namespace boulder::kernels::cuda::attn {

template <int HS>
struct Sm90FusedBwdCfg {
  static constexpr int kThreads = 256, kBkv = 128, kBq = HS == 64 ? 128 : 64;
  static constexpr int kKVBytes = HS / 64 * kBkv * 128;  // K or V
  static constexpr int kQBytes = HS / 64 * kBq * 128;    // Q or dO, one stage
  static constexpr int kDSBytes = kBq / 64 * kBkv * 128;  // dSᵀ
  static constexpr int kDQBytes = 64 * 64 * 4;            // one warpgroup's dQ part, one stage
  // K, V, Q[2], dO[2], dSᵀ, dQ[2 warpgroups][2], lse2[2], D[2], and room to align to 1024.
  static constexpr int kSmemBytes =
      2 * kKVBytes + 4 * kQBytes + kDSBytes + 4 * kDQBytes + 4 * kBq * 4 + 1024;
};

// The offset (floats) of dq_acc's unit (query rows [64r, 64r + 64), head columns [64c, 64c + 64))
// of head bh = b·NH + h.
template <int HS>
__host__ __device__ __forceinline__ size_t DQUnit(size_t bh, int Tp, int r, int c) {
  return ((bh * (Tp / 64) + r) * (HS / 64) + c) * 4096;
}

template <int HS>
__global__ void __launch_bounds__(Sm90FusedBwdCfg<HS>::kThreads, 1)
    FlashBackwardFusedSm90Kernel(bf16* __restrict__ dqkv, float* __restrict__ dq_acc,
                                 const bf16* __restrict__ dout, const bf16* __restrict__ qkv,
                                 const float* __restrict__ lse2, const float* __restrict__ Dp,
                                 int T, int Tp, int C, int NH, float scale, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(BOULDER_ATTENTION_EMULATION)
  using Cfg = Sm90FusedBwdCfg<HS>;
  constexpr int kBkv = Cfg::kBkv, kBq = Cfg::kBq, kThreads = Cfg::kThreads;
  constexpr int kN = kBq / 2, kO = HS / 2;  // accumulators per thread: Sᵀ (and dPᵀ), dK (and dV)
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* sK = attn::AlignSwizzled(smem);
  unsigned char* sV = sK + Cfg::kKVBytes;
  unsigned char* sQ = sV + Cfg::kKVBytes;                        // [2]
  unsigned char* sdO = sQ + 2 * Cfg::kQBytes;                    // [2]
  unsigned char* sdS = sdO + 2 * Cfg::kQBytes;                   // [kBkv keys][kBq queries]
  unsigned char* sdQ = sdS + Cfg::kDSBytes;                      // [warpgroup][2]
  float* sL = reinterpret_cast<float*>(sdQ + 4 * Cfg::kDQBytes);  // [2][kBq]
  float* sD = sL + 2 * kBq;                                      // [2][kBq]

  const int kt = blockIdx.y;  // grid (B·NH, key tiles), as the two-kernel path's
  const int h = blockIdx.x % NH, b = blockIdx.x / NH;
  const int wg = threadIdx.x / 128, wq = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int tw = threadIdx.x % 128;  // thread within the warpgroup
  const int g = lane / 4, t4 = lane % 4;
  const size_t stride = 3 * size_t(C);
  const bf16* qbase = qkv + size_t(b) * T * stride + h * HS;
  const int kv0 = kt * kBkv;
  const int qt_begin = kv0 / kBq, n_qt = (T + kBq - 1) / kBq;

  // The loads of a query tile recompute their sources from the block index (made opaque so
  // that the compiler does not keep four pointers live across the loop's register peak).
  auto load_q_tile = [&](int qt, int stage) {
    int bx = blockIdx.x;
    asm volatile("" : "+r"(bx));
    const int hh = bx % NH, bb = bx / NH;
    const size_t bhh = size_t(bb) * NH + hh;
    attn::LoadSwizzledAsync<kBq, HS, kThreads>(sQ + stage * Cfg::kQBytes,
                                               qkv + size_t(bb) * T * stride + hh * HS, stride,
                                               qt * kBq, T);
    attn::LoadSwizzledAsync<kBq, HS, kThreads>(sdO + stage * Cfg::kQBytes,
                                               dout + size_t(bb) * T * C + hh * HS, size_t(C),
                                               qt * kBq, T);
    attn::LoadFloatsAsync<kBq>(sL + stage * kBq, lse2 + bhh * Tp + qt * kBq);
    attn::LoadFloatsAsync<kBq>(sD + stage * kBq, Dp + bhh * Tp + qt * kBq);
  };
  attn::LoadSwizzledAsync<kBkv, HS, kThreads>(sK, qbase + C, stride, kv0, T);
  attn::LoadSwizzledAsync<kBkv, HS, kThreads>(sV, qbase + 2 * C, stride, kv0, T);
  load_q_tile(qt_begin, 0);
  attn::CpAsyncCommit();

  const int kvw = kv0 + 64 * wg;       // the warpgroup's first key
  const int krow = kvw + 16 * wq + g;  // this thread's keys: krow and krow + 8
  const int kr = 64 * wg + 16 * wq + g;  // the same within the tile
  const uint32_t k_all = attn::SmemAddr(sK);
  const uint32_t k_addr = k_all + wg * 64 * 128;
  const uint32_t v_addr = attn::SmemAddr(sV) + wg * 64 * 128;
  // This warpgroup's dQ part: the dSᵀ atom (64 queries) its A reads and the K atom (64 head
  // columns) its B reads; at head size 64 the query half, at 128 the column half.
  const uint32_t ds_addr = attn::SmemAddr(sdS) + (HS == 64 ? wg : 0) * kBkv * 128;
  const uint32_t kq_addr = k_all + (HS == 64 ? 0 : wg) * kBkv * 128;
  const uint32_t stage_addr = attn::SmemAddr(sdQ) + wg * 2 * Cfg::kDQBytes;
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
    const bool visible = kvw <= q0 + kBq - 1;  // some (query, key) pair of the warpgroup's shows
    if (visible) {
      // As FlashBackwardKVSm90Kernel: Sᵀ and dPᵀ issued together, Pᵀ, dV, dSᵀ, dK.
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

      // dSᵀ (BF16) rows kr, kr + 8 into the shared tile, accumulators 4j, 4j + 1 and 4j + 2,
      // 4j + 3 being queries 8j + 2·t4 and one more of each row.
      uint32_t row = attn::SmemAddr(sdS) + kr * 128 + 4 * t4, sw = g;
      asm volatile("" : "+r"(row), "+r"(sw));  // addresses made here, not kept live
#pragma unroll
      for (int j = 0; j < kBq / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int ql = 8 * j + 2 * t4;
          // SwizzledChunk(kBkv, kr + 4e, j): rows kr and kr + 8 share the swizzle kr % 8 = g.
          attn::StoreShared32(row + (j / 8) * kBkv * 128 + 4 * e * 128 + (((j % 8) ^ sw) << 4),
                              attn::PackBf16(st[4 * j + e] * (dpt[4 * j + e] - sDs[ql]),
                                             st[4 * j + e + 1] * (dpt[4 * j + e + 1] - sDs[ql + 1])));
        }
      }
    } else {  // no visible pair: dS is 0 (stored so that the dQ product needs no branch)
#pragma unroll
      for (int j = 0; j < kBq / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          *reinterpret_cast<uint32_t*>(sdS + wgmma::SwizzledChunk(kBkv, kr + 4 * e, j) + 4 * t4) =
              0u;
        }
      }
    }
    wgmma::FenceProxyAsync();  // the dSᵀ stores, for the products reading them
    __syncthreads();

    if (visible) {  // dK += dSᵀ·Q, dSᵀ (K-major) from the warpgroup's rows of the shared tile
      const uint32_t ds_rows = attn::SmemAddr(sdS) + wg * 64 * 128;
      wgmma::FenceOperand(dk);
      wgmma::Fence();
#pragma unroll
      for (int kk = 0; kk < kBq / 16; ++kk) {
        WgmmaSS<HS, 0, 1>(dk, wgmma::Desc(ds_rows + (kk / 4) * kBkv * 128 + (kk % 4) * 32u, 16, 1024),
                          wgmma::Desc(q_addr + kk * 16 * 128, kBq * 128, 1024), 1);
      }
      wgmma::Commit();
    }

    // This warpgroup's 64 × 64 part of the tile's dQ over the block's 128 keys.
    float dq[32];  // the first product overwrites it (scale_d 0)
    wgmma::FenceOperand(dq);
    wgmma::Fence();
    uint32_t a_base = ds_addr, b_base = kq_addr;
    asm volatile("" : "+r"(a_base), "+r"(b_base));  // descriptors made here, not kept live
#pragma unroll
    for (int s = 0; s < kBkv / 16; ++s) {
      wgmma::WgmmaSS64<1, 1>(dq, wgmma::Desc(a_base + s * 16 * 128, kBkv * 128, 1024),
                             wgmma::Desc(b_base + s * 16 * 128, kBkv * 128, 1024), s > 0);
    }
    wgmma::Commit();
    wgmma::Wait<0>();  // dK (where issued) and dQ
    wgmma::FenceOperand(dq);
    wgmma::FenceOperand(dk);
    wgmma::FenceOperand(dv);

    // Stage the part (this stage's previous reduction, two tiles ago, has read it: the issuing
    // thread waited for that before the block barrier that ended the last tile) and add it.
    const uint32_t part = stage_addr + stage * Cfg::kDQBytes;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      attn::StoreSharedF4(part + (j * 128 + tw) * 16,
                          make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]));
    }
    wgmma::FenceProxyAsync();  // for the bulk copy engine
    attn::WarpgroupBarrier(wg);
    if (tw == 0) {
      const int r = HS == 64 ? 2 * qt + wg : qt, c = HS == 64 ? 0 : wg;
      int bx = blockIdx.x;  // b·NH + h, recomputed here for the register peak's sake
      asm volatile("" : "+r"(bx));
      attn::BulkReduceAddF32(dq_acc + DQUnit<HS>(size_t(bx), Tp, r, c), part, Cfg::kDQBytes);
      attn::BulkCommit();
      attn::BulkWaitRead<1>();  // the other stage's reduction, before the barrier below
    }
    __syncthreads();  // every warpgroup is done with this stage before a refill
  }
  attn::CpAsyncWait<0>();
  if (tw == 0) attn::BulkWaitAll();

  // The K and V tiles (read by nothing any more: the loop's last barrier follows every dQ
  // product) stage dK and dV.
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

// dqkv's Q part (rows t < T) = scale · dQ from dq_acc (FlashBackwardFusedSm90Kernel's units).
// One thread per 4 consecutive float4 of a unit (n_groups = B·NH·Tp·HS / 16): the four quad
// threads' accumulators 4j..4j+3 of one warp row pair, i.e. rows 16w + g and 16w + g + 8 of the
// unit, columns [8j, 8j + 8); each row written as one 16-byte store.
template <int HS>
__global__ void ConvertDQSm90Kernel(bf16* __restrict__ dqkv, const float* __restrict__ dq_acc,
                                    size_t n_groups, int T, int Tp, int C, int NH, float scale) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_groups) return;
  const size_t unit = i / 256;
  const int in = int(i % 256), j = in / 32, w = (in % 32) / 8, g = in % 8;
  constexpr int kCols = HS / 64;
  const int c = int(unit % kCols);
  const size_t rest = unit / kCols;
  const int r = int(rest % (Tp / 64));
  const size_t bh = rest / (Tp / 64);
  const int h = int(bh % NH), b = int(bh / NH);
  const float4* src = reinterpret_cast<const float4*>(dq_acc) + unit * 1024 + j * 128 + 32 * w +
                      4 * g;
  float4 f[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) f[k] = src[k];
  const int t = 64 * r + 16 * w + g;
  bf16* dst = dqkv + size_t(b) * T * 3 * C + h * HS + 64 * c + 8 * j;
  if (t < T) {
    Bf16x8 v;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v.v[2 * k] = __float2bfloat16(f[k].x * scale);
      v.v[2 * k + 1] = __float2bfloat16(f[k].y * scale);
    }
    Store8(dst + size_t(t) * 3 * C, v);
  }
  if (t + 8 < T) {
    Bf16x8 v;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v.v[2 * k] = __float2bfloat16(f[k].z * scale);
      v.v[2 * k + 1] = __float2bfloat16(f[k].w * scale);
    }
    Store8(dst + size_t(t + 8) * 3 * C, v);
  }
}

}  // namespace boulder::kernels::cuda::attn

#endif  // BOULDER_KERNELS_CUDA_ATTENTION_BWD_FUSED_SM90_CUH_
