#include "worker/engine/model.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/split_master.h"

namespace boulder::engine {
namespace {

using kernels::Epilogue;

// Every arena sub-buffer starts on a 64-byte boundary (vector loads, cache lines).
constexpr size_t kAlign = 64;

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

void* Advance(void* base, size_t bytes) { return static_cast<char*>(base) + bytes; }

}  // namespace

absl::StatusOr<Recompute> ParseRecompute(absl::string_view mode) {
  if (mode.empty() || mode == "none") return Recompute::kNone;
  if (mode == "gelu") return Recompute::kGelu;
  if (mode == "mlp") return Recompute::kMlp;
  if (mode == "full") return Recompute::kFull;
  return absl::InvalidArgumentError(absl::StrCat("training.activation_checkpointing: unknown '",
                                                 mode, "' (none, gelu, mlp or full)"));
}

Model::Model(kernels::Backend* backend, const ModelOptions& options)
    : backend_(backend), options_(options), layout_(options.config) {}

Model::~Model() {
  for (void* p : allocations_) backend_->Free(p);
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(kernels::Backend* backend,
                                                     const ModelOptions& options) {
  const ModelConfig& c = options.config;
  if (c.vocab_size <= 0 || c.hidden <= 0 || c.heads <= 0 || c.layers <= 0 || c.ffn <= 0 ||
      c.context <= 0) {
    return absl::InvalidArgumentError("model: every dimension must be positive");
  }
  if (c.padded_vocab_size < c.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: padded vocab ", c.padded_vocab_size, " < vocab ", c.vocab_size));
  }
  if (c.hidden % c.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.heads: ", c.heads, " does not divide hidden ", c.hidden));
  }
  if (options.batch_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.batch_size: must be positive, got ", options.batch_size));
  }
  if (options.seq_len <= 0 || options.seq_len > c.context) {
    return absl::InvalidArgumentError(absl::StrCat("training.seq_len: ", options.seq_len,
                                                   " is not in [1, context ", c.context, "]"));
  }
  for (int layer : options.freeze_layers) {
    if (layer < 0 || layer >= c.layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("training.freeze_layers: layer ", layer, " is not in [0, ", c.layers, ")"));
    }
  }
  if (options.grad_accum_steps <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training.grad_accum_steps: must be positive, got ", options.grad_accum_steps));
  }
  if (options.gradient_ranks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient_ranks: must be positive, got ", options.gradient_ranks));
  }
  // In FP8 GELU's output is never kept (Recompute's comment): kGelu is kNone's layout.
  ModelOptions resolved = options;
  if (resolved.fp8.enabled && resolved.recompute == Recompute::kGelu) {
    resolved.recompute = Recompute::kNone;
  }
  std::unique_ptr<Model> model(new Model(backend, resolved));
  absl::Status s = model->Allocate();
  if (!s.ok()) return s;
  return model;
}

absl::Status Model::Allocate() {
  const ModelConfig& c = options_.config;
  elem_ = kernels::DTypeSize(backend_->compute_dtype());
  state_elem_ = kernels::DTypeSize(backend_->state_dtype());
  master_elem_ = backend_->master_bytes_per_param();
  const size_t n = layout_.num_params();

  // Trainable tensors, merged into runs where they are adjacent in the layout.
  std::vector<bool> frozen_layer(c.layers, false);
  for (int layer : options_.freeze_layers) frozen_layer[layer] = true;
  num_trainable_ = 0;
  runs_.clear();
  for (const TensorInfo& t : layout_.tensors()) {
    const bool embedding = t.kind == TensorKind::kWte || t.kind == TensorKind::kWpe;
    const bool frozen =
        (t.layer >= 0 && frozen_layer[t.layer]) || (embedding && options_.freeze_embeddings);
    if (frozen) continue;
    if (!runs_.empty() && runs_.back().param_offset + runs_.back().numel == t.offset) {
      runs_.back().numel += t.numel;
    } else {
      runs_.push_back(TrainableRun{t.offset, num_trainable_, t.numel});
    }
    num_trainable_ += t.numel;
  }
  // With the embeddings frozen, no gradient needs to flow below the lowest trainable layer.
  lowest_backward_layer_ = 0;
  if (options_.freeze_embeddings) {
    while (lowest_backward_layer_ < c.layers && frozen_layer[lowest_backward_layer_]) {
      ++lowest_backward_layer_;
    }
  }
  const size_t nt = num_trainable_;
  // Each bucket's gradients in grads_: frozen tensors are whole layers or the embeddings, so a
  // bucket is all trainable or has none (as DataParallel's bucket all-reduces assume).
  bucket_grads_.clear();
  for (const Bucket& b : layout_.Buckets()) {
    const std::optional<size_t> g = GradOffset(b.offset);
    bucket_grads_.push_back(g.has_value() ? Bucket{*g, b.numel} : Bucket{0, 0});
  }

  auto alloc = [this](size_t bytes, auto** out) -> absl::Status {
    absl::StatusOr<void*> p = backend_->Alloc(bytes);
    if (!p.ok()) return p.status();
    allocations_.push_back(*p);
    *out = static_cast<std::remove_pointer_t<decltype(out)>>(*p);
    return absl::OkStatus();
  };
  absl::Status s = alloc(n * elem_, &params_);
  if (s.ok()) s = alloc(nt * elem_, &grads_);
  if (s.ok()) s = alloc(nt * state_elem_, &m_);
  if (s.ok()) s = alloc(nt * state_elem_, &v_);
  if (s.ok()) s = alloc((nt + 7) / 8, &decay_bits_);
  if (s.ok() && master_elem_ > 0) s = alloc(nt * master_elem_, &master_);
  if (!s.ok()) return s;

  if (s = SetParameters(layout_.InitialValues(options_.seed)); !s.ok()) return s;
  backend_->Memset0(grads_, nt * elem_);
  SplitZeroGrad();
  backend_->Memset0(m_, nt * state_elem_);
  backend_->Memset0(v_, nt * state_elem_);
  // The decay mask of the trainable parameters (in gradient order), one bit each.
  const std::vector<uint8_t> mask = layout_.DecayMask();
  std::vector<uint8_t> trainable_mask(nt);
  for (const TrainableRun& r : runs_) {
    std::copy_n(mask.begin() + static_cast<std::ptrdiff_t>(r.param_offset), r.numel,
                trainable_mask.begin() + static_cast<std::ptrdiff_t>(r.grad_offset));
  }
  const std::vector<uint8_t> bits = kernels::PackDecayBits(trainable_mask);
  backend_->CopyFromHost(decay_bits_, bits.data(), bits.size());

  // The arena: two passes over the same carving, the first to size it.
  rows_ = std::max(options_.batch_size * options_.seq_len, c.context);
  const size_t R = rows_, C = c.hidden, F = c.ffn, Vp = c.padded_vocab_size, NH = c.heads;
  char* base = nullptr;
  size_t used = 0;
  auto take = [&](size_t bytes) -> void* {
    void* out = base == nullptr ? nullptr : base + used;
    used += AlignUp(bytes);
    return out;
  };
  auto carve = [&]() {
    used = 0;
    act_.tokens = static_cast<int32_t*>(take(R * sizeof(int32_t)));
    act_.targets = static_cast<int32_t*>(take(R * sizeof(int32_t)));
    act_.encoded = take(R * C * elem_);
    act_.layers.resize(c.layers);
    // Activation checkpointing: what is recomputed is carved once and shared by all layers.
    const Recompute mode = options_.recompute;
    LayerActs shared{};
    // FP8 training without recompute: the LayerNorm outputs feed only their Linears' FP8
    // casts (the backward recomputes the FP8 transposes from LayerNorm's kept input and
    // statistics, as LayerNorm's backward reads them), so one pair serves every layer, and is
    // the backward's scratch for that recomputation. (kMlp's recompute reads ln2 again: kept
    // per layer there.)
    const bool shared_ln = options_.fp8.enabled && mode == Recompute::kNone;
    if (shared_ln) {
      shared.ln1 = take(R * C * elem_);
      shared.ln2 = take(R * C * elem_);
    }
    auto carve_inner = [&](LayerActs& la) {
      la.ln1 = shared_ln ? shared.ln1 : take(R * C * elem_);
      la.ln1_mean = static_cast<float*>(take(R * sizeof(float)));
      la.ln1_rstd = static_cast<float*>(take(R * sizeof(float)));
      la.qkv = take(R * 3 * C * elem_);
      la.atty = take(R * C * elem_);
      la.att_stats = static_cast<float*>(take(R * NH * sizeof(float)));
      la.residual2 = take(R * C * elem_);
      la.ln2 = shared_ln ? shared.ln2 : take(R * C * elem_);
      la.ln2_mean = static_cast<float*>(take(R * sizeof(float)));
      la.ln2_rstd = static_cast<float*>(take(R * sizeof(float)));
    };
    if (mode == Recompute::kFull) carve_inner(shared);
    if (mode == Recompute::kMlp || mode == Recompute::kFull) shared.fc_pre = take(R * F * elem_);
    // GELU's output (fc2's input): per layer in kNone without FP8; otherwise one buffer that
    // the backward recomputes from the layer's pre-activation (Backward()). In FP8 that buffer
    // doubles as the backward's FP8 output gradient and its transpose (model_fp8.cc), and dqkv
    // below as the FP8 input scratch: each is carved large enough for both uses.
    const bool fp8 = options_.fp8.enabled;
    const bool gelu_per_layer = !fp8 && mode == Recompute::kNone;
    const size_t N8 = static_cast<size_t>(options_.batch_size) * options_.seq_len;
    const size_t fp8_dout = AlignUp(N8 * std::max(3 * C, F));
    shared.fc_gelu =
        gelu_per_layer ? nullptr : take(std::max(R * F * elem_, fp8 ? 2 * fp8_dout : 0));
    fp8_dout_ = fp8 ? static_cast<uint8_t*>(shared.fc_gelu) : nullptr;
    fp8_dout_t_ = fp8_dout_ != nullptr ? fp8_dout_ + fp8_dout : nullptr;
    for (LayerActs& la : act_.layers) {
      if (mode == Recompute::kFull) {
        la = shared;
      } else {
        carve_inner(la);
      }
      const bool fc_pre_per_layer = mode == Recompute::kNone || mode == Recompute::kGelu;
      la.fc_pre = fc_pre_per_layer ? take(R * F * elem_) : shared.fc_pre;
      la.fc_gelu = gelu_per_layer ? take(R * F * elem_) : shared.fc_gelu;
      la.residual3 = take(R * C * elem_);
    }
    act_.lnf = take(R * C * elem_);
    act_.lnf_mean = static_cast<float*>(take(R * sizeof(float)));
    act_.lnf_rstd = static_cast<float*>(take(R * sizeof(float)));
    act_.logits = take(R * Vp * elem_);
    act_.losses = static_cast<float*>(take(R * sizeof(float)));
    act_.scratch = take(R * C * elem_);
    act_.dresidual = take(R * C * elem_);
    act_.dln = take(R * C * elem_);
    act_.datty = take(R * C * elem_);
    const size_t dqkv_bytes = std::max(R * 3 * C * elem_, fp8 ? N8 * std::max(C, F) : 0);
    act_.dqkv = take(dqkv_bytes);
    fp8_input_ = fp8 ? static_cast<uint8_t*>(act_.dqkv) : nullptr;
    fp8_input_bytes_ = fp8 ? dqkv_bytes : 0;
    act_.dfc = take(R * F * elem_);
    act_.norm_sq = static_cast<float*>(take(sizeof(float)));
    act_.frozen_ln_grad = take(2 * C * elem_);
  };
  carve();
  arena_bytes_ = used;
  if (s = alloc(arena_bytes_, &base); !s.ok()) return s;
  carve();
  return AllocateFp8();
}

size_t Model::total_bytes() const {
  const size_t n = layout_.num_params(), nt = num_trainable_;
  return n * elem_ + nt * elem_ + 2 * nt * state_elem_ + nt * master_elem_ + (nt + 7) / 8 +
         arena_bytes_ + fp8_bytes_;
}

absl::StatusOr<std::vector<float>> Model::GetParameters() {
  const size_t n = layout_.num_params();
  std::vector<float> out(n);
  backend_->CopyToHostF32(out.data(), params_, backend_->compute_dtype(), n);
  if (absl::Status s = backend_->Synchronize(); !s.ok()) return s;
  if (master_ != nullptr) {
    absl::StatusOr<std::vector<float>> master = ReadMasterF32();
    if (!master.ok()) return master.status();
    for (const TrainableRun& r : runs_) {
      std::copy_n(master->data() + r.grad_offset, r.numel, out.data() + r.param_offset);
    }
  }
  return out;
}

bool Model::split_master() const {
  return master_ != nullptr &&
         backend_->master_layout() == kernels::Backend::MasterLayout::kBf16LowHalves;
}

absl::StatusOr<std::vector<float>> Model::ReadMasterF32() const {
  const size_t nt = num_trainable_;
  std::vector<float> out(master_ != nullptr ? nt : 0);
  if (master_ == nullptr) return out;
  if (!split_master()) {
    backend_->CopyToHostF32(out.data(), master_, backend_->state_dtype(), nt);
    if (absl::Status s = backend_->Synchronize(); !s.ok()) return s;
    return out;
  }
  // The high halves are the trainable parameters' BF16 bits, in gradient order.
  std::vector<uint16_t> hi(nt), lo(nt);
  for (const TrainableRun& r : runs_) {
    backend_->CopyToHost(hi.data() + r.grad_offset, Advance(params_, r.param_offset * elem_),
                         r.numel * sizeof(uint16_t));
  }
  backend_->CopyToHost(lo.data(), master_, nt * sizeof(uint16_t));
  if (absl::Status s = backend_->Synchronize(); !s.ok()) return s;
  for (size_t i = 0; i < nt; ++i) out[i] = kernels::JoinMaster(hi[i], lo[i]);
  return out;
}

absl::Status Model::WriteMasterF32(absl::Span<const float> values) {
  const size_t nt = num_trainable_;
  if (master_ == nullptr) {
    return absl::FailedPreconditionError("master weights: this model keeps none");
  }
  if (values.size() != nt) {
    return absl::InvalidArgumentError(absl::StrCat("master weights: got ", values.size(),
                                                   " values for ", nt, " trainable parameters"));
  }
  if (!split_master()) {
    backend_->CopyFromHostF32(master_, backend_->state_dtype(), values.data(), nt);
    return backend_->Synchronize();
  }
  std::vector<uint16_t> hi(nt), lo(nt);
  for (size_t i = 0; i < nt; ++i) kernels::SplitMaster(values[i], &hi[i], &lo[i]);
  for (const TrainableRun& r : runs_) {
    backend_->CopyFromHost(Advance(params_, r.param_offset * elem_), hi.data() + r.grad_offset,
                           r.numel * sizeof(uint16_t));
  }
  backend_->CopyFromHost(master_, lo.data(), nt * sizeof(uint16_t));
  return backend_->Synchronize();
}

absl::Status Model::SetParameters(const std::vector<float>& values) {
  const size_t n = layout_.num_params();
  if (values.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameters: got ", values.size(), " values for ", n, " parameters"));
  }
  backend_->CopyFromHostF32(params_, backend_->compute_dtype(), values.data(), n);
  if (master_ != nullptr) {
    // The trainable parameters' master copies (with split masters, their working weights too).
    std::vector<float> master(num_trainable_);
    for (const TrainableRun& r : runs_) {
      std::copy_n(values.data() + r.param_offset, r.numel, master.data() + r.grad_offset);
    }
    return WriteMasterF32(master);
  }
  return backend_->Synchronize();
}

void* Model::P(TensorKind kind, int layer) const {
  return Advance(params_, layout_.Offset(kind, layer) * elem_);
}

std::optional<size_t> Model::GradOffset(size_t param_offset) const {
  for (const TrainableRun& r : runs_) {
    if (param_offset >= r.param_offset && param_offset < r.param_offset + r.numel) {
      return r.grad_offset + (param_offset - r.param_offset);
    }
  }
  return std::nullopt;
}

void* Model::G(TensorKind kind, int layer) const {
  const size_t offset = layout_.Offset(kind, layer);
  for (const TrainableRun& r : runs_) {
    if (offset >= r.param_offset && offset < r.param_offset + r.numel) {
      return Advance(grads_, (r.grad_offset + offset - r.param_offset) * elem_);
    }
  }
  return nullptr;  // frozen
}

void* Model::HeadGrad() const {
  return G(layout_.Has(TensorKind::kLmHead) ? TensorKind::kLmHead : TensorKind::kWte);
}

void* Model::HeadWeight(void* base) const {
  const TensorKind head = layout_.Has(TensorKind::kLmHead) ? TensorKind::kLmHead : TensorKind::kWte;
  return Advance(base, layout_.Offset(head) * elem_);
}

absl::Status Model::CheckTokens(absl::Span<const int32_t> ids, const char* what) const {
  const int V = options_.config.vocab_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= V) {
      return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "]: token ", ids[i],
                                                     " is outside the vocabulary [0, ", V, ")"));
    }
  }
  return absl::OkStatus();
}

void Model::ForwardImpl(int B, int T) {
  const ModelConfig& c = options_.config;
  const int N = B * T, C = c.hidden, F = c.ffn;
  kernels::Backend& be = *backend_;
  be.EncoderForward(act_.encoded, act_.tokens, P(TensorKind::kWte), P(TensorKind::kWpe), B, T, C);
  const void* residual = act_.encoded;
  // Each residual add runs fused with the LayerNorm after it (the next layer's ln_1, or ln_f
  // after the last layer); only layer 0's ln_1 stands alone.
  // (Create() requires at least one layer.)
  LayerActs& first = act_.layers[0];
  // ln_1 and ln_2 go through LayerNormBeforeLinear (FP8 training: they write their Linear's
  // FP8 input directly); ln_f stays in the compute dtype (the LM head is not FP8).
  LayerNormBeforeLinear(0, Fp8Linear::kQkv, nullptr, first.ln1, first.ln1_mean, first.ln1_rstd,
                        residual, nullptr, P(TensorKind::kLn1Weight, 0),
                        P(TensorKind::kLn1Bias, 0), N, C);
  for (int l = 0; l < c.layers; ++l) {
    LayerActs& la = act_.layers[l];
    Linear(l, Fp8Linear::kQkv, la.qkv, nullptr, la.ln1, P(TensorKind::kQkvWeight, l),
           P(TensorKind::kQkvBias, l), N, C, 3 * C, Epilogue::kNone);
    AttentionBeforeLinear(l, B, T);
    Linear(l, Fp8Linear::kAttnProj, act_.scratch, nullptr, la.atty,
           P(TensorKind::kAttnProjWeight, l), P(TensorKind::kAttnProjBias, l), N, C, C,
           Epilogue::kNone);
    LayerNormBeforeLinear(l, Fp8Linear::kFc1, la.residual2, la.ln2, la.ln2_mean, la.ln2_rstd,
                          residual, act_.scratch, P(TensorKind::kLn2Weight, l),
                          P(TensorKind::kLn2Bias, l), N, C);
    Linear(l, Fp8Linear::kFc1, la.fc_gelu, la.fc_pre, la.ln2, P(TensorKind::kFc1Weight, l),
           P(TensorKind::kFc1Bias, l), N, C, F, Epilogue::kGelu);
    Linear(l, Fp8Linear::kFc2, act_.scratch, nullptr, la.fc_gelu, P(TensorKind::kFc2Weight, l),
           P(TensorKind::kFc2Bias, l), N, F, C, Epilogue::kNone, /*gelu_pre=*/la.fc_pre);
    if (l + 1 < c.layers) {
      LayerActs& next = act_.layers[l + 1];
      LayerNormBeforeLinear(l + 1, Fp8Linear::kQkv, la.residual3, next.ln1, next.ln1_mean,
                            next.ln1_rstd, la.residual2, act_.scratch,
                            P(TensorKind::kLn1Weight, l + 1), P(TensorKind::kLn1Bias, l + 1), N,
                            C);
    } else {
      be.ResidualLayerNormForward(la.residual3, act_.lnf, act_.lnf_mean, act_.lnf_rstd,
                                  la.residual2, act_.scratch, P(TensorKind::kLnfWeight),
                                  P(TensorKind::kLnfBias), N, C);
    }
    residual = la.residual3;
  }
  be.MatmulForward(act_.logits, nullptr, act_.lnf, HeadWeight(params_), nullptr, N, C,
                   c.padded_vocab_size, Epilogue::kNone);
  last_B_ = B;
  last_T_ = T;
}

absl::StatusOr<double> Model::Forward(absl::Span<const int32_t> tokens,
                                      absl::Span<const int32_t> targets) {
  if (absl::Status s = UploadBatch(tokens, targets); !s.ok()) return s;
  EnqueueTrainingForward();
  absl::StatusOr<double> loss = ReadLoss();
  backward_ready_ = loss.ok();
  return loss;
}

absl::Status Model::ForwardLogits(absl::Span<const int32_t> tokens, int B, int T) {
  const ModelConfig& c = options_.config;
  if (B <= 0 || T <= 0 || T > c.context || static_cast<int64_t>(B) * T > rows_) {
    return absl::InvalidArgumentError(absl::StrCat("forward: shape B=", B, ", T=", T,
                                                   " does not fit (context ", c.context,
                                                   ", at most ", rows_, " rows)"));
  }
  const size_t N = static_cast<size_t>(B) * T;
  if (tokens.size() != N) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward: expected ", N, " tokens, got ", tokens.size()));
  }
  if (absl::Status s = CheckTokens(tokens, "tokens"); !s.ok()) return s;
  backward_ready_ = false;
  backend_->CopyFromHost(act_.tokens, tokens.data(), N * sizeof(int32_t));
  ForwardImpl(B, T);
  return backend_->Synchronize();
}

absl::Status Model::Backward() {
  if (!backward_ready_) {
    return absl::FailedPreconditionError(
        "backward: needs a training Forward() first (each Forward() allows one Backward())");
  }
  backward_ready_ = false;
  EnqueueBackward(/*first_of_step=*/TakePendingZeroGrad());
  return backend_->Synchronize();
}

void Model::BucketReady(int i) {
  if (on_bucket_ready_) on_bucket_ready_(i);
  if (!norm_in_this_backward_) return;
  const Bucket& g = bucket_grads_[static_cast<size_t>(i)];
  if (g.numel == 0) return;
  backend_->NormSquaredBeside(act_.norm_sq, Advance(grads_, g.offset * elem_), g.numel,
                              /*accumulate=*/norm_covered_ > 0);
  norm_covered_ += g.numel;
}

void Model::EnqueueBackward(bool first_of_step) {
  const ModelConfig& c = options_.config;
  const int B = last_B_, T = last_T_, N = B * T, C = c.hidden, F = c.ffn, NH = c.heads;
  kernels::Backend& be = *backend_;
  // The norm as the buckets become final: only where this backward's gradients are the
  // step's (one micro-batch) and no all-reduce changes them afterwards (one rank).
  grad_norm_ready_ = false;
  norm_in_this_backward_ = options_.grad_norm_in_backward && options_.grad_accum_steps == 1 &&
                           options_.gradient_ranks == 1 && !on_bucket_ready_ &&
                           num_trainable_ > 0;
  norm_covered_ = 0;
  // The weight-gradient GEMMs write with '=' (the gradients ZeroGrad deferred) until the end.
  overwrite_weight_grads_ = first_of_step && defers_zero_grad();
  be.SetWeightGradientOverwrite(overwrite_weight_grads_);
  // LayerNormBackward accumulates into the residual stream's gradient, so it starts at 0;
  // every other activation gradient is written with '='.
  be.Memset0(act_.dresidual, static_cast<size_t>(N) * C * elem_);
  be.MatmulBackward(act_.dln, HeadGrad(), nullptr, act_.logits, nullptr, act_.lnf,
                    HeadWeight(params_), N, C, c.padded_vocab_size);
  // A frozen LayerNorm's weight and bias gradients go to scratch and are dropped.
  void* const frozen_dw = act_.frozen_ln_grad;
  void* const frozen_db = Advance(act_.frozen_ln_grad, static_cast<size_t>(C) * elem_);
  auto ln_grad = [&](TensorKind weight, TensorKind bias, int l, void** dw, void** db) {
    *dw = G(weight, l);
    *db = G(bias, l);
    if (*dw == nullptr) *dw = frozen_dw;
    if (*db == nullptr) *db = frozen_db;
  };
  be.Memset0(act_.frozen_ln_grad, 2 * static_cast<size_t>(C) * elem_);
  void* dw = nullptr;
  void* db = nullptr;
  const void* last = c.layers > 0 ? act_.layers.back().residual3 : act_.encoded;
  be.LayerNormBackward(act_.dresidual, G(TensorKind::kLnfWeight), G(TensorKind::kLnfBias), act_.dln,
                       last, P(TensorKind::kLnfWeight), act_.lnf_mean, act_.lnf_rstd, N, C);
  BucketReady(c.layers + 1);
  const Recompute mode = options_.recompute;
  for (int l = c.layers - 1; l >= lowest_backward_layer_; --l) {
    LayerActs& la = act_.layers[l];
    const void* residual_in = l == 0 ? act_.encoded : act_.layers[l - 1].residual3;
    // The shared buffers still hold the last layer's activations from the forward.
    if ((mode == Recompute::kMlp || mode == Recompute::kFull) && l != c.layers - 1) {
      fp8_recompute_ = true;
      RecomputeLayer(l);
      fp8_recompute_ = false;
    }
    // fc2's input, GELU(fc_pre), is (except in kNone) one buffer shared by all layers that
    // still holds the last layer's from the forward: recompute it for the others. In every
    // recompute mode from the same (kept or bit-identically recomputed) fc_pre with the same
    // kernel, so those modes stay bit-identical (kMlp's GEMM epilogue output is overwritten).
    // In FP8 fc2's LinearBackward recomputes its FP8 input's transpose from fc_pre instead.
    if (l != c.layers - 1 && fp8_ == nullptr && mode != Recompute::kNone) {
      be.GeluForward(la.fc_gelu, la.fc_pre, static_cast<size_t>(N) * F);
    }
    // MLP block: dresidual (the gradient w.r.t. residual3) flows to fc2's output unchanged.
    if (fp8_ == nullptr) {
      // fc2's backward with the GELU's backward and fc1's bias gradient fused into it.
      be.MatmulBackwardGelu(act_.dfc, G(TensorKind::kFc1Bias, l), la.fc_pre,
                            G(TensorKind::kFc2Weight, l), G(TensorKind::kFc2Bias, l),
                            act_.dresidual, la.fc_gelu, P(TensorKind::kFc2Weight, l), N, F, C);
      be.MatmulBackward(act_.dln, G(TensorKind::kFc1Weight, l), nullptr, act_.dfc, nullptr, la.ln2,
                        P(TensorKind::kFc1Weight, l), N, C, F);
    } else {
      MlpBackwardFp8(l);
    }
    ln_grad(TensorKind::kLn2Weight, TensorKind::kLn2Bias, l, &dw, &db);
    be.LayerNormBackward(act_.dresidual, dw, db, act_.dln, la.residual2,
                         P(TensorKind::kLn2Weight, l), la.ln2_mean, la.ln2_rstd, N, C);
    // Attention block.
    LinearBackward(l, Fp8Linear::kAttnProj, act_.datty, G(TensorKind::kAttnProjWeight, l),
                   G(TensorKind::kAttnProjBias, l), act_.dresidual, nullptr, la.atty,
                   P(TensorKind::kAttnProjWeight, l), N, C, C);
    be.AttentionBackward(act_.dqkv, act_.datty, la.qkv, la.atty, la.att_stats, B, T, C, NH);
    LinearBackward(l, Fp8Linear::kQkv, act_.dln, G(TensorKind::kQkvWeight, l),
                   G(TensorKind::kQkvBias, l), act_.dqkv, nullptr, la.ln1,
                   P(TensorKind::kQkvWeight, l), N, C, 3 * C);
    ln_grad(TensorKind::kLn1Weight, TensorKind::kLn1Bias, l, &dw, &db);
    be.LayerNormBackward(act_.dresidual, dw, db, act_.dln, residual_in,
                         P(TensorKind::kLn1Weight, l), la.ln1_mean, la.ln1_rstd, N, C);
    BucketReady(l + 1);
  }
  be.SetWeightGradientOverwrite(false);
  overwrite_weight_grads_ = false;
  if (!options_.freeze_embeddings) {
    be.EncoderBackward(G(TensorKind::kWte), G(TensorKind::kWpe), act_.dresidual, act_.tokens, B, T,
                       C);
    BucketReady(0);
  }
  if (norm_in_this_backward_) {
    be.JoinNormSquared();
    // Every gradient covered (a bucket the backward did not reach has none): the norm is ready.
    grad_norm_ready_ = norm_covered_ == num_trainable_;
    norm_in_this_backward_ = false;
  }
}

void Model::RecomputeLayer(int l) {
  const ModelConfig& c = options_.config;
  const int B = last_B_, T = last_T_, N = B * T, C = c.hidden, F = c.ffn, NH = c.heads;
  kernels::Backend& be = *backend_;
  LayerActs& la = act_.layers[l];
  if (options_.recompute == Recompute::kFull) {
    const void* residual = l == 0 ? act_.encoded : act_.layers[l - 1].residual3;
    be.LayerNormForward(la.ln1, la.ln1_mean, la.ln1_rstd, residual, P(TensorKind::kLn1Weight, l),
                        P(TensorKind::kLn1Bias, l), N, C);
    Linear(l, Fp8Linear::kQkv, la.qkv, nullptr, la.ln1, P(TensorKind::kQkvWeight, l),
           P(TensorKind::kQkvBias, l), N, C, 3 * C, Epilogue::kNone);
    be.AttentionForward(la.atty, la.att_stats, la.qkv, B, T, C, NH);
    Linear(l, Fp8Linear::kAttnProj, act_.scratch, nullptr, la.atty,
           P(TensorKind::kAttnProjWeight, l), P(TensorKind::kAttnProjBias, l), N, C, C,
           Epilogue::kNone);
    be.ResidualLayerNormForward(la.residual2, la.ln2, la.ln2_mean, la.ln2_rstd, residual,
                                act_.scratch, P(TensorKind::kLn2Weight, l),
                                P(TensorKind::kLn2Bias, l), N, C);
  }
  Linear(l, Fp8Linear::kFc1, la.fc_gelu, la.fc_pre, la.ln2, P(TensorKind::kFc1Weight, l),
         P(TensorKind::kFc1Bias, l), N, C, F, Epilogue::kGelu);
}

void Model::SplitZeroGrad() {
  const ModelConfig& c = options_.config;
  const size_t total = num_trainable_ * elem_;
  deferred_zero_.clear();
  eager_zero_.clear();
  zero_grad_pending_ = false;
  if (!options_.overwrite_first_weight_gradients) {
    eager_zero_.push_back({0, total});
    return;
  }
  // The weight gradients of every backward's GEMMs: the head's (the LM head, or wte's when
  // tied: the head's GEMM runs before EncoderBackward adds to it) and the four Linears' of
  // every layer the backward reaches. Frozen tensors have no gradient (G is null).
  auto add = [&](void* g, size_t numel) {
    if (g == nullptr) return;
    const size_t at = static_cast<size_t>(static_cast<char*>(g) - static_cast<char*>(grads_));
    deferred_zero_.push_back({at, numel * elem_});
  };
  const size_t C = c.hidden, F = c.ffn;
  add(HeadGrad(), static_cast<size_t>(c.padded_vocab_size) * C);
  for (int l = lowest_backward_layer_; l < c.layers; ++l) {
    add(G(TensorKind::kQkvWeight, l), 3 * C * C);
    add(G(TensorKind::kAttnProjWeight, l), C * C);
    add(G(TensorKind::kFc1Weight, l), F * C);
    add(G(TensorKind::kFc2Weight, l), C * F);
  }
  std::sort(deferred_zero_.begin(), deferred_zero_.end(),
            [](const auto& a, const auto& b) { return a.offset < b.offset; });
  size_t at = 0;
  for (const kernels::Backend::ByteRange& r : deferred_zero_) {
    if (r.offset > at) eager_zero_.push_back({at, r.offset - at});
    at = r.offset + r.bytes;
  }
  if (at < total) eager_zero_.push_back({at, total - at});
}

void Model::ZeroGrad() {
  grad_norm_ready_ = false;
  backend_->Memset0Ranges(grads_, eager_zero_);
  zero_grad_pending_ = defers_zero_grad();
}

bool Model::TakePendingZeroGrad() {
  const bool pending = zero_grad_pending_;
  zero_grad_pending_ = false;
  return pending;
}

void Model::FlushPendingZeroGrad() {
  if (TakePendingZeroGrad()) {
    grad_norm_ready_ = false;
    backend_->Memset0Ranges(grads_, deferred_zero_);
  }
}

absl::StatusOr<float> Model::GradNorm() {
  FlushPendingZeroGrad();
  if (!grad_norm_ready_) {
    backend_->NormSquared(act_.norm_sq, grads_, num_trainable_);
    grad_norm_ready_ = true;  // an OptimizerStep() next (FP8's eager skip check) reuses it
  }
  float norm_sq = 0.0f;
  backend_->CopyToHost(&norm_sq, act_.norm_sq, sizeof(float));
  if (absl::Status s = backend_->Synchronize(); !s.ok()) return s;
  return std::sqrt(norm_sq);
}

absl::StatusOr<float> Model::OptimizerStep(float lr, int t) {
  FlushPendingZeroGrad();
  if (absl::Status s = SetOptimizerStep(lr, t); !s.ok()) return s;
  EnqueueOptimizerStep();
  return ReadGradNorm();
}

absl::StatusOr<std::vector<int32_t>> Model::Generate(absl::Span<const int32_t> prompt, int n) {
  if (prompt.empty()) return absl::InvalidArgumentError("generate: empty prompt");
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("generate: n = ", n, " < 0"));
  if (absl::Status s = CheckTokens(prompt, "prompt"); !s.ok()) return s;
  const ModelConfig& c = options_.config;
  std::vector<int32_t> seq(prompt.begin(), prompt.end());
  std::vector<int32_t> generated;
  generated.reserve(n);
  for (int i = 0; i < n; ++i) {
    const int window = static_cast<int>(std::min<size_t>(seq.size(), c.context));
    absl::Span<const int32_t> last(seq.data() + seq.size() - window, window);
    if (absl::Status s = ForwardLogits(last, 1, window); !s.ok()) return s;
    const void* row =
        Advance(act_.logits, static_cast<size_t>(window - 1) * c.padded_vocab_size * elem_);
    backend_->Argmax(act_.targets, row, 1, c.vocab_size, c.padded_vocab_size);
    int32_t next = 0;
    backend_->CopyToHost(&next, act_.targets, sizeof(int32_t));
    if (absl::Status s = backend_->Synchronize(); !s.ok()) return s;
    seq.push_back(next);
    generated.push_back(next);
  }
  return generated;
}

}  // namespace boulder::engine
