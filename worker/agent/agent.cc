#include "worker/agent/agent.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/spec_checkpoint.h"
#include "common/status_util.h"
#include "worker/agent/capabilities.h"
#include "worker/agent/console.h"
#include "worker/agent/gpu_probe.h"

namespace boulder::agent {
namespace {

// What one ReportSteps call carries at most, and how many calls one trainer gets per pass
// before the reporter moves on to the next.
constexpr size_t kMaxStepsPerCall = 512;
constexpr size_t kMaxLogsPerCall = 512;
constexpr int kMaxCallsPerPass = 8;
// Attempts remembered as done here, so a repeated assignment does not run twice. Job ids grow,
// so the smallest key is the oldest.
constexpr size_t kMaxFinished = 4096;
// Extra time, beyond the kill grace, Shutdown waits for a SIGKILLed trainer to be reaped.
constexpr absl::Duration kReapSlack = absl::Seconds(5);

// Errors a retry cannot fix: the coordinator understood and refused.
bool IsPermanent(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::UNIMPLEMENTED:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::ALREADY_EXISTS:
      return true;
    default:
      return false;
  }
}

std::string Describe(const grpc::Status& status) {
  return common::FromGrpcStatus(status).ToString();
}

// Makes `*path` (when set) absolute against the working directory.
absl::Status MakeAbsolute(std::string* path, absl::string_view flag) {
  if (path->empty()) return absl::OkStatus();
  std::error_code ec;
  std::filesystem::path absolute = std::filesystem::absolute(*path, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat(flag, " ", *path, ": ", ec.message()));
  *path = absolute.lexically_normal().string();
  return absl::OkStatus();
}

}  // namespace

absl::Status ResolveRelativePaths(AgentOptions* options) {
  for (auto [path, flag] : {std::pair{&options->work_dir, "--work-dir"},
                            std::pair{&options->checkpoint_root, "--checkpoint-root"},
                            std::pair{&options->security.ca_file, "--tls-ca"},
                            std::pair{&options->security.cert_file, "--tls-cert"},
                            std::pair{&options->security.key_file, "--tls-key"}}) {
    if (absl::Status s = MakeAbsolute(path, flag); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Agent>> Agent::Create(AgentOptions options) {
  if (!options.print) options.print = PrintToStdout;
  if (!options.log) options.log = LogToStderr;
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError("--coordinator: required (HOST:PORT)");
  }
  if (options.threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads: must be 0 (all cores) or more, got ", options.threads));
  }
  const GpuProbeResult probe = ProbeGpus();
  absl::StatusOr<BackendChoice> choice = ChooseBackend(options.backend, probe, kCudaBackendBuilt);
  if (!choice.ok()) return choice.status();
  if (options.trainer_path.empty()) return absl::InvalidArgumentError("--trainer: required");
  std::error_code ec;
  if (!std::filesystem::is_regular_file(options.trainer_path, ec) ||
      access(options.trainer_path.c_str(), X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--trainer ", options.trainer_path,
        ": not an executable file (build the boulder-trainer target or pass --trainer)"));
  }
  if (options.work_dir.empty()) return absl::InvalidArgumentError("--work-dir: required");
  if (absl::Status s = ResolveRelativePaths(&options); !s.ok()) return s;
  std::filesystem::create_directories(options.work_dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--work-dir ", options.work_dir, ": ", ec.message()));
  }

  if (options.checkpoint_root.empty()) options.checkpoint_root = options.work_dir + "/checkpoints";
  std::filesystem::create_directories(options.checkpoint_root, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint-root ", options.checkpoint_root, ": ", ec.message()));
  }

  // Reconnect quickly after a coordinator restart instead of gRPC's default (up to 2 min).
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  auto channel = common::CreateSecureChannel(options.coordinator, options.security, args);
  if (!channel.ok()) return channel.status();

  options.log(absl::StrCat("backend ", choice->backend, " (", choice->note, ")"));

  std::unique_ptr<Agent> agent(
      new Agent(std::move(options), BuildCapabilities(*choice, probe), *std::move(channel)));
  const AgentOptions& opts = agent->options_;
  if (!opts.metrics_listen.empty()) {
    absl::StatusOr<int> port = agent->metrics_.Serve(opts.metrics_listen);
    if (!port.ok()) return port.status();
    agent->metrics_port_ = *port;
    const std::string host = opts.metrics_listen.substr(0, opts.metrics_listen.rfind(':'));
    opts.print(absl::StrCat("metrics on ", host, ":", *port));
  }
  return agent;
}

Agent::Agent(AgentOptions options, v1::WorkerCapabilities capabilities,
             std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      capabilities_(std::move(capabilities)),
      stub_(v1::WorkerService::NewStub(channel)) {}

Agent::~Agent() { Shutdown(); }

void Agent::Log(absl::string_view line) const { options_.log(line); }

std::string Agent::worker_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return worker_id_;
}

void Agent::Start() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (started_ || stopping_) return;
    started_ = true;
  }
  heartbeat_thread_ = std::thread(&Agent::HeartbeatLoop, this);
  reporter_thread_ = std::thread(&Agent::ReportLoop, this);
}

void Agent::Shutdown() {
  // No assignment starts once stopping_ is set, so this snapshot holds every trainer.
  std::vector<std::shared_ptr<Attempt>> attempts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    stopping_ = true;
    for (const auto& [key, attempt] : attempts_) attempts.push_back(attempt);
  }
  for (const auto& attempt : attempts) {
    if (attempt->Stop(Attempt::StopReason::kShutdown, options_.kill_grace)) {
      Log(absl::StrCat(attempt->label(), ": stopping the trainer"));
    }
  }
  // Heartbeats go on meanwhile, so the coordinator does not declare this worker lost while a
  // trainer takes its grace period.
  for (const auto& attempt : attempts) attempt->WaitForExit(options_.kill_grace + kReapSlack);
  {
    std::lock_guard<std::mutex> lock(mu_);
    heartbeat_stop_ = true;
    if (heartbeat_call_ != nullptr) heartbeat_call_->TryCancel();
  }
  cv_.notify_all();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    reporter_stop_ = true;
    reporter_wake_ = true;
    reporter_deadline_ = absl::Now() + options_.shutdown_report_timeout;
  }
  cv_.notify_all();
  if (reporter_thread_.joinable()) reporter_thread_.join();
  std::map<Key, std::shared_ptr<Attempt>> unreported;
  {
    std::lock_guard<std::mutex> lock(mu_);
    unreported.swap(attempts_);
  }
  if (!unreported.empty()) {
    Log(absl::StrCat("could not report ", unreported.size(),
                     " trainer exit(s) to the coordinator before shutting down"));
  }
}

template <typename Call>
grpc::Status Agent::HeartbeatRpc(Call call) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (heartbeat_stop_) return grpc::Status(grpc::StatusCode::CANCELLED, "shutting down");
    heartbeat_call_ = &context;
  }
  grpc::Status status = call(&context);
  std::lock_guard<std::mutex> lock(mu_);
  heartbeat_call_ = nullptr;
  return status;
}

template <typename Call>
grpc::Status Agent::ReporterRpc(Call call) {
  absl::Time deadline = absl::Now() + options_.rpc_timeout;
  {
    std::lock_guard<std::mutex> lock(mu_);
    deadline = std::min(deadline, reporter_deadline_);
  }
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  return call(&context);
}

void Agent::NoteCoordinatorUp() {
  if (coordinator_down_.exchange(false)) {
    Log(absl::StrCat("coordinator at ", options_.coordinator, " answers again"));
  }
}

void Agent::NoteCoordinatorDown(absl::string_view what, const grpc::Status& status) {
  if (!coordinator_down_.exchange(true)) {
    Log(absl::StrCat(what, " to ", options_.coordinator, " failed (", Describe(status),
                     "); retrying"));
  }
}

// ---- Registration and heartbeats -------------------------------------------------------

bool Agent::Register(bool first) {
  absl::Duration backoff = options_.register_backoff_initial;
  while (true) {
    v1::RegisterWorkerRequest request;
    *request.mutable_capabilities() = capabilities_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      request.set_requested_id(worker_id_.empty() ? options_.id : worker_id_);
    }
    for (v1::RunningTrainer& running : Running()) *request.add_running() = std::move(running);
    v1::RegisterWorkerResponse response;
    grpc::Status status = HeartbeatRpc([&](grpc::ClientContext* context) {
      return stub_->RegisterWorker(context, request, &response);
    });
    if (status.ok() && response.worker_id().empty()) {
      status = grpc::Status(grpc::StatusCode::INTERNAL, "the coordinator returned no worker id");
    }
    if (status.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        worker_id_ = response.worker_id();
        if (response.heartbeat_interval_ms() > 0) {
          heartbeat_interval_ = absl::Milliseconds(response.heartbeat_interval_ms());
        }
      }
      coordinator_down_ = false;
      metrics_.RecordHeartbeat(absl::Now());
      if (first) {
        options_.print(absl::StrCat("boulder-worker ", response.worker_id(), " registered with ",
                                    options_.coordinator, " (backend ", capabilities_.backend(),
                                    ", ", capabilities_.cpu_cores(), " cores)"));
      } else {
        Log(absl::StrCat("registered again as ", response.worker_id(), " with ",
                         request.running_size(), " running trainer(s)"));
      }
      return true;
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (heartbeat_stop_) return false;
    Log(absl::StrCat(
        "cannot register with ", options_.coordinator, ": ",
        common::ExplainClosedConnection(common::FromGrpcStatus(status), options_.security)
            .ToString(),
        "; retrying in ", absl::FormatDuration(backoff)));
    if (cv_.wait_until(lock, absl::ToChronoTime(absl::Now() + backoff),
                       [this] { return heartbeat_stop_; })) {
      return false;
    }
    backoff = std::min(backoff * 2, options_.register_backoff_max);
  }
}

void Agent::HeartbeatLoop() {
  if (!Register(/*first=*/true)) return;
  absl::Time next = absl::Now();
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      next += heartbeat_interval_;
      if (cv_.wait_until(lock, absl::ToChronoTime(next), [this] { return heartbeat_stop_; })) {
        return;
      }
    }
    next = absl::Now();
    v1::HeartbeatRequest request;
    request.set_worker_id(worker_id());
    for (v1::RunningTrainer& running : Running()) *request.add_running() = std::move(running);
    v1::HeartbeatResponse response;
    const grpc::Status status = HeartbeatRpc([&](grpc::ClientContext* context) {
      return stub_->Heartbeat(context, request, &response);
    });
    if (status.ok()) {
      NoteCoordinatorUp();
      metrics_.RecordHeartbeat(absl::Now());
      for (const v1::Assignment& assignment : response.assignments()) StartAttempt(assignment);
      for (const v1::RunningTrainer& cancel : response.cancel()) CancelAttempt(cancel);
    } else if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
      Log(absl::StrCat("the coordinator at ", options_.coordinator, " does not know worker ",
                       request.worker_id(), " (restarted?): registering again"));
      if (!Register(/*first=*/false)) return;
      next = absl::Now();
    } else if (status.error_code() != grpc::StatusCode::CANCELLED) {
      NoteCoordinatorDown("heartbeat", status);
    }
  }
}

std::vector<v1::RunningTrainer> Agent::Running() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::RunningTrainer> running;
  for (const auto& [key, attempt] : attempts_) running.push_back(attempt->running());
  return running;
}

void Agent::StartAttempt(const v1::Assignment& assignment) {
  const Key key{assignment.job_id(), assignment.attempt()};
  std::shared_ptr<Attempt> attempt;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || attempts_.count(key) > 0 || finished_.count(key) > 0) return;
    AttemptOptions attempt_options;
    attempt_options.trainer_path = options_.trainer_path;
    attempt_options.dir = absl::StrCat(options_.work_dir, "/job-", assignment.job_id(), "/attempt-",
                                       assignment.attempt());
    attempt_options.threads = options_.threads;
    attempt_options.checkpoint_dir = common::CheckpointDirectory(
        options_.checkpoint_root, assignment.spec(), assignment.job_id());
    attempt_options.backend = capabilities_.backend();
    attempt_options.coordinator = options_.coordinator;
    attempt_options.security = options_.security;
    attempt_options.buffer_limits = options_.buffer_limits;
    attempt_options.metrics = &metrics_;
    attempt_options.peak_flops =
        PeakFlops(capabilities_, assignment.spec().precision(), options_.threads);
    attempt_options.log = options_.log;
    attempt_options.on_exit = [this] { WakeReporter(); };
    attempt = std::make_shared<Attempt>(assignment, std::move(attempt_options));
    attempts_.emplace(key, attempt);
  }
  Log(absl::StrCat(attempt->label(), ": assigned, world size ", assignment.world_size()));
  attempt->Launch();
}

void Agent::CancelAttempt(const v1::RunningTrainer& running) {
  std::shared_ptr<Attempt> attempt;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = attempts_.find(Key{running.job_id(), running.attempt()});
    if (it == attempts_.end()) return;
    attempt = it->second;
  }
  if (attempt->Stop(Attempt::StopReason::kCancelled, options_.kill_grace)) {
    Log(absl::StrCat(attempt->label(), ": cancelled by the coordinator; stopping the trainer"));
  }
}

// ---- Reporting -------------------------------------------------------------------------

void Agent::WakeReporter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    reporter_wake_ = true;
  }
  cv_.notify_all();
}

void Agent::ReportLoop() {
  while (true) {
    std::vector<std::shared_ptr<Attempt>> attempts;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, absl::ToChronoMilliseconds(options_.flush_interval),
                   [this] { return reporter_wake_; });
      reporter_wake_ = false;
      if (reporter_stop_ && (attempts_.empty() || absl::Now() >= reporter_deadline_)) return;
      for (const auto& [key, attempt] : attempts_) attempts.push_back(attempt);
    }
    for (const auto& attempt : attempts) ReportAttempt(attempt);
  }
}

void Agent::ReportAttempt(const std::shared_ptr<Attempt>& attempt) {
  // Read first: once the attempt has exited, everything its trainer wrote is in the buffer.
  const bool exited = attempt->exited();
  if (!Flush(*attempt) || !exited || !UploadWeights(*attempt) || !SendExit(*attempt)) return;
  const Key key{attempt->job_id(), attempt->attempt()};
  std::lock_guard<std::mutex> lock(mu_);
  attempts_.erase(key);
  finished_.insert(key);
  if (finished_.size() > kMaxFinished) finished_.erase(finished_.begin());
}

bool Agent::Flush(Attempt& attempt) {
  for (int call = 0; call < kMaxCallsPerPass; ++call) {
    ReportBatch batch = attempt.buffer().Take(kMaxStepsPerCall, kMaxLogsPerCall);
    if (batch.empty()) return true;
    v1::ReportStepsRequest request;
    request.set_worker_id(worker_id());
    request.set_job_id(attempt.job_id());
    request.set_attempt(attempt.attempt());
    for (const v1::StepReport& step : batch.steps) *request.add_steps() = step;
    for (const v1::LogLine& log : batch.logs) *request.add_logs() = log;
    if (batch.generation.has_value()) *request.mutable_generation() = *batch.generation;
    v1::ReportStepsResponse response;
    const grpc::Status status = ReporterRpc([&](grpc::ClientContext* context) {
      return stub_->ReportSteps(context, request, &response);
    });
    if (status.ok()) {
      NoteCoordinatorUp();
      if (response.cancel() && attempt.Stop(Attempt::StopReason::kCancelled, options_.kill_grace)) {
        Log(absl::StrCat(attempt.label(),
                         ": the coordinator says it no longer runs here; stopping the trainer"));
      }
      continue;
    }
    if (!IsPermanent(status.error_code())) {
      attempt.buffer().Restore(std::move(batch));
      NoteCoordinatorDown("ReportSteps", status);
      return false;
    }
    Log(absl::StrCat(attempt.label(), ": the coordinator refused ", batch.steps.size(),
                     " step report(s) and ", batch.logs.size(), " log line(s) (", Describe(status),
                     "); dropping them"));
  }
  return attempt.buffer().empty();
}

bool Agent::UploadWeights(Attempt& attempt) {
  if (attempt.weights_done) return true;
  const v1::ReportExitRequest exit = attempt.ExitReport();
  const std::string path = absl::StrCat(attempt.dir(), "/", kWeightsFile);
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (attempt.rank() != 0 || exit.exit_code() != 0 || exit.cancelled() || !in) {
    attempt.weights_done = true;
    return true;
  }
  const int64_t total = static_cast<int64_t>(in.tellg());
  in.seekg(0);
  constexpr int64_t kChunk = 1 << 20;
  int64_t offset = 0;
  do {  // an empty file still sends one (last) chunk
    v1::UploadWeightsRequest request;
    request.set_worker_id(worker_id());
    request.set_job_id(attempt.job_id());
    request.set_attempt(attempt.attempt());
    request.set_format("safetensors");
    request.set_total_bytes(total);
    request.set_offset(offset);
    std::string* data = request.mutable_data();
    data->resize(static_cast<size_t>(std::min(kChunk, total - offset)));
    if (!in.read(data->data(), static_cast<std::streamsize>(data->size()))) {
      Log(absl::StrCat(attempt.label(), ": cannot read ", path, "; not uploading the weights"));
      attempt.weights_done = true;
      return true;
    }
    request.set_last(offset + static_cast<int64_t>(data->size()) == total);
    v1::UploadWeightsResponse response;
    const grpc::Status status = ReporterRpc([&](grpc::ClientContext* context) {
      return stub_->UploadWeights(context, request, &response);
    });
    if (!status.ok()) {
      if (!IsPermanent(status.error_code())) {
        NoteCoordinatorDown("UploadWeights", status);
        return false;  // retried from the start on the next pass
      }
      Log(absl::StrCat(attempt.label(), ": the coordinator refused the weights (", Describe(status),
                       "); the job will have none to export"));
      attempt.weights_done = true;
      return true;
    }
    offset += static_cast<int64_t>(data->size());
  } while (offset < total);
  NoteCoordinatorUp();
  Log(absl::StrCat(attempt.label(), ": uploaded the weights (", total, " bytes)"));
  attempt.weights_done = true;
  return true;
}

bool Agent::SendExit(Attempt& attempt) {
  v1::ReportExitRequest request = attempt.ExitReport();
  request.set_worker_id(worker_id());
  v1::ReportExitResponse response;
  const grpc::Status status = ReporterRpc(
      [&](grpc::ClientContext* context) { return stub_->ReportExit(context, request, &response); });
  if (status.ok()) {
    NoteCoordinatorUp();
    return true;
  }
  if (!IsPermanent(status.error_code())) {
    NoteCoordinatorDown("ReportExit", status);
    return false;
  }
  Log(absl::StrCat(attempt.label(), ": the coordinator refused the exit report (", Describe(status),
                   "); dropping it"));
  return true;
}

}  // namespace boulder::agent
