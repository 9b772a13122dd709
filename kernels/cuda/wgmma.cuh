// Warpgroup matrix products on Hopper (wgmma, sm_90a only) for the attention kernels
// (attention_fwd_sm90.cu): the instructions, their fences, and shared-memory descriptors of
// 128-byte-swizzled BF16 tiles.
//
// Tiles. A [rows][cols] BF16 tile is stored as cols / 64 column blocks ("atoms") of
// rows × 128 bytes, atom after atom; row r of an atom starts at r·128 bytes and its 16-byte
// chunk c sits at chunk position c ^ (r % 8) (the 128-byte swizzle, which the hardware undoes
// on absolute address bits 4–6 xor 7–9, so every atom starts 1024-byte aligned). The same bytes
// serve either way round:
//   K-major (Q and K for S = Q·Kᵀ; K, the contracted dimension, along a row): 8-row groups
//     1024 bytes apart (SBO); one k16 step is 32 bytes along the row, and steps 4–7 of a
//     128-column tile sit in the second atom.
//   MN-major (V for O = P·V; N, the head dimension, along a row, the contracted keys down the
//     rows): 8-key groups 1024 bytes apart (SBO), 64-column atoms LBO bytes apart; one k16 step
//     is 16 rows, 2048 bytes.
// Descriptor bits (PTX ISA, "Matrix Descriptor Format"): start address >> 4 in 0–13, LBO >> 4
// in 16–29, SBO >> 4 in 32–45, swizzle mode in 62–63 (1 = 128-byte).
//
// Accumulators of an m64nN product (PTX ISA, "wgmma .m64nNk16 register fragment layout"): warp
// w of the warpgroup holds rows 16w + g and 16w + g + 8 (g = lane / 4, t = lane % 4); for each
// 8-column block j, d[4j], d[4j+1] = (16w + g, 8j + 2t..), d[4j+2], d[4j+3] = (16w + g + 8,
// 8j + 2t..) — mma.sync's C layout, block after block. So the A operand from registers of a
// following product (a warp's 16 rows × 16 columns, mma.sync's A fragment) is the packed pairs
// of two consecutive blocks, as AFromC does for mma.sync.
#ifndef BOULDER_KERNELS_CUDA_WGMMA_CUH_
#define BOULDER_KERNELS_CUDA_WGMMA_CUH_

#include <cstdint>

namespace boulder::kernels::cuda::wgmma {

// A 128-byte-swizzle descriptor for the tile starting at shared address `addr` (bytes).
__device__ __forceinline__ uint64_t Desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFFu) >> 4) | uint64_t((lbo >> 4) & 0x3FFFu) << 16 |
         uint64_t((sbo >> 4) & 0x3FFFu) << 32 | uint64_t(1) << 62;
}

// Byte offset of 16-byte chunk c (of 8 elements) of row r in a swizzled tile of `rows` rows.
__device__ __forceinline__ uint32_t SwizzledChunk(int rows, int r, int c) {
  return uint32_t((c / 8) * rows * 128 + r * 128 + (((c % 8) ^ (r % 8)) << 4));
}

// The accumulator operands of a wgmma with N FP32 registers d[0..N): the register list
// "{%0, ..., %N-1}" (the instruction's other operands then number from %N) and the
// matching "+f" constraints, each list extending the one half its size. Every wgmma wrapper
// uses them (here and in fp8_gemm_sm90.cuh).
#define BOULDER_WGMMA_LIST32                                                                   \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define BOULDER_WGMMA_LIST64                                                                    \
  BOULDER_WGMMA_LIST32                                                                          \
      ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, " \
      "%49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define BOULDER_WGMMA_LIST128                                                                      \
  BOULDER_WGMMA_LIST64                                                                             \
      ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, "    \
      "%81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, " \
      "%99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, "  \
      "%114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define BOULDER_WGMMA_REGS32 "{" BOULDER_WGMMA_LIST32 "}"
#define BOULDER_WGMMA_REGS64 "{" BOULDER_WGMMA_LIST64 "}"
#define BOULDER_WGMMA_REGS128 "{" BOULDER_WGMMA_LIST128 "}"
#define BOULDER_WGMMA_D32                                                                         \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define BOULDER_WGMMA_D64                                                                          \
  BOULDER_WGMMA_D32, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), \
      "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]),   \
      "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),   \
      "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]),   \
      "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define BOULDER_WGMMA_D128                                                                         \
  BOULDER_WGMMA_D64, "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), \
      "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),   \
      "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),   \
      "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),   \
      "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),   \
      "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),            \
      "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),          \
      "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),          \
      "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),          \
      "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// The instructions below exist on sm_90a only. The emulation tests compile the kernels as host
// C++ with BOULDER_ATTENTION_EMULATION defined and emulated_gpu.h's versions of exactly these
// functions (a warpgroup's products run at the wait that retires them).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(BOULDER_ATTENTION_EMULATION)
// Registers written by other instructions must be ordered before a wgmma that reads them.
__device__ __forceinline__ void Fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void Commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void Wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared-memory writes of this thread (st.shared, cp.async) visible to the async proxy that
// wgmma reads through.
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Pins accumulator registers at this point of the instruction stream: the compiler sees the
// wgmma asm as producing them at issue, so without this a read could move above the Wait.
template <int N>
__device__ __forceinline__ void FenceOperand(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// Shared memory by its shared-space address. Writes are the generic proxy's: fence them
// (FenceProxyAsync) before a wgmma, TMA store or bulk copy reads them.
__device__ __forceinline__ void StoreShared32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void StoreShared16(uint32_t addr, uint16_t v) {
  asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(addr), "h"(v) : "memory");
}
__device__ __forceinline__ uint32_t LoadShared32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

// Bulk groups: a thread's TMA tensor stores (fp8gemm::TmaStore) and 1-D bulk copies
// (BulkStore) join its one open bulk group; BulkCommit closes it, and the waits count the
// committed groups of both kinds together.
//
// `bytes` (a multiple of 16) from shared memory at src to global dst, both 16-byte aligned,
// asynchronously (a 1-D bulk copy).
__device__ __forceinline__ void BulkStore(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst),
               "r"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void BulkCommit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Until at most N of this thread's committed bulk groups still read their shared memory.
template <int N>
__device__ __forceinline__ void BulkWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Until every one of this thread's committed bulk groups is done.
__device__ __forceinline__ void BulkWaitAll() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// d[0..32) = A·B (scale_d 0) or d + A·B (scale_d 1): wgmma m64n64k16, A and B from
// shared memory (descriptors), BF16 products accumulated in FP32; kTransA / kTransB 1: A / B is
// MN-major.
template <int kTransA, int kTransB>
__device__ __forceinline__ void WgmmaSS64(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                          int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " BOULDER_WGMMA_REGS32
      ", %32, %33, p, 1, 1, %35, %36;\n}\n"
      : BOULDER_WGMMA_D32
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB));
}

// d[0..64) = A·B (scale_d 0) or d + A·B (scale_d 1): wgmma m64n128k16, A and B from
// shared memory (descriptors), BF16 products accumulated in FP32; kTransA / kTransB 1: A / B is
// MN-major.
template <int kTransA, int kTransB>
__device__ __forceinline__ void WgmmaSS128(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                           int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " BOULDER_WGMMA_REGS64
      ", %64, %65, p, 1, 1, %67, %68;\n}\n"
      : BOULDER_WGMMA_D64
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB));
}

// d[0..128) = A·B (scale_d 0) or d + A·B (scale_d 1): wgmma m64n256k16, A and B K-major from
// shared memory (descriptors), BF16 products accumulated in FP32 (bf16_gemm_sm90.cuh's
// 256-column tiles).
__device__ __forceinline__ void WgmmaSS256(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                           int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " BOULDER_WGMMA_REGS128
      ", %128, %129, p, 1, 1, 0, 0;\n}\n"
      : BOULDER_WGMMA_D128
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// d[0..32) += A·B: wgmma m64n64k16 with A from registers (the warpgroup's 64 × 16 block,
// each warp's 16 rows as an mma.sync A fragment) and B from shared memory; kTransB 1: B is
// MN-major.
template <int kTransB>
__device__ __forceinline__ void WgmmaRS64(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " BOULDER_WGMMA_REGS32
      ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : BOULDER_WGMMA_D32
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1), "n"(kTransB));
}

// d[0..64) += A·B: wgmma m64n128k16 with A from registers (the warpgroup's 64 × 16 block,
// each warp's 16 rows as an mma.sync A fragment) and B from shared memory; kTransB 1: B is
// MN-major.
template <int kTransB>
__device__ __forceinline__ void WgmmaRS128(float (&d)[64], const uint32_t (&a)[4],
                                           uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " BOULDER_WGMMA_REGS64
      ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : BOULDER_WGMMA_D64
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1), "n"(kTransB));
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL && !BOULDER_ATTENTION_EMULATION

}  // namespace boulder::kernels::cuda::wgmma

#endif  // BOULDER_KERNELS_CUDA_WGMMA_CUH_
