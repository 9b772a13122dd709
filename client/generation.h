// Rendering and checking of a job's generated tokens. The seed task's sequences are
// (phase + stride * i) % vocab, so a model that learned the task continues its prompt with the
// prompt's constant stride, modulo the vocabulary size.
//
// Pure functions; thread-safe.
#ifndef BOULDER_CLIENT_GENERATION_H_
#define BOULDER_CLIENT_GENERATION_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "boulder/v1/job.pb.h"

namespace boulder::client {

// The stride s in [0, vocab) with tokens[i+1] == (tokens[i] + s) mod vocab for all i, if
// there is one; nullopt for fewer than two tokens or no constant stride. With vocab <= 0
// (unknown) the plain differences are compared instead.
std::optional<int64_t> ConstantStride(const std::vector<int64_t>& tokens, int64_t vocab);

struct GenerationCheck {
  // The prompt's own stride; nullopt when the prompt has none (or is shorter than 2 tokens).
  std::optional<int64_t> prompt_stride;
  // Whether prompt followed by the generated tokens keeps that one stride.
  bool continues = false;
};
GenerationCheck CheckGeneration(const v1::GenerationResult& generation, int64_t vocab);

// Space-separated tokens; when there are more than `max_tokens`, the first `max_tokens` and
// " ...". max_tokens == 0 means all.
std::string JoinTokens(const google::protobuf::RepeatedField<int32_t>& tokens, size_t max_tokens);

// One line for `boulder watch`:
//   prompt: 5 9 13 17 ...  generated: 37 41 45 ... (constant stride 4)
// or "... (no constant stride; the prompt's stride is 4)" / "(no constant stride)".
std::string GenerationLine(const v1::GenerationResult& generation, int64_t vocab,
                           size_t max_tokens);

// The verdict line of `boulder get`: "constant stride 4: yes", "constant stride 4: no" (the
// generation broke the prompt's stride 4) or "constant stride: no" (the prompt has none).
std::string StrideVerdict(const v1::GenerationResult& generation, int64_t vocab);

}  // namespace boulder::client

#endif  // BOULDER_CLIENT_GENERATION_H_
