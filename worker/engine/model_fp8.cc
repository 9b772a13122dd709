// The Model's FP8 path (Transformer Engine's delayed scaling) for the four Linears of every
// layer. Per training micro-batch:
//   forward:  input -> cast-transpose (E4M3, the input's scale; the transpose is kept for the
//             weight gradient); weight -> cast-transpose once per optimizer step;
//             out = FP8 GEMM (fast accumulation) + bias, then GELU for fc1;
//   backward: dGELU (fc1), bias gradient in the compute dtype and dout -> cast-transpose (E5M2
//             in hybrid) in one Backend::CastFp8Grad; dinp = FP8 GEMM(dout, weightᵀ);
//             dweight += FP8 GEMM(doutᵀ, inputᵀ).
// The amaxes and counters of every cast accumulate in Fp8State until Fp8EndStep. Activation
// checkpointing recomputes a layer's FP8 Linears in the backward with the step's scales and
// FP8 weights, recording nothing (see Linear).
#include <algorithm>
#include <utility>

#include "worker/engine/model.h"

namespace boulder::engine {

absl::Status Model::AllocateFp8() {
  const Fp8Options& f = options_.fp8;
  if (!f.enabled) return absl::OkStatus();
  const ModelConfig& c = options_.config;
  absl::StatusOr<std::unique_ptr<Fp8State>> state = Fp8State::Create(backend_, f, c.layers);
  if (!state.ok()) return state.status();
  fp8_ = std::move(*state);
  fp8_bytes_ = fp8_->bytes();
  const size_t N = static_cast<size_t>(options_.batch_size) * options_.seq_len;
  const size_t C = c.hidden, F = c.ffn;
  auto alloc = [this](size_t bytes, uint8_t** out) -> absl::Status {
    absl::StatusOr<void*> p = backend_->Alloc(bytes);
    if (!p.ok()) return p.status();
    allocations_.push_back(*p);
    fp8_bytes_ += bytes;
    *out = static_cast<uint8_t*>(*p);
    return absl::OkStatus();
  };
  absl::Status s = alloc(8 + kernels::kFp8CountersPerTensor * sizeof(uint64_t), &fp8_discard_);
  if (s.ok()) s = alloc(N * std::max(C, F), &fp8_input_);
  if (s.ok()) s = alloc(N * std::max(3 * C, F), &fp8_dout_);
  if (s.ok()) s = alloc(N * std::max(3 * C, F), &fp8_dout_t_);
  fp8_linears_.resize(static_cast<size_t>(c.layers) * Fp8State::kLinears);
  for (int l = 0; l < c.layers && s.ok(); ++l) {
    // {K, OC} of qkv, attn_proj, fc1, fc2.
    const size_t dims[Fp8State::kLinears][2] = {{C, 3 * C}, {C, C}, {C, F}, {F, C}};
    for (int t = 0; t < Fp8State::kLinears && s.ok(); ++t) {
      Fp8LinearBuffers& b = fp8_linears_[static_cast<size_t>(l) * Fp8State::kLinears + t];
      const size_t K = dims[t][0], OC = dims[t][1];
      s = alloc(K * N, &b.input_t);
      if (s.ok()) s = alloc(OC * K, &b.weight);
      if (s.ok()) s = alloc(K * OC, &b.weight_t);
    }
  }
  return s;
}

void Model::Linear(int layer, Fp8Linear t, void* out, void* pre_gelu, const void* inp,
                   const void* weight, const void* bias, int N, int C, int OC,
                   kernels::Epilogue epilogue) {
  kernels::Backend& be = *backend_;
  if (fp8_ == nullptr || !(fp8_training_forward_ || fp8_recompute_)) {
    be.MatmulForward(out, pre_gelu, inp, weight, bias, N, C, OC, epilogue);
    return;
  }
  Fp8State& s = *fp8_;
  Fp8LinearBuffers& b =
      fp8_linears_[static_cast<size_t>(layer) * Fp8State::kLinears + static_cast<int>(t)];
  const int in = s.Index(layer, t, Fp8Role::kInput), w = s.Index(layer, t, Fp8Role::kWeight);
  const kernels::Fp8Format in_fmt = s.Format(Fp8Role::kInput);
  const kernels::Fp8Format w_fmt = s.Format(Fp8Role::kWeight);
  if (fp8_recompute_) {
    // The backward's recomputation (activation checkpointing): the same input cast with the
    // same scale gives the same FP8 bytes, so the GEMM reproduces the forward's output. The
    // forward already recorded this cast's amax and counters and kept its transpose (per
    // layer, for the weight gradient): nothing is recorded or kept again.
    be.CastFp8(fp8_input_, nullptr, inp, N, C, in_fmt, s.scale(in),
               reinterpret_cast<float*>(fp8_discard_),
               reinterpret_cast<uint64_t*>(fp8_discard_ + 8));
  } else {
    be.CastFp8(fp8_input_, b.input_t, inp, N, C, in_fmt, s.scale(in), s.amax(in), s.counts(in));
    s.AddElements(in, static_cast<int64_t>(N) * C);
  }
  // The weights do not change between a forward and its backward: a recompute finds them
  // cast already.
  if (b.weight_version != fp8_weight_version_) {
    be.CastFp8(b.weight, b.weight_t, weight, OC, C, w_fmt, s.scale(w), s.amax(w), s.counts(w));
    s.AddElements(w, static_cast<int64_t>(OC) * C);
    b.weight_version = fp8_weight_version_;
  }
  if (epilogue == kernels::Epilogue::kGelu) {
    be.MatmulFp8Gelu(out, pre_gelu, fp8_input_, in_fmt, s.scale_inv(in), b.weight, w_fmt,
                     s.scale_inv(w), bias, N, OC, C);
  } else {
    be.MatmulFp8(out, fp8_input_, in_fmt, s.scale_inv(in), b.weight, w_fmt, s.scale_inv(w), bias,
                 N, OC, C, /*accumulate=*/false, /*fast_accum=*/true);
  }
}

void Model::LinearBackward(int layer, Fp8Linear t, void* dinp, void* dweight, void* dbias,
                           void* dout, const void* pre_gelu, const void* inp, const void* weight,
                           int N, int C, int OC) {
  kernels::Backend& be = *backend_;
  if (fp8_ == nullptr) {
    be.MatmulBackward(dinp, dweight, dbias, dout, pre_gelu, inp, weight, N, C, OC);
    return;
  }
  Fp8State& s = *fp8_;
  Fp8LinearBuffers& b =
      fp8_linears_[static_cast<size_t>(layer) * Fp8State::kLinears + static_cast<int>(t)];
  const int in = s.Index(layer, t, Fp8Role::kInput), w = s.Index(layer, t, Fp8Role::kWeight);
  const int g = s.Index(layer, t, Fp8Role::kGradOutput);
  const kernels::Fp8Format in_fmt = s.Format(Fp8Role::kInput);
  const kernels::Fp8Format w_fmt = s.Format(Fp8Role::kWeight);
  const kernels::Fp8Format g_fmt = s.Format(Fp8Role::kGradOutput);
  // dGELU (fc1), the bias gradient and the cast in one pass where the backend fuses them.
  be.CastFp8Grad(fp8_dout_, fp8_dout_t_, dout, pre_gelu, dbias, N, OC, g_fmt, s.scale(g),
                 s.amax(g), s.counts(g));
  s.AddElements(g, static_cast<int64_t>(N) * OC);
  if (dinp != nullptr) {
    // dinp[N,C] = dout[N,OC] · W[OC,C]: K = OC, the weight's transpose [C,OC] is K-contiguous.
    be.MatmulFp8(dinp, fp8_dout_, g_fmt, s.scale_inv(g), b.weight_t, w_fmt, s.scale_inv(w), nullptr,
                 N, C, OC, false, false);
  }
  // dW[OC,C] += doutᵀ[OC,N] · inp[N,C]: K = N, both transposes are K-contiguous. A frozen
  // weight (training.freeze_layers) has no gradient.
  if (dweight == nullptr) return;
  be.MatmulFp8(dweight, fp8_dout_t_, g_fmt, s.scale_inv(g), b.input_t, in_fmt, s.scale_inv(in),
               nullptr, OC, C, N, /*accumulate=*/true, false);
}

absl::Status Model::Fp8EndStep(bool apply, std::vector<Fp8TensorStat>* stats) {
  if (fp8_ == nullptr) {
    return absl::FailedPreconditionError("Fp8EndStep: the model does not train in FP8");
  }
  if (apply) fp8_->UpdateScales(/*skip_if_non_finite=*/nullptr);
  if (stats != nullptr) {
    absl::StatusOr<std::vector<Fp8TensorStat>> read = fp8_->ReadStats();
    if (!read.ok()) return read.status();
    *stats = std::move(*read);
  }
  fp8_->ResetStep(/*discard_amax=*/!apply);
  // The weights' FP8 copies were cast with the old scales (and a skipped step discarded
  // their amaxes): cast them again at the next forward.
  ++fp8_weight_version_;
  return absl::OkStatus();
}

}  // namespace boulder::engine
