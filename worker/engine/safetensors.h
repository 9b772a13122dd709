// safetensors files (Hugging Face's format: an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the
// tensors' bytes) and the GPT-2 naming that maps them onto a ParamLayout.
//
// GPT-2 names and layouts (as GPT2LMHeadModel writes them, optionally prefixed "transformer."):
//   wte.weight [V, C], wpe.weight [context, C], h.N.ln_1.{weight,bias} [C],
//   h.N.attn.c_attn.{weight [C, 3C], bias [3C]}, h.N.attn.c_proj.{weight [C, C], bias [C]},
//   h.N.ln_2.{weight,bias}, h.N.mlp.c_fc.{weight [C, F], bias [F]},
//   h.N.mlp.c_proj.{weight [F, C], bias [C]}, ln_f.{weight,bias}, lm_head.weight [V, C].
// The h.N.* matrices are Conv1D weights, [in, out]: Boulder stores Linear weights [out, in],
// so they are transposed both ways. Boulder pads the vocabulary (wte, lm_head have Vp >= V
// rows); files hold the V real rows and the padding rows load as 0.
//
// Thread-safety: plain functions over values.
#ifndef BOULDER_WORKER_ENGINE_SAFETENSORS_H_
#define BOULDER_WORKER_ENGINE_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/param_layout.h"

namespace boulder::engine {

// Largest header accepted (the format's reference implementation uses the same limit).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafeTensor {
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

struct SafetensorsContents {
  std::map<std::string, SafeTensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Reads a whole file. INVALID_ARGUMENT naming the path (and the tensor) for a malformed file:
// a short file, a header over the limit or not JSON, data offsets outside the data section,
// overlapping, or disagreeing with dtype x shape. NOT_FOUND when it does not exist.
absl::StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path);

// A tensor's values as FP32 (F32 and BF16 are supported). INVALID_ARGUMENT names the dtype.
absl::StatusOr<std::vector<float>> ToFloat32(const SafeTensor& tensor, const std::string& name);

// Writes F32 tensors (sorted by name, as the format's writers do). INTERNAL naming the path on
// I/O errors.
absl::Status WriteSafetensors(const std::string& path, const SafetensorsContents& contents);

// The flat FP32 parameters (layout order, num_params() long) from a GPT-2 safetensors file.
// INVALID_ARGUMENT naming the file and the tensor: a missing or unexpected tensor, a shape
// that disagrees with the model (the expected GPT-2 shape is named), an unsupported dtype. The
// causal-mask buffers h.N.attn.bias / h.N.attn.masked_bias that older files carry are ignored.
// A tied model accepts a file with lm_head.weight only if it equals wte.weight.
absl::StatusOr<std::vector<float>> LoadGpt2Safetensors(const std::string& path,
                                                       const ParamLayout& layout);

// Writes the flat FP32 parameters in GPT-2 names (prefixed "transformer.", as
// GPT2LMHeadModel.save_pretrained does; lm_head.weight only for an untied model).
// REQUIRES: params.size() == layout.num_params().
absl::Status WriteGpt2Safetensors(const std::string& path, const ParamLayout& layout,
                                  const std::vector<float>& params);

}  // namespace boulder::engine

#endif  // BOULDER_WORKER_ENGINE_SAFETENSORS_H_
