// Warp-level building blocks of the flash attention kernels (attention_fwd.cu,
// attention_bwd.cu): BF16 tensor-core products through mma.sync.m16n8k16 with FP32
// accumulators in registers, operand fragments loaded from shared memory with ldmatrix, and
// cp.async tile copies from global memory.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), with g = lane / 4 and
// t = lane % 4:
//   A (16 × 16, 4 registers of 2 BF16): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..),
//     a3 = (g+8, 2t+8..).
//   B (16 × 8, 2 registers): b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g).
//   C (16 × 8 FP32): c0, c1 = (g, 2t..2t+1), c2, c3 = (g+8, 2t..2t+1).
// So the C fragments of two adjacent n8 tiles are, once packed to BF16, exactly the A fragment
// of the 16-column block they cover (AFromC): a product's result feeds the next product
// without going through shared memory.
//
// Shared-memory tiles are row-major with rows of HS + 8 BF16 (kPad): a row is a multiple of
// 16 bytes and consecutive rows start 16 bytes apart modulo 128, so the eight 16-byte rows an
// ldmatrix phase reads fall in distinct banks. The sm_90a kernels (attention_{fwd,bwd}_sm90.cuh)
// use wgmma's 128-byte-swizzled tiles instead (wgmma.cuh, LoadSwizzledAsync below) and, of
// these, the cp.async copies, SmemAddr, NamedBarrier and PackBf16, and the staging helpers
// below.
#ifndef BOULDER_KERNELS_CUDA_ATTENTION_COMMON_CUH_
#define BOULDER_KERNELS_CUDA_ATTENTION_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace boulder::kernels::cuda::attn {

using bf16 = __nv_bfloat16;

constexpr int kPad = 8;  // BF16 elements added to each shared-memory row
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The PTX primitives. attention_emulation_test.cc compiles these kernels as host C++ with
// BOULDER_ATTENTION_EMULATION defined and emulated_gpu.h's versions of exactly these functions
// (warps emulated lane by lane), so the fragment and tile index arithmetic is tested without a
// GPU.
#ifndef BOULDER_ATTENTION_EMULATION
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; when !valid the destination is zero-filled and
// nothing is read (src must still be a valid address).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void Ldsm4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p))
               : "memory");
}
__device__ __forceinline__ void Ldsm4T(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p))
               : "memory");
}

// c += a · [b0; b1] (16 × 16 by 16 × 8, FP32 accumulate).
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Barrier `kId` (1–15; 0 is __syncthreads') over kThreads threads, a multiple of 32.
template <int kId, int kThreads>
__device__ __forceinline__ void NamedBarrier() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}
#endif  // BOULDER_ATTENTION_EMULATION

// The A fragment of the 16 × 16 block at p of a row-major [m][k] matrix (leading dim ld).
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const bf16* p, int ld, int lane) {
  Ldsm4(a, p + (lane % 16) * ld + (lane / 16) * 8);
}
// The A fragment (m × k = 16 × 16) of a matrix stored transposed, [k][m]; p at (k0, m0).
__device__ __forceinline__ void LoadAT(uint32_t (&a)[4], const bf16* p, int ld, int lane) {
  const int j = lane / 8, r = lane % 8;
  Ldsm4T(a, p + ((j / 2) * 8 + r) * ld + (j % 2) * 8);
}
// B fragments of two adjacent n8 tiles (n 16 × k 16) of a matrix stored [n][k] (as K is for
// Q·Kᵀ); p at (n0, k0). b[0], b[1] belong to columns n0..n0+7, b[2], b[3] to n0+8..n0+15.
__device__ __forceinline__ void LoadB(uint32_t (&b)[4], const bf16* p, int ld, int lane) {
  const int j = lane / 8, r = lane % 8;
  Ldsm4(b, p + ((j / 2) * 8 + r) * ld + (j % 2) * 8);
}
// The same from a matrix stored [k][n] (as V is for P·V); p at (k0, n0).
__device__ __forceinline__ void LoadBT(uint32_t (&b)[4], const bf16* p, int ld, int lane) {
  const int j = lane / 8, r = lane % 8;
  Ldsm4T(b, p + ((j % 2) * 8 + r) * ld + (j / 2) * 8);
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low 16 bits
  return *reinterpret_cast<uint32_t*>(&v);
}

// The A fragment of columns [16kk, 16kk + 16) of a 16-row strip held as C fragments c[n8].
template <int N8>
__device__ __forceinline__ void AFromC(uint32_t (&a)[4], const float (&c)[N8][4], int kk) {
  a[0] = PackBf16(c[2 * kk][0], c[2 * kk][1]);
  a[1] = PackBf16(c[2 * kk][2], c[2 * kk][3]);
  a[2] = PackBf16(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = PackBf16(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// acc[N/8] += A(16 × K strip at a, row-major [m][k]) · B where B is the K × N block at b of a
// matrix stored [n][k] (kTransB false: B = storedᵀ, as Kᵀ) or [k][n] (kTransB true).
template <int K, int N, bool kTransB>
__device__ __forceinline__ void WarpGemm(float (&acc)[N / 8][4], const bf16* a, int lda,
                                         const bf16* b, int ldb, int lane) {
  static_assert(K % 16 == 0 && N % 16 == 0, "tile sizes");
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t af[4];
    LoadA(af, a + kk * 16, lda, lane);
#pragma unroll
    for (int jj = 0; jj < N / 16; ++jj) {
      uint32_t bf[4];
      if constexpr (kTransB) {
        LoadBT(bf, b + kk * 16 * ldb + jj * 16, ldb, lane);
      } else {
        LoadB(bf, b + jj * 16 * ldb + kk * 16, ldb, lane);
      }
      Mma(acc[2 * jj], af, bf[0], bf[1]);
      Mma(acc[2 * jj + 1], af, bf[2], bf[3]);
    }
  }
}

// acc[N/8] += P · B, P a 16 × K strip held as C fragments p[K/8] (rounded to BF16 here) and B
// the K × N block at b of a matrix stored [k][n].
template <int K, int N>
__device__ __forceinline__ void WarpGemmRegA(float (&acc)[N / 8][4], const float (&p)[K / 8][4],
                                             const bf16* b, int ldb, int lane) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t af[4];
    AFromC(af, p, kk);
#pragma unroll
    for (int jj = 0; jj < N / 16; ++jj) {
      uint32_t bf[4];
      LoadBT(bf, b + kk * 16 * ldb + jj * 16, ldb, lane);
      Mma(acc[2 * jj], af, bf[0], bf[1]);
      Mma(acc[2 * jj + 1], af, bf[2], bf[3]);
    }
  }
}

template <int N8>
__device__ __forceinline__ void Zero(float (&acc)[N8][4]) {
#pragma unroll
  for (int j = 0; j < N8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
}

// Copies rows [row0, row0 + ROWS) × HS columns of a global matrix (row stride `stride`
// elements) into a shared tile with rows of HS + kPad; rows at or past T are zero-filled.
// Every thread of the block (THREADS) takes part; the copies join the thread's open cp.async
// group.
template <int ROWS, int HS, int THREADS>
__device__ __forceinline__ void LoadTileAsync(bf16* tile, const bf16* base, size_t stride, int row0,
                                              int T) {
  constexpr int kVecs = HS / 8, kLd = HS + kPad;
  static_assert((ROWS * kVecs) % THREADS == 0, "tile copy must divide among the threads");
#pragma unroll
  for (int it = 0; it < ROWS * kVecs / THREADS; ++it) {
    const int i = it * THREADS + threadIdx.x;
    const int r = i / kVecs, c = (i % kVecs) * 8;
    const bool valid = row0 + r < T;
    const bf16* src = base + size_t(valid ? row0 + r : 0) * stride + c;
    CpAsync16(tile + r * kLd + c, src, valid);
  }
}

// The same into a 128-byte-swizzled tile of ROWS rows (wgmma.cuh's layout, for the sm_90a
// kernels) at `tile`, 1024-byte aligned.
template <int ROWS, int HS, int THREADS>
__device__ __forceinline__ void LoadSwizzledAsync(unsigned char* tile, const bf16* base,
                                                  size_t stride, int row0, int T) {
  constexpr int kChunks = HS / 8;
  static_assert((ROWS * kChunks) % THREADS == 0, "tile copy must divide among the threads");
#pragma unroll
  for (int it = 0; it < ROWS * kChunks / THREADS; ++it) {
    const int i = it * THREADS + threadIdx.x;
    const int r = i / kChunks, c = i % kChunks;
    const bool valid = row0 + r < T;
    CpAsync16(tile + wgmma::SwizzledChunk(ROWS, r, c),
              base + size_t(valid ? row0 + r : 0) * stride + c * 8, valid);
  }
}

// The start of dynamic shared memory rounded up to 1024 bytes, the 128-byte swizzle's period
// (the sm_90a kernels ask for 1024 bytes more than their tiles take).
__device__ __forceinline__ unsigned char* AlignSwizzled(unsigned char* smem) {
  return smem + ((1024u - (SmemAddr(smem) & 1023u)) & 1023u);
}

// The 128 threads of warpgroup `wg` (0 or 1) of a block meet (named barrier 1 + wg; 0 is
// __syncthreads').
__device__ __forceinline__ void WarpgroupBarrier(int wg) {
  if (wg == 0) {
    NamedBarrier<1, 128>();
  } else {
    NamedBarrier<2, 128>();
  }
}

// Writes this thread's part of a warpgroup's m64nHS accumulators (wgmma.cuh's layout), times s0
// in its first row and s1 in its second, as BF16 into rows r and r + 8 of a swizzled tile of
// ROWS rows: each quad writes 4 bytes into distinct banks.
template <int ROWS, int HS>
__device__ __forceinline__ void StageAccumulators(unsigned char* tile, int r,
                                                  const float (&acc)[HS / 2], float s0, float s1) {
  const int t4 = threadIdx.x % 4;
#pragma unroll
  for (int j = 0; j < HS / 8; ++j) {
    *reinterpret_cast<uint32_t*>(tile + wgmma::SwizzledChunk(ROWS, r, j) + 4 * t4) =
        PackBf16(acc[4 * j] * s0, acc[4 * j + 1] * s0);
    *reinterpret_cast<uint32_t*>(tile + wgmma::SwizzledChunk(ROWS, r + 8, j) + 4 * t4) =
        PackBf16(acc[4 * j + 2] * s1, acc[4 * j + 3] * s1);
  }
}

// Copies rows [tile_row0, tile_row0 + 64) × HS columns of a swizzled tile of ROWS rows to
// global rows [row0, row0 + 64) (row stride `stride`; rows at or past T skipped), 16 bytes per
// store, by the 128 threads of one warpgroup; each stored chunk also goes to
// chunk(global row, chunk index, its 8 BF16 values).
struct NoChunk {
  __device__ __forceinline__ void operator()(int, int, uint4) const {}
};
template <int ROWS, int HS, class Chunk = NoChunk>
__device__ __forceinline__ void StoreWarpgroupRows(bf16* dst, size_t stride, int row0, int T,
                                                   const unsigned char* tile, int tile_row0,
                                                   Chunk chunk = Chunk()) {
  constexpr int kChunks = HS / 8;
#pragma unroll
  for (int it = 0; it < 64 * kChunks / 128; ++it) {
    const int i = it * 128 + threadIdx.x % 128;
    const int r = i / kChunks, c = i % kChunks;
    if (row0 + r < T) {
      const uint4 v =
          *reinterpret_cast<const uint4*>(tile + wgmma::SwizzledChunk(ROWS, tile_row0 + r, c));
      *reinterpret_cast<uint4*>(dst + size_t(row0 + r) * stride + c * 8) = v;
      chunk(row0 + r, c, v);
    }
  }
}

// Copies N floats (N a multiple of 4, src 16-byte aligned) into shared memory asynchronously.
template <int N>
__device__ __forceinline__ void LoadFloatsAsync(float* dst, const float* src) {
  static_assert(N % 4 == 0, "16-byte chunks");
  if (threadIdx.x < N / 4) CpAsync16(dst + threadIdx.x * 4, src + threadIdx.x * 4, true);
}

// Writes a warp's 16-row strip (C fragments acc[HS/8], times `scale`) as BF16 to rows
// [row0, row0 + 16) of a global matrix (row stride `stride`; rows at or past T skipped),
// staging through `stage`, 16 shared rows of HS + kPad this warp alone uses.
template <int HS>
__device__ __forceinline__ void StoreStrip(bf16* dst, size_t stride, int row0, int T,
                                           const float (&acc)[HS / 8][4], float scale0,
                                           float scale1, bf16* stage, int lane) {
  constexpr int kLd = HS + kPad, kVecs = HS / 8;
  const int g = lane / 4, t = lane % 4;
  __syncwarp();
#pragma unroll
  for (int j = 0; j < HS / 8; ++j) {
    *reinterpret_cast<uint32_t*>(stage + g * kLd + 8 * j + 2 * t) =
        PackBf16(acc[j][0] * scale0, acc[j][1] * scale0);
    *reinterpret_cast<uint32_t*>(stage + (g + 8) * kLd + 8 * j + 2 * t) =
        PackBf16(acc[j][2] * scale1, acc[j][3] * scale1);
  }
  __syncwarp();
#pragma unroll
  for (int it = 0; it < 16 * kVecs / 32; ++it) {
    const int i = it * 32 + lane;
    const int r = i / kVecs, c = (i % kVecs) * 8;
    if (row0 + r < T) {
      *reinterpret_cast<int4*>(dst + size_t(row0 + r) * stride + c) =
          *reinterpret_cast<const int4*>(stage + r * kLd + c);
    }
  }
  __syncwarp();
}

}  // namespace boulder::kernels::cuda::attn

#endif  // BOULDER_KERNELS_CUDA_ATTENTION_COMMON_CUH_
