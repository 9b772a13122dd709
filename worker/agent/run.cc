#include "worker/agent/run.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/agent/console.h"

namespace boulder::agent {

absl::Status ResolveDefaults(AgentOptions* options) {
  std::error_code ec;
  if (options->trainer_path.empty()) {
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("--trainer: cannot find this executable's directory (", ec.message(),
                       "); pass --trainer"));
    }
    options->trainer_path = (self.parent_path() / "boulder-trainer").string();
  }
  if (options->work_dir.empty()) {
    const std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("--work-dir: no temp directory (", ec.message(), "); pass --work-dir"));
    }
    std::string pattern = (tmp / "boulder-worker-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      return absl::ErrnoToStatus(errno, absl::StrCat("--work-dir: creating ", pattern));
    }
    options->work_dir = std::move(pattern);
  }
  return absl::OkStatus();
}

absl::Status Run(AgentOptions options) {
  // Blocked before any thread starts, so every thread inherits the mask and the signals wait
  // for sigwait below. Trainers get an unblocked mask back (TrainerProcess).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  if (!options.print) options.print = PrintToStdout;
  if (!options.log) options.log = LogToStderr;
  const bool fresh_work_dir = options.work_dir.empty();
  if (absl::Status status = ResolveDefaults(&options); !status.ok()) return status;
  absl::StatusOr<std::unique_ptr<Agent>> agent = Agent::Create(options);
  if (!agent.ok()) {
    // Leave nothing behind for a run that never started (remove() only takes an empty dir).
    std::error_code ignored;
    if (fresh_work_dir) std::filesystem::remove(options.work_dir, ignored);
    return agent.status();
  }
  (*agent)->Start();

  int signal = 0;
  while (sigwait(&stop_signals, &signal) != 0) {
  }
  const char* name = sigabbrev_np(signal);
  options.log(absl::StrCat("received SIG", name == nullptr ? "?" : name, ": shutting down"));
  (*agent)->Shutdown();
  return absl::OkStatus();
}

}  // namespace boulder::agent
