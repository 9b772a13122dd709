// The worker agent: registers this machine with the coordinator, heartbeats, starts one
// trainer process per assignment, forwards what the trainers report and reports how they
// ended.
//
// Threads. A heartbeat thread registers (retrying with backoff while the coordinator is
// unavailable), heartbeats every heartbeat_interval_ms with the running trainers, starts
// assignments and stops cancelled ones; on NOT_FOUND (the coordinator restarted and forgot
// this worker) it registers again under the same id with the running trainers, which keep
// running. A reporter thread sends each trainer's buffered step reports and log lines with
// ReportSteps at most every flush_interval, and once a trainer has exited and everything it
// wrote is acknowledged, ReportExit, retried until acknowledged. Each trainer has a
// supervisor thread (TrainerProcess).
//
// Errors from the coordinator: a refusal no retry can fix (INVALID_ARGUMENT,
// FAILED_PRECONDITION, PERMISSION_DENIED, UNAUTHENTICATED, UNIMPLEMENTED, OUT_OF_RANGE,
// ALREADY_EXISTS) drops that batch or exit report, with a log line; anything else (UNAVAILABLE,
// DEADLINE_EXCEEDED, NOT_FOUND until registered again, ...) is retried, the step reports and
// log lines waiting in a bounded buffer that drops the oldest.
//
// A trainer counts as running, in heartbeats and registrations, until its exit has been
// acknowledged, so a coordinator never concludes it vanished before hearing how it ended.
//
// Thread-safety: all methods may be called from any thread.
#ifndef BOULDER_WORKER_AGENT_AGENT_H_
#define BOULDER_WORKER_AGENT_AGENT_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "boulder/v1/worker.grpc.pb.h"
#include "common/grpc_security.h"
#include "worker/agent/attempt.h"
#include "worker/agent/metrics.h"
#include "worker/agent/report_buffer.h"

namespace boulder::agent {

// Relative paths below are resolved against the working directory at Agent::Create (see
// ResolveRelativePaths).
struct AgentOptions {
  // The coordinator's WorkerService, "HOST:PORT". Required.
  std::string coordinator;
  // TLS to the coordinator (or, explicitly, plaintext) and the worker join token
  // (security.token) sent with every call.
  common::ChannelSecurityOptions security;
  // "auto" | "cpu" | "cuda"; see ChooseBackend.
  std::string backend = "auto";
  // Serve /metrics at this "HOST:PORT" (port 0: any free port); empty: no endpoint.
  std::string metrics_listen;
  // The trainer executable. Required (Run() defaults it to boulder-trainer beside the agent).
  std::string trainer_path;
  // Attempt directories go under here, as job-J/attempt-A, and are kept after the trainer
  // exits. Required (Run() defaults it to a fresh directory under the system temp dir).
  std::string work_dir;
  // Jobs' checkpoints go under here, as <root>/job-<id> (or <root>/<checkpoint.dir>). A job
  // restarted on another worker resumes only from checkpoints that worker can read: point every
  // worker at the same shared storage (NFS, a PVC with ReadWriteMany). Empty: Create uses
  // <work_dir>/checkpoints (this machine only).
  std::string checkpoint_root;
  // The id to register under; empty: the coordinator chooses.
  std::string id;
  // Threads per trainer (its --threads); 0: all cores.
  int threads = 0;

  // How long a stopped trainer has between SIGTERM and SIGKILL.
  absl::Duration kill_grace = absl::Seconds(10);
  // Longest a step report waits in the agent before it is sent.
  absl::Duration flush_interval = absl::Milliseconds(250);
  // Deadline of each RPC to the coordinator.
  absl::Duration rpc_timeout = absl::Seconds(5);
  // Registration retries: first wait, doubled after each failure up to the max.
  absl::Duration register_backoff_initial = absl::Milliseconds(250);
  absl::Duration register_backoff_max = absl::Seconds(5);
  // How long Shutdown keeps trying to report the trainers' exits once they have stopped.
  absl::Duration shutdown_report_timeout = absl::Seconds(5);
  // Per trainer: what is held while the coordinator is unreachable.
  ReportBuffer::Limits buffer_limits;

  // Lines for the user: "boulder-worker <id> registered with ...", "metrics on ...".
  // Default: stdout.
  std::function<void(absl::string_view)> print;
  // Diagnostics (registration failures, trainer starts and exits). Default: stderr, with a
  // timestamp.
  std::function<void(absl::string_view)> log;
};

// Makes the relative paths in `options` (work_dir, checkpoint_root, the TLS files) absolute
// against the current working directory. The trainers get these paths on their command lines
// and run in their attempt directories, where a relative path would name another file.
// INVALID_ARGUMENT naming the flag when a path cannot be resolved.
absl::Status ResolveRelativePaths(AgentOptions* options);

class Agent {
 public:
  // Validates the options, probes the GPUs, chooses the backend, creates the work directory
  // and starts the metrics endpoint (printing "metrics on HOST:PORT"). Talks to nobody yet.
  // INVALID_ARGUMENT: a bad option, named by its flag (e.g. "--backend cuda: this build has
  // no CUDA backend", "--trainer /x: not an executable file", "tls_ca: cannot read ...").
  // UNAVAILABLE: the metrics
  // address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Agent>> Create(AgentOptions options);

  ~Agent();  // Shutdown()
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Starts registering, heartbeating and reporting. REQUIRES: called at most once.
  void Start();

  // Stops the trainers (SIGTERM, SIGKILL after kill_grace) while heartbeats go on, reports
  // their exits (for at most shutdown_report_timeout after they stopped) and joins every
  // thread. Idempotent.
  void Shutdown();

  const v1::WorkerCapabilities& capabilities() const { return capabilities_; }
  std::string worker_id() const;                      // empty until registered
  int metrics_port() const { return metrics_port_; }  // 0 when not serving
  AgentMetrics& metrics() { return metrics_; }

 private:
  using Key = std::pair<int64_t, int32_t>;  // (job id, attempt)

  Agent(AgentOptions options, v1::WorkerCapabilities capabilities,
        std::shared_ptr<grpc::Channel> channel);

  void HeartbeatLoop();
  bool Register(bool first);  // false: shutting down
  void StartAttempt(const v1::Assignment& assignment);
  void CancelAttempt(const v1::RunningTrainer& running);
  std::vector<v1::RunningTrainer> Running() const;

  void ReportLoop();
  void ReportAttempt(const std::shared_ptr<Attempt>& attempt);
  bool Flush(Attempt& attempt);     // true: nothing left to send
  bool SendExit(Attempt& attempt);  // true: done with this exit (acknowledged or rejected)
  // Rank 0's weights after a clean exit; true: done (uploaded, none, or refused for good).
  bool UploadWeights(Attempt& attempt);
  void WakeReporter();

  // One RPC from the heartbeat thread, cancelled by Shutdown once the trainers have stopped.
  template <typename Call>
  grpc::Status HeartbeatRpc(Call call);
  // One RPC from the reporter, with its deadline cut short once shutting down.
  template <typename Call>
  grpc::Status ReporterRpc(Call call);
  void NoteCoordinatorUp();
  void NoteCoordinatorDown(absl::string_view what, const grpc::Status& status);
  void Log(absl::string_view line) const;

  const AgentOptions options_;
  const v1::WorkerCapabilities capabilities_;
  AgentMetrics metrics_;
  int metrics_port_ = 0;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  std::atomic<bool> coordinator_down_{false};

  mutable std::mutex mu_;
  std::condition_variable cv_;  // wakes the heartbeat and reporter threads
  std::string worker_id_;       // guarded by mu_
  absl::Duration heartbeat_interval_ = absl::Seconds(1);  // guarded by mu_
  std::map<Key, std::shared_ptr<Attempt>> attempts_;      // guarded by mu_
  std::set<Key> finished_;                                // guarded by mu_
  grpc::ClientContext* heartbeat_call_ = nullptr;         // guarded by mu_
  bool started_ = false;                                  // guarded by mu_
  bool stopping_ = false;                                 // guarded by mu_; no new assignments
  bool heartbeat_stop_ = false;  // guarded by mu_; the heartbeat thread ends
  bool shut_down_ = false;       // guarded by mu_
  bool reporter_wake_ = false;   // guarded by mu_
  bool reporter_stop_ = false;   // guarded by mu_
  absl::Time reporter_deadline_ = absl::InfiniteFuture();  // guarded by mu_

  std::thread heartbeat_thread_;
  std::thread reporter_thread_;
};

}  // namespace boulder::agent

#endif  // BOULDER_WORKER_AGENT_AGENT_H_
