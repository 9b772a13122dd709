// Checkpoint files: a sectioned, checksummed container written atomically, and the directory
// of a job's checkpoints (ckpt-<step>.bin, newest kept, older pruned).
//
// File layout (all integers little-endian):
//   "BLDRCKPT"            8 bytes magic
//   u32 version           kCheckpointVersion
//   u32 section count     N (at most kMaxCheckpointSections)
//   i64 step              the optimizer steps completed when it was written
//   N x { char name[32] (NUL-padded, at least one NUL), u64 offset, u64 size, u32 crc32c,
//         u32 reserved (0) }
//   u32 crc32c            of every header byte before it
//   section bytes         each at its offset, in table order, contiguous to the end of file
// A file is valid when the magic, version, header checksum and every section's checksum match
// and the sections end exactly at the end of the file; anything else (truncation, a flipped
// bit, a stray temp file renamed by hand) is DATA_LOSS.
//
// Sections the trainer writes (worker/engine/trainer_checkpoint.cc):
//   "meta"      text key=value lines: step, tokens, model shape, dtypes (checked on resume)
//   "params"    parameters, compute dtype, ParamLayout order
//   "master"    FP32 master weights (only when the compute dtype is narrower than FP32)
//   "adam_m", "adam_v"  AdamW moments, FP32
//   "data"      data-loader position (arithmetic data: the next step; batches are a pure
//               function of (seed, rank, step, micro-batch))
//   "rng"       the engine's counter-based RNG streams (seeds; no hidden state to carry)
//   "fp8_scaling"  precision fp8 only: every FP8 tensor's scale, scale_inv and amax history
//               (Fp8State::SaveScaling); the skip counters are in "meta"
// Sections reserved for other features, so readers can grow without a format change:
//   "token_data"   a token-file loader's position: file, offset, shuffle epoch (issue 10)
// Readers ignore sections they do not know; a writer adds a section by name.
//
// Durability: WriteCheckpointFile writes a temporary file in the same directory, fsyncs it,
// renames it over the final name and fsyncs the directory, so a crash leaves either the old
// set of files or the new one, never a partial file under a checkpoint name.
//
// Thread-safety: functions over values and files; concurrent writers to one directory are not
// supported (one trainer per job writes).
#ifndef BOULDER_WORKER_ENGINE_CHECKPOINT_H_
#define BOULDER_WORKER_ENGINE_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace boulder::engine {

inline constexpr uint32_t kCheckpointVersion = 1;
inline constexpr size_t kCheckpointNameBytes = 32;
inline constexpr uint32_t kMaxCheckpointSections = 64;

// One section to write: `size` bytes at `data` (host memory, alive during the write).
struct CheckpointSectionRef {
  std::string name;  // 1..31 bytes
  const void* data = nullptr;
  size_t size = 0;
};

// A checkpoint read back.
struct CheckpointData {
  int64_t step = 0;
  std::vector<std::pair<std::string, std::string>> sections;  // name, bytes; file order
  // The section's bytes, or null when absent.
  const std::string* Find(absl::string_view name) const;
};

// Writes `sections` atomically to `path` (see Durability). INVALID_ARGUMENT for a bad or
// duplicate section name or too many sections; the OS error (with the path) otherwise, in
// which case no file is left under `path` or its temporary name.
absl::Status WriteCheckpointFile(const std::string& path, int64_t step,
                                 const std::vector<CheckpointSectionRef>& sections);

// Reads and verifies a file. NOT_FOUND when it does not exist; DATA_LOSS naming what is wrong
// ("section adam_m: checksum mismatch", "truncated: header says 1234 bytes, file has 1000").
absl::StatusOr<CheckpointData> ReadCheckpointFile(const std::string& path);

// "ckpt-0000000100.bin".
std::string CheckpointFileName(int64_t step);

// The checkpoint files in `dir`, newest (highest step) first: (step, path). A missing
// directory has none. Temporary and foreign files are ignored.
absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> ListCheckpoints(
    const std::string& dir);

// Creates `dir` (and parents), writes the checkpoint of `step` there and removes all but the
// newest `keep_last` checkpoints (and stale temporary files). REQUIRES: keep_last >= 1.
absl::Status SaveCheckpoint(const std::string& dir, int64_t step,
                            const std::vector<CheckpointSectionRef>& sections, int keep_last);

// The newest checkpoint in `dir` that reads back valid. Each invalid newer one is reported
// through `on_skip(path, why)` and skipped. nullopt when there is none (or no directory).
// Errors other than DATA_LOSS from a file (e.g. permission denied) are returned.
absl::StatusOr<std::optional<CheckpointData>> LoadLatestCheckpoint(
    const std::string& dir,
    const std::function<void(const std::string&, const absl::Status&)>& on_skip = nullptr,
    std::string* loaded_path = nullptr);

}  // namespace boulder::engine

#endif  // BOULDER_WORKER_ENGINE_CHECKPOINT_H_
