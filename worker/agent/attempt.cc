#include "worker/agent/attempt.h"

#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace boulder::agent {
namespace {

// Malformed report lines logged per attempt; a trainer that writes garbage on its report fd
// must not flood the agent's log.
constexpr int kMaxMalformedLinesLogged = 5;

google::protobuf::Timestamp Now() {
  const absl::Time now = absl::Now();
  const int64_t seconds = absl::ToUnixSeconds(now);
  google::protobuf::Timestamp ts;
  ts.set_seconds(seconds);
  ts.set_nanos(
      static_cast<int32_t>(absl::ToInt64Nanoseconds(now - absl::FromUnixSeconds(seconds))));
  return ts;
}

std::string DescribeSignal(int signal) {
  const char* abbrev = sigabbrev_np(signal);
  return abbrev == nullptr ? absl::StrCat("signal ", signal)
                           : absl::StrCat("signal ", signal, " (SIG", abbrev, ")");
}

// Writes `content` to `path`, readable by this user only (0600).
absl::Status WriteSecretFile(const std::string& path, const std::string& content) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("writing ", path, ": ", strerror(errno)));
  const ssize_t n = write(fd, content.data(), content.size());
  const int saved = errno;
  close(fd);
  if (n != static_cast<ssize_t>(content.size())) {
    return absl::InternalError(absl::StrCat("writing ", path, ": ", strerror(saved)));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> RendezvousSecurityArgs(const common::ChannelSecurityOptions& security,
                                                const std::string& token_file) {
  std::vector<std::string> args;
  auto add = [&args](const char* flag, const std::string& value) {
    if (value.empty()) return;
    args.push_back(flag);
    args.push_back(value);
  };
  if (security.insecure) args.push_back("--insecure");
  add("--tls-ca", security.ca_file);
  add("--tls-cert", security.cert_file);
  add("--tls-key", security.key_file);
  add("--tls-server-name", security.server_name_override);
  add("--join-token-file", token_file);
  return args;
}

std::vector<std::string> TrainerArgs(const v1::Assignment& assignment, const std::string& spec_path,
                                     int threads, const std::string& backend,
                                     const std::string& checkpoint_dir,
                                     const std::string& coordinator) {
  std::vector<std::string> args = {"--spec",       spec_path,
                                   "--report-fd",  absl::StrCat(kReportFd),
                                   "--job-id",     absl::StrCat(assignment.job_id()),
                                   "--attempt",    absl::StrCat(assignment.attempt()),
                                   "--rank",       absl::StrCat(assignment.rank()),
                                   "--world-size", absl::StrCat(assignment.world_size()),
                                   "--threads",    absl::StrCat(threads)};
  // Rank 0 writes the trained weights into its attempt directory (the trainer's cwd); the
  // agent uploads them to the coordinator before reporting the exit.
  if (assignment.rank() == 0) {
    args.push_back("--weights-out");
    args.push_back(kWeightsFile);
  }
  args.push_back("--quiet");
  if (!backend.empty()) {
    args.push_back("--backend");
    args.push_back(backend);
  }
  if (!checkpoint_dir.empty()) {
    args.push_back("--checkpoint-dir");
    args.push_back(checkpoint_dir);
  }
  if (!coordinator.empty()) {
    args.push_back("--coordinator");
    args.push_back(coordinator);
  }
  return args;
}

absl::Status WriteSpecJson(const v1::JobSpec& spec, const std::string& path) {
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  print.add_whitespace = true;
  std::string json;
  const auto printed = google::protobuf::util::MessageToJsonString(spec, &json, print);
  if (!printed.ok()) {
    return absl::InternalError(
        absl::StrCat("writing ", path, ": ", std::string(printed.message())));
  }
  // Written aside and renamed, so a reader never sees half a spec.
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("writing ", tmp));
  size_t written = 0;
  while (written < json.size()) {
    const ssize_t n = write(fd, json.data() + written, json.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return absl::ErrnoToStatus(err, absl::StrCat("writing ", tmp));
    }
    written += static_cast<size_t>(n);
  }
  if (close(fd) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("writing ", tmp));
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("renaming ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

Attempt::Attempt(v1::Assignment assignment, AttemptOptions options)
    : assignment_(std::move(assignment)),
      options_(std::move(options)),
      label_(absl::StrCat("job ", assignment_.job_id(), " attempt ", assignment_.attempt(),
                          " rank ", assignment_.rank())),
      mfu_{ModelFlopsPerToken(assignment_.spec()), options_.peak_flops},
      buffer_(options_.buffer_limits) {}

Attempt::~Attempt() {
  std::unique_ptr<TrainerProcess> process;
  {
    std::lock_guard<std::mutex> lock(mu_);
    process = std::move(process_);
  }
  // Outside mu_: the supervisor's last callbacks take it.
  process.reset();
}

void Attempt::Log(absl::string_view line) const {
  if (options_.log) options_.log(absl::StrCat(label_, ": ", line));
}

TrainerCallbacks Attempt::Callbacks() {
  TrainerCallbacks callbacks;
  callbacks.on_message = [this](v1::TrainerMessage message) {
    switch (message.kind_case()) {
      case v1::TrainerMessage::kStep: {
        v1::StepReport* step = message.mutable_step();
        // The agent knows which attempt this is; the trainer's copy is not trusted.
        step->set_job_id(assignment_.job_id());
        step->set_attempt(assignment_.attempt());
        step->set_rank(assignment_.rank());
        if (!step->has_time()) *step->mutable_time() = Now();
        if (options_.metrics != nullptr) {
          options_.metrics->RecordStep(assignment_.job_id(), assignment_.rank(), *step, mfu_);
        }
        buffer_.AddStep(std::move(*step));
        break;
      }
      case v1::TrainerMessage::kGeneration:
        buffer_.SetGeneration(std::move(*message.mutable_generation()));
        break;
      case v1::TrainerMessage::kError:
        Log(absl::StrCat("trainer error: ", message.error()));
        break;
      case v1::TrainerMessage::KIND_NOT_SET:
        break;
    }
  };
  callbacks.on_output = [this](std::string line, bool truncated) {
    v1::LogLine log;
    log.set_rank(assignment_.rank());
    log.set_text(truncated ? absl::StrCat(line, " [truncated]") : std::move(line));
    *log.mutable_time() = Now();
    buffer_.AddLog(std::move(log));
  };
  callbacks.on_bad_report = [this](absl::string_view line, const absl::Status& why) {
    ++malformed_lines_;
    if (malformed_lines_ <= kMaxMalformedLinesLogged) {
      Log(absl::StrCat("skipped a malformed report line (", why.message(),
                       "): ", line.substr(0, 200)));
    }
    if (malformed_lines_ == kMaxMalformedLinesLogged) {
      Log("further malformed report lines are skipped silently");
    }
  };
  callbacks.on_exit = [this](const TrainerExit& exit) { OnTrainerExit(exit); };
  return callbacks;
}

void Attempt::Launch() {
  int failure_code = kSpawnFailedExitCode;
  std::string failure;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (launched_) return;
    launched_ = true;
    if (stop_reason_.has_value()) {
      failure_code = -1;
      failure = "stopped before the trainer started";
    } else {
      std::error_code ec;
      std::filesystem::create_directories(options_.dir, ec);
      const std::string spec_path = options_.dir + "/spec.json";
      absl::Status status =
          ec ? absl::InternalError(absl::StrCat("creating ", options_.dir, ": ", ec.message()))
             : WriteSpecJson(assignment_.spec(), spec_path);
      TrainerSpawnOptions spawn;
      if (status.ok()) {
        spawn.path = options_.trainer_path;
        spawn.args = TrainerArgs(assignment_, spec_path, options_.threads, options_.backend,
                                 options_.checkpoint_dir, options_.coordinator);
        if (!options_.security.token.empty()) {
          token_file_ = options_.dir + "/" + kJoinTokenFile;
          status = WriteSecretFile(token_file_, options_.security.token + "\n");
        }
        for (std::string& a : RendezvousSecurityArgs(options_.security, token_file_)) {
          spawn.args.push_back(std::move(a));
        }
      }
      if (status.ok()) {
        spawn.working_dir = options_.dir;
        absl::StatusOr<std::unique_ptr<TrainerProcess>> process =
            TrainerProcess::Start(std::move(spawn), Callbacks());
        if (process.ok()) {
          process_ = *std::move(process);
          Log(absl::StrCat("started trainer, pid ", process_->pid(), ", in ", options_.dir));
          return;
        }
        status = process.status();
      }
      failure = absl::StrCat("could not start the trainer: ", status.message());
    }
  }
  EndWithoutTrainer(failure_code, std::move(failure));
}

bool Attempt::Stop(StopReason reason, absl::Duration grace) {
  std::lock_guard<std::mutex> lock(mu_);
  if (exit_.has_value()) return false;
  const bool first = !stop_reason_.has_value();
  if (first) stop_reason_ = reason;
  if (process_ != nullptr) process_->Terminate(grace);
  return first;
}

v1::RunningTrainer Attempt::running() const {
  v1::RunningTrainer running;
  running.set_job_id(assignment_.job_id());
  running.set_attempt(assignment_.attempt());
  return running;
}

pid_t Attempt::pid() const {
  std::lock_guard<std::mutex> lock(mu_);
  return process_ == nullptr ? 0 : process_->pid();
}

bool Attempt::exited() const {
  std::lock_guard<std::mutex> lock(mu_);
  return exit_.has_value();
}

bool Attempt::WaitForExit(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return exited_cv_.wait_until(lock, absl::ToChronoTime(absl::Now() + timeout),
                               [this] { return exit_.has_value(); });
}

v1::ReportExitRequest Attempt::ExitReport() const {
  std::lock_guard<std::mutex> lock(mu_);
  return exit_.value_or(v1::ReportExitRequest());
}

void Attempt::RemoveTokenFile() {
  std::string path;
  {
    std::lock_guard<std::mutex> lock(mu_);
    path.swap(token_file_);
  }
  if (path.empty()) return;
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    Log(absl::StrCat("could not remove the join token file ", path, ": ", strerror(errno)));
  }
}

void Attempt::OnTrainerExit(const TrainerExit& exit) {
  RemoveTokenFile();
  v1::ReportExitRequest report;
  report.set_job_id(assignment_.job_id());
  report.set_attempt(assignment_.attempt());
  report.set_exit_code(exit.exit_code);
  report.set_signal(exit.signal);
  std::optional<StopReason> reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    reason = stop_reason_;
  }
  report.set_cancelled(reason == StopReason::kCancelled);
  // The most specific explanation available.
  if (!exit.error.empty()) {
    report.set_message(exit.error);
  } else if (reason == StopReason::kShutdown) {
    report.set_message("stopped: the worker agent is shutting down");
  } else if (!exit.last_output.empty()) {
    report.set_message(exit.last_output);
  } else if (exit.signal != 0) {
    report.set_message(absl::StrCat("killed by ", DescribeSignal(exit.signal)));
  } else if (exit.exit_code != 0) {
    report.set_message(absl::StrCat("exited with code ", exit.exit_code));
  }
  if (options_.metrics != nullptr) options_.metrics->RecordExit(exit.exit_code, exit.signal);
  Log(exit.signal != 0 ? absl::StrCat("trainer killed by ", DescribeSignal(exit.signal))
                       : absl::StrCat("trainer exited with code ", exit.exit_code));
  {
    std::lock_guard<std::mutex> lock(mu_);
    exit_ = std::move(report);
  }
  exited_cv_.notify_all();
  if (options_.on_exit) options_.on_exit();
}

void Attempt::EndWithoutTrainer(int exit_code, std::string message) {
  RemoveTokenFile();
  Log(message);
  if (options_.metrics != nullptr) options_.metrics->RecordExit(exit_code, 0);
  v1::ReportExitRequest report;
  report.set_job_id(assignment_.job_id());
  report.set_attempt(assignment_.attempt());
  report.set_exit_code(exit_code);
  report.set_message(std::move(message));
  {
    std::lock_guard<std::mutex> lock(mu_);
    report.set_cancelled(stop_reason_ == StopReason::kCancelled);
    exit_ = std::move(report);
  }
  exited_cv_.notify_all();
  if (options_.on_exit) options_.on_exit();
}

}  // namespace boulder::agent
