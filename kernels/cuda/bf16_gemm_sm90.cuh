// The BF16 GEMM of bf16_gemm_sm90.h: the kernel (bf16_gemm_sm90.cu has the tensor maps and the
// launcher). It is fp8_gemm_sm90.cuh's persistent, warp-specialised kernel (fast accumulation,
// not accumulating) with BF16 operands: the producer, the stage ring, the barriers and the
// staged TMA-store epilogue are that file's pieces, unchanged.
//
// BF16 operands as bytes: a row of K BF16 values is 2K bytes, and a stage's k-block is 128
// bytes of every row (64 values), loaded by TMA through byte tensor maps with the 128-byte
// swizzle exactly as the FP8 kernel loads its 128 codes. One wgmma k16 step of BF16 is the same
// 32 bytes along the row as one k32 step of FP8, so the main loop's descriptors are the FP8
// kernel's; only the instruction (wgmma m64nBNk16 .bf16) and the scale (none) differ.
//
// kGelu (fc1's forward, cuBLASLt's GELU_AUX_BIAS): map_out receives the pre-activation
// pre = bf16(acc + bias) and map_gelu bf16(GeluTanh(pre)), each warpgroup staging the second
// in its output staging once the first's TMA stores have read it.
//
// The PTX primitives exist on sm_90a only; bf16_gemm_emulation_test.cc compiles this kernel as
// host C++ on the emulated GPU (emulated_gpu.h, emulated_gpu_tma.h).
#ifndef BOULDER_KERNELS_CUDA_BF16_GEMM_SM90_CUH_
#define BOULDER_KERNELS_CUDA_BF16_GEMM_SM90_CUH_

#include "kernels/cuda/fp8_gemm_sm90.cuh"

namespace boulder::kernels::cuda::bf16gemm {

using fp8gemm::bf16;
using fp8gemm::kBK;
using fp8gemm::kBM;
using fp8gemm::kConsumers;
using fp8gemm::kThreads;
// The FP8 kernel's fast-accumulation configuration: the same bytes per stage.
template <int BN>
using Cfg = fp8gemm::GemmCfg<BN, true>;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(BOULDER_ATTENTION_EMULATION)
// d (+)= A·B for one k16 step: m64n256k16 or m64n128k16, both operands K-major.
__device__ __forceinline__ void WgmmaBf16(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                          int scale_d) {
  wgmma::WgmmaSS256(d, desc_a, desc_b, scale_d);
}
__device__ __forceinline__ void WgmmaBf16(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                          int scale_d) {
  wgmma::WgmmaSS128<0, 0>(d, desc_a, desc_b, scale_d);
}

// GELU of the BF16 pairs StageBand kept (pre[2j + h]: row half h of 8-column block j), as BF16,
// into the same swizzled 64 × 64 boxes StageBand writes.
template <int kCols>
__device__ __forceinline__ void StageGeluBf16(const uint32_t (&pre)[kCols / 4], uint32_t stage,
                                              int w4, int g, int q) {
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t w = pre[2 * j + h];
      const __nv_bfloat162 v = __floats2bfloat162_rn(GeluTanh(__uint_as_float(w << 16)),
                                                     GeluTanh(__uint_as_float(w & 0xffff0000u)));
      const int r = w4 * 16 + g + 8 * h;  // r % 8 == g
      const uint32_t addr = stage + (j / 8) * 8192 + r * 128 + (((j % 8) ^ g) << 4) + 4 * q;
      wgmma::StoreShared32(addr, *reinterpret_cast<const uint32_t*>(&v));
    }
  }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL || BOULDER_ATTENTION_EMULATION

// out[M, N] = a[M, K] · b[N, K]ᵀ (+ bias[N]), row-major BF16; kbytes = 2K (a multiple of 128).
// kGelu: out is the pre-activation and map_gelu's tensor GELU of it (above).
template <int BN, bool kGelu>
__global__ void __launch_bounds__(kThreads, 1)
    Bf16GemmSm90Kernel(const __grid_constant__ CUtensorMap map_a,
                       const __grid_constant__ CUtensorMap map_b,
                       const __grid_constant__ CUtensorMap map_out,
                       const __grid_constant__ CUtensorMap map_gelu, const bf16* __restrict__ bias,
                       int M, int N, int kbytes) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(BOULDER_ATTENTION_EMULATION)
  using C = Cfg<BN>;
  constexpr int S = C::kStages;
  constexpr int kAcc = BN / 2;  // accumulators per consumer thread
  const fp8gemm::Smem sm = fp8gemm::SmemOf<C>();
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  fp8gemm::InitStageBarriers<C>(sm, kConsumers / 32);
  const int tiles_n = N / BN, my_tiles = fp8gemm::CtaTiles((M / kBM) * tiles_n);
  const int kblocks = kbytes / kBK;
  if (tid >= kConsumers) {
    if (lane == 0) fp8gemm::ProduceStages<C>(sm, &map_a, &map_b, my_tiles, kblocks, tiles_n);
    return;
  }

  const int wg = warp / 4;
  auto release = [&](int s) {
    if (lane == 0) fp8gemm::MbarArrive(sm.empty + 8 * s);
  };
  float acc[kAcc];
  int it = 0;
  for (int i = 0; i < my_tiles; ++i) {
    const int t = blockIdx.x + i * gridDim.x, tm = t / tiles_n, tn = t % tiles_n;
    for (int kb = 0; kb < kblocks; ++kb, ++it) {
      const int s = it % S;
      fp8gemm::MbarWait(sm.full + 8 * s, (it / S) & 1);
      const uint32_t a_tile = sm.a + s * C::kABytes + wg * 64 * 128;
      const uint32_t b_tile = sm.b + s * C::kBBytes;
      wgmma::Fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 32; ++kk) {
        WgmmaBf16(acc, wgmma::Desc(a_tile + 32 * kk, 16, 1024),
                  wgmma::Desc(b_tile + 32 * kk, 16, 1024), (kb > 0 || kk > 0) ? 1 : 0);
      }
      wgmma::Commit();
      if (kb > 0) {
        wgmma::Wait<1>();
        release((it - 1) % S);
      }
    }
    wgmma::Wait<0>();
    wgmma::FenceOperand(acc);
    release((it - 1) % S);

    // Epilogue (the producer is already loading the next tile), as the FP8 kernel's.
    const int g = lane / 4, q = lane % 4;
    const uint32_t stage = sm.out + wg * (C::kOutBytes / 2);
    uint32_t pre[kGelu ? BN / 4 : 1];  // kGelu: the BF16 pairs, for GELU
    fp8gemm::StagedEpilogue(
        wg, tid % 128 == 0,
        [&] {
          fp8gemm::StageBand<BN>(acc, stage, tn * BN, bias, 1.f, warp % 4, g, q,
                                 kGelu ? pre : nullptr);
        },
        [&] { fp8gemm::StoreBand<BN>(&map_out, stage, tn * BN, tm * kBM + wg * 64); });
    if constexpr (kGelu) {
      // The next tile's first product overwrites acc, but the compiler sees it read: zeros
      // free its registers for pre here (as in the FP8 kernel).
#pragma unroll
      for (int r = 0; r < kAcc; ++r) acc[r] = 0.f;
      fp8gemm::StagedEpilogue(
          wg, tid % 128 == 0, [&] { StageGeluBf16<BN>(pre, stage, warp % 4, g, q); },
          [&] { fp8gemm::StoreBand<BN>(&map_gelu, stage, tn * BN, tm * kBM + wg * 64); });
    }
  }
  // The staging must stay until the last stores have read it.
  if (tid % 128 == 0) wgmma::BulkWaitAll();
#endif  // __CUDA_ARCH_FEAT_SM90_ALL || BOULDER_ATTENTION_EMULATION
}

// The ping-pong variant (fp8_gemm_sm90.cuh's Fp8GemmSm90PingPongKernel on BF16 operands): each
// consumer warpgroup owns whole 128 × 128 tiles (two m64n128k16 products per k16 step), the two
// taking the CTA's tiles in turn, their main loops alternating (named barriers 3 and 4), so one
// warpgroup's epilogue (kGelu: both stores) runs under the other's products.
using PingPongCfg = fp8gemm::PingPongCfg;
template <bool kGelu>
__global__ void __launch_bounds__(kThreads, 1)
    Bf16GemmSm90PingPongKernel(const __grid_constant__ CUtensorMap map_a,
                               const __grid_constant__ CUtensorMap map_b,
                               const __grid_constant__ CUtensorMap map_out,
                               const __grid_constant__ CUtensorMap map_gelu,
                               const bf16* __restrict__ bias, int M, int N, int kbytes) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(BOULDER_ATTENTION_EMULATION)
  using C = PingPongCfg;
  constexpr int S = C::kStages;
  const fp8gemm::Smem sm = fp8gemm::SmemOf<C>();
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  fp8gemm::InitStageBarriers<C>(sm, 4);  // the using warpgroup's warps
  const int tiles_n = N / 128, my_tiles = fp8gemm::CtaTiles((M / kBM) * tiles_n);
  const int kblocks = kbytes / kBK;
  if (tid >= kConsumers) {
    if (lane == 0) fp8gemm::ProduceStages<C>(sm, &map_a, &map_b, my_tiles, kblocks, tiles_n);
    return;
  }

  const int wg = warp / 4, w4 = warp % 4;
  auto release = [&](int s) {
    if (lane == 0) fp8gemm::MbarArrive(sm.empty + 8 * s);
  };
  float acc[2][64];  // rows 0-63 and 64-127 of the tile
  for (int i = wg; i < my_tiles; i += 2) {
    const int t = blockIdx.x + i * gridDim.x, tm = t / tiles_n, tn = t % tiles_n;
    if (i > 0) fp8gemm::NamedBarrier(3 + wg, 256);  // the other warpgroup's main loop is done
    int it = i * kblocks;
    for (int kb = 0; kb < kblocks; ++kb, ++it) {
      const int s = it % S;
      fp8gemm::MbarWait(sm.full + 8 * s, (it / S) & 1);
      const uint32_t a_tile = sm.a + s * C::kABytes, b_tile = sm.b + s * C::kBBytes;
      wgmma::Fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 32; ++kk) {
        const uint64_t db = wgmma::Desc(b_tile + 32 * kk, 16, 1024);
        const int scale_d = (kb > 0 || kk > 0) ? 1 : 0;
        WgmmaBf16(acc[0], wgmma::Desc(a_tile + 32 * kk, 16, 1024), db, scale_d);
        WgmmaBf16(acc[1], wgmma::Desc(a_tile + 64 * 128 + 32 * kk, 16, 1024), db, scale_d);
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
    if (i + 1 < my_tiles) fp8gemm::NamedArrive(3 + (1 - wg), 256);  // the other may start

    const int g = lane / 4, q = lane % 4;
    const uint32_t stage = sm.out + wg * C::kWgOutBytes;  // the halves' boxes, 16 KB apart
    uint32_t pre[kGelu ? 2 : 1][kGelu ? 32 : 1];
    fp8gemm::StagedEpilogue(
        wg, tid % 128 == 0,
        [&] {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            fp8gemm::StageBand<128>(acc[half], stage + half * 16384, tn * 128, bias, 1.f, w4, g,
                                    q, kGelu ? pre[half] : nullptr);
          }
        },
        [&] {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            fp8gemm::StoreBand<128>(&map_out, stage + half * 16384, tn * 128,
                                    tm * kBM + half * 64);
          }
        });
    if constexpr (kGelu) {
#pragma unroll
      for (int r = 0; r < 64; ++r) acc[0][r] = acc[1][r] = 0.f;  // frees acc for pre
      fp8gemm::StagedEpilogue(
          wg, tid % 128 == 0,
          [&] {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              StageGeluBf16<128>(pre[half], stage + half * 16384, w4, g, q);
            }
          },
          [&] {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              fp8gemm::StoreBand<128>(&map_gelu, stage + half * 16384, tn * 128,
                                      tm * kBM + half * 64);
            }
          });
    }
  }
  if (tid % 128 == 0) wgmma::BulkWaitAll();
#endif  // __CUDA_ARCH_FEAT_SM90_ALL || BOULDER_ATTENTION_EMULATION
}

}  // namespace boulder::kernels::cuda::bf16gemm

#endif  // BOULDER_KERNELS_CUDA_BF16_GEMM_SM90_CUH_
