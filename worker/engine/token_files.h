// Pre-tokenized training data: llm.c `.bin` shards, memory-mapped.
//
// Shard format (llm.c): a header of 256 little-endian int32 — [0] magic 20240520, [1] version 1,
// [2] the token count n — then n uint16 tokens; the file is exactly 1024 + 2n bytes.
//
// Samples. Every shard is cut into windows of T+1 tokens starting at multiples of T (inputs
// are a window's first T tokens, targets its last T), in shard order (shards sorted by path).
// Window w belongs to rank w % world_size. Training reads this rank's windows in a fresh
// permutation per epoch, drawn from (seed, epoch); evaluation reads them in order, from the
// first, so every evaluation sees the same held-out tokens.
//
// Position. Batches are a pure function of the sample counter: sample i of this rank is
// window perm_{i / n}[i % n]. TokenDataPosition {epoch, sample_in_epoch} is the whole loader
// state (two integers): a checkpoint stores PositionAt(step) and a resumed run continues from
// the same counter (training step s reads samples ((s-1)*accum + micro)*B ...).
//
// Validation happens in Open(), before training starts: a missing glob match, a truncated or
// oversized file, a wrong magic or version, and a token >= vocab_size are INVALID_ARGUMENT
// errors naming the file and the byte offset.
//
// Thread-safety: Open() and the const accessors are safe to call concurrently; Get() caches
// the current epoch's permutation and must be called from one thread.
#ifndef BOULDER_WORKER_ENGINE_TOKEN_FILES_H_
#define BOULDER_WORKER_ENGINE_TOKEN_FILES_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "worker/engine/data.h"

namespace boulder::engine {

inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr size_t kTokenFileHeaderInts = 256;
inline constexpr size_t kTokenFileHeaderBytes = kTokenFileHeaderInts * sizeof(int32_t);

// A read-only memory-mapped file. Movable, not copyable; unmaps on destruction.
class MappedFile {
 public:
  // NOT_FOUND / PERMISSION_DENIED / INTERNAL naming the path when it cannot be opened/mapped.
  static absl::StatusOr<MappedFile> Open(const std::string& path);
  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// The paths a glob matches, sorted. INVALID_ARGUMENT naming `what` (the spec field) when it
// matches nothing.
absl::StatusOr<std::vector<std::string>> ExpandGlob(const std::string& pattern,
                                                    absl::string_view what);

// Writes one shard. INTERNAL naming the path on I/O errors; INVALID_ARGUMENT for a token
// outside [0, 65535].
absl::Status WriteTokenFile(const std::string& path, absl::Span<const int32_t> tokens);

struct TokenDataPosition {
  uint64_t epoch = 0;
  uint64_t sample_in_epoch = 0;
};

struct TokenDataOptions {
  std::string glob;    // shards
  std::string field;   // spec field named in errors, e.g. "data.token_files"
  int vocab_size = 0;  // every token must be below this
  int seq_len = 1;     // T
  int rank = 0;        // this process's rank, in [0, world_size)
  int world_size = 1;
  uint64_t seed = 0;    // shuffles the windows per epoch
  bool shuffle = true;  // false: read windows in order (evaluation)
};

class TokenData {
 public:
  // Maps and validates every shard (see the header comment for the errors); INVALID_ARGUMENT
  // also when this rank gets no window of T+1 tokens.
  static absl::StatusOr<std::unique_ptr<TokenData>> Open(const TokenDataOptions& options);

  // Batch of B rows starting at this rank's sample `first_sample` (rows take consecutive
  // samples). strides are left empty.
  Batch GetSamples(uint64_t first_sample, int B);
  // Training micro-batch `micro` of 1-based step `step` (grad_accum micro-batches a step).
  Batch Get(int64_t step, int micro, int B, int grad_accum);
  // The position before step `step` (1-based) is read.
  TokenDataPosition PositionAt(int64_t step, int B, int grad_accum) const;

  // The first `len` tokens of this rank's first window (a generation prompt).
  std::vector<int32_t> Prompt(int len) const;

  uint64_t num_windows() const { return num_windows_; }  // this rank's
  uint64_t num_tokens() const { return num_tokens_; }    // all shards
  size_t num_files() const { return files_.size(); }

 private:
  explicit TokenData(const TokenDataOptions& options) : options_(options) {}
  // The first token of this rank's k-th window.
  const uint16_t* Window(uint64_t k) const;
  const std::vector<uint64_t>& Permutation(uint64_t epoch);

  TokenDataOptions options_;
  std::vector<MappedFile> files_;
  std::vector<uint64_t> window_end_;  // per file: windows in it and the files before (all ranks)
  uint64_t num_windows_ = 0;
  uint64_t num_tokens_ = 0;
  uint64_t perm_epoch_ = UINT64_MAX;
  std::vector<uint64_t> perm_;
};

}  // namespace boulder::engine

#endif  // BOULDER_WORKER_ENGINE_TOKEN_FILES_H_
