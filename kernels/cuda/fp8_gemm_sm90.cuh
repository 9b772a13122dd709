// The FP8 GEMM of fp8_gemm_sm90.h: the kernel (fp8_gemm_sm90.cu has the tensor maps and the
// launcher).
//
// Shared memory of a CTA: kStages stages of [a tile: 128 rows × 128 bytes][b tile: BN rows ×
// 128 bytes], each tile written by TMA with the 128-byte swizzle (16-byte chunk c of row r at
// chunk c ^ (r % 8); wgmma.cuh describes the layout, which is the BF16 K-major one byte for
// byte: one k32 step of FP8 is 32 bytes along the row), then the output tile's staging, then
// full[kStages] and empty[kStages] mbarriers, then the consumer warps' statistics slots (the
// kGelu kernels' cast of fc2's input). full[s] completes when stage s's bytes
// have landed (TMA's complete_tx); empty[s] when the 8 consumer warps have retired their
// products on it.
//
// Iterations are numbered across the CTA's tiles (tile i, k-block kb: i · kblocks + kb), so
// stage = iteration % kStages and the barriers' phase parity = (iteration / kStages) & 1.
// The producer warp's first lane issues every load as soon as its stage is free, so it runs up
// to kStages k-blocks ahead of the consumers, across tile boundaries.
//
// The PTX primitives below exist on sm_90a only. fp8_gemm_emulation_test.cc compiles this
// kernel as host C++ with BOULDER_ATTENTION_EMULATION defined and emulated_gpu_tma.h's versions
// of exactly these functions (and emulated_gpu.h's of wgmma.cuh's: TMA, mbarriers and wgmma on
// an emulated GPU).
#ifndef BOULDER_KERNELS_CUDA_FP8_GEMM_SM90_CUH_
#define BOULDER_KERNELS_CUDA_FP8_GEMM_SM90_CUH_

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_cast.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace boulder::kernels::cuda::fp8gemm {

using bf16 = __nv_bfloat16;
constexpr int kBM = 128, kBK = 128;
// Two consumer warpgroups (warps 0-7, 64 output rows each) and one producer warp (warp 8).
constexpr int kConsumers = 256, kThreads = kConsumers + 32;
// After the barriers: each consumer warp's statistics of the GELU cast (kGelu), 4 words.
constexpr int kStatsBytes = (kConsumers / 32) * 16;

// The fused cast of fc2's input (kGelu kernels): fp8(GELU(the BF16 output) · *scale) as E4M3,
// with CastFp8's statistics added to amax (largest |value| bit pattern) and counts (saturated,
// underflow, non-finite).
struct GeluCastArgs {
  const float* scale;
  float* amax;
  unsigned long long* counts;
};

template <int BN, bool kFast>
struct GemmCfg {
  static_assert(BN == 128 || (BN == 256 && kFast), "tiles: 128 (both), 256 (fast accumulation)");
  // BN / 2 FP32 accumulators per consumer thread (64 rows × BN per warpgroup), twice that for
  // split accumulation: at most 128, which fits 288 threads of up to 224 registers, so one
  // CTA per multiprocessor with as many stages as 192 KB of shared memory holds.
  static constexpr int kBN = BN;
  static constexpr int kABytes = kBM * kBK, kBBytes = BN * kBK;
  static constexpr int kStageBytes = kABytes + kBBytes;
  // The output tile's staging for the TMA store: 128 rows × BN BF16, as 64-column boxes of
  // 64 rows × 128 bytes (128-byte swizzle), each warpgroup's 64 rows box after box.
  static constexpr int kOutBytes = kBM * BN * 2;
  static constexpr int kStages = (208 * 1024 - kOutBytes) / kStageBytes;
  static constexpr int kSmemBytes =
      kStages * kStageBytes + kOutBytes + 1024 + 2 * kStages * 8 + kStatsBytes;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(BOULDER_ATTENTION_EMULATION)
// The dynamic shared memory's shared-space address.
__device__ __forceinline__ uint32_t SharedBase() {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  return static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
}
__device__ __forceinline__ void FenceMbarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void PrefetchTensorMap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
__device__ __forceinline__ void MbarInit(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void MbarExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// A box of the 2-D tensor map (x: byte along K, y: row) into shared memory at dst; its bytes
// count towards bar's transaction.
// Stores the 2-D box at (x, y) (x: column, y: row) of the tensor map from shared memory at src;
// completion through the bulk-group of the issuing thread.
__device__ __forceinline__ void TmaStore(const CUtensorMap* map, int x, int y, uint32_t src) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(x), "r"(y), "r"(src)
      : "memory");
}
__device__ __forceinline__ void NamedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at named barrier id (of `threads` threads) without waiting.
__device__ __forceinline__ void NamedArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void TmaLoad(uint32_t dst, const CUtensorMap* map, int x, int y,
                                        uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// One FP8 wgmma m64n256k32 / m64n128k32 (128 / 64 accumulators d) on operand types TYPES
// ("e4m3.e4m3", ...), both from shared memory through desc_a / desc_b; scale_d 0 overwrites d.
#define BOULDER_WGMMA_FP8_N256(TYPES)                                                \
  asm volatile(                                                                      \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                  \
      "wgmma.mma_async.sync.aligned.m64n256k32.f32." TYPES " " BOULDER_WGMMA_REGS128 \
      ", %128, %129, p, 1, 1;\n}\n"                                                  \
      : BOULDER_WGMMA_D128                                                           \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d))
#define BOULDER_WGMMA_FP8_N128(TYPES)                                               \
  asm volatile(                                                                     \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                  \
      "wgmma.mma_async.sync.aligned.m64n128k32.f32." TYPES " " BOULDER_WGMMA_REGS64 \
      ", %64, %65, p, 1, 1;\n}\n"                                                   \
      : BOULDER_WGMMA_D64                                                           \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d))

// d = A·B (scale_d 0) or d + A·B: wgmma m64nNk32 (N = 2 · registers), FP8 operands from
// shared memory (K-major descriptors), FP32 accumulators; kAE4 / kBE4: E4M3, else E5M2.
template <bool kAE4, bool kBE4>
__device__ __forceinline__ void WgmmaFp8(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                         int scale_d) {
  static_assert(kAE4 || kBE4, "wgmma takes at most one E5M2 operand here");
  if constexpr (kAE4 && kBE4) {
    BOULDER_WGMMA_FP8_N256("e4m3.e4m3");
  } else if constexpr (kAE4) {
    BOULDER_WGMMA_FP8_N256("e4m3.e5m2");
  } else {
    BOULDER_WGMMA_FP8_N256("e5m2.e4m3");
  }
}
template <bool kAE4, bool kBE4>
__device__ __forceinline__ void WgmmaFp8(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                         int scale_d) {
  static_assert(kAE4 || kBE4, "wgmma takes at most one E5M2 operand here");
  if constexpr (kAE4 && kBE4) {
    BOULDER_WGMMA_FP8_N128("e4m3.e4m3");
  } else if constexpr (kAE4) {
    BOULDER_WGMMA_FP8_N128("e4m3.e5m2");
  } else {
    BOULDER_WGMMA_FP8_N128("e5m2.e4m3");
  }
}
#undef BOULDER_WGMMA_FP8_N256
#undef BOULDER_WGMMA_FP8_N128
#endif  // __CUDA_ARCH_FEAT_SM90_ALL && !BOULDER_ATTENTION_EMULATION

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(BOULDER_ATTENTION_EMULATION)
// ---- Pieces of both kernels (Fp8GemmSm90Kernel, Fp8GemmSm90PingPongKernel) ----------------

// A CTA's shared memory (Cfg: GemmCfg or PingPongCfg): the stages' a and b tiles, the output
// staging, the full and empty barriers, then the warps' statistics slots (kStatsBytes), from
// the 1024-byte-aligned base.
struct Smem {
  uint32_t a, b, out, full, empty, stats;
};
template <class Cfg>
__device__ __forceinline__ Smem SmemOf() {
  const uint32_t base = (SharedBase() + 1023u) & ~1023u;
  const uint32_t out = base + Cfg::kStages * Cfg::kStageBytes;
  const uint32_t full = out + Cfg::kOutBytes;
  return {base,
          base + Cfg::kStages * Cfg::kABytes,
          out,
          full,
          full + Cfg::kStages * 8,
          full + 2 * Cfg::kStages * 8};
}

// Thread 0 sets up every stage's barriers (full: the producer's arrival plus the bytes;
// empty: one arrival per warp that uses the stage), then the block synchronises.
template <class Cfg>
__device__ __forceinline__ void InitStageBarriers(const Smem& sm, int consumer_warps) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::kStages; ++s) {
      MbarInit(sm.full + 8 * s, 1);
      MbarInit(sm.empty + 8 * s, consumer_warps);
    }
    FenceMbarrierInit();
  }
  __syncthreads();
}

// How many of the tiles this CTA takes (blockIdx.x, blockIdx.x + gridDim.x, ...).
__device__ __forceinline__ int CtaTiles(int tiles) {
  return static_cast<int>(blockIdx.x) < tiles ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
}

// The producer (lane 0 of the last warp): loads every iteration (the CTA's tile i, k-block
// kb, numbered i · kblocks + kb) into its stage as soon as the consumers have freed it.
template <class Cfg>
__device__ __forceinline__ void ProduceStages(const Smem& sm, const CUtensorMap* map_a,
                                              const CUtensorMap* map_b, int my_tiles, int kblocks,
                                              int tiles_n) {
  constexpr int S = Cfg::kStages;
  PrefetchTensorMap(map_a);
  PrefetchTensorMap(map_b);
  const int total = my_tiles * kblocks;
  for (int it = 0; it < total; ++it) {
    const int s = it % S;
    MbarWait(sm.empty + 8 * s, ((it / S) & 1) ^ 1);
    const int t = blockIdx.x + (it / kblocks) * gridDim.x, kb = it % kblocks;
    const uint32_t full = sm.full + 8 * s;
    MbarExpectTx(full, Cfg::kStageBytes);
    TmaLoad(sm.a + s * Cfg::kABytes, map_a, kb * kBK, (t / tiles_n) * kBM, full);
    TmaLoad(sm.b + s * Cfg::kBBytes, map_b, kb * kBK, (t % tiles_n) * Cfg::kBN, full);
  }
}

// The epilogue of a 64-row band whose accumulators a warpgroup holds (wgmma.cuh: warp w4 has
// rows 16·w4 + g and 16·w4 + g + 8; acc[4j + 2h + c] is column 8j + 2q + c of row + 8h), kCols
// columns from col0. BandPair is the BF16 value alpha · acc + bias of such a pair (row half h
// of 8-column block j; b2: the bias of its two columns); StageBand writes those values into the
// band's swizzled 64 × 64 staging boxes from `stage` (and, with keep, pair 2j + h into
// keep[2j + h]); StoreBand stores those boxes with TMA at (x0, y0); AccumulateBand adds
// alpha · acc to out in place instead (row0: the thread's first row).
__device__ __forceinline__ float2 BiasPair(const bf16* bias, int col) {
  float2 b2 = make_float2(0.f, 0.f);
  if (bias != nullptr)
    b2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(bias + col));
  return b2;
}
__device__ __forceinline__ __nv_bfloat162 BandPair(const float* acc, int j, int h, float2 b2,
                                                   float alpha) {
  return __float22bfloat162_rn(
      make_float2(acc[4 * j + 2 * h] * alpha + b2.x, acc[4 * j + 2 * h + 1] * alpha + b2.y));
}
template <int kCols>
__device__ __forceinline__ void StageBand(const float (&acc)[kCols / 2], uint32_t stage, int col0,
                                          const bf16* bias, float alpha, int w4, int g, int q,
                                          uint32_t* keep = nullptr) {
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
    const float2 b2 = BiasPair(bias, col0 + 8 * j + 2 * q);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = w4 * 16 + g + 8 * h;  // r % 8 == g
      const __nv_bfloat162 v = BandPair(acc, j, h, b2, alpha);
      const uint32_t addr = stage + (j / 8) * 8192 + r * 128 + (((j % 8) ^ g) << 4) + 4 * q;
      wgmma::StoreShared32(addr, *reinterpret_cast<const uint32_t*>(&v));
      if (keep != nullptr) keep[2 * j + h] = *reinterpret_cast<const uint32_t*>(&v);
    }
  }
}

// fc2's FP8 input (the kGelu kernels), staged once the BF16 stores have read the staging:
// StageGeluCodes writes the E4M3 code of GELU of each BF16 value StageBand kept (pre) into the
// band's swizzled boxes of 64 rows × 128 bytes from `stage` (kCols / 128 of them, 8 KB apart),
// computed as fp8_gelu.cu's GeluCastFp8 computes it from the stored BF16 pre-activation:
// g = bf16(GeluTanh(pre)) (this file is compiled with fp8_gelu.cu's flags), cast with Cast2
// (fp8_cast.cuh: CastOne's codes and counts, into st). (The kept BF16 pairs are half the
// registers of the accumulators, and keeping the codes instead spills the 256-wide tile.)
// StoreCodes stores the boxes with TMA at (x0, y0).
template <int kCols>
__device__ __forceinline__ void StageGeluCodes(const uint32_t (&pre)[kCols / 4], uint32_t stage,
                                               float scale, CastStats& st, int w4, int g, int q) {
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t w = pre[2 * j + h];
      const float2 p = make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
      const float2 gv = __bfloat1622float2(__floats2bfloat162_rn(GeluTanh(p.x), GeluTanh(p.y)));
      const uint32_t c = Cast2<true>(gv.x, gv.y, scale, st);
      const int r = w4 * 16 + g + 8 * h;  // r % 8 == g; bytes 8j + 2q, + 1 of the row
      const uint32_t addr =
          stage + (j / 16) * 8192 + r * 128 + ((((j % 16) / 2) ^ g) << 4) + 8 * (j % 2) + 2 * q;
      wgmma::StoreShared16(addr, static_cast<uint16_t>(c));
    }
  }
}
template <int kCols>
__device__ __forceinline__ void StoreCodes(const CUtensorMap* map, uint32_t stage, int x0, int y0) {
#pragma unroll
  for (int box = 0; box < kCols / 128; ++box) {
    TmaStore(map, x0 + box * 128, y0, stage + box * 8192);
  }
}

// A consumer warp's statistics of the GELU cast live in its shared slot (4 words: amax bits,
// saturated, underflow, non-finite; only its lane 0 touches them), not in registers across the
// main loop: AddToSlot folds one tile's (a reduction over the warp), FlushSlot adds the slot to
// the tensor's amax and counters at the end (as FlushWarpCastStats: where non-zero).
__device__ __forceinline__ void ClearSlot(uint32_t slot, int lane) {
  if (lane == 0) {
    for (int k = 0; k < 4; ++k) wgmma::StoreShared32(slot + 4 * k, 0);
  }
}
__device__ __forceinline__ void AddToSlot(CastStats st, uint32_t slot, int lane) {
  st.amax = __reduce_max_sync(0xffffffffu, st.amax);
  st.saturated = __reduce_add_sync(0xffffffffu, st.saturated);
  st.underflow = __reduce_add_sync(0xffffffffu, st.underflow);
  st.non_finite = __reduce_add_sync(0xffffffffu, st.non_finite);
  if (lane == 0) {
    wgmma::StoreShared32(slot, max(wgmma::LoadShared32(slot), st.amax));
    wgmma::StoreShared32(slot + 4, wgmma::LoadShared32(slot + 4) + st.saturated);
    wgmma::StoreShared32(slot + 8, wgmma::LoadShared32(slot + 8) + st.underflow);
    wgmma::StoreShared32(slot + 12, wgmma::LoadShared32(slot + 12) + st.non_finite);
  }
}
__device__ __forceinline__ void FlushSlot(uint32_t slot, float* amax, unsigned long long* counts,
                                          int lane) {
  if (lane == 0) {
    const unsigned int m = wgmma::LoadShared32(slot);
    if (m) atomicMax(reinterpret_cast<unsigned int*>(amax), m);
    for (int k = 0; k < 3; ++k) {
      const unsigned int n = wgmma::LoadShared32(slot + 4 + 4 * k);
      if (n) atomicAdd(&counts[k], static_cast<unsigned long long>(n));
    }
  }
}
template <int kCols>
__device__ __forceinline__ void StoreBand(const CUtensorMap* map, uint32_t stage, int x0, int y0) {
#pragma unroll
  for (int box = 0; box < kCols / 64; ++box) TmaStore(map, x0 + box * 64, y0, stage + box * 8192);
}
template <int kCols>
__device__ __forceinline__ void AccumulateBand(const float (&acc)[kCols / 2], bf16* out, int row0,
                                               int col0, int N, float alpha, int q) {
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
    const int col = col0 + 8 * j + 2 * q;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(out + size_t(row0 + 8 * h) * N + col);
      const float2 o = __bfloat1622float2(*p);
      *p = __float22bfloat162_rn(
          make_float2(acc[4 * j + 2 * h] * alpha + o.x, acc[4 * j + 2 * h + 1] * alpha + o.y));
    }
  }
}

// The staged epilogue of warpgroup wg: its first thread (issuer) waits until its previous
// stores have read the staging, the warpgroup fills it (fill()), then the issuer starts the
// TMA stores (store()), which run while the warpgroup goes on.
template <class Fill, class Store>
__device__ __forceinline__ void StagedEpilogue(int wg, bool issuer, Fill fill, Store store) {
  if (issuer) wgmma::BulkWaitRead<0>();
  NamedBarrier(1 + wg, 128);
  fill();
  wgmma::FenceProxyAsync();
  NamedBarrier(1 + wg, 128);
  if (issuer) {
    store();
    wgmma::BulkCommit();
  }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL || BOULDER_ATTENTION_EMULATION

// kGelu (fast accumulation, not accumulating): the BF16 output as always, and fc2's FP8 input
// (GeluCastArgs) through map_gelu: each warpgroup stages its band's codes in its output staging
// once the BF16 stores have read it, and every consumer warp adds its statistics at the end.
template <int BN, bool kFast, bool kAE4, bool kBE4, bool kGelu = false>
__global__ void __launch_bounds__(kThreads, 1)
    Fp8GemmSm90Kernel(const __grid_constant__ CUtensorMap map_a,
                      const __grid_constant__ CUtensorMap map_b,
                      const __grid_constant__ CUtensorMap map_out, bf16* __restrict__ out,
                      const bf16* __restrict__ bias, const float* __restrict__ a_scale_inv,
                      const float* __restrict__ b_scale_inv, int M, int N, int K, int accumulate,
                      const __grid_constant__ CUtensorMap map_gelu, GeluCastArgs gelu) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(BOULDER_ATTENTION_EMULATION)
  static_assert(!kGelu || kFast, "the GELU cast is the forward's (fast accumulation)");
  using Cfg = GemmCfg<BN, kFast>;
  constexpr int S = Cfg::kStages;
  constexpr int kAcc = BN / 2;  // accumulators per consumer thread
  const Smem sm = SmemOf<Cfg>();
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  InitStageBarriers<Cfg>(sm, kConsumers / 32);
  const int tiles_n = N / BN, my_tiles = CtaTiles((M / kBM) * tiles_n), kblocks = K / kBK;
  if (tid >= kConsumers) {
    if (lane == 0) ProduceStages<Cfg>(sm, &map_a, &map_b, my_tiles, kblocks, tiles_n);
    return;
  }

  // Consumers. A warp is done with stage s once its products on it have retired.
  const int wg = warp / 4;
  auto release = [&](int s) {
    if (lane == 0) MbarArrive(sm.empty + 8 * s);
  };
  const float alpha = *a_scale_inv * *b_scale_inv;
  const uint32_t slot = sm.stats + warp * 16;  // kGelu: this warp's statistics
  if constexpr (kGelu) ClearSlot(slot, lane);
  float acc[kAcc];
  float part[kFast ? 1 : kAcc];
  int it = 0;
  for (int i = 0; i < my_tiles; ++i) {
    const int t = blockIdx.x + i * gridDim.x, tm = t / tiles_n, tn = t % tiles_n;
    for (int kb = 0; kb < kblocks; ++kb, ++it) {
      const int s = it % S;
      MbarWait(sm.full + 8 * s, (it / S) & 1);
      const uint32_t a_tile = sm.a + s * Cfg::kABytes + wg * 64 * 128;
      const uint32_t b_tile = sm.b + s * Cfg::kBBytes;
      wgmma::Fence();
      if constexpr (kFast) {
#pragma unroll
        for (int kk = 0; kk < kBK / 32; ++kk) {
          WgmmaFp8<kAE4, kBE4>(acc, wgmma::Desc(a_tile + 32 * kk, 16, 1024),
                               wgmma::Desc(b_tile + 32 * kk, 16, 1024), (kb > 0 || kk > 0) ? 1 : 0);
        }
        wgmma::Commit();
        if (kb > 0) {
          wgmma::Wait<1>();
          release((it - 1) % S);
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < kBK / 32; ++kk) {
          WgmmaFp8<kAE4, kBE4>(part, wgmma::Desc(a_tile + 32 * kk, 16, 1024),
                               wgmma::Desc(b_tile + 32 * kk, 16, 1024), kk > 0 ? 1 : 0);
        }
        wgmma::Commit();
        wgmma::Wait<0>();
        wgmma::FenceOperand(part);
        release(s);
#pragma unroll
        for (int r = 0; r < kAcc; ++r) acc[r] = kb == 0 ? part[r] : acc[r] + part[r];
      }
    }
    if constexpr (kFast) {
      wgmma::Wait<0>();
      wgmma::FenceOperand(acc);
      release((it - 1) % S);
    }

    // Epilogue (the producer is already loading the next tile): warp w of the warpgroup holds
    // rows 16w + g and 16w + g + 8 of its 64, and in 8-column block j columns 8j + 2q and
    // 8j + 2q + 1 (wgmma.cuh).
    const int g = lane / 4, q = lane % 4;
    if (!accumulate) {
      // Through shared memory: the warpgroup's 64 rows, then BN / 64 TMA stores.
      const uint32_t stage = sm.out + wg * (Cfg::kOutBytes / 2);
      uint32_t pre[kGelu ? BN / 4 : 1];  // kGelu: the BF16 pairs, for fc2's input
      StagedEpilogue(
          wg, tid % 128 == 0,
          [&] {
            StageBand<BN>(acc, stage, tn * BN, bias, alpha, warp % 4, g, q, kGelu ? pre : nullptr);
          },
          [&] { StoreBand<BN>(&map_out, stage, tn * BN, tm * kBM + wg * 64); });
      if constexpr (kGelu) {
        // The next tile's first product overwrites acc, but the compiler sees it read: zeros
        // free its registers for pre here (else the 256-wide tile spills).
#pragma unroll
        for (int r = 0; r < kAcc; ++r) acc[r] = 0.f;
        // fc2's input in the same staging once the BF16 stores have read it (the wait).
        StagedEpilogue(
            wg, tid % 128 == 0,
            [&] {
              CastStats st;
              StageGeluCodes<BN>(pre, stage, *gelu.scale, st, warp % 4, g, q);
              AddToSlot(st, slot, lane);
            },
            [&] { StoreCodes<BN>(&map_gelu, stage, tn * BN, tm * kBM + wg * 64); });
      }
    } else {
      AccumulateBand<BN>(acc, out, tm * kBM + wg * 64 + (warp % 4) * 16 + g, tn * BN, N, alpha, q);
    }
  }
  if constexpr (kGelu) FlushSlot(slot, gelu.amax, gelu.counts, lane);
  // The staging must stay until the last stores have read it.
  if (tid % 128 == 0) wgmma::BulkWaitAll();
#endif  // __CUDA_ARCH_FEAT_SM90_ALL || BOULDER_ATTENTION_EMULATION
}

// The ping-pong variant (fast accumulation only): each consumer warpgroup owns whole 128 × 128
// tiles (two m64n128k32 products per k32 step, 128 accumulators per thread), the two taking
// the CTA's tiles in turn. Their main loops alternate (named barriers 3 and 4: a warpgroup
// starts its next main loop once the other has finished its own), so one warpgroup's
// epilogue runs under the other's products. The producer warp loads the tiles' k-blocks in
// order, as in Fp8GemmSm90Kernel; a stage is freed by the 4 warps of the warpgroup using it.
struct PingPongCfg {
  static constexpr int kBN = 128;
  static constexpr int kABytes = kBM * kBK, kBBytes = 128 * kBK;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kWgOutBytes = kBM * 128 * 2;  // one warpgroup's tile, four 64 × 64 boxes
  static constexpr int kOutBytes = 2 * kWgOutBytes;
  static constexpr int kStages = (224 * 1024 - kOutBytes) / kStageBytes;
  static constexpr int kSmemBytes =
      kStages * kStageBytes + kOutBytes + 1024 + 2 * kStages * 8 + kStatsBytes;
};

// kGelu: as Fp8GemmSm90Kernel's, each warpgroup's 128-row tile's codes staged after its BF16.
template <bool kAE4, bool kBE4, bool kGelu = false>
__global__ void __launch_bounds__(kThreads, 1)
    Fp8GemmSm90PingPongKernel(const __grid_constant__ CUtensorMap map_a,
                              const __grid_constant__ CUtensorMap map_b,
                              const __grid_constant__ CUtensorMap map_out, bf16* __restrict__ out,
                              const bf16* __restrict__ bias, const float* __restrict__ a_scale_inv,
                              const float* __restrict__ b_scale_inv, int M, int N, int K,
                              int accumulate, const __grid_constant__ CUtensorMap map_gelu,
                              GeluCastArgs gelu) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(BOULDER_ATTENTION_EMULATION)
  using Cfg = PingPongCfg;
  constexpr int S = Cfg::kStages;
  const Smem sm = SmemOf<Cfg>();
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  InitStageBarriers<Cfg>(sm, 4);  // the using warpgroup's warps
  const int tiles_n = N / 128, my_tiles = CtaTiles((M / kBM) * tiles_n), kblocks = K / kBK;
  if (tid >= kConsumers) {
    if (lane == 0) ProduceStages<Cfg>(sm, &map_a, &map_b, my_tiles, kblocks, tiles_n);
    return;
  }

  const int wg = warp / 4, w4 = warp % 4;
  auto release = [&](int s) {
    if (lane == 0) MbarArrive(sm.empty + 8 * s);
  };
  const float alpha = *a_scale_inv * *b_scale_inv;
  const uint32_t slot = sm.stats + warp * 16;  // kGelu: this warp's statistics
  if constexpr (kGelu) ClearSlot(slot, lane);
  float acc[2][64];  // rows 0-63 and 64-127 of the tile
  for (int i = wg; i < my_tiles; i += 2) {
    const int t = blockIdx.x + i * gridDim.x, tm = t / tiles_n, tn = t % tiles_n;
    if (i > 0) NamedBarrier(3 + wg, 256);  // the other warpgroup's main loop is done
    int it = i * kblocks;
    for (int kb = 0; kb < kblocks; ++kb, ++it) {
      const int s = it % S;
      MbarWait(sm.full + 8 * s, (it / S) & 1);
      const uint32_t a_tile = sm.a + s * Cfg::kABytes, b_tile = sm.b + s * Cfg::kBBytes;
      wgmma::Fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 32; ++kk) {
        const uint64_t db = wgmma::Desc(b_tile + 32 * kk, 16, 1024);
        const int scale_d = (kb > 0 || kk > 0) ? 1 : 0;
        WgmmaFp8<kAE4, kBE4>(acc[0], wgmma::Desc(a_tile + 32 * kk, 16, 1024), db, scale_d);
        WgmmaFp8<kAE4, kBE4>(acc[1], wgmma::Desc(a_tile + 64 * 128 + 32 * kk, 16, 1024), db,
                             scale_d);
      }
      wgmma::Commit();
      if (kb > 0) {
        wgmma::Wait<1>();
        release((it - 1) % S);
      }
    }
    wgmma::Wait<0>();
    wgmma::FenceOperand(acc[0]);
    wgmma::FenceOperand(acc[1]);
    release((it - 1) % S);
    if (i + 1 < my_tiles) NamedArrive(3 + (1 - wg), 256);  // the other may start its next

    // Epilogue, as Fp8GemmSm90Kernel's, for 128 rows: acc[half] holds rows 16·w4 + g (+ 8) of
    // the 64-row half.
    const int g = lane / 4, q = lane % 4;
    if (!accumulate) {
      const uint32_t stage = sm.out + wg * Cfg::kWgOutBytes;  // the halves' boxes, 16 KB apart
      uint32_t pre[kGelu ? 2 : 1][kGelu ? 32 : 1];            // kGelu: the halves' BF16 pairs
      StagedEpilogue(
          wg, tid % 128 == 0,
          [&] {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              StageBand<128>(acc[half], stage + half * 16384, tn * 128, bias, alpha, w4, g, q,
                             kGelu ? pre[half] : nullptr);
            }
          },
          [&] {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              StoreBand<128>(&map_out, stage + half * 16384, tn * 128, tm * kBM + half * 64);
            }
          });
      if constexpr (kGelu) {
        // As in Fp8GemmSm90Kernel: zeros free acc's registers for pre.
#pragma unroll
        for (int r = 0; r < 64; ++r) acc[0][r] = acc[1][r] = 0.f;
        // fc2's input, the halves' codes (one 8 KB box each), in the same staging once the
        // BF16 stores have read it.
        StagedEpilogue(
            wg, tid % 128 == 0,
            [&] {
              CastStats st;
              const float gelu_scale = *gelu.scale;
#pragma unroll
              for (int half = 0; half < 2; ++half) {
                StageGeluCodes<128>(pre[half], stage + half * 8192, gelu_scale, st, w4, g, q);
              }
              AddToSlot(st, slot, lane);
            },
            [&] {
#pragma unroll
              for (int half = 0; half < 2; ++half) {
                StoreCodes<128>(&map_gelu, stage + half * 8192, tn * 128, tm * kBM + half * 64);
              }
            });
      }
    } else {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        AccumulateBand<128>(acc[half], out, tm * kBM + half * 64 + w4 * 16 + g, tn * 128, N, alpha,
                            q);
      }
    }
  }
  if constexpr (kGelu) FlushSlot(slot, gelu.amax, gelu.counts, lane);
  if (tid % 128 == 0) wgmma::BulkWaitAll();
#endif  // __CUDA_ARCH_FEAT_SM90_ALL || BOULDER_ATTENTION_EMULATION
}

}  // namespace boulder::kernels::cuda::fp8gemm

#endif  // BOULDER_KERNELS_CUDA_FP8_GEMM_SM90_CUH_
