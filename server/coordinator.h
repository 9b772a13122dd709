// Coordinator: the coordinator's state machine, independent of gRPC. The RPC services are thin
// adapters over it, and tests drive it directly with a fake clock.
//
// It owns the JobStore (the source of truth for jobs and their events) and keeps the live view
// of workers in memory (written through to the store on every change of state). Every
// mutation is one SQLite transaction; its events are published to hub() after it commits, so
// an acknowledged change is durable and a watcher never sees an event the store lacks.
//
// Job lifecycle: QUEUED -> SCHEDULED (placed; attempt incremented) -> RUNNING (first report)
// -> SUCCEEDED | FAILED | CANCELLED. Any non-terminal state may go to CANCELLED (CancelJob).
// A failed attempt (worker lost, trainer exited non-zero or by a signal, trainer stopped by its
// agent unasked, lost during a coordinator restart) makes the job RESTARTING while
// attempt <= spec.max_restarts, else FAILED with the cause (coordinator_restart.cc). A
// RESTARTING job is placed again (on any suitable idle worker, as a queued job in id order)
// once no worker still runs its failed attempt; its trainer resumes from the job's latest
// checkpoint. Each failed attempt and each placement is a state-change event.
//
// Worker protocol (what a worker agent must do):
//  - RegisterWorker, then Heartbeat every heartbeat_interval. NOT_FOUND from any worker RPC
//    means "register again" (after a coordinator restart, or after being declared LOST),
//    passing requested_id and the trainers still running.
//  - A heartbeat's assignments are repeated until the worker lists the job in `running` (or
//    reports on it): an agent must start each (job_id, attempt) once and ignore repeats.
//  - Stop every trainer listed in a heartbeat's `cancel`, or when ReportSteps says cancel, and
//    send ReportExit for every trainer that ends (cancelled=true when it was told to stop).
//    The worker stays BUSY until then.
//
// Choices where the contract leaves room:
//  - A LOST worker's heartbeats get NOT_FOUND; when it registers again it is revived (IDLE),
//    and trainers it still runs are cancelled (their jobs were failed when it was lost).
//  - After a coordinator restart, workers loaded from the store are listed with their last
//    known state but get NOT_FOUND until they register again; a job SCHEDULED/RUNNING at
//    start that does not get all its ranks back within heartbeat_timeout is FAILED "lost
//    during coordinator restart".
//  - A trainer a worker acknowledged but stops listing without a ReportExit is given
//    heartbeat_timeout for the exit report to arrive, then its job is FAILED.
//  - Step reports and log lines for a job that no longer runs on the reporting worker are
//    discarded, and the reply says cancel.
//  - A gang job succeeds when every rank exited 0; the first rank to fail fails the job and
//    the other ranks are cancelled.
//  - An exit reported as cancelled while the job is still active (nobody asked for it: the
//    agent shutting down, say) fails the attempt, "rank R on worker W was stopped by its
//    agent" (a restart within max_restarts); once the job is CANCELLED (or otherwise
//    finished) exits do not change its state.
//  - SubmitJob refuses (FAILED_PRECONDITION, with the estimate) a job that can only run on
//    cuda workers when every registered cuda worker's GPU is smaller than the job's memory
//    estimate (common/memory_estimate.h); with no cuda worker registered it queues. The
//    scheduler never places a job on a GPU smaller than its estimate.
//  - workers.last_heartbeat in the store is written on registration, on changes of state and
//    by Flush() (at shutdown), not on every heartbeat.
//
// Thread-safe: one mutex serializes every operation (SQLite access included).
#ifndef BOULDER_SERVER_COORDINATOR_H_
#define BOULDER_SERVER_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "boulder/v1/job.pb.h"
#include "boulder/v1/worker.pb.h"
#include "server/event_hub.h"
#include "server/job_store.h"
#include "server/metrics.h"

namespace boulder::server {

struct CoordinatorOptions {
  // A worker silent for longer is LOST and its job FAILED. Also the grace a restarted
  // coordinator gives workers to register again and reclaim their running jobs.
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  // Told to workers at registration.
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  // Time source; absl::Now when empty (tests inject a fake clock).
  std::function<absl::Time()> clock;
};

// A page of a job's stored events (for WatchJob).
struct EventPage {
  std::vector<v1::JobEvent> events;
  // The job was SUCCEEDED, FAILED or CANCELLED when the page was read.
  bool job_finished = false;
};

class Coordinator {
 public:
  // Loads jobs and workers from `store` (restart reconciliation starts now). `metrics` is not
  // owned and must outlive the Coordinator.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(std::unique_ptr<JobStore> store,
                                                             ServerMetrics* metrics,
                                                             CoordinatorOptions options);
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // --- Jobs. NOT_FOUND "job 42 not found" for unknown ids.

  // Validates and resolves the spec (INVALID_ARGUMENT with the field path), stores the job
  // QUEUED (owned by `owner`, "" without authentication) and commits before returning it.
  absl::StatusOr<v1::Job> SubmitJob(const v1::SubmitJobRequest& request,
                                    const std::string& owner = "");
  absl::StatusOr<v1::Job> GetJob(int64_t job_id);
  // Newest first; only `owner`'s jobs when given. INVALID_ARGUMENT for a negative limit.
  absl::StatusOr<std::vector<v1::Job>> ListJobs(const v1::ListJobsRequest& request,
                                                const std::optional<std::string>& owner = {});
  // FAILED_PRECONDITION "job 3 already SUCCEEDED" for a finished job.
  absl::StatusOr<v1::Job> CancelJob(int64_t job_id);
  absl::StatusOr<std::vector<v1::LogLine>> GetJobLogs(int64_t job_id);
  // Up to `limit` stored events with seq > after_seq, and whether the job had finished.
  absl::StatusOr<EventPage> ReadEvents(int64_t job_id, int64_t after_seq, int limit);
  // Live events, published after each commit.
  EventHub& hub() { return hub_; }

  // --- Workers. NOT_FOUND "worker w is not registered" tells the agent to register again.

  // INVALID_ARGUMENT for a bad backend or requested_id.
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request);
  // Runs the scheduler, then returns this worker's assignments and cancellations.
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  absl::StatusOr<v1::ReportStepsResponse> ReportSteps(const v1::ReportStepsRequest& request);
  // Stale reports (another attempt, another worker) are accepted and ignored.
  absl::Status ReportExit(const v1::ReportExitRequest& request);
  // Ordered by registration time, then id.
  std::vector<v1::Worker> ListWorkers();

  // --- Housekeeping.

  // Declares workers silent for longer than heartbeat_timeout LOST (failing their jobs) and,
  // once the restart grace has passed, fails jobs not reclaimed. Call periodically.
  absl::Status CheckLiveness();
  // Writes every worker's in-memory state (last heartbeat included) to the store.
  absl::Status Flush();

  const CoordinatorOptions& options() const { return options_; }

 private:
  struct WorkerEntry {
    v1::Worker info;  // latest_report and last_heartbeat are kept here, exactly
    // Registered with this process (false: loaded from the store at start).
    bool registered = false;
    absl::Time last_seen;
    // The worker listed (or reported on) its current assignment.
    bool acked = false;
    // Since when an acknowledged trainer has been missing from the worker's heartbeats.
    absl::Time missing_since = absl::InfiniteFuture();
  };

  // Changes staged by one operation, committed in one transaction.
  struct Update {
    std::map<int64_t, v1::Job> jobs;
    std::map<std::string, v1::Worker> workers;
    std::vector<v1::JobEvent> events;
  };

  Coordinator(std::unique_ptr<JobStore> store, ServerMetrics* metrics, CoordinatorOptions options);
  absl::Status Load();
  absl::Time Now() const { return options_.clock(); }

  // Staging helpers; REQUIRE mu_.
  absl::StatusOr<v1::Job*> StageJob(Update& u, int64_t job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::Worker* StageWorker(Update& u, const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::JobEvent* AddEvent(Update& u, int64_t job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets the state and its event; a terminal state also sets end_time and the job's message.
  void SetState(Update& u, v1::Job* job, v1::JobState state, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker has nothing to run: IDLE (LOST stays LOST), no job.
  void Release(Update& u, const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits `u`, then applies its workers to memory, publishes its events, updates gauges.
  absl::Status Commit(Update& u) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefreshGauges(bool jobs, bool workers) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status RunScheduler() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The current attempt of `job` failed because of `cause`: RESTARTING within the job's
  // max_restarts, else FAILED. No-op for a job not SCHEDULED or RUNNING (coordinator_restart.cc).
  void FailAttempt(Update& u, v1::Job* job, const std::string& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK, or FAILED_PRECONDITION when no registered cuda worker can hold a cuda-only `spec`.
  absl::Status CheckMemoryAtSubmit(const v1::JobSpec& spec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True while a worker is BUSY with `job_id` (a RESTARTING job waits for that).
  bool AnyWorkerBusyWith(int64_t job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<WorkerEntry*> FindRegistered(const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string NewWorkerId() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoordinatorOptions options_;
  ServerMetrics* const metrics_;
  EventHub hub_;

  absl::Mutex mu_;
  std::unique_ptr<JobStore> store_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, WorkerEntry> workers_ ABSL_GUARDED_BY(mu_);
  int64_t next_worker_number_ ABSL_GUARDED_BY(mu_) = 1;
  // Jobs SCHEDULED/RUNNING when this process started, checked once at restart_deadline_.
  std::set<int64_t> restart_jobs_ ABSL_GUARDED_BY(mu_);
  // Set by every change the scheduler's placement depends on; cleared when it runs.
  bool schedule_needed_ ABSL_GUARDED_BY(mu_) = true;
  absl::Time restart_deadline_ ABSL_GUARDED_BY(mu_);
};

// SCHEDULED, RUNNING or RESTARTING: workers are (or should be) running it.
bool IsActive(v1::JobState state);
// SUCCEEDED, FAILED or CANCELLED.
bool IsTerminal(v1::JobState state);

}  // namespace boulder::server

#endif  // BOULDER_SERVER_COORDINATOR_H_
