// The FP8 scaling state of a model trained with Transformer Engine's delayed scaling: for
// every FP8 tensor (the input, weight and output gradient of each layer's qkv, attention
// projection, fc1 and fc2 Linear) a scale, its inverse, the current step's amax, an amax
// history and saturation/underflow/non-finite counters, all in device memory, updated by
// the backend's fused Fp8ScaleUpdate once per optimizer step.
//
// Formats: "hybrid" casts inputs and weights to E4M3 and gradients to E5M2; "e4m3" all E4M3.
// Scales start at 1 (as Transformer Engine's), histories at 0.
//
// Ownership: allocated through (and freed with) a Backend that must outlive it. Not
// thread-safe: use from the backend's thread.
#ifndef BOULDER_WORKER_ENGINE_FP8_STATE_H_
#define BOULDER_WORKER_ENGINE_FP8_STATE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"

namespace boulder::engine {

// The FP8 Linears of a layer and the operands of each, in index order.
enum class Fp8Linear { kQkv = 0, kAttnProj = 1, kFc1 = 2, kFc2 = 3 };
enum class Fp8Role { kInput = 0, kWeight = 1, kGradOutput = 2 };
const char* Fp8LinearName(Fp8Linear t);  // "qkv", "attn_proj", "fc1", "fc2"
const char* Fp8RoleName(Fp8Role r);      // "input", "weight", "grad_output"

struct Fp8Options {
  bool enabled = false;         // precision fp8
  bool hybrid = true;           // E5M2 gradients (else E4M3 everywhere)
  int amax_history_len = 16;    // >= 1
  bool use_history_max = true;  // "max" (else "most_recent")
  int margin = 0;               // >= 0
};

// One tensor's statistics after a step.
struct Fp8TensorStat {
  int layer = 0;
  Fp8Linear linear = Fp8Linear::kQkv;
  Fp8Role role = Fp8Role::kInput;
  kernels::Fp8Format format = kernels::Fp8Format::kE4M3;
  float scale = 0;  // after the step's update (the next step's scale)
  float amax = 0;   // this step's (the history's newest entry)
  float amax_history_max = 0;
  double saturated_ratio = 0;  // of the elements cast this step
  double underflow_ratio = 0;
  uint64_t non_finite = 0;  // inf/NaN elements cast this step
  int64_t elements = 0;     // elements cast this step
};

class Fp8State {
 public:
  static constexpr int kLinears = 4;
  static constexpr int kRoles = 3;

  // INVALID_ARGUMENT for layers < 1, history < 1 or margin < 0; allocation errors from the
  // backend.
  static absl::StatusOr<std::unique_ptr<Fp8State>> Create(kernels::Backend* backend,
                                                          const Fp8Options& options, int layers);
  ~Fp8State();
  Fp8State(const Fp8State&) = delete;
  Fp8State& operator=(const Fp8State&) = delete;

  int num_tensors() const { return n_; }
  // Bytes allocated from the backend (one block).
  size_t bytes() const { return bytes_; }
  int Index(int layer, Fp8Linear t, Fp8Role r) const {
    return (layer * kLinears + static_cast<int>(t)) * kRoles + static_cast<int>(r);
  }
  kernels::Fp8Format Format(Fp8Role r) const {
    return options_.hybrid && r == Fp8Role::kGradOutput ? kernels::Fp8Format::kE5M2
                                                        : kernels::Fp8Format::kE4M3;
  }
  // Device pointers of tensor i's slots; each kind is one contiguous array over i (so
  // amax(0) is the whole step's amax array of num_tensors() floats, as a data-parallel
  // all-reduce needs).
  float* scale(int i) const { return scale_ + i; }
  // Each scale_inv on its own 256-byte slot (kScaleInvStride floats apart): cuBLASLt's FP8
  // GEMMs reject a scale pointer that is only 4-byte aligned (CUBLAS_STATUS_NOT_SUPPORTED from
  // every algorithm, seen on the H200 with CUDA 13.0).
  static constexpr int kScaleInvStride = 64;
  float* scale_inv(int i) const { return scale_inv_ + static_cast<size_t>(i) * kScaleInvStride; }
  float* amax(int i) const { return amax_ + i; }
  uint64_t* counts(int i) const {
    return counts_ + static_cast<size_t>(i) * kernels::kFp8CountersPerTensor;
  }
  // Host tally of the elements cast into tensor i this step (for the ratios).
  void AddElements(int i, int64_t n) { elements_[i] += n; }
  // Every tensor's tally so far this step (num_tensors() entries). A CUDA graph records its
  // casts' tallies once (StepGraph takes what a recording added, puts the tallies back as they
  // were, and adds the recorded ones at each replay: AddElements below).
  const std::vector<int64_t>& elements() const { return elements_; }
  void set_elements(std::vector<int64_t> elements) { elements_ = std::move(elements); }
  // Adds per_tensor[i] to tensor i's tally. REQUIRES: num_tensors() entries.
  void AddElements(const std::vector<int64_t>& per_tensor) {
    for (size_t i = 0; i < elements_.size(); ++i) elements_[i] += per_tensor[i];
  }

  // Enqueues the fused delayed-scaling update of every tensor (rolls the step's amaxes into
  // the histories and zeroes them). skip_if_non_finite: null, or a device scalar (the step's
  // gradient sum of squares) that, when inf or NaN, makes the update do nothing: scales and
  // histories kept, the step's amaxes left for ResetStep(/*discard_amax=*/true) (a step
  // replayed from a CUDA graph decides to skip on the device).
  void UpdateScales(const float* skip_if_non_finite);
  // Reads every tensor's statistics (synchronises with the backend).
  absl::StatusOr<std::vector<Fp8TensorStat>> ReadStats();
  // Starts the next step's statistics: zeroes the counters and element tallies; with
  // discard_amax also the step's amaxes (a skipped step must not reach the histories).
  void ResetStep(bool discard_amax);

  // The scaling state a checkpoint carries (its "fp8_scaling" section): every tensor's scale,
  // scale_inv and amax history, with the tensor count, history length and format they were
  // made for. The step's amaxes and counters are not in it: a checkpoint is taken between
  // steps, when they are zero. Synchronises with the backend.
  absl::StatusOr<std::string> SaveScaling();
  // Loads what SaveScaling wrote into this state (and zeroes the step's amaxes and counters).
  // FAILED_PRECONDITION when it was made for another tensor count (layers), history length or
  // format (naming both); DATA_LOSS when the bytes are malformed.
  absl::Status RestoreScaling(absl::string_view bytes);

  // "layer 2 fc1 grad_output": the first tensor (forward order, then backward order) with a
  // non-finite element or amax in `stats`; empty when none.
  static std::string FirstNonFinite(const std::vector<Fp8TensorStat>& stats);

 private:
  Fp8State(kernels::Backend* backend, const Fp8Options& options, int layers);

  kernels::Backend* backend_;
  Fp8Options options_;
  int layers_;
  int n_;
  void* block_ = nullptr;
  size_t bytes_ = 0;
  float* scale_ = nullptr;
  float* scale_inv_ = nullptr;
  float* amax_ = nullptr;
  float* fp8_max_ = nullptr;
  float* history_ = nullptr;  // [n, amax_history_len]
  uint64_t* counts_ = nullptr;
  std::vector<int64_t> elements_;
};

}  // namespace boulder::engine

#endif  // BOULDER_WORKER_ENGINE_FP8_STATE_H_
