// One trainer process: spawned in its own process group with its report pipe on fd 3 and its
// stdout+stderr on a second pipe, then supervised by a thread of its own that reads both
// pipes, parses report lines and notices the exit.
//
// Process hygiene. The child gets only fds 0 (/dev/null), 1 and 2 (the output pipe) and 3
// (the report pipe); an unblocked signal mask and default SIGPIPE/SIGINT/SIGTERM/SIGHUP/SIGQUIT;
// and its own process group, so signals reach the trainer and everything it started, and a
// terminal's Ctrl-C reaches only the agent. When the trainer exits, what is left of its group
// is killed (a stray child would otherwise hold the pipes open), the pipes are drained, and the
// exit is delivered.
//
// Thread-safety: Terminate, exited, WaitForExit and pid may be called from any thread. The
// callbacks run on the supervisor thread, one at a time, each pipe's lines in the order written;
// on_exit is the last call and comes exactly once. A callback must not destroy the
// TrainerProcess. The destructor kills a trainer still running and joins the thread.
//
// REQUIRES: SIGCHLD is not ignored in this process (the kernel would then reap trainers itself
// and their exit status would be lost).
#ifndef BOULDER_WORKER_AGENT_TRAINER_PROCESS_H_
#define BOULDER_WORKER_AGENT_TRAINER_PROCESS_H_

#include <sys/types.h>

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "boulder/v1/worker.pb.h"

namespace boulder::agent {

// The report fd number the trainer is told about with --report-fd.
inline constexpr int kReportFd = 3;

struct TrainerExit {
  int exit_code = 0;        // -1 when killed by a signal
  int signal = 0;           // the signal that killed it; 0 when it exited
  bool terminated = false;  // Terminate() was called before it exited
  std::string error;        // the last TrainerMessage.error it reported; may be empty
  std::string last_output;  // its last non-empty stdout/stderr line; may be empty
};

struct TrainerCallbacks {
  std::function<void(v1::TrainerMessage message)> on_message;
  // A stdout/stderr line; `truncated` when it was longer than the limit and was cut.
  std::function<void(std::string line, bool truncated)> on_output;
  // A report-fd line that did not parse (its first 200 bytes when it was too long), for the
  // owner to log; it is skipped. The view is valid only during the call.
  std::function<void(absl::string_view line, const absl::Status& why)> on_bad_report;
  std::function<void(const TrainerExit& exit)> on_exit;
};

struct TrainerSpawnOptions {
  std::string path;               // the executable; REQUIRES: non-empty
  std::vector<std::string> args;  // argv[1..]
  std::string working_dir;        // the child's cwd; empty: the agent's
  size_t max_report_line_bytes = 4 << 20;
  size_t max_output_line_bytes = 16 << 10;
  // After the trainer exits and its group is killed, how long to wait for the pipes to
  // close (a process that left the group may still hold them).
  absl::Duration drain_timeout = absl::Seconds(2);
};

class TrainerProcess {
 public:
  // Spawns the trainer and starts supervising it. Null callbacks are allowed.
  // NOT_FOUND / PERMISSION_DENIED / ...: the exec (or the chdir before it) failed; the message
  // names the path and the error, e.g. "exec /x/boulder-trainer: No such file or directory".
  // Other codes: creating pipes or forking failed.
  static absl::StatusOr<std::unique_ptr<TrainerProcess>> Start(TrainerSpawnOptions options,
                                                               TrainerCallbacks callbacks);

  ~TrainerProcess();
  TrainerProcess(const TrainerProcess&) = delete;
  TrainerProcess& operator=(const TrainerProcess&) = delete;

  pid_t pid() const { return pid_; }

  // Sends SIGTERM to the trainer's process group now and SIGKILL once `grace` has passed
  // (at once when grace <= 0). A second call can only bring the SIGKILL closer. No-op once
  // the trainer has been reaped.
  void Terminate(absl::Duration grace);

  // True once on_exit has returned.
  bool exited() const;

  // Waits until on_exit has returned or `timeout` passed; returns exited().
  bool WaitForExit(absl::Duration timeout);

 private:
  TrainerProcess(pid_t pid, int report_fd, int output_fd, TrainerSpawnOptions options,
                 TrainerCallbacks callbacks);
  void Supervise();

  const pid_t pid_;
  const TrainerSpawnOptions options_;
  const TrainerCallbacks callbacks_;
  int report_fd_;
  int output_fd_;
  std::string last_error_;   // supervisor thread only
  std::string last_output_;  // supervisor thread only

  mutable std::mutex mu_;
  std::condition_variable exited_cv_;
  bool reaped_ = false;                // guarded by mu_; the pid may be reused after this
  bool terminated_ = false;            // guarded by mu_
  std::optional<absl::Time> kill_at_;  // guarded by mu_
  bool killed_ = false;                // guarded by mu_; SIGKILL sent
  bool exited_ = false;                // guarded by mu_; on_exit returned

  std::thread thread_;
};

}  // namespace boulder::agent

#endif  // BOULDER_WORKER_AGENT_TRAINER_PROCESS_H_
