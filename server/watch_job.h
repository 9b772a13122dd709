// WatchJobReactor: the server side of JobService.WatchJob.
//
// Writes the job's stored events with seq > after_seq (read in pages, so a long history is
// never held in memory at once), then live events as they are committed, and finishes OK
// right after writing a terminal state change (SUCCEEDED, FAILED, CANCELLED) — or after the
// backlog when the job had already finished before after_seq. NOT_FOUND for unknown jobs.
//
// It subscribes to the Coordinator's EventHub before reading the backlog; live events that
// arrive meanwhile are held and merged by seq, so none is lost or written twice.
//
// One write in flight at a time, the message kept alive until OnWriteDone; Finish is called
// exactly once, never while holding the reactor's lock (gRPC may run OnDone inline);
// OnCancel and OnWriteDone(false) end the stream. Deletes itself in OnDone.
#ifndef BOULDER_SERVER_WATCH_JOB_H_
#define BOULDER_SERVER_WATCH_JOB_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "boulder/v1/job.pb.h"
#include "server/coordinator.h"
#include "server/metrics.h"

namespace boulder::server {

class WatchJobReactor final : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  // Events read from the store per page.
  static constexpr int kPageSize = 256;

  // `coordinator` and `metrics` must outlive the RPC (the server's Shutdown waits for it).
  WatchJobReactor(Coordinator* coordinator, ServerMetrics* metrics,
                  const v1::WatchJobRequest& request);

  // Subscribes and starts the backlog. Call once, from the RPC handler.
  void Start();

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  enum class Next { kWait, kFetch, kFinish };

  // Reads the next page of backlog; REQUIRES fetching_ and mu_ not held.
  void FetchPage();
  // Called by the EventHub on the publishing thread (under the Coordinator's and the hub's
  // locks): queues and may start a write, never finishes.
  void OnLive(const v1::JobEvent& event);
  void Enqueue(const v1::JobEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the next write, or says what the caller must do once it has dropped mu_.
  Next Advance() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the stream finished with `status`; the caller calls Finish(grpc_status) unlocked.
  grpc::Status EndLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Act(Next next, const grpc::Status& status);

  Coordinator* const coordinator_;
  ServerMetrics* const metrics_;
  const int64_t job_id_;
  const absl::Time start_;
  uint64_t subscription_ = 0;

  absl::Mutex mu_;
  std::deque<v1::JobEvent> queue_ ABSL_GUARDED_BY(mu_);
  v1::JobEvent current_;  // being written; touched only by whoever set writing_
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool fetching_ ABSL_GUARDED_BY(mu_) = false;
  bool backlog_done_ ABSL_GUARDED_BY(mu_) = false;
  int64_t cursor_ ABSL_GUARDED_BY(mu_);    // backlog read up to this seq
  int64_t last_seq_ ABSL_GUARDED_BY(mu_);  // highest seq queued or written
  std::vector<v1::JobEvent> live_pending_ ABSL_GUARDED_BY(mu_);
  bool end_after_queue_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
  absl::StatusCode final_code_ ABSL_GUARDED_BY(mu_) = absl::StatusCode::kOk;
};

}  // namespace boulder::server

#endif  // BOULDER_SERVER_WATCH_JOB_H_
