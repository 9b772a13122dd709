// An FP8 GEMM of our own for Hopper (sm_90a): row-major out[M,N] (BF16) = a_scale_inv ·
// b_scale_inv · a[M,K] · b[N,K]ᵀ (+ bias[N]) (+ out, accumulating), with E4M3 or E5M2
// operands (at most one E5M2), both K-contiguous: the layout of CudaBackend::MatmulFp8.
//
// Why: cuBLASLt's FP8 kernels run GPT-2's k = 768 shapes at 1.07–1.11 PFLOP/s against 1.5 on
// its best shape; its epilogue writes overlap the products only in part
// (bench/gpu-2026-12-04.md, "Where cuBLASLt's FP8 GEMMs lose time").
//
// How (the kernel: fp8_gemm_sm90.cuh; tensor maps and launch: fp8_gemm_sm90.cu): one CTA per
// multiprocessor (persistent) walks 128 × BN output tiles (BN 256 for fast accumulation where
// N allows, else 128). A producer warp streams
// 128-byte-deep k-blocks of a (128 rows) and b (BN rows) into a ring of shared-memory stages
// with TMA (128-byte swizzle, mbarrier completion), running on into the next tile while two
// consumer warpgroups (64 rows each) finish the current one. The consumers issue wgmma
// m64nBNk32 from shared memory, then stage the tile in shared memory as BF16 (scale, bias
// applied) and hand it to TMA stores that run while they start the next tile. Accumulating
// calls (weight gradients) read and write global memory directly. fast_accum false (data and
// weight gradients, as Transformer Engine's split accumulator) adds each 128-deep block's
// products into FP32 registers of their own, so the tensor cores' reduced-precision
// accumulation spans at most 128 products. With Fp8GemmGeluCast (fc1's forward), the same
// staging then carries fc2's FP8 input (GELU of the BF16 output, cast with its statistics) to
// a second set of TMA stores: no separate GELU cast reads the output back (not yet measured on
// a GPU; CudaBackend::MatmulFp8GeluCast, off by default).
//
// Measured on the H200 (fp8_gemm_bench, bench/fp8-gemm-2026-12-04.md): faster than cuBLASLt on
// the forwards with k <= 1024 (GPT-2's qkv, projection, fc1: 5-18%), level or slower at larger
// k and with split accumulation; CudaBackend routes calls by Fp8GemmSm90Preferred.
//
// The order of every sum is fixed by the shapes: results are bit-identical from run to run.
// Tests: cuda_fp8_test (on the GPU, against the CPU emulation), fp8_gemm_emulation_test (the
// kernels on an emulated GPU, in CI), fp8_gemm_sm90_test (the host-side choices).
#ifndef BOULDER_KERNELS_CUDA_FP8_GEMM_SM90_H_
#define BOULDER_KERNELS_CUDA_FP8_GEMM_SM90_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace boulder::kernels::cuda {

// Output tiles of 128 rows × 256 or 128 columns (256 needs fast accumulation, since split
// accumulation needs twice the registers, and N a multiple of 256); kAuto:
// Fp8GemmSm90AutoColumns's choice.
// kPingPong (fast accumulation only, else kN128): 128 × 128 tiles, each consumer warpgroup
// owning whole tiles in turn so one's epilogue runs under the other's products
// (Fp8GemmSm90PingPongKernel); checked on the emulated GPU, not yet timed on a GPU.
enum class Fp8GemmTile { kAuto, kN256, kN128, kPingPong };

// The tile width kAuto takes on a device of `sms` multiprocessors: 256 where allowed unless its
// last round of tiles leaves enough of the device idle that 128 finishes first (on the H200 this
// picks the faster of the two on every forward fp8_gemm_bench measured: seed's qkv and
// projection 128, GPT-2's 256; bench/fp8-gemm-2026-12-04.md).
int Fp8GemmSm90AutoColumns(int M, int N, bool fast_accum, int sms);

// Compute capability 9.0 and a build carrying sm_90a code, and the driver's tensor-map encoder.
bool Fp8GemmSm90Available();
// Shapes and pointers the kernel takes: M, N, K multiples of 128; a, b and out 16-byte aligned;
// bias 4-byte aligned; at most one E5M2 operand.
bool Fp8GemmSm90Supports(int M, int N, int K, bool a_e4m3, bool b_e4m3, const void* a,
                         const void* b, const void* out, const void* bias);
// Whether the kernel beats cuBLASLt on this shape on the H200 (measured with fp8_gemm_bench;
// the list and its numbers are in fp8_gemm_sm90.cu). fast_accum: the forward's GEMMs.
bool Fp8GemmSm90Preferred(int M, int N, int K, bool fast_accum);

// fc1's forward with fc2's input cast fused into the epilogue (CudaBackend::MatmulFp8GeluCast):
// besides the BF16 output, out[M, N] (row-major, 16-byte aligned) = E4M3 codes of
// GELU(the BF16 output) · *scale, the bytes and statistics of GeluCastFp8 (fp8_gelu.cu) on the
// BF16 output: max |GELU| into *amax (atomicMax of the bit pattern, as CastFp8), saturated,
// underflow and non-finite counts added to counts[0..2]. Each consumer warp adds its own
// statistics once, at the end.
struct Fp8GemmGeluCast {
  uint8_t* out;
  const float* scale;
  float* amax;
  unsigned long long* counts;
};
// The calls that take it: both operands E4M3, fast accumulation, not accumulating, and the
// pointers above set (out 16-byte aligned).
bool Fp8GemmSm90SupportsGeluCast(bool a_e4m3, bool b_e4m3, bool accumulate, bool fast_accum,
                                 const Fp8GemmGeluCast& gelu);

// Launches the kernel on s; cudaErrorInvalidValue where !Fp8GemmSm90Supports or
// !Fp8GemmSm90Available, or with gelu where !Fp8GemmSm90SupportsGeluCast. bias: length N or
// null (not with accumulate).
cudaError_t Fp8GemmSm90(__nv_bfloat16* out, const uint8_t* a, bool a_e4m3, const float* a_scale_inv,
                        const uint8_t* b, bool b_e4m3, const float* b_scale_inv,
                        const __nv_bfloat16* bias, int M, int N, int K, bool accumulate,
                        bool fast_accum, cudaStream_t s, Fp8GemmTile tile = Fp8GemmTile::kAuto,
                        const Fp8GemmGeluCast* gelu = nullptr);

}  // namespace boulder::kernels::cuda

#endif  // BOULDER_KERNELS_CUDA_FP8_GEMM_SM90_H_
