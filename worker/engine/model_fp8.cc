// The Model's FP8 path (Transformer Engine's delayed scaling) for the four Linears of every
// layer. Per training micro-batch:
//   forward:  input -> cast (E4M3, the input's scale) into the shared scratch (for qkv and fc1
//             by their LayerNorm, Backend::ResidualLayerNormFp8Forward, when nothing is
//             recomputed); weights -> cast once per optimizer step, every layer's in one
//             Backend::CastFp8Batch at the step's first FP8 Linear (row-major, kept per layer);
//             out = FP8 GEMM (fast accumulation) + bias; fc1 writes only its pre-activation,
//             and fc2's input cast computes the GELU from it (Backend::GeluCastFp8, one pass:
//             no BF16 GELU output is written or read), or, where the backend takes the two as
//             one op (Backend::MatmulFp8GeluCast, ModelOptions::fp8_fuse_gelu_cast), fc1's GEMM
//             casts fc2's input itself, into the GELU output's buffer; likewise the attention
//             forward may cast the projection's input itself (Backend::AttentionForwardFp8Cast,
//             ModelOptions::fp8_fuse_attention_cast, Model::AttentionBeforeLinear);
//   backward: dGELU (fc1), bias gradient in the compute dtype and dout -> cast-transpose (E5M2
//             in hybrid) in one Backend::CastFp8Grad; weightᵀ -> kept (written with the
//             weight: fp8_keep_weight_transposes) or the FP8 weight transposed into one shared
//             buffer (Backend::TransposeFp8);
//             dinp = FP8 GEMM(dout, weightᵀ); the input's transpose recomputed into the shared
//             scratch: fc2's from fc1's kept pre-activation (Backend::GeluCastFp8, before the
//             gradient cast, whose output may share the GELU buffer), then the others after
//             the gradient cast (the scratch is act_.dqkv, qkv's dout): the attention
//             projection's cast again from the kept attention output, qkv's and fc1's from
//             their LayerNorm's kept input, mean and rstd (Backend::LayerNormFp8FromStats: the
//             arena shares the LayerNorm outputs between layers) or, under activation
//             checkpointing, cast again from the LayerNorm output (kept per layer in kMlp,
//             recomputed in kFull); dweight += FP8 GEMM(doutᵀ, inputᵀ).
// The MLP's backward (MlpBackwardFp8), where fc2's input transpose is recomputed: fc2's
// gradient cast (its transpose beside fc2's input transpose in the scratch), fc2's data
// gradient, then one Backend::GeluCastFp8AndGrad reading fc1's pre-activation once for both
// fc2's input transpose and fc1's gradient cast (dGELU, bias gradient), fc2's weight gradient,
// fc1's backward: the same bytes as the two LinearBackward calls, one read of N·F BF16 values
// fewer per layer.
// Every recomputed operand uses the step's scales and is the bytes the forward's cast wrote:
// the weightᵀ, the inputsᵀ of qkv, the projection and fc1, and fc2's inputᵀ (GeluCastFp8 of
// the same kept pre-activation, as in the forward).
// Statistics: the amaxes and counters of every forward cast and backward gradient cast
// accumulate in Fp8State until Fp8EndStep. An input's statistics are its forward cast's, a
// weight's its once-per-step cast's (over the same elements its transpose holds); the
// backward's recomputing casts, and activation checkpointing's recomputed Linears
// (RecomputeLayer), record nothing (their amax and counters go to fp8_discard_).
// Memory: per layer only the four FP8 weights (one byte per weight); the scratch is in the
// arena, and one weight transpose (of the largest Linear) is shared.
// ModelOptions::fp8_keep_transposes keeps every input and weight transpose per layer instead
// (the layout before the recomputation, for tests); fp8_keep_weight_transposes the weight
// transposes only (written by CastFp8Weights with the weights) and
// fp8_keep_ln_input_transposes qkv's and fc1's input transposes (written by their LayerNorm),
// where memory allows.
#include <algorithm>
#include <utility>

#include "worker/engine/model.h"

namespace boulder::engine {
namespace {

// {K, OC} of FP8 Linear t of a layer: qkv {C, 3C}, attn_proj {C, C}, fc1 {C, F}, fc2 {F, C}.
struct LinearDims {
  size_t k, oc;
};
LinearDims DimsOf(const ModelConfig& c, int t) {
  const size_t C = c.hidden, F = c.ffn;
  const LinearDims dims[Fp8State::kLinears] = {{C, 3 * C}, {C, C}, {C, F}, {F, C}};
  return dims[t];
}

// fc2's output-gradient transpose sits this far into fp8_input_ in MlpBackwardFp8, after fc2's
// input transpose (a cuBLASLt operand: 256-byte aligned).
size_t AfterInputTranspose(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

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
  const bool keep = options_.fp8_keep_transposes;
  const bool keep_w = keep || options_.fp8_keep_weight_transposes;
  const bool keep_ln =
      options_.fp8_keep_ln_input_transposes && options_.recompute == Recompute::kNone;
  auto alloc = [this](size_t bytes, uint8_t** out) -> absl::Status {
    absl::StatusOr<void*> p = backend_->Alloc(bytes);
    if (!p.ok()) return p.status();
    allocations_.push_back(*p);
    fp8_bytes_ += bytes;
    *out = static_cast<uint8_t*>(*p);
    return absl::OkStatus();
  };
  // The cast scratch (fp8_input_, fp8_dout_, fp8_dout_t_) is in the arena (Allocate()).
  absl::Status s = alloc(8 + kernels::kFp8CountersPerTensor * sizeof(uint64_t), &fp8_discard_);
  if (s.ok() && !keep_w) s = alloc(C * std::max(3 * C, F), &fp8_weight_t_);
  fp8_linears_.resize(static_cast<size_t>(c.layers) * Fp8State::kLinears);
  for (int l = 0; l < c.layers && s.ok(); ++l) {
    for (int t = 0; t < Fp8State::kLinears && s.ok(); ++t) {
      Fp8LinearBuffers& b = fp8_linears_[static_cast<size_t>(l) * Fp8State::kLinears + t];
      const size_t K = DimsOf(c, t).k, OC = DimsOf(c, t).oc;
      const bool ln_input =
          t == static_cast<int>(Fp8Linear::kQkv) || t == static_cast<int>(Fp8Linear::kFc1);
      if (keep || (keep_ln && ln_input)) s = alloc(K * N, &b.input_t);
      if (s.ok()) s = alloc(OC * K, &b.weight);
      if (s.ok() && keep_w) s = alloc(K * OC, &b.weight_t);
    }
  }
  return s;
}

void Model::Linear(int layer, Fp8Linear t, void* out, void* pre_gelu, const void* inp,
                   const void* weight, const void* bias, int N, int C, int OC,
                   kernels::Epilogue epilogue, const void* gelu_pre) {
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
  // fc2's input, GELU(fc1's pre-activation), is cast from the pre-activation in one pass; inp's
  // buffer (the GELU output's, unused in FP8 training) is the op's scratch.
  auto cast_input = [&](uint8_t* out_t, float* amax, uint64_t* counts) {
    if (gelu_pre != nullptr) {
      be.GeluCastFp8(fp8_input_, out_t, const_cast<void*>(inp), gelu_pre, N, C, in_fmt,
                     s.scale(in), amax, counts);
    } else {
      be.CastFp8(fp8_input_, out_t, inp, N, C, in_fmt, s.scale(in), amax, counts);
    }
  };
  const int linear = layer * Fp8State::kLinears + static_cast<int>(t);
  const uint8_t* a = fp8_input_;
  if (fp8_recompute_) {
    // The backward's recomputation (activation checkpointing): the same input cast with the
    // same scale gives the same FP8 bytes, so the GEMM reproduces the forward's output. The
    // forward already recorded this cast's amax and counters and kept what it keeps: nothing
    // is recorded or kept again.
    cast_input(nullptr, reinterpret_cast<float*>(fp8_discard_),
               reinterpret_cast<uint64_t*>(fp8_discard_ + 8));
  } else if (fp8_precast_.linear == linear) {
    // LayerNormBeforeLinear (and input_t where kept), AttentionBeforeLinear or fc1's GEMM cast
    // it and recorded the cast.
    a = fp8_precast_.data;
  } else {
    // b.input_t is null where the backward recomputes the transpose.
    cast_input(b.input_t, s.amax(in), s.counts(in));
    s.AddElements(in, static_cast<int64_t>(N) * C);
  }
  fp8_precast_ = Fp8Precast();
  // The weights do not change between a forward and its backward: a recompute finds them
  // cast already. The step's first FP8 Linear casts every layer's (one batch of small casts).
  // (b.weight_t, where kept, is written with b.weight; else the backward transposes b.weight.)
  if (b.weight_version != fp8_weight_version_) CastFp8Weights();
  // fc1 (kGelu) writes its pre-activation only: fc2's input cast computes the GELU from it
  // (gelu_pre above), and so does the backward's recomputed transpose, so the forward and the
  // backward cast the same values.
  void* const gemm_out = epilogue == kernels::Epilogue::kGelu ? pre_gelu : out;
  if (epilogue == kernels::Epilogue::kGelu && t == Fp8Linear::kFc1 && !fp8_recompute_ &&
      options_.fp8_fuse_gelu_cast &&
      fp8_linears_[static_cast<size_t>(layer) * Fp8State::kLinears +
                   static_cast<int>(Fp8Linear::kFc2)]
              .input_t == nullptr) {
    // fc2's input cast (its forward cast: recorded, as there) in fc1's GEMM where the backend
    // takes it, into out (the GELU output's buffer, unused in FP8 training: fc2's inp), which
    // holds N·OC bytes and is not the GEMM's operand. fc2's Linear then finds it cast.
    const int in2 = s.Index(layer, Fp8Linear::kFc2, Fp8Role::kInput);
    if (be.MatmulFp8GeluCast(gemm_out, static_cast<uint8_t*>(out), a, in_fmt, s.scale_inv(in),
                             b.weight, w_fmt, s.scale_inv(w), bias, N, OC, C, in_fmt, s.scale(in2),
                             s.amax(in2), s.counts(in2))) {
      s.AddElements(in2, static_cast<int64_t>(N) * OC);
      fp8_precast_ = {layer * Fp8State::kLinears + static_cast<int>(Fp8Linear::kFc2),
                      static_cast<const uint8_t*>(out)};
      return;
    }
  }
  be.MatmulFp8(gemm_out, a, in_fmt, s.scale_inv(in), b.weight, w_fmt, s.scale_inv(w), bias, N, OC,
               C, /*accumulate=*/false, /*fast_accum=*/true);
}

void Model::CastFp8Weights() {
  Fp8State& s = *fp8_;
  const ModelConfig& c = options_.config;
  const TensorKind kinds[Fp8State::kLinears] = {TensorKind::kQkvWeight,
                                                TensorKind::kAttnProjWeight,
                                                TensorKind::kFc1Weight, TensorKind::kFc2Weight};
  std::vector<kernels::Fp8CastJob> jobs;
  jobs.reserve(fp8_linears_.size());
  for (int l = 0; l < c.layers; ++l) {
    for (int t = 0; t < Fp8State::kLinears; ++t) {
      Fp8LinearBuffers& b = fp8_linears_[static_cast<size_t>(l) * Fp8State::kLinears + t];
      const int w = s.Index(l, static_cast<Fp8Linear>(t), Fp8Role::kWeight);
      const int K = static_cast<int>(DimsOf(c, t).k), OC = static_cast<int>(DimsOf(c, t).oc);
      kernels::Fp8CastJob job;
      job.out = b.weight;
      job.out_t = b.weight_t;
      job.inp = P(kinds[t], l);
      job.rows = OC;
      job.cols = K;
      job.scale = s.scale(w);
      job.amax = s.amax(w);
      job.counts = s.counts(w);
      jobs.push_back(job);
      s.AddElements(w, static_cast<int64_t>(OC) * K);
      b.weight_version = fp8_weight_version_;
    }
  }
  backend_->CastFp8Batch(jobs, s.Format(Fp8Role::kWeight));
}

void Model::LayerNormBeforeLinear(int layer, Fp8Linear t, void* residual, void* out, float* mean,
                                  float* rstd, const void* a, const void* b, const void* weight,
                                  const void* bias, int N, int C) {
  kernels::Backend& be = *backend_;
  if (fp8_ == nullptr || !fp8_training_forward_ || options_.recompute != Recompute::kNone) {
    if (residual != nullptr) {
      be.ResidualLayerNormForward(residual, out, mean, rstd, a, b, weight, bias, N, C);
    } else {
      be.LayerNormForward(out, mean, rstd, a, weight, bias, N, C);
    }
    return;
  }
  Fp8State& s = *fp8_;
  const int linear = layer * Fp8State::kLinears + static_cast<int>(t);
  const int in = s.Index(layer, t, Fp8Role::kInput);
  be.ResidualLayerNormFp8Forward(residual, out, mean, rstd, a, b, weight, bias, N, C, fp8_input_,
                                 fp8_linears_[static_cast<size_t>(linear)].input_t,
                                 s.Format(Fp8Role::kInput), s.scale(in), s.amax(in), s.counts(in));
  s.AddElements(in, static_cast<int64_t>(N) * C);
  fp8_precast_ = {linear, fp8_input_};
}

void Model::AttentionBeforeLinear(int layer, int B, int T) {
  kernels::Backend& be = *backend_;
  const ModelConfig& c = options_.config;
  LayerActs& la = act_.layers[layer];
  const int linear = layer * Fp8State::kLinears + static_cast<int>(Fp8Linear::kAttnProj);
  if (fp8_ != nullptr && fp8_training_forward_ && !fp8_recompute_ &&
      options_.fp8_fuse_attention_cast &&
      fp8_linears_[static_cast<size_t>(linear)].input_t == nullptr) {
    Fp8State& s = *fp8_;
    const int in = s.Index(layer, Fp8Linear::kAttnProj, Fp8Role::kInput);
    if (be.AttentionForwardFp8Cast(la.atty, la.att_stats, la.qkv, B, T, c.hidden, c.heads,
                                   fp8_input_, s.Format(Fp8Role::kInput), s.scale(in), s.amax(in),
                                   s.counts(in))) {
      s.AddElements(in, static_cast<int64_t>(B) * T * c.hidden);
      fp8_precast_ = {linear, fp8_input_};
      return;
    }
  }
  be.AttentionForward(la.atty, la.att_stats, la.qkv, B, T, c.hidden, c.heads);
}

void Model::DataGradientFp8(int layer, Fp8Linear t, void* dinp, int N, int C, int OC) {
  Fp8State& s = *fp8_;
  const Fp8LinearBuffers& b =
      fp8_linears_[static_cast<size_t>(layer) * Fp8State::kLinears + static_cast<int>(t)];
  const int w = s.Index(layer, t, Fp8Role::kWeight), g = s.Index(layer, t, Fp8Role::kGradOutput);
  // dinp[N,C] = dout[N,OC] · W[OC,C]: K = OC, the weight's transpose [C,OC] is K-contiguous:
  // kept, or the step's FP8 weight transposed now (the bytes a cast of the transpose with the
  // same scale gives, one byte read per weight instead of two).
  const uint8_t* w_t = b.weight_t;
  if (w_t == nullptr) {
    backend_->TransposeFp8(fp8_weight_t_, b.weight, OC, C);
    w_t = fp8_weight_t_;
  }
  backend_->MatmulFp8(dinp, fp8_dout_, s.Format(Fp8Role::kGradOutput), s.scale_inv(g), w_t,
                      s.Format(Fp8Role::kWeight), s.scale_inv(w), nullptr, N, C, OC, false, false);
}

void Model::LinearBackward(int layer, Fp8Linear t, void* dinp, void* dweight, void* dbias,
                           void* dout, const void* pre_gelu, const void* inp, const void* weight,
                           int N, int C, int OC, bool cast_dout) {
  kernels::Backend& be = *backend_;
  if (fp8_ == nullptr) {
    be.MatmulBackward(dinp, dweight, dbias, dout, pre_gelu, inp, weight, N, C, OC);
    return;
  }
  Fp8State& s = *fp8_;
  const Fp8LinearBuffers& b =
      fp8_linears_[static_cast<size_t>(layer) * Fp8State::kLinears + static_cast<int>(t)];
  const int in = s.Index(layer, t, Fp8Role::kInput), g = s.Index(layer, t, Fp8Role::kGradOutput);
  const kernels::Fp8Format in_fmt = s.Format(Fp8Role::kInput);
  const kernels::Fp8Format g_fmt = s.Format(Fp8Role::kGradOutput);
  float* const discard_amax = reinterpret_cast<float*>(fp8_discard_);
  uint64_t* const discard_counts = reinterpret_cast<uint64_t*>(fp8_discard_ + 8);
  // The input's transpose for the weight gradient: kept by the forward (fp8_keep_transposes),
  // or recomputed into the shared scratch (fp8_input_) with the step's scale. fc2's first,
  // because its recomputation (GELU from fc1's kept pre-activation) may use the GELU buffer as
  // scratch, where the gradient cast below writes; the others after that cast, because
  // fp8_input_ is act_.dqkv, qkv's dout.
  const uint8_t* inp_t = b.input_t;
  const bool recompute_inp_t = inp_t == nullptr && dweight != nullptr;
  if (recompute_inp_t && t == Fp8Linear::kFc2) {
    LayerActs& la = act_.layers[layer];
    be.GeluCastFp8(nullptr, fp8_input_, la.fc_gelu, la.fc_pre, N, C, in_fmt, s.scale(in),
                   discard_amax, discard_counts);
    inp_t = fp8_input_;
  }
  // dGELU (fc1), the bias gradient and the cast in one pass where the backend fuses them.
  if (cast_dout) {
    be.CastFp8Grad(fp8_dout_, fp8_dout_t_, dout, pre_gelu, dbias, N, OC, g_fmt, s.scale(g),
                   s.amax(g), s.counts(g));
    s.AddElements(g, static_cast<int64_t>(N) * OC);
  }
  if (dinp != nullptr) DataGradientFp8(layer, t, dinp, N, C, OC);
  // dW[OC,C] += doutᵀ[OC,N] · inp[N,C]: K = N, both transposes are K-contiguous. A frozen
  // weight (training.freeze_layers) has no gradient.
  if (dweight == nullptr) return;
  if (recompute_inp_t && t != Fp8Linear::kFc2) {
    const bool ln_input = t == Fp8Linear::kQkv || t == Fp8Linear::kFc1;
    if (ln_input && options_.recompute == Recompute::kNone) {
      // The arena shares the LayerNorm outputs between layers (Allocate()): recompute qkv's or
      // fc1's input from its LayerNorm's kept input and statistics, the forward's bytes. That
      // shared output buffer, free in the backward, is the scratch.
      LayerActs& la = act_.layers[layer];
      const bool qkv = t == Fp8Linear::kQkv;
      const void* x = !qkv         ? la.residual2
                      : layer == 0 ? act_.encoded
                                   : act_.layers[layer - 1].residual3;
      const TensorKind w_kind = qkv ? TensorKind::kLn1Weight : TensorKind::kLn2Weight;
      const TensorKind b_kind = qkv ? TensorKind::kLn1Bias : TensorKind::kLn2Bias;
      be.LayerNormFp8FromStats(nullptr, fp8_input_, qkv ? la.ln1 : la.ln2, x,
                               qkv ? la.ln1_mean : la.ln2_mean, qkv ? la.ln1_rstd : la.ln2_rstd,
                               P(w_kind, layer), P(b_kind, layer), N, C, in_fmt, s.scale(in),
                               discard_amax, discard_counts);
    } else {
      // The input is at hand: the attention output, or a LayerNorm output kept per layer (kMlp)
      // or recomputed (kFull).
      be.CastFp8(nullptr, fp8_input_, inp, N, C, in_fmt, s.scale(in), discard_amax, discard_counts);
    }
    inp_t = fp8_input_;
  }
  be.MatmulFp8(dweight, fp8_dout_t_, g_fmt, s.scale_inv(g), inp_t, in_fmt, s.scale_inv(in), nullptr,
               OC, C, N, /*accumulate=*/!overwrite_weight_grads_, false);
}

bool Model::MlpFp8FusedCasts(int l) const {
  const ModelConfig& c = options_.config;
  const size_t N = static_cast<size_t>(last_B_) * last_T_;
  const Fp8LinearBuffers& fc2 =
      fp8_linears_[static_cast<size_t>(l) * Fp8State::kLinears + static_cast<int>(Fp8Linear::kFc2)];
  // fc2's input transpose recomputed (not kept), fc2 trained (its weight gradient needs it),
  // and room in fp8_input_ for that transpose [F, N] and fc2's output-gradient transpose [C, N]
  // side by side (the latter must outlive fc1's gradient cast into fp8_dout_t_).
  return fc2.input_t == nullptr && G(TensorKind::kFc2Weight, l) != nullptr &&
         AfterInputTranspose(N * c.ffn) + N * c.hidden <= fp8_input_bytes_;
}

void Model::MlpBackwardFp8(int l) {
  const ModelConfig& c = options_.config;
  const int N = last_B_ * last_T_, C = c.hidden, F = c.ffn;
  LayerActs& la = act_.layers[l];
  if (!MlpFp8FusedCasts(l)) {
    LinearBackward(l, Fp8Linear::kFc2, act_.dfc, G(TensorKind::kFc2Weight, l),
                   G(TensorKind::kFc2Bias, l), act_.dresidual, nullptr, la.fc_gelu,
                   P(TensorKind::kFc2Weight, l), N, F, C);
    LinearBackward(l, Fp8Linear::kFc1, act_.dln, G(TensorKind::kFc1Weight, l),
                   G(TensorKind::kFc1Bias, l), act_.dfc, la.fc_pre, la.ln2,
                   P(TensorKind::kFc1Weight, l), N, C, F);
    return;
  }
  // The order: fc2's gradient cast (its transpose beside fc2's input transpose in fp8_input_),
  // fc2's data gradient (dfc, the gradient w.r.t. GELU's output), then one pass over fc1's
  // pre-activation writing fc2's input transpose (GELU, recomputed) and fc1's gradient cast
  // (dGELU, fc1's bias gradient) into fp8_dout_ / fp8_dout_t_ (fc2's row-major gradient there
  // is consumed by then), fc2's weight gradient, then fc1's backward without its cast. The
  // same bytes, statistics and sums as the two LinearBackward calls (Backend::
  // GeluCastFp8AndGrad's contract); only the order of independent work differs.
  kernels::Backend& be = *backend_;
  Fp8State& s = *fp8_;
  const int in2 = s.Index(l, Fp8Linear::kFc2, Fp8Role::kInput);
  const int g2 = s.Index(l, Fp8Linear::kFc2, Fp8Role::kGradOutput);
  const int g1 = s.Index(l, Fp8Linear::kFc1, Fp8Role::kGradOutput);
  const kernels::Fp8Format in_fmt = s.Format(Fp8Role::kInput);
  const kernels::Fp8Format g_fmt = s.Format(Fp8Role::kGradOutput);
  uint8_t* const fc2_dout_t = fp8_input_ + AfterInputTranspose(static_cast<size_t>(N) * F);
  be.CastFp8Grad(fp8_dout_, fc2_dout_t, act_.dresidual, nullptr, G(TensorKind::kFc2Bias, l), N, C,
                 g_fmt, s.scale(g2), s.amax(g2), s.counts(g2));
  s.AddElements(g2, static_cast<int64_t>(N) * C);
  DataGradientFp8(l, Fp8Linear::kFc2, act_.dfc, N, F, C);
  be.GeluCastFp8AndGrad(fp8_input_, in_fmt, s.scale(in2), reinterpret_cast<float*>(fp8_discard_),
                        reinterpret_cast<uint64_t*>(fp8_discard_ + 8), fp8_dout_, fp8_dout_t_,
                        act_.dfc, la.fc_pre, G(TensorKind::kFc1Bias, l), N, F, g_fmt, s.scale(g1),
                        s.amax(g1), s.counts(g1), la.fc_gelu);
  s.AddElements(g1, static_cast<int64_t>(N) * F);
  be.MatmulFp8(G(TensorKind::kFc2Weight, l), fc2_dout_t, g_fmt, s.scale_inv(g2), fp8_input_, in_fmt,
               s.scale_inv(in2), nullptr, C, F, N, /*accumulate=*/!overwrite_weight_grads_, false);
  LinearBackward(l, Fp8Linear::kFc1, act_.dln, G(TensorKind::kFc1Weight, l),
                 G(TensorKind::kFc1Bias, l), act_.dfc, la.fc_pre, la.ln2,
                 P(TensorKind::kFc1Weight, l), N, C, F, /*cast_dout=*/false);
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
