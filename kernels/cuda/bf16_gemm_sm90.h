// A BF16 GEMM of our own for Hopper (sm_90a), for Linear forwards: row-major
// out[M, N] = a[M, K] · b[N, K]ᵀ (+ bias[N]), both operands K-contiguous (the layout of
// CudaBackend::MatmulForward: a the input, b the weight), FP32 accumulation, BF16 output. With
// gelu_out (fc1's forward, cuBLASLt's GELU_AUX_BIAS): out is the pre-activation
// bf16(a·bᵀ + bias) and gelu_out[M, N] = bf16(GeluTanh(out)), GELU of the rounded
// pre-activation (what GeluForward recomputes from it in the backward).
//
// Why: cuBLASLt's GELU_AUX_BIAS epilogue costs fc1's forward 20-55% over the same GEMM without
// it (H100, hidden-2048 0.441 vs 0.36 ms; GPT-2 0.166 vs 0.106 ms per call;
// bench/results/attention-one-pass-2026-12-05-6e309b7 profiles).
//
// How: fp8_gemm_sm90.cuh's persistent warp-specialised kernel (TMA producer warp, two consumer
// warpgroups, 128 × BN tiles, staged TMA-store epilogue) on BF16 operands
// (bf16_gemm_sm90.cuh); the GELU is a second staged store of the same tile.
//
// The order of every sum is fixed by the shapes: results are bit-identical from run to run.
// Tests: bf16_gemm_emulation_test (the kernel on an emulated GPU, in CI), cuda_ops_test (on the
// GPU, through CudaBackend::MatmulForward, against the CPU backend).
#ifndef BOULDER_KERNELS_CUDA_BF16_GEMM_SM90_H_
#define BOULDER_KERNELS_CUDA_BF16_GEMM_SM90_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace boulder::kernels::cuda {

// Output tiles of 128 rows × 256 or 128 columns; kAuto: Fp8GemmSm90AutoColumns's choice;
// kPingPong: 128 × 128 tiles, each consumer warpgroup owning whole tiles in turn so one's
// epilogue runs under the other's products.
enum class Bf16GemmTile { kAuto, kN256, kN128, kPingPong };

// Compute capability 9.0, a build carrying sm_90a code, and the driver's tensor-map encoder.
bool Bf16GemmSm90Available();
// Shapes and pointers the kernel takes: M and N multiples of 128, K of 64; a, b, out and
// gelu_out 16-byte aligned; bias 4-byte aligned.
bool Bf16GemmSm90Supports(int M, int N, int K, const void* a, const void* b, const void* out,
                          const void* bias, const void* gelu_out);

// Whether the kernel beats cuBLASLt on this call (out[M, N], k = K; gelu: the GELU epilogue),
// as measured with bf16_gemm_bench (the list and its numbers are in bf16_gemm_sm90.cu).
bool Bf16GemmSm90Preferred(int M, int N, int K, bool gelu);

// Launches the kernel on s; cudaErrorInvalidValue where !Bf16GemmSm90Supports or
// !Bf16GemmSm90Available. bias: length N or null; gelu_out: M × N or null.
cudaError_t Bf16GemmSm90(__nv_bfloat16* out, __nv_bfloat16* gelu_out, const __nv_bfloat16* a,
                         const __nv_bfloat16* b, const __nv_bfloat16* bias, int M, int N, int K,
                         cudaStream_t s, Bf16GemmTile tile = Bf16GemmTile::kAuto);

}  // namespace boulder::kernels::cuda

#endif  // BOULDER_KERNELS_CUDA_BF16_GEMM_SM90_H_
