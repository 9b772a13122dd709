// The training step of model.h split into device work and host-side edges, so that a CUDA
// graph can record the device work once (step_graph.h) and the eager path runs the same calls
// (Forward, Backward and OptimizerStep are built from these): both enqueue the same kernels
// with the same arguments, so their results are bit-identical.
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/engine/model.h"

namespace boulder::engine {
namespace {

void* Advance(void* base, size_t bytes) { return static_cast<char*>(base) + bytes; }

}  // namespace

absl::Status Model::UploadBatch(absl::Span<const int32_t> tokens,
                                absl::Span<const int32_t> targets) {
  const int B = options_.batch_size, T = options_.seq_len;
  const size_t N = static_cast<size_t>(B) * T;
  if (tokens.size() != N || targets.size() != N) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward: expected ", N, " tokens and targets (B=", B, ", T=", T, "), got ",
                     tokens.size(), " and ", targets.size()));
  }
  if (absl::Status s = CheckTokens(tokens, "tokens"); !s.ok()) return s;
  if (absl::Status s = CheckTokens(targets, "targets"); !s.ok()) return s;
  backward_ready_ = false;
  backend_->CopyFromHost(act_.tokens, tokens.data(), N * sizeof(int32_t));
  backend_->CopyFromHost(act_.targets, targets.data(), N * sizeof(int32_t));
  return absl::OkStatus();
}

void Model::EnqueueTrainingForward() {
  const int B = options_.batch_size, T = options_.seq_len;
  const size_t N = static_cast<size_t>(B) * T;
  fp8_training_forward_ = true;
  ForwardImpl(B, T);
  fp8_training_forward_ = false;
  const float dloss = 1.0f / static_cast<float>(N * options_.grad_accum_steps *
                                                static_cast<size_t>(options_.gradient_ranks));
  backend_->SoftmaxCrossEntropy(act_.losses, act_.logits, act_.targets, static_cast<int>(N),
                                options_.config.vocab_size, options_.config.padded_vocab_size,
                                dloss);
}

absl::StatusOr<double> Model::ReadLoss() {
  const size_t N = static_cast<size_t>(options_.batch_size) * options_.seq_len;
  std::vector<float> losses(N);
  backend_->CopyToHost(losses.data(), act_.losses, N * sizeof(float));
  if (absl::Status s = backend_->Synchronize(); !s.ok()) return s;
  double sum = 0.0;
  for (float l : losses) sum += l;
  return sum / static_cast<double>(N);
}

absl::Status Model::SetOptimizerStep(float lr, int t) {
  if (adamw_step_ == nullptr) {
    absl::StatusOr<void*> p = backend_->Alloc(kernels::Backend::kAdamWStepFloats * sizeof(float));
    if (!p.ok()) return p.status();
    allocations_.push_back(*p);
    adamw_step_ = static_cast<float*>(*p);
  }
  const AdamWConfig& a = options_.adamw;
  backend_->SetAdamWStep(adamw_step_, lr, t, a.beta1, a.beta2, /*skip_non_finite=*/fp8_ != nullptr);
  return absl::OkStatus();
}

void Model::EnqueueOptimizerStep() {
  const AdamWConfig& a = options_.adamw;
  // Computed already by the backward (ModelOptions::grad_norm_in_backward) or a GradNorm().
  if (!grad_norm_ready_) backend_->NormSquared(act_.norm_sq, grads_, num_trainable_);
  // One AdamW per run of trainable tensors; the clip factor is read from the one norm.
  for (const TrainableRun& r : runs_) {
    const size_t g = r.grad_offset;
    backend_->AdamWDeviceStep(Advance(params_, r.param_offset * elem_),
                              master_ == nullptr ? nullptr : Advance(master_, g * state_elem_),
                              Advance(grads_, g * elem_), Advance(m_, g * state_elem_),
                              Advance(v_, g * state_elem_), kernels::DecayBits{decay_bits_, g},
                              r.numel, adamw_step_, a.beta1, a.beta2, a.eps, a.weight_decay, 1.0f,
                              act_.norm_sq, a.grad_clip);
  }
  ++fp8_weight_version_;  // the FP8 weight copies are stale now
}

void Model::EnqueueFp8ScaleUpdate() {
  if (fp8_ != nullptr) fp8_->UpdateScales(/*skip_if_non_finite=*/act_.norm_sq);
}

absl::Status Model::Fp8EndReplayedStep(std::vector<Fp8TensorStat>* stats) {
  if (fp8_ == nullptr) {
    return absl::FailedPreconditionError("Fp8EndReplayedStep: the model does not train in FP8");
  }
  if (stats != nullptr) {
    absl::StatusOr<std::vector<Fp8TensorStat>> read = fp8_->ReadStats();
    if (!read.ok()) return read.status();
    *stats = std::move(*read);
  }
  fp8_->ResetStep(/*discard_amax=*/false);  // the recorded update zeroed them already
  ++fp8_weight_version_;
  return absl::OkStatus();
}

absl::StatusOr<float> Model::ReadGradNorm() {
  float norm_sq = 0.0f;
  backend_->CopyToHost(&norm_sq, act_.norm_sq, sizeof(float));
  if (absl::Status s = backend_->Synchronize(); !s.ok()) return s;
  return std::sqrt(norm_sq);
}

}  // namespace boulder::engine
