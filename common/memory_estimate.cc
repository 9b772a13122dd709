#include "common/memory_estimate.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace boulder::common {
namespace {

// worker/engine/param_layout.cc PaddedVocabSize and model.cc kAlign.
int64_t PaddedVocab(int64_t v) {
  const int64_t multiple = v <= 1024 ? 32 : 128;
  return (v + multiple - 1) / multiple * multiple;
}
constexpr int64_t kAlign = 64;
int64_t AlignUp(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::string GiB(int64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
}

}  // namespace

absl::StatusOr<MemoryEstimate> EstimateTrainingMemory(const v1::JobSpec& resolved,
                                                      absl::string_view precision,
                                                      absl::string_view backend) {
  if (backend != "cpu" && backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("backend '", backend, "': expected cpu or cuda"));
  }
  int64_t elem = 0;
  const bool fp8 = precision == "fp8";
  if (precision == "fp32") {
    elem = 4;
  } else if (precision == "bf16") {
    elem = 2;
  } else if (fp8) {
    elem = backend == "cuda" ? 2 : 4;  // bf16 on the GPU, fp32 under the cpu emulation
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "precision '", precision, "': no memory estimate (expected fp32, bf16 or fp8)"));
  }
  const v1::ModelSpec& m = resolved.model();
  if (m.vocab_size() <= 0 || m.hidden() <= 0 || m.heads() <= 0 || m.layers() <= 0 || m.ffn() <= 0 ||
      m.context() <= 0 || resolved.training().batch_size() <= 0 ||
      resolved.training().seq_len() <= 0) {
    return absl::InvalidArgumentError("model: not resolved (every size must be positive)");
  }
  const int64_t C = m.hidden(), F = m.ffn(), Vp = PaddedVocab(m.vocab_size()), L = m.layers(),
                NH = m.heads();
  const int64_t per_layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + F * C + F + C * F + C;
  const int64_t n =
      Vp * C + m.context() * C + L * per_layer + 2 * C + (m.tie_embeddings() ? 0 : Vp * C);
  constexpr int64_t kState = 4;  // FP32 moments and master weights
  // The cuda backend keeps a BF16 model's FP32 master as the BF16 weight plus a 16-bit low
  // half (Backend::MasterLayout::kBf16LowHalves, its default): 2 more bytes per parameter.
  const int64_t master = elem == kState ? 0 : (backend == "cuda" ? 2 : kState);

  MemoryEstimate e;
  e.num_params = n;
  e.params_bytes = n * elem;
  e.grads_bytes = n * elem;
  e.optimizer_bytes = 2 * n * kState + (n + 7) / 8 + n * master;

  const int64_t R = std::max<int64_t>(
      int64_t{resolved.training().batch_size()} * resolved.training().seq_len(), m.context());
  const int64_t f = 4;  // float statistics
  int64_t a = 2 * AlignUp(R * 4) + AlignUp(R * C * elem);
  // A layer's inner activations (ln1 .. ln2 and their statistics), its fc1 output (the
  // pre-activation) and its output; GELU's output per layer too in "none" without FP8, else
  // one buffer shared by all layers.
  const int64_t inner = AlignUp(R * C * elem) + 2 * AlignUp(R * f) + AlignUp(R * 3 * C * elem) +
                        AlignUp(R * C * elem) + AlignUp(R * NH * f) + AlignUp(R * C * elem) +
                        AlignUp(R * C * elem) + 2 * AlignUp(R * f);
  const int64_t ffn = AlignUp(R * F * elem), out = AlignUp(R * C * elem);
  const std::string& recompute = resolved.training().activation_checkpointing();
  // As the model's arena: GELU's output per layer only in "none" (or empty) without FP8.
  const bool gelu_per_layer = !fp8 && (recompute.empty() || recompute == "none");
  if (recompute == "full") {  // inner and fc1 output shared
    a += inner + ffn + L * out;
  } else if (recompute == "mlp") {  // fc1 output shared
    a += ffn + L * (inner + out);
  } else if (fp8) {  // ln1 and ln2 (the FP8 casts' inputs) shared by all layers
    const int64_t ln = 2 * AlignUp(R * C * elem);
    a += ln + L * (inner - ln + ffn + out);
  } else {  // "gelu", or "none" with GELU's output per layer
    a += L * (inner + (gelu_per_layer ? 2 : 1) * ffn + out);
  }
  // The training micro-batch's rows (the FP8 buffers' N).
  const int64_t N = int64_t{resolved.training().batch_size()} * resolved.training().seq_len();
  // GELU's shared output; in FP8 also the backward's FP8 output gradient and its transpose
  // (model_fp8.cc), one byte per element.
  if (!gelu_per_layer) {
    a += AlignUp(std::max(R * F * elem, fp8 ? 2 * AlignUp(N * std::max(3 * C, F)) : 0));
  }
  a += AlignUp(R * C * elem) + 2 * AlignUp(R * f) + AlignUp(R * Vp * elem) + AlignUp(R * f);
  // The backward scratch: dresidual, dln, datty, scratch; dqkv (in FP8 also the FP8 input
  // scratch); dfc; the norm.
  a += 4 * AlignUp(R * C * elem) +
       AlignUp(std::max(R * 3 * C * elem, fp8 ? N * std::max(C, F) : 0)) + AlignUp(R * F * elem) +
       AlignUp(f);
  a += AlignUp(2 * C * elem);  // a frozen LayerNorm's discarded weight and bias gradients
  e.activations_bytes = a;
  if (fp8) {
    const int64_t H = resolved.fp8().amax_history_len();
    if (H < 1) return absl::InvalidArgumentError("fp8.amax_history_len: not resolved (< 1)");
    // worker/engine/fp8_state.cc: per tensor (input, weight, output gradient of 4 Linears per
    // layer) scale, amax and format max, scale_inv on its own 256-byte slot
    // (Fp8State::kScaleInvStride), an amax history and 3 uint64 counters
    // (kernels::kFp8CountersPerTensor); each region 256-byte aligned.
    const int64_t tensors = L * 4 * 3;
    const int64_t counters = 3 * int64_t{sizeof(uint64_t)};
    auto align256 = [](int64_t n) { return (n + 255) / 256 * 256; };
    const int64_t state = 3 * align256(tensors * 4) + align256(tensors * 256) +
                          align256(tensors * H * 4) + align256(tensors * counters);
    // model_fp8.cc AllocateFp8, one byte per element, for the training micro-batch's rows:
    // where the recomputing casts put their statistics, and the backward's weight transpose
    // (of the largest Linear).
    const int64_t shared_t = C * std::max(3 * C, F);
    const int64_t scratch = 8 + counters + shared_t;
    // Per layer: qkv {K C, OC 3C}, attn_proj {C, C}, fc1 {C, F}, fc2 {F, C}; each keeps the
    // FP8 weight [OC, K] (the backward recomputes every input transpose).
    const int64_t linears = 3 * C * C + C * C + C * F + F * C;
    e.fp8_bytes = state + scratch + L * linears;
    if (backend == "cuda") {
      // Every weight transpose kept per layer instead of the shared one, where FP8 then still
      // needs no more than BF16.
      absl::StatusOr<MemoryEstimate> bf16 = EstimateTrainingMemory(resolved, "bf16", backend);
      if (!bf16.ok()) return bf16.status();
      const int64_t kept = e.fp8_bytes - shared_t + L * linears;
      const int64_t others =
          e.params_bytes + e.grads_bytes + e.optimizer_bytes + e.activations_bytes;
      const int64_t budget = bf16->total_bytes - kCudaRuntimeReserveBytes;
      if (others + kept <= budget) {
        e.fp8_bytes = kept;
        e.fp8_keeps_weight_transposes = true;
        // Then qkv's and fc1's input transposes [C, N] per layer (one byte each), where their
        // LayerNorm writes them (no activation checkpointing).
        const int64_t ln_t = L * 2 * C * N;
        if (recompute != "full" && recompute != "mlp" && others + kept + ln_t <= budget) {
          e.fp8_bytes += ln_t;
          e.fp8_keeps_ln_input_transposes = true;
        }
      }
    }
  }
  e.runtime_bytes = backend == "cuda" ? kCudaRuntimeReserveBytes : 0;
  e.total_bytes = e.params_bytes + e.grads_bytes + e.optimizer_bytes + e.activations_bytes +
                  e.fp8_bytes + e.runtime_bytes;
  return e;
}

std::string FormatMemoryEstimate(const MemoryEstimate& e) {
  std::string out = absl::StrCat(GiB(e.total_bytes), " (params ", GiB(e.params_bytes), ", grads ",
                                 GiB(e.grads_bytes), ", optimizer ", GiB(e.optimizer_bytes),
                                 ", activations ", GiB(e.activations_bytes));
  if (e.fp8_bytes > 0) absl::StrAppend(&out, ", FP8 ", GiB(e.fp8_bytes));
  if (e.runtime_bytes > 0) absl::StrAppend(&out, ", CUDA runtime ", GiB(e.runtime_bytes));
  absl::StrAppend(&out, ")");
  return out;
}

}  // namespace boulder::common
