// The coordinator process: gRPC server (JobService, WorkerService, health checking,
// reflection), the Prometheus endpoint and the liveness thread around one Coordinator.
#ifndef BOULDER_SERVER_SERVER_H_
#define BOULDER_SERVER_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc_security.h"
#include "server/auth.h"
#include "server/coordinator.h"
#include "server/metrics.h"
#include "server/weights_store.h"
#include "server/rendezvous.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace boulder::server {

class JobServiceImpl;
class WorkerServiceImpl;

struct ServerOptions {
  // gRPC address, "HOST:PORT"; port 0 picks a free port (see CoordinatorServer::address()).
  std::string listen = "127.0.0.1:7070";
  // SQLite file, created if missing.
  std::string db_path;
  // Where finished jobs' trained weights are kept (server/weights_store.h); empty:
  // db_path + ".weights".
  std::string weights_dir;
  // Prometheus endpoint ("/metrics"), "HOST:PORT"; empty: none. Port 0 picks a free port.
  std::string metrics_listen;
  // A second, plaintext gRPC port serving only grpc.health.v1.Health, for probes that cannot
  // speak TLS (Kubernetes' grpc probes), "HOST:PORT"; empty: none. Port 0 picks a free port.
  std::string health_listen;
  // See CoordinatorOptions.
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  // How long Shutdown lets RPCs in flight finish before cancelling them.
  absl::Duration shutdown_grace = absl::Seconds(5);
  // TLS (server certificate, optional client CA for mutual TLS) or, explicitly, plaintext.
  common::ServerSecurityOptions security;
  // The users/tokens file (server/auth.h says its format). Required unless security.insecure;
  // empty with insecure: no authentication, every caller is an anonymous admin.
  std::string auth_file;
};

// A running coordinator. Thread-safe.
class CoordinatorServer {
 public:
  // Opens the database, loads state, starts serving. INVALID_ARGUMENT for malformed
  // addresses or durations, bad TLS files or a bad tokens file (or none without insecure),
  // UNAVAILABLE when an address cannot be bound, and the JobStore's errors for the database.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(const ServerOptions& options);

  // Shuts down if still running.
  ~CoordinatorServer();
  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;

  // "HOST:PORT" with the port actually bound.
  const std::string& address() const { return address_; }
  // "HOST:PORT" of the metrics endpoint; empty without one.
  const std::string& metrics_address() const { return metrics_address_; }
  // "HOST:PORT" of the plaintext health port; empty without one.
  const std::string& health_address() const { return health_address_; }

  Coordinator& coordinator() { return *coordinator_; }
  ServerMetrics& metrics() { return *metrics_; }

  // Health NOT_SERVING, gRPC Shutdown with the grace deadline (streams still open are
  // cancelled then), stops the liveness thread, flushes worker state and closes the database.
  // Idempotent.
  void Shutdown();

 private:
  CoordinatorServer() = default;
  void LivenessLoop();

  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<WeightsStore> weights_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<RendezvousService> rendezvous_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::Server> health_server_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string address_;
  std::string metrics_address_;
  std::string health_address_;
  absl::Duration shutdown_grace_;
  absl::Duration liveness_period_;
  std::thread liveness_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

// The boulder-coordinator binary: starts the server, prints common::kInsecureWarning to stderr
// when running plaintext and a warning when authentication is off, then
//   "boulder-coordinator listening on HOST:PORT"   (and "metrics on HOST:PORT",
//   "health on HOST:PORT")
// to stdout once serving, then serves until SIGTERM or SIGINT and shuts down. Returns the
// process exit code: 0 after a clean shutdown, 1 if it could not start (the reason on stderr).
// REQUIRES: called from main() before any other thread exists (it blocks the two signals so
// that every thread inherits the mask and sigwait() receives them).
int Run(const ServerOptions& options);

}  // namespace boulder::server

#endif  // BOULDER_SERVER_SERVER_H_
