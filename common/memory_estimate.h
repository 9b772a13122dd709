// Estimates the device memory a training job needs, from its resolved spec, without building
// the model: what the submit-time check compares with a worker's gpu_memory_bytes.
//
// It follows the engine's allocation exactly (worker/engine/model.cc, checked by
// worker/engine/memory_estimate_test.cc): parameters and gradients in the compute dtype,
// AdamW moments in FP32 (and FP32 master weights when the compute dtype is narrower: on cuda
// as the BF16 weights plus 16-bit low halves, Backend::MasterLayout::kBf16LowHalves), a
// one-bit-per-parameter weight-decay mask, and one activation arena for max(batch*seq_len, context)
// token rows (every sub-buffer 64-byte aligned) laid out as training.activation_checkpointing
// ("none", "gelu", "mlp", "full"; empty reads as none) says. Precision fp8 trains in the backend's
// compute dtype (bf16 on cuda, fp32 on the cpu emulation) and adds the FP8 buffers of
// worker/engine/model_fp8.cc: the scaling state (scales, amaxes, histories, counters), one
// shared FP8 weight transpose, and per layer and Linear the FP8 weight (the backward
// recomputes the FP8 input transposes); the FP8 cast scratch lives in two arena buffers
// (GELU's output, dqkv), carved large enough for it. FP8 on cuda keeps every Linear's FP8
// weight transpose per layer instead of the shared one when the job's estimate still stays at
// or below the same job's in bf16 (fp8_keeps_weight_transposes), and then, without activation
// checkpointing, qkv's and fc1's FP8 input transposes where that still holds
// (fp8_keeps_ln_input_transposes): FP8 never takes more memory than BF16 for them. On cuda it
// adds
// kCudaRuntimeReserveBytes for the CUDA context and cuBLASLt workspace, which the trainer does
// not allocate through the model.
//
// Thread-safe: plain functions over values.
#ifndef BOULDER_COMMON_MEMORY_ESTIMATE_H_
#define BOULDER_COMMON_MEMORY_ESTIMATE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "boulder/v1/spec.pb.h"

namespace boulder::common {

// CUDA context, cuBLASLt workspace and allocator slack on a GPU (a stated allowance, not
// measured per device).
inline constexpr int64_t kCudaRuntimeReserveBytes = int64_t{1} << 30;

struct MemoryEstimate {
  int64_t num_params = 0;  // including the padded vocabulary rows
  int64_t params_bytes = 0;
  int64_t grads_bytes = 0;
  int64_t optimizer_bytes = 0;  // AdamW m and v, FP32 master weights, the decay mask
  int64_t activations_bytes = 0;
  int64_t fp8_bytes = 0;      // precision fp8 only
  // precision fp8 on cuda: each Linear's FP8 weight transpose is kept per layer (cast with the
  // weights once per step) rather than cast again by every backward into one shared buffer.
  bool fp8_keeps_weight_transposes = false;
  // precision fp8 on cuda without activation checkpointing, where FP8 still fits in BF16's
  // memory after the weight transposes: qkv's and fc1's FP8 input transposes are kept per layer
  // (written by their LayerNorm in the forward) rather than recomputed in the backward.
  bool fp8_keeps_ln_input_transposes = false;
  int64_t runtime_bytes = 0;  // kCudaRuntimeReserveBytes on cuda, 0 on cpu
  int64_t total_bytes = 0;    // the sum of the above
};

// The estimate for `resolved` trained at `precision` ("fp32", "bf16" or "fp8"; what
// EffectivePrecision returns) on `backend` ("cpu" or "cuda").
// INVALID_ARGUMENT for another precision or backend, or a spec whose model is not resolved.
absl::StatusOr<MemoryEstimate> EstimateTrainingMemory(const v1::JobSpec& resolved,
                                                      absl::string_view precision,
                                                      absl::string_view backend);

// "2.4 GiB (params 0.1 GiB, grads 0.1 GiB, optimizer 0.4 GiB, activations 0.8 GiB, FP8
// 0.1 GiB, CUDA runtime 1.0 GiB)" (FP8 only when there are FP8 buffers).
std::string FormatMemoryEstimate(const MemoryEstimate& estimate);

}  // namespace boulder::common

#endif  // BOULDER_COMMON_MEMORY_ESTIMATE_H_
