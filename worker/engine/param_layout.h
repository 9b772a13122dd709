// The GPT model's shape and where each parameter tensor lives in the one flat parameter buffer.
//
// Parameters, their gradients and the AdamW moments are each one contiguous buffer (as llm.c
// does) with this layout, so the optimizer, the gradient norm and checkpoints are single passes
// and a data-parallel all-reduce can run per-layer buckets. Order (GPT-2 names):
//   wte.weight [Vp,C], wpe.weight [maxT,C]                              (bucket 0)
//   per layer l: h.l.ln_1.{weight,bias} [C], h.l.attn.c_attn.{weight [3C,C], bias [3C]},
//                h.l.attn.c_proj.{weight [C,C], bias [C]}, h.l.ln_2.{weight,bias} [C],
//                h.l.mlp.c_fc.{weight [F,C], bias [F]}, h.l.mlp.c_proj.{weight [C,F], bias [C]}
//                                                                       (bucket l + 1)
//   ln_f.{weight,bias} [C], lm_head.weight [Vp,C] (absent when tied)    (bucket L + 1)
// Tensors are packed back to back (no gaps). Only 2-D matrices get weight decay.
//
// Pure host code; thread-safe (values only).
#ifndef BOULDER_WORKER_ENGINE_PARAM_LAYOUT_H_
#define BOULDER_WORKER_ENGINE_PARAM_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "boulder/v1/spec.pb.h"

namespace boulder::engine {

struct ModelConfig {
  int vocab_size = 0;         // V: real tokens
  int padded_vocab_size = 0;  // Vp: V rounded up (see PaddedVocabSize)
  int hidden = 0;             // C
  int heads = 0;              // NH; divides C
  int layers = 0;             // L
  int ffn = 0;                // F
  int context = 0;            // maxT: longest sequence the position embedding covers
  bool tie_embeddings = false;
};

// V rounded up to a multiple of 32 when V <= 1024, else of 128 (GPT-2's 50257 -> 50304), so
// the LM-head GEMM has friendly shapes.
int PaddedVocabSize(int vocab_size);

// The config of a resolved spec's model section. INVALID_ARGUMENT (with the field path) when a
// field is missing or impossible: common/ validates specs, this guards callers that skip it.
absl::StatusOr<ModelConfig> ModelConfigFromSpec(const v1::ModelSpec& spec);

// Which tensor of a layer (or of the model) a TensorInfo is; drives init and the forward.
enum class TensorKind {
  kWte,
  kWpe,
  kLn1Weight,
  kLn1Bias,
  kQkvWeight,
  kQkvBias,
  kAttnProjWeight,
  kAttnProjBias,
  kLn2Weight,
  kLn2Bias,
  kFc1Weight,
  kFc1Bias,
  kFc2Weight,
  kFc2Bias,
  kLnfWeight,
  kLnfBias,
  kLmHead,
};

struct TensorInfo {
  std::string name;  // e.g. "h.0.attn.c_attn.weight"
  TensorKind kind;
  int layer = -1;              // 0..L-1 for per-layer tensors, -1 otherwise
  size_t offset = 0;           // in elements, into the flat buffers
  std::vector<int64_t> shape;  // row-major
  size_t numel = 0;
  bool decays = false;  // weight decay applies (2-D matrices only)
};

// A contiguous element range of the flat buffers.
struct Bucket {
  size_t offset = 0;
  size_t numel = 0;
};

class ParamLayout {
 public:
  // REQUIRES: config is valid (ModelConfigFromSpec or equivalent checks).
  explicit ParamLayout(const ModelConfig& config);

  const ModelConfig& config() const { return config_; }
  size_t num_params() const { return num_params_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  // Offset of one tensor. REQUIRES: the tensor exists (aborts otherwise, e.g. for kLmHead on
  // a tied model); `layer` is ignored for model-level tensors.
  size_t Offset(TensorKind kind, int layer = -1) const;
  bool Has(TensorKind kind) const;

  // Per-layer buckets in layout order: embeddings, layer 0, ..., layer L-1, final LN + head.
  // They tile [0, num_params) exactly.
  std::vector<Bucket> Buckets() const;

  // One byte per parameter: 1 where weight decay applies.
  std::vector<uint8_t> DecayMask() const;

  // Deterministic initial values (FP32, host) from `seed`: matrices N(0, 0.02) with the
  // residual projections (attn.c_proj, mlp.c_proj) scaled by 1/sqrt(2L); biases 0; LayerNorm
  // weight 1, bias 0; the padding rows (V..Vp-1) of wte and lm_head 0.
  std::vector<float> InitialValues(uint64_t seed) const;

 private:
  void Add(std::string name, TensorKind kind, int layer, std::vector<int64_t> shape);

  ModelConfig config_;
  std::vector<TensorInfo> tensors_;
  size_t num_params_ = 0;
};

}  // namespace boulder::engine

#endif  // BOULDER_WORKER_ENGINE_PARAM_LAYOUT_H_
