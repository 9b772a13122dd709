// One assignment on this worker: its directory and spec file, its trainer process, what the
// trainer reported and the coordinator has not acknowledged yet, and how it ended.
//
// Lifecycle: construct, Launch() once, Stop() any number of times, then, once exited(),
// ExitReport(). If the spec cannot be written or the trainer cannot be spawned (or Stop came
// first), the attempt ends at once and its ExitReport says why.
//
// Thread-safe. Callbacks in AttemptOptions run on the trainer's supervisor thread (or on the
// caller's, when the attempt ends without a trainer); they must not destroy the Attempt.
#ifndef BOULDER_WORKER_AGENT_ATTEMPT_H_
#define BOULDER_WORKER_AGENT_ATTEMPT_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "boulder/v1/worker.pb.h"
#include "common/grpc_security.h"
#include "worker/agent/metrics.h"
#include "worker/agent/report_buffer.h"
#include "worker/agent/trainer_process.h"

namespace boulder::agent {

// Exit code reported when the trainer could not be started (as a shell reports it).
inline constexpr int kSpawnFailedExitCode = 127;

struct AttemptOptions {
  std::string trainer_path;  // REQUIRES: non-empty
  std::string dir;           // this attempt's directory; created by Launch
  int threads = 0;           // --threads for the trainer; 0: all cores
  std::string checkpoint_dir;  // --checkpoint-dir for the trainer; empty: no checkpoints
  std::string backend;       // --backend for the trainer: the one this worker registered with
  std::string coordinator;   // --coordinator for the trainer (its data-parallel rendezvous)
  // The agent's own TLS settings and join token, passed on to the trainer's rendezvous (the
  // token through a 0600 file in the attempt's directory, never on the command line).
  common::ChannelSecurityOptions security;
  ReportBuffer::Limits buffer_limits;
  AgentMetrics* metrics = nullptr;  // not owned; may be null
  // The device's peak FLOP/s for this job's precision (PeakFlops); 0: unknown, no MFU metric.
  double peak_flops = 0;
  // A diagnostic line about this attempt (already prefixed with its label).
  std::function<void(absl::string_view)> log;
  // The attempt has ended (its exit is ready to report).
  std::function<void()> on_exit;
};

// The file, in the attempt's directory, where rank 0's trainer writes the trained weights.
inline constexpr char kWeightsFile[] = "weights.safetensors";
// The 0600 file, in the attempt's directory, holding the join token for the trainer's
// rendezvous (--join-token-file); removed when the attempt ends.
inline constexpr char kJoinTokenFile[] = "join.token";

// The trainer's command line after argv[0].
// `backend` ("cpu" or "cuda") pins the trainer to the backend this worker registered with, so
// a worker started with --backend cpu on a GPU host trains on the CPU; empty: the spec decides.
// `checkpoint_dir`, when non-empty, is where the trainer resumes from and writes checkpoints.
// `coordinator` ("HOST:PORT", the agent's own) is where ranks of a multi-worker job
// rendezvous; empty: not passed.
// The trainer flags that give its rendezvous `security` (TLS files, --insecure and, when
// `token_file` is non-empty, --join-token-file).
std::vector<std::string> RendezvousSecurityArgs(const common::ChannelSecurityOptions& security,
                                                const std::string& token_file);

std::vector<std::string> TrainerArgs(const v1::Assignment& assignment, const std::string& spec_path,
                                     int threads, const std::string& backend = "",
                                     const std::string& checkpoint_dir = "",
                                     const std::string& coordinator = "");

// Writes `spec` as protobuf JSON with the proto field names (what ParseJobSpecYaml reads).
// Errors carry the path and the OS error.
absl::Status WriteSpecJson(const v1::JobSpec& spec, const std::string& path);

class Attempt {
 public:
  enum class StopReason {
    kCancelled,  // the coordinator cancelled it: reported with cancelled = true
    kShutdown,   // the agent is shutting down
  };

  Attempt(v1::Assignment assignment, AttemptOptions options);
  ~Attempt();  // kills a trainer still running
  Attempt(const Attempt&) = delete;
  Attempt& operator=(const Attempt&) = delete;

  // Creates the directory, writes spec.json (and, with a join token, kJoinTokenFile) there and
  // spawns the trainer in it.
  void Launch();

  // SIGTERM to the trainer's process group, SIGKILL after `grace`. The first reason sticks.
  // Returns true for the first call before the attempt ended.
  bool Stop(StopReason reason, absl::Duration grace);

  int64_t job_id() const { return assignment_.job_id(); }
  int32_t attempt() const { return assignment_.attempt(); }
  int32_t rank() const { return assignment_.rank(); }
  const std::string& label() const { return label_; }  // "job 7 attempt 1 rank 0"
  const std::string& dir() const { return options_.dir; }
  // The agent's reporter thread's bookkeeping: the weights were uploaded (or there are none
  // to upload). Only that thread touches it.
  bool weights_done = false;
  v1::RunningTrainer running() const;
  ReportBuffer& buffer() { return buffer_; }
  pid_t pid() const;  // 0 before launch or when the spawn failed

  bool exited() const;
  bool WaitForExit(absl::Duration timeout);

  // The exit to report, without worker_id. REQUIRES: exited().
  v1::ReportExitRequest ExitReport() const;

 private:
  void OnTrainerExit(const TrainerExit& exit);
  void EndWithoutTrainer(int exit_code, std::string message);
  // Deletes the join token file, if Launch wrote one (the attempt has ended).
  void RemoveTokenFile();
  void Log(absl::string_view line) const;
  TrainerCallbacks Callbacks();

  const v1::Assignment assignment_;
  const AttemptOptions options_;
  const std::string label_;
  const MfuInputs mfu_;
  ReportBuffer buffer_;
  int malformed_lines_ = 0;  // supervisor thread only

  mutable std::mutex mu_;
  std::condition_variable exited_cv_;
  bool launched_ = false;                      // guarded by mu_
  std::optional<StopReason> stop_reason_;      // guarded by mu_
  std::optional<v1::ReportExitRequest> exit_;  // guarded by mu_
  std::unique_ptr<TrainerProcess> process_;    // set once, under mu_, by Launch
  std::string token_file_;                     // guarded by mu_; "" once removed
};

}  // namespace boulder::agent

#endif  // BOULDER_WORKER_AGENT_ATTEMPT_H_
