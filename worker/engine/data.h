// Synthetic training data: "arithmetic" sequences x_i = (phase + stride * i) mod V.
//
// Each sequence draws stride uniformly from [1, max_stride] and phase from [0, V); a batch row
// holds x_0..x_{T-1} as inputs and x_1..x_T as targets. Only the first target is uncertain
// (which stride?); from the second on, the stride is determined by the two previous tokens,
// so a model that has learned the task reaches a mean loss of ln(max_stride) / T.
//
// Every row of a global batch is a pure function of (seed, step, micro-batch, global row), so
// a re-run or a job resumed at step s sees exactly the data of the original run, and data
// parallelism does not change the data: rank r of N with micro-batch B takes global rows
// [r*B, (r+1)*B), so N workers of batch B see exactly the sequences 1 worker of batch N*B sees;
// generation prompts come from a separate stream (seed ^ kPromptStream) that training never draws
// from.
//
// Thread-safety: const methods on a value; safe to call concurrently.
#ifndef BOULDER_WORKER_ENGINE_DATA_H_
#define BOULDER_WORKER_ENGINE_DATA_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "boulder/v1/spec.pb.h"

namespace boulder::engine {

struct Batch {
  std::vector<int32_t> inputs;   // [B*T], row-major
  std::vector<int32_t> targets;  // [B*T]: inputs shifted by one
  std::vector<int32_t> strides;  // [B]: each row's stride (for tests and diagnostics)
};

class ArithmeticData {
 public:
  // Mixed into the seed for the generation-prompt stream.
  static constexpr uint64_t kPromptStream = 0x70726F6D70747321ull;  // "prompts!"

  // REQUIRES: vocab_size >= 2, 1 <= max_stride.
  ArithmeticData(int vocab_size, int max_stride, uint64_t seed);

  // The data section of a resolved spec. INVALID_ARGUMENT (with the field path) for a source
  // other than "arithmetic" or a max_stride outside [1, vocab).
  static absl::StatusOr<ArithmeticData> FromSpec(const v1::JobSpec& spec);

  // The micro-batch `micro` of optimizer step `step` (1-based) on `rank`: B rows of T tokens,
  // the global rows [rank*B, (rank+1)*B).
  Batch Get(int rank, int64_t step, int micro, int B, int T) const;

  // Global rows [first_row, first_row + B) of micro-batch `micro` of step `step`.
  Batch GetRows(int64_t step, int micro, int64_t first_row, int B, int T) const;

  // A held-out sequence of `len` tokens used as the generation prompt; also returns its stride
  // through `stride` when non-null.
  std::vector<int32_t> Prompt(int len, int32_t* stride = nullptr) const;

  int vocab_size() const { return vocab_size_; }
  int max_stride() const { return max_stride_; }

 private:
  int vocab_size_;
  int max_stride_;
  uint64_t seed_;
};

// True when every consecutive difference (mod V) of `tokens` is the same; sets *stride to it
// (in [0, V)) when non-null. Sequences shorter than two tokens are trivially constant (0).
bool HasConstantStride(const std::vector<int32_t>& tokens, int vocab_size,
                       int32_t* stride = nullptr);

}  // namespace boulder::engine

#endif  // BOULDER_WORKER_ENGINE_DATA_H_
