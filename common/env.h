// Every environment variable Boulder reads, in one place.
#ifndef BOULDER_COMMON_ENV_H_
#define BOULDER_COMMON_ENV_H_

namespace boulder::common {

// The coordinator address the CLI uses when --coordinator is not given ("HOST:PORT").
inline constexpr char kEnvCoordinator[] = "BOULDER_COORDINATOR";

// When set (to anything but "0") in a trainer's environment, the backend times every op on the
// device and the trainer prints the per-op table to stderr at the end (cuda backend only).
inline constexpr char kEnvProfileKernels[] = "BOULDER_PROFILE_KERNELS";

// Which FP8 GEMM the cuda backend runs (CudaBackend::set_fp8_gemm): "auto" (the default: our
// Hopper kernel on the shapes where it was measured faster, cuBLASLt elsewhere), "cublaslt"
// (cuBLASLt everywhere) or "own" (our kernel on every shape it takes). For benchmarks, and a
// way back to cuBLASLt should our kernel misbehave; any other value fails the backend's creation.
inline constexpr char kEnvFp8Gemm[] = "BOULDER_FP8_GEMM";

// Which BF16 GEMM the cuda backend's Linear forwards (CudaBackend::MatmulForward) run
// (CudaBackend::set_bf16_gemm): "auto" (the default: the measured choice per call, see
// CudaBackend::RoutesToOwnBf16Gemm), "cublaslt" (cuBLASLt everywhere), "own" (our Hopper kernel,
// bf16_gemm_sm90.h, on every forward it takes) or "own-gelu" (ours on fc1's GELU forwards
// only). BOULDER_BF16_GEMM_TILE picks its tile: "auto" (the default), "256", "128" or
// "pingpong". For benchmarks, and a way back to cuBLASLt; any other value fails the backend's
// creation.
inline constexpr char kEnvBf16Gemm[] = "BOULDER_BF16_GEMM";
inline constexpr char kEnvBf16GemmTile[] = "BOULDER_BF16_GEMM_TILE";

// Whether fc1's FP8 forward casts fc2's input in its GEMM's epilogue (our Hopper kernel, where
// BOULDER_FP8_GEMM routes fc1 to it): "off" (the default: the GEMM, then GeluCastFp8; measured
// faster on the H200 than the fused epilogue) or "on". Any other value fails the CUDA backend's
// creation.
inline constexpr char kEnvFp8GemmGelu[] = "BOULDER_FP8_GEMM_GELU";

// Whether FP8 training's attention forward casts its output (the projection's FP8 input) in
// its own epilogue (the wgmma kernel, on Hopper): "on" (the default; measured faster on the
// H200) or "off" (the forward, then CastFp8). Any other value fails the CUDA backend's creation.
inline constexpr char kEnvFp8AttentionCast[] = "BOULDER_FP8_ATTENTION_CAST";

// How the Hopper attention backward gets dQ (kernels/cuda/ops.h, AttentionDq): "auto" (the
// default: AttentionDqDefault, stored at head size 128, recompute at 64), "recompute" (a
// second kernel recomputes S and dP) or "stored" (the dK/dV kernel stores dS, and the second
// kernel multiplies it by K). For benchmarks; any other value fails the CUDA backend's
// creation.
inline constexpr char kEnvAttentionDq[] = "BOULDER_ATTENTION_DQ";

// Which Hopper attention forward runs (kernels/cuda/ops.h, AttentionFwdVariant): "plain" (the
// default), "pipelined" (each warpgroup's softmax under its next products; two blocks per
// multiprocessor at head size 64, one at 128) or "pipelined1" (one block at both). The same
// outputs bit for bit; not
// yet timed on a GPU. For benchmarks; any other value fails the CUDA backend's creation.
inline constexpr char kEnvAttentionFwd[] = "BOULDER_ATTENTION_FWD";

// Whether a training step's first backward writes the weight gradients with '=' instead of the
// step zeroing them first and the GEMMs adding to them (ModelOptions::
// overwrite_first_weight_gradients): "on" (the default: the same values, less memory traffic;
// measured 0.4 ms faster per hidden-2048 BF16 step on an H100) or "off". For benchmarks; any
// other value fails the job at start.
inline constexpr char kEnvWeightGradOverwrite[] = "BOULDER_WEIGHT_GRAD_OVERWRITE";

// Where a training step computes its gradient norm (ModelOptions::grad_norm_in_backward):
// "step" (the default: one pass over the gradients after the backward) or "backward" (bucket
// by bucket during the backward, beside it on the GPU, where the step has one micro-batch and
// one gradient rank; not yet run on a GPU, so off by default). For benchmarks; any other value
// fails the job at start.
inline constexpr char kEnvGradNorm[] = "BOULDER_GRAD_NORM";

// How the cuda backend keeps the FP32 master weights (Backend::master_layout): "split" (the
// default: the BF16 working weight and a 16-bit low half, kernels/split_master.h: the same FP32
// values in 2 bytes per parameter less memory and AdamW traffic) or "fp32" (a separate FP32
// copy, as before; for benchmarks). Any other value fails the CUDA backend's creation.
inline constexpr char kEnvMasterWeights[] = "BOULDER_MASTER_WEIGHTS";

// NCCL's switch for NVLink SHARP multicast. The NCCL communicator (worker/comm) sets it to "0"
// when unset, so multicast stays off unless an operator turns it on explicitly.
inline constexpr char kEnvNcclNvlsEnable[] = "NCCL_NVLS_ENABLE";

// The CLI user's bearer token, when --token-file is not given (see README, Security).
inline constexpr char kEnvToken[] = "BOULDER_TOKEN";

// The worker join token, when boulder-worker's --join-token-file is not given.
inline constexpr char kEnvJoinToken[] = "BOULDER_JOIN_TOKEN";

// The CLI's TLS files when --tls-ca / --tls-cert / --tls-key are not given: the CA that signed
// the coordinator's certificate (default: the system's roots) and a client certificate and key
// for coordinators that require one.
inline constexpr char kEnvTlsCa[] = "BOULDER_TLS_CA";
inline constexpr char kEnvTlsCert[] = "BOULDER_TLS_CERT";
inline constexpr char kEnvTlsKey[] = "BOULDER_TLS_KEY";

// "1" (or "true"): the CLI talks plaintext to the coordinator, like --insecure.
inline constexpr char kEnvInsecure[] = "BOULDER_INSECURE";

}  // namespace boulder::common

#endif  // BOULDER_COMMON_ENV_H_
