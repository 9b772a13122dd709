// WeightsStore: the trained weights of finished jobs, on the coordinator's disk.
//
// How weights travel: the worker agent starts rank 0's trainer with --weights-out; when that
// trainer exits 0 the agent uploads the file in chunks (WorkerService.UploadWeights) before it
// reports the exit, so a job is SUCCEEDED only once its weights are here. `boulder export`
// downloads them in chunks (JobService.ExportWeights). Chunks are unary RPCs of at most 1 MiB
// carrying their offset: an interrupted upload or download resumes where it stopped, and no
// message comes near gRPC's size limits.
//
// Layout: DIR/job-<id>.safetensors (complete) and DIR/job-<id>.attempt-<a>.part (an upload in
// progress; renamed when its last chunk arrives, so readers never see a partial file).
//
// Thread-safe: one mutex around every operation.
#ifndef BOULDER_SERVER_WEIGHTS_STORE_H_
#define BOULDER_SERVER_WEIGHTS_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace boulder::server {

struct WeightsStoreOptions {
  std::string dir;                        // created if missing
  int64_t max_bytes = int64_t{64} << 30;  // largest file accepted (64 GiB)
};

inline constexpr int64_t kMaxWeightsChunkBytes = 4 << 20;
inline constexpr int64_t kDefaultWeightsChunkBytes = 1 << 20;

class WeightsStore {
 public:
  // INVALID_ARGUMENT for an empty dir; INTERNAL naming it when it cannot be created.
  static absl::StatusOr<std::unique_ptr<WeightsStore>> Open(const WeightsStoreOptions& options);

  // Appends one chunk of job `job_id`'s attempt `attempt` upload; returns the bytes received.
  // offset 0 starts (or restarts) the upload. FAILED_PRECONDITION naming the expected offset
  // when `offset` is not the bytes received so far; INVALID_ARGUMENT for a chunk over
  // kMaxWeightsChunkBytes, a total_bytes that changed, or a last chunk that does not complete
  // total_bytes, or a total_bytes over max_bytes (a retry cannot help); INTERNAL for I/O.
  absl::StatusOr<int64_t> Append(int64_t job_id, int32_t attempt, int64_t total_bytes,
                                 int64_t offset, absl::string_view data, bool last);

  struct Chunk {
    std::string data;
    int64_t total_bytes = 0;
  };
  // Up to max_bytes (0: kDefaultWeightsChunkBytes; capped at kMaxWeightsChunkBytes) from
  // `offset`. NOT_FOUND when the job has no complete weights; OUT_OF_RANGE for an offset past
  // the end.
  absl::StatusOr<Chunk> Read(int64_t job_id, int64_t offset, int64_t max_bytes);

  const WeightsStoreOptions& options() const { return options_; }

 private:
  explicit WeightsStore(WeightsStoreOptions options) : options_(std::move(options)) {}
  std::string FinalPath(int64_t job_id) const;
  std::string PartPath(int64_t job_id, int32_t attempt) const;

  const WeightsStoreOptions options_;
  absl::Mutex mu_;
  // The upload in progress per job: attempt and declared size.
  struct Upload {
    int32_t attempt = 0;
    int64_t total_bytes = 0;
    int64_t received = 0;
  };
  std::map<int64_t, Upload> uploads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace boulder::server

#endif  // BOULDER_SERVER_WEIGHTS_STORE_H_
