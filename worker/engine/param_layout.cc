#include "worker/engine/param_layout.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/engine/rng.h"

namespace boulder::engine {

int PaddedVocabSize(int vocab_size) {
  const int multiple = vocab_size <= 1024 ? 32 : 128;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

absl::StatusOr<ModelConfig> ModelConfigFromSpec(const v1::ModelSpec& spec) {
  struct Field {
    const char* name;
    bool has;
    int value;
  };
  const Field fields[] = {
      {"vocab_size", spec.has_vocab_size(), spec.vocab_size()},
      {"hidden", spec.has_hidden(), spec.hidden()},
      {"heads", spec.has_heads(), spec.heads()},
      {"layers", spec.has_layers(), spec.layers()},
      {"ffn", spec.has_ffn(), spec.ffn()},
      {"context", spec.has_context(), spec.context()},
  };
  for (const Field& f : fields) {
    if (!f.has) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.", f.name, ": not set (the trainer needs a resolved spec)"));
    }
    if (f.value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.", f.name, ": must be positive, got ", f.value));
    }
  }
  if (spec.hidden() % spec.heads() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.heads: ", spec.heads(), " does not divide hidden ", spec.hidden()));
  }
  ModelConfig c;
  c.vocab_size = spec.vocab_size();
  c.padded_vocab_size = PaddedVocabSize(c.vocab_size);
  c.hidden = spec.hidden();
  c.heads = spec.heads();
  c.layers = spec.layers();
  c.ffn = spec.ffn();
  c.context = spec.context();
  c.tie_embeddings = spec.tie_embeddings();
  return c;
}

ParamLayout::ParamLayout(const ModelConfig& config) : config_(config) {
  const int64_t C = config.hidden, F = config.ffn, Vp = config.padded_vocab_size;
  Add("wte.weight", TensorKind::kWte, -1, {Vp, C});
  Add("wpe.weight", TensorKind::kWpe, -1, {config.context, C});
  for (int l = 0; l < config.layers; ++l) {
    const std::string h = absl::StrCat("h.", l, ".");
    Add(h + "ln_1.weight", TensorKind::kLn1Weight, l, {C});
    Add(h + "ln_1.bias", TensorKind::kLn1Bias, l, {C});
    Add(h + "attn.c_attn.weight", TensorKind::kQkvWeight, l, {3 * C, C});
    Add(h + "attn.c_attn.bias", TensorKind::kQkvBias, l, {3 * C});
    Add(h + "attn.c_proj.weight", TensorKind::kAttnProjWeight, l, {C, C});
    Add(h + "attn.c_proj.bias", TensorKind::kAttnProjBias, l, {C});
    Add(h + "ln_2.weight", TensorKind::kLn2Weight, l, {C});
    Add(h + "ln_2.bias", TensorKind::kLn2Bias, l, {C});
    Add(h + "mlp.c_fc.weight", TensorKind::kFc1Weight, l, {F, C});
    Add(h + "mlp.c_fc.bias", TensorKind::kFc1Bias, l, {F});
    Add(h + "mlp.c_proj.weight", TensorKind::kFc2Weight, l, {C, F});
    Add(h + "mlp.c_proj.bias", TensorKind::kFc2Bias, l, {C});
  }
  Add("ln_f.weight", TensorKind::kLnfWeight, -1, {C});
  Add("ln_f.bias", TensorKind::kLnfBias, -1, {C});
  if (!config.tie_embeddings) Add("lm_head.weight", TensorKind::kLmHead, -1, {Vp, C});
}

void ParamLayout::Add(std::string name, TensorKind kind, int layer, std::vector<int64_t> shape) {
  TensorInfo t;
  t.name = std::move(name);
  t.kind = kind;
  t.layer = layer;
  t.offset = num_params_;
  t.numel = 1;
  for (int64_t d : shape) t.numel *= static_cast<size_t>(d);
  t.decays = shape.size() == 2;
  t.shape = std::move(shape);
  num_params_ += t.numel;
  tensors_.push_back(std::move(t));
}

namespace {
// Programmer invariants only (this abseil has no CHECK).
void Invariant(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "ParamLayout invariant violated: %s\n", what.c_str());
  std::abort();
}

// Tensors per transformer layer, and how many model-level tensors precede layer 0.
constexpr int kPerLayer = 12;
constexpr int kBeforeLayers = 2;

bool IsLayerTensor(TensorKind kind) {
  return kind >= TensorKind::kLn1Weight && kind <= TensorKind::kFc2Bias;
}
}  // namespace

bool ParamLayout::Has(TensorKind kind) const {
  return kind != TensorKind::kLmHead || !config_.tie_embeddings;
}

size_t ParamLayout::Offset(TensorKind kind, int layer) const {
  Invariant(Has(kind), "no lm_head tensor in a tied model");
  size_t index;
  if (IsLayerTensor(kind)) {
    Invariant(layer >= 0 && layer < config_.layers, absl::StrCat("layer ", layer));
    index = kBeforeLayers + layer * kPerLayer +
            (static_cast<int>(kind) - static_cast<int>(TensorKind::kLn1Weight));
  } else if (kind == TensorKind::kWte || kind == TensorKind::kWpe) {
    index = static_cast<int>(kind) - static_cast<int>(TensorKind::kWte);
  } else {
    index = kBeforeLayers + config_.layers * kPerLayer +
            (static_cast<int>(kind) - static_cast<int>(TensorKind::kLnfWeight));
  }
  const TensorInfo& t = tensors_[index];
  Invariant(t.kind == kind && t.layer == (IsLayerTensor(kind) ? layer : -1), t.name);
  return t.offset;
}

std::vector<Bucket> ParamLayout::Buckets() const {
  std::vector<Bucket> buckets;
  int current = -2;  // bucket key of the previous tensor
  for (const TensorInfo& t : tensors_) {
    const int key = t.layer >= 0                                                 ? t.layer
                    : (t.kind == TensorKind::kWte || t.kind == TensorKind::kWpe) ? -1
                                                                                 : config_.layers;
    if (key != current) {
      buckets.push_back({t.offset, 0});
      current = key;
    }
    buckets.back().numel += t.numel;
  }
  return buckets;
}

std::vector<uint8_t> ParamLayout::DecayMask() const {
  std::vector<uint8_t> mask(num_params_, 0);
  for (const TensorInfo& t : tensors_) {
    if (t.decays) std::fill(mask.begin() + t.offset, mask.begin() + t.offset + t.numel, 1);
  }
  return mask;
}

std::vector<float> ParamLayout::InitialValues(uint64_t seed) const {
  std::vector<float> values(num_params_, 0.0f);
  Rng rng(seed);
  const double residual_scale = 1.0 / std::sqrt(2.0 * config_.layers);
  const size_t C = config_.hidden;
  for (const TensorInfo& t : tensors_) {
    float* p = values.data() + t.offset;
    switch (t.kind) {
      case TensorKind::kLn1Weight:
      case TensorKind::kLn2Weight:
      case TensorKind::kLnfWeight:
        std::fill(p, p + t.numel, 1.0f);
        break;
      case TensorKind::kWte:
      case TensorKind::kLmHead: {
        // Padding rows stay 0: no token maps to them and their logits are ignored.
        const size_t real = static_cast<size_t>(config_.vocab_size) * C;
        for (size_t i = 0; i < real; ++i) p[i] = static_cast<float>(0.02 * rng.Gaussian());
        break;
      }
      case TensorKind::kAttnProjWeight:
      case TensorKind::kFc2Weight:
        for (size_t i = 0; i < t.numel; ++i) {
          p[i] = static_cast<float>(0.02 * residual_scale * rng.Gaussian());
        }
        break;
      case TensorKind::kWpe:
      case TensorKind::kQkvWeight:
      case TensorKind::kFc1Weight:
        for (size_t i = 0; i < t.numel; ++i) p[i] = static_cast<float>(0.02 * rng.Gaussian());
        break;
      default:  // biases
        break;
    }
  }
  return values;
}

}  // namespace boulder::engine
