#include "worker/agent/trainer_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "worker/agent/line_splitter.h"
#include "worker/agent/report_parser.h"

extern char** environ;

namespace boulder::agent {
namespace {

// How often the supervisor looks for the trainer's exit and a due SIGKILL while its pipes are
// quiet.
constexpr int kTickMs = 100;
// The parent keeps the fds it hands to the child above this, so the child's dup2 onto
// 0..kReportFd never overwrites one it still has to copy.
constexpr int kFirstHighFd = 10;

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    reset(other.release());
    return *this;
  }
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

absl::Status MakePipe(UniqueFd* read_end, UniqueFd* write_end) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::ErrnoToStatus(errno, "pipe2");
  read_end->reset(fds[0]);
  write_end->reset(fds[1]);
  return absl::OkStatus();
}

absl::Status MoveAbove(UniqueFd* fd, int min_fd) {
  if (fd->get() >= min_fd) return absl::OkStatus();
  const int moved = fcntl(fd->get(), F_DUPFD_CLOEXEC, min_fd);
  if (moved < 0) return absl::ErrnoToStatus(errno, "fcntl(F_DUPFD_CLOEXEC)");
  fd->reset(moved);
  return absl::OkStatus();
}

// What the child writes on the CLOEXEC error pipe when it cannot exec.
struct ChildFailure {
  enum Stage : int { kSetup = 0, kChdir = 1, kExec = 2 };
  int stage;
  int error;
};

[[noreturn]] void ChildFail(int err_fd, int stage, int error) {
  const ChildFailure failure{stage, error};
  ssize_t unused = write(err_fd, &failure, sizeof(failure));
  (void)unused;
  _exit(127);
}

// Runs in the forked child of a possibly multithreaded parent: async-signal-safe calls only
// (no allocation, no locks) until execve.
[[noreturn]] void ChildExec(const char* path, char* const* argv, const char* dir, int devnull,
                            int output_w, int report_w, int err_w, int max_fd) {
  setpgid(0, 0);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  const int reset_signals[] = {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  for (int sig : reset_signals) sigaction(sig, &dfl, nullptr);

  if (dup2(devnull, STDIN_FILENO) < 0 || dup2(output_w, STDOUT_FILENO) < 0 ||
      dup2(output_w, STDERR_FILENO) < 0 || dup2(report_w, kReportFd) < 0) {
    ChildFail(err_w, ChildFailure::kSetup, errno);
  }
  if (close_range(kReportFd + 1, err_w - 1, 0) != 0 || close_range(err_w + 1, ~0U, 0) != 0) {
    for (int fd = kReportFd + 1; fd < max_fd; ++fd) {
      if (fd != err_w) close(fd);
    }
  }
  if (dir != nullptr && chdir(dir) != 0) ChildFail(err_w, ChildFailure::kChdir, errno);
  execve(path, argv, environ);
  ChildFail(err_w, ChildFailure::kExec, errno);
}

bool IsBlank(absl::string_view line) { return absl::StripAsciiWhitespace(line).empty(); }

}  // namespace

absl::StatusOr<std::unique_ptr<TrainerProcess>> TrainerProcess::Start(TrainerSpawnOptions options,
                                                                      TrainerCallbacks callbacks) {
  if (options.path.empty()) return absl::InvalidArgumentError("trainer path is empty");
  // The child changes directory before exec, so a relative path must be made absolute here.
  std::error_code ec;
  const std::string path = std::filesystem::absolute(options.path, ec).string();
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer path ", options.path, ": ", ec.message()));
  }

  // Everything the child touches is prepared before fork.
  std::vector<std::string> arg_storage;
  arg_storage.push_back(path);
  arg_storage.insert(arg_storage.end(), options.args.begin(), options.args.end());
  std::vector<char*> argv;
  argv.reserve(arg_storage.size() + 1);
  for (std::string& arg : arg_storage) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const char* dir = options.working_dir.empty() ? nullptr : options.working_dir.c_str();
  // Bounds the child's fallback close loop, used only where close_range is missing.
  const auto open_max = sysconf(_SC_OPEN_MAX);
  const int max_fd = open_max > 0 && open_max < (1 << 20) ? static_cast<int>(open_max) : 1 << 20;

  UniqueFd report_r, report_w, output_r, output_w, err_r, err_w;
  for (auto [r, w] : {std::pair{&report_r, &report_w}, std::pair{&output_r, &output_w},
                      std::pair{&err_r, &err_w}}) {
    if (absl::Status s = MakePipe(r, w); !s.ok()) return s;
  }
  UniqueFd devnull(open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (devnull.get() < 0) return absl::ErrnoToStatus(errno, "open /dev/null");
  for (UniqueFd* fd : {&report_w, &output_w, &err_w, &devnull}) {
    if (absl::Status s = MoveAbove(fd, kFirstHighFd); !s.ok()) return s;
  }

  const pid_t pid = fork();
  if (pid < 0) return absl::ErrnoToStatus(errno, "fork");
  if (pid == 0) {
    ChildExec(path.c_str(), argv.data(), dir, devnull.get(), output_w.get(), report_w.get(),
              err_w.get(), max_fd);
  }
  // Both sides set the group, so it exists whichever runs first; EACCES after the child's
  // exec is expected.
  setpgid(pid, pid);
  report_w.reset();
  output_w.reset();
  err_w.reset();
  devnull.reset();

  // EOF on the error pipe: the exec succeeded and closed it (CLOEXEC).
  ChildFailure failure{};
  ssize_t n = 0;
  do {
    n = read(err_r.get(), &failure, sizeof(failure));
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof(failure))) {
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    switch (failure.stage) {
      case ChildFailure::kChdir:
        return absl::ErrnoToStatus(failure.error, absl::StrCat("chdir ", options.working_dir));
      case ChildFailure::kExec:
        return absl::ErrnoToStatus(failure.error, absl::StrCat("exec ", path));
      default:
        return absl::ErrnoToStatus(failure.error, "setting up the trainer's fds");
    }
  }
  for (const UniqueFd* fd : {&report_r, &output_r}) {
    fcntl(fd->get(), F_SETFL, fcntl(fd->get(), F_GETFL) | O_NONBLOCK);
  }
  std::unique_ptr<TrainerProcess> process(new TrainerProcess(
      pid, report_r.release(), output_r.release(), std::move(options), std::move(callbacks)));
  process->thread_ = std::thread(&TrainerProcess::Supervise, process.get());
  return process;
}

TrainerProcess::TrainerProcess(pid_t pid, int report_fd, int output_fd, TrainerSpawnOptions options,
                               TrainerCallbacks callbacks)
    : pid_(pid),
      options_(std::move(options)),
      callbacks_(std::move(callbacks)),
      report_fd_(report_fd),
      output_fd_(output_fd) {}

TrainerProcess::~TrainerProcess() {
  Terminate(absl::ZeroDuration());
  if (thread_.joinable()) thread_.join();
  if (report_fd_ >= 0) close(report_fd_);
  if (output_fd_ >= 0) close(output_fd_);
}

void TrainerProcess::Terminate(absl::Duration grace) {
  std::lock_guard<std::mutex> lock(mu_);
  if (reaped_) return;
  terminated_ = true;
  if (grace <= absl::ZeroDuration()) {
    if (!killed_) kill(-pid_, SIGKILL);
    killed_ = true;
    return;
  }
  const absl::Time kill_at = absl::Now() + grace;
  if (!kill_at_.has_value()) {
    kill(-pid_, SIGTERM);
    kill_at_ = kill_at;
  } else if (kill_at < *kill_at_) {
    kill_at_ = kill_at;
  }
}

bool TrainerProcess::exited() const {
  std::lock_guard<std::mutex> lock(mu_);
  return exited_;
}

bool TrainerProcess::WaitForExit(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = absl::ToChronoTime(absl::Now() + timeout);
  return exited_cv_.wait_until(lock, deadline, [this] { return exited_; });
}

void TrainerProcess::Supervise() {
  LineSplitter report_lines(options_.max_report_line_bytes);
  LineSplitter output_lines(options_.max_output_line_bytes);
  const LineSplitter::Emit on_report = [this](absl::string_view line, bool truncated) {
    if (truncated) {
      if (callbacks_.on_bad_report) {
        callbacks_.on_bad_report(
            line.substr(0, 200),
            absl::InvalidArgumentError(absl::StrCat("report line: longer than ",
                                                    options_.max_report_line_bytes, " bytes")));
      }
      return;
    }
    if (IsBlank(line)) return;
    absl::StatusOr<v1::TrainerMessage> message = ParseTrainerMessage(line);
    if (!message.ok()) {
      if (callbacks_.on_bad_report) {
        callbacks_.on_bad_report(line, message.status());
      }
      return;
    }
    if (message->kind_case() == v1::TrainerMessage::kError) last_error_ = message->error();
    if (callbacks_.on_message) callbacks_.on_message(*std::move(message));
  };
  const LineSplitter::Emit on_output = [this](absl::string_view line, bool truncated) {
    if (IsBlank(line)) return;
    last_output_ = std::string(line);
    if (callbacks_.on_output) callbacks_.on_output(std::string(line), truncated);
  };
  // Reads what is available now (bounded, so one chatty pipe cannot starve the exit checks);
  // closes the fd at EOF.
  auto drain = [](int* fd, LineSplitter* lines, const LineSplitter::Emit& emit) {
    char buf[64 << 10];
    for (int i = 0; i < 16 && *fd >= 0; ++i) {
      const ssize_t n = read(*fd, buf, sizeof(buf));
      if (n > 0) {
        lines->Append(absl::string_view(buf, static_cast<size_t>(n)), emit);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      lines->Finish(emit);
      close(*fd);
      *fd = -1;
    }
  };

  bool leader_exited = false;
  absl::Time drain_deadline = absl::InfiniteFuture();
  while (true) {
    pollfd fds[2];
    nfds_t nfds = 0;
    if (report_fd_ >= 0) fds[nfds++] = {report_fd_, POLLIN, 0};
    if (output_fd_ >= 0) fds[nfds++] = {output_fd_, POLLIN, 0};
    poll(nfds > 0 ? fds : nullptr, nfds, kTickMs);
    drain(&report_fd_, &report_lines, on_report);
    drain(&output_fd_, &output_lines, on_output);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (kill_at_.has_value() && !killed_ && absl::Now() >= *kill_at_) {
        kill(-pid_, SIGKILL);
        killed_ = true;
      }
    }
    if (!leader_exited) {
      siginfo_t info;
      memset(&info, 0, sizeof(info));
      const int rc = waitid(P_PID, pid_, &info, WEXITED | WNOHANG | WNOWAIT);
      if (rc == 0 && info.si_pid == pid_) {
        leader_exited = true;
        // Unreaped, the leader still holds its pid and so its group id: this reaches only
        // what the trainer left behind.
        kill(-pid_, SIGKILL);
        drain_deadline = absl::Now() + options_.drain_timeout;
      } else if (rc < 0 && errno == ECHILD) {
        // Reaped behind our back (SIGCHLD ignored): the group id may already be reused, so
        // nothing is signalled.
        leader_exited = true;
        drain_deadline = absl::Now() + options_.drain_timeout;
      }
    }
    if (leader_exited && ((report_fd_ < 0 && output_fd_ < 0) || absl::Now() >= drain_deadline)) {
      break;
    }
  }
  for (auto [fd, lines, emit] : {std::tuple{&report_fd_, &report_lines, &on_report},
                                 std::tuple{&output_fd_, &output_lines, &on_output}}) {
    if (*fd < 0) continue;
    lines->Finish(*emit);
    close(*fd);
    *fd = -1;
  }

  TrainerExit exit;
  {
    std::lock_guard<std::mutex> lock(mu_);
    int status = 0;
    pid_t reaped = 0;
    do {
      reaped = waitpid(pid_, &status, 0);
    } while (reaped < 0 && errno == EINTR);
    reaped_ = true;
    exit.terminated = terminated_;
    if (reaped != pid_) {
      // Only when SIGCHLD is ignored, which reaps children behind our back.
      exit.exit_code = -1;
      exit.error = "the trainer's exit status was lost (SIGCHLD is ignored)";
    } else if (WIFSIGNALED(status)) {
      exit.exit_code = -1;
      exit.signal = WTERMSIG(status);
    } else {
      exit.exit_code = WEXITSTATUS(status);
    }
  }
  if (exit.error.empty()) exit.error = last_error_;
  exit.last_output = last_output_;
  if (callbacks_.on_exit) callbacks_.on_exit(exit);
  {
    std::lock_guard<std::mutex> lock(mu_);
    exited_ = true;
  }
  exited_cv_.notify_all();
}

}  // namespace boulder::agent
