#include "worker/engine/data.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/engine/rng.h"

namespace boulder::engine {

ArithmeticData::ArithmeticData(int vocab_size, int max_stride, uint64_t seed)
    : vocab_size_(vocab_size), max_stride_(max_stride), seed_(seed) {}

absl::StatusOr<ArithmeticData> ArithmeticData::FromSpec(const v1::JobSpec& spec) {
  const std::string& source = spec.data().source();
  if (source != "arithmetic") {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.source: '", source, "' is not supported (this build knows 'arithmetic')"));
  }
  const int V = spec.model().vocab_size();
  const int S = spec.data().max_stride();
  if (S < 1 || S >= V) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.max_stride: ", S, " is not in [1, vocab_size ", V, ")"));
  }
  return ArithmeticData(V, S, spec.training().seed());
}

namespace {
// Fills `len` tokens of one sequence and returns its stride.
int32_t FillSequence(Rng* rng, int V, int max_stride, int32_t* out, int len) {
  const int64_t stride = 1 + static_cast<int64_t>(rng->Below(max_stride));
  const int64_t phase = static_cast<int64_t>(rng->Below(V));
  for (int i = 0; i < len; ++i) out[i] = static_cast<int32_t>((phase + stride * i) % V);
  return static_cast<int32_t>(stride);
}
}  // namespace

Batch ArithmeticData::Get(int rank, int64_t step, int micro, int B, int T) const {
  return GetRows(step, micro, static_cast<int64_t>(rank) * B, B, T);
}

Batch ArithmeticData::GetRows(int64_t step, int micro, int64_t first_row, int B, int T) const {
  Batch batch;
  batch.inputs.resize(static_cast<size_t>(B) * T);
  batch.targets.resize(static_cast<size_t>(B) * T);
  batch.strides.resize(B);
  std::vector<int32_t> seq(T + 1);
  for (int b = 0; b < B; ++b) {
    Rng rng(HashWords({seed_, static_cast<uint64_t>(step), static_cast<uint64_t>(micro),
                       static_cast<uint64_t>(first_row + b)}));
    batch.strides[b] = FillSequence(&rng, vocab_size_, max_stride_, seq.data(), T + 1);
    for (int t = 0; t < T; ++t) {
      batch.inputs[static_cast<size_t>(b) * T + t] = seq[t];
      batch.targets[static_cast<size_t>(b) * T + t] = seq[t + 1];
    }
  }
  return batch;
}

std::vector<int32_t> ArithmeticData::Prompt(int len, int32_t* stride) const {
  Rng rng(HashWords({seed_ ^ kPromptStream}));
  std::vector<int32_t> out(len > 0 ? len : 0);
  const int32_t s =
      FillSequence(&rng, vocab_size_, max_stride_, out.data(), static_cast<int>(out.size()));
  if (stride != nullptr) *stride = s;
  return out;
}

bool HasConstantStride(const std::vector<int32_t>& tokens, int vocab_size, int32_t* stride) {
  int32_t first = 0;
  for (size_t i = 1; i < tokens.size(); ++i) {
    const int32_t d = ((tokens[i] - tokens[i - 1]) % vocab_size + vocab_size) % vocab_size;
    if (i == 1) {
      first = d;
    } else if (d != first) {
      return false;
    }
  }
  if (stride != nullptr) *stride = first;
  return true;
}

}  // namespace boulder::engine
