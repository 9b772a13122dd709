#include "client/generation.h"

#include "absl/strings/str_cat.h"

namespace boulder::client {
namespace {

int64_t Mod(int64_t value, int64_t vocab) {
  if (vocab <= 0) return value;
  int64_t m = value % vocab;
  return m < 0 ? m + vocab : m;
}

}  // namespace

std::optional<int64_t> ConstantStride(const std::vector<int64_t>& tokens, int64_t vocab) {
  if (tokens.size() < 2) return std::nullopt;
  const int64_t stride = Mod(tokens[1] - tokens[0], vocab);
  for (size_t i = 2; i < tokens.size(); ++i) {
    if (Mod(tokens[i] - tokens[i - 1], vocab) != stride) return std::nullopt;
  }
  return stride;
}

GenerationCheck CheckGeneration(const v1::GenerationResult& generation, int64_t vocab) {
  std::vector<int64_t> all(generation.prompt().begin(), generation.prompt().end());
  GenerationCheck check;
  check.prompt_stride = ConstantStride(all, vocab);
  all.insert(all.end(), generation.tokens().begin(), generation.tokens().end());
  std::optional<int64_t> whole = ConstantStride(all, vocab);
  check.continues = check.prompt_stride.has_value() && whole == check.prompt_stride;
  return check;
}

std::string JoinTokens(const google::protobuf::RepeatedField<int32_t>& tokens, size_t max_tokens) {
  std::string out;
  size_t shown = max_tokens == 0 ? tokens.size() : std::min<size_t>(max_tokens, tokens.size());
  for (size_t i = 0; i < shown; ++i) {
    if (i > 0) out += " ";
    absl::StrAppend(&out, tokens[static_cast<int>(i)]);
  }
  if (shown < static_cast<size_t>(tokens.size())) out += " ...";
  return out;
}

std::string GenerationLine(const v1::GenerationResult& generation, int64_t vocab,
                           size_t max_tokens) {
  GenerationCheck check = CheckGeneration(generation, vocab);
  std::string verdict;
  if (check.continues) {
    verdict = absl::StrCat("(constant stride ", *check.prompt_stride, ")");
  } else if (check.prompt_stride.has_value()) {
    verdict =
        absl::StrCat("(no constant stride; the prompt's stride is ", *check.prompt_stride, ")");
  } else {
    verdict = "(no constant stride)";
  }
  return absl::StrCat("prompt: ", JoinTokens(generation.prompt(), max_tokens),
                      "  generated: ", JoinTokens(generation.tokens(), max_tokens), " ", verdict);
}

std::string StrideVerdict(const v1::GenerationResult& generation, int64_t vocab) {
  GenerationCheck check = CheckGeneration(generation, vocab);
  if (!check.prompt_stride.has_value()) return "constant stride: no";
  return absl::StrCat("constant stride ", *check.prompt_stride, ": ",
                      check.continues ? "yes" : "no");
}

}  // namespace boulder::client
