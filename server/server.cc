#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <algorithm>
#include <exception>
#include <iostream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/exposer.h"
#include "server/services.h"

namespace boulder::server {
namespace {

// "HOST:PORT" -> HOST (brackets of an IPv6 host kept), or an error naming `flag`.
absl::StatusOr<std::string> HostOf(const std::string& address, const char* flag) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": expected HOST:PORT, got '", address, "'"));
  }
  return address.substr(0, colon);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const ServerOptions& options) {
  auto host = HostOf(options.listen, "listen");
  if (!host.ok()) return host.status();
  if (options.heartbeat_timeout <= absl::ZeroDuration() ||
      options.heartbeat_interval <= absl::ZeroDuration() ||
      options.heartbeat_interval >= options.heartbeat_timeout) {
    return absl::InvalidArgumentError(
        absl::StrCat("heartbeat_interval (", absl::FormatDuration(options.heartbeat_interval),
                     ") and heartbeat_timeout (", absl::FormatDuration(options.heartbeat_timeout),
                     ") must be positive, the interval shorter than the timeout"));
  }
  if (options.db_path.empty()) return absl::InvalidArgumentError("db: a path is required");
  std::string health_host;
  if (!options.health_listen.empty()) {
    auto h = HostOf(options.health_listen, "health_listen");
    if (!h.ok()) return h.status();
    health_host = *std::move(h);
  }
  std::string metrics_host;
  if (!options.metrics_listen.empty()) {
    auto h = HostOf(options.metrics_listen, "metrics_listen");
    if (!h.ok()) return h.status();
    metrics_host = *std::move(h);
  }

  auto credentials = common::MakeServerCredentials(options.security);
  if (!credentials.ok()) return credentials.status();
  std::unique_ptr<Authenticator> auth;
  if (!options.auth_file.empty()) {
    auto a = Authenticator::LoadFile(options.auth_file);
    if (!a.ok()) return a.status();
    auth = *std::move(a);
  } else if (!options.security.insecure) {
    return absl::InvalidArgumentError(
        "auth_file: a tokens file is required (authentication may be off only with --insecure)");
  }

  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  s->auth_ = std::move(auth);
  s->shutdown_grace_ = options.shutdown_grace;
  // Often enough that a lost worker is noticed well within 10% of the timeout.
  s->liveness_period_ =
      std::clamp(options.heartbeat_timeout / 10, absl::Milliseconds(10), absl::Seconds(1));
  s->metrics_ = std::make_unique<ServerMetrics>();
  auto store = JobStore::Open(options.db_path);
  if (!store.ok()) return store.status();
  CoordinatorOptions copts;
  copts.heartbeat_timeout = options.heartbeat_timeout;
  copts.heartbeat_interval = options.heartbeat_interval;
  auto coordinator = Coordinator::Create(*std::move(store), s->metrics_.get(), copts);
  if (!coordinator.ok()) return coordinator.status();
  s->coordinator_ = *std::move(coordinator);

  if (!options.metrics_listen.empty()) {
    try {
      s->exposer_ = std::make_unique<prometheus::Exposer>(options.metrics_listen);
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("metrics_listen: cannot listen on ",
                                                 options.metrics_listen, ": ", e.what()));
    }
    s->exposer_->RegisterCollectable(s->metrics_->registry());
    std::vector<int> ports = s->exposer_->GetListeningPorts();
    if (ports.empty()) {
      return absl::UnavailableError(
          absl::StrCat("metrics_listen: cannot listen on ", options.metrics_listen));
    }
    s->metrics_address_ = absl::StrCat(metrics_host, ":", ports.front());
  }

  WeightsStoreOptions wopts;
  wopts.dir = options.weights_dir.empty() ? options.db_path + ".weights" : options.weights_dir;
  auto weights = WeightsStore::Open(wopts);
  if (!weights.ok()) return weights.status();
  s->weights_ = *std::move(weights);

  s->job_service_ =
      std::make_unique<JobServiceImpl>(s->coordinator_.get(), s->metrics_.get(),
                                       s->weights_.get(), s->auth_.get());
  s->worker_service_ = std::make_unique<WorkerServiceImpl>(s->coordinator_.get(), s->metrics_.get(),
                                                           s->weights_.get(), s->auth_.get());
  RendezvousOptions ropts;
  ropts.check_scope = [coordinator = s->coordinator_.get()](int64_t job_id,
                                                            int32_t attempt) -> absl::Status {
    absl::StatusOr<v1::Job> job = coordinator->GetJob(job_id);
    if (!job.ok()) return job.status();
    if (!IsActive(job->state()) || job->attempt() != attempt) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " attempt ", attempt, " is not running (job is ",
                       v1::JobState_Name(job->state()), " at attempt ", job->attempt(), ")"));
    }
    return absl::OkStatus();
  };
  // Trainers rendezvous with their worker's join token.
  ropts.authorize = [auth = s->auth_.get()](const grpc::ServerContextBase& context) {
    absl::StatusOr<Principal> caller = Caller(auth, context);
    if (!caller.ok()) return caller.status();
    return RequireWorker(*caller);
  };
  s->rendezvous_service_ = std::make_unique<RendezvousService>(ropts, s->metrics_.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Without this, gRPC sets SO_REUSEPORT and a second coordinator could share the port.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  common::SetServerMessageLimits(&builder);
  builder.AddListeningPort(options.listen, *credentials, &port);
  builder.RegisterService(s->job_service_.get());
  builder.RegisterService(s->worker_service_.get());
  builder.RegisterService(s->rendezvous_service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("listen: cannot listen on ", options.listen));
  }
  s->address_ = absl::StrCat(*host, ":", port);
  if (!options.health_listen.empty()) {
    // Health only: no job or worker service is reachable without TLS and a token here.
    grpc::ServerBuilder health;
    health.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    health.SetMaxReceiveMessageSize(4096);
    int health_port = 0;
    health.AddListeningPort(options.health_listen, grpc::InsecureServerCredentials(), &health_port);
    s->health_server_ = health.BuildAndStart();
    if (s->health_server_ == nullptr || health_port == 0) {
      return absl::UnavailableError(
          absl::StrCat("health_listen: cannot listen on ", options.health_listen));
    }
    s->health_address_ = absl::StrCat(health_host, ":", health_port);
    s->health_server_->GetHealthCheckService()->SetServingStatus(true);
  }
  s->server_->GetHealthCheckService()->SetServingStatus(true);
  s->liveness_ = std::thread([raw = s.get()] { raw->LivenessLoop(); });
  return s;
}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

void CoordinatorServer::LivenessLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), liveness_period_);
    if (stopping_) break;
    mu_.Unlock();
    absl::Status s = coordinator_->CheckLiveness();
    // The loop is this status's edge: report it and try again next period.
    if (!s.ok()) std::cerr << "boulder-coordinator: liveness check: " << s << std::endl;
    mu_.Lock();
  }
}

void CoordinatorServer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  if (health_server_ != nullptr) health_server_->GetHealthCheckService()->SetServingStatus(false);
  if (server_ != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(false);
    server_->Shutdown(std::chrono::system_clock::now() +
                      absl::ToChronoMilliseconds(shutdown_grace_));
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (liveness_.joinable()) liveness_.join();
  if (coordinator_ != nullptr) {
    if (absl::Status s = coordinator_->Flush(); !s.ok()) {
      std::cerr << "boulder-coordinator: saving worker state: " << s << std::endl;
    }
  }
  if (health_server_ != nullptr) {
    health_server_->Shutdown(std::chrono::system_clock::now());
    health_server_.reset();
  }
  server_.reset();
  exposer_.reset();
  worker_service_.reset();
  job_service_.reset();
  coordinator_.reset();  // closes the database
}

int Run(const ServerOptions& options) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (options.security.insecure) std::cerr << common::kInsecureWarning << std::endl;
  if (options.auth_file.empty()) {
    std::cerr << "WARNING: no --auth-file: authentication is off; every caller may submit, "
                 "read and cancel every job and act as a worker."
              << std::endl;
  }
  auto server = CoordinatorServer::Start(options);
  if (!server.ok()) {
    std::cerr << "boulder-coordinator: " << server.status().message() << std::endl;
    return 1;
  }
  std::cout << "boulder-coordinator listening on " << (*server)->address() << std::endl;
  if (!(*server)->metrics_address().empty()) {
    std::cout << "metrics on " << (*server)->metrics_address() << std::endl;
  }
  if (!(*server)->health_address().empty()) {
    std::cout << "health on " << (*server)->health_address() << std::endl;
  }
  int sig = 0;
  sigwait(&signals, &sig);
  (*server)->Shutdown();
  return 0;
}

}  // namespace boulder::server
