// The coordinator's rendezvous store (boulder.v1.RendezvousService): a key-value table per
// (job, attempt) through which a job's trainers exchange what they need to connect (Gloo TCP
// addresses, the NCCL unique id). Coordination plane only: collectives never go through it.
//
// Get waits for missing keys without blocking a gRPC thread: the call is parked and finished
// by the Set that completes it, or by the sweeper thread at its deadline (DEADLINE_EXCEEDED
// naming the keys still missing). Keys die with their attempt: the sweeper drops a scope once
// `check_scope` says the attempt no longer runs, and Set/Get on such a scope fail with
// FAILED_PRECONDITION.
//
// Thread-safe. Destroy it after the grpc::Server has shut down; the destructor finishes parked
// calls with UNAVAILABLE.
#ifndef BOULDER_SERVER_RENDEZVOUS_H_
#define BOULDER_SERVER_RENDEZVOUS_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "boulder/v1/rendezvous.grpc.pb.h"
#include "server/metrics.h"

namespace boulder::server {

struct RendezvousOptions {
  // OK when (job_id, attempt) is a running attempt that may use the store; otherwise the
  // error the RPC returns (FAILED_PRECONDITION, NOT_FOUND). Required.
  std::function<absl::Status(int64_t job_id, int32_t attempt)> check_scope;
  // OK when the caller may use the store (the coordinator requires the worker join token);
  // otherwise the error the RPC returns (UNAUTHENTICATED, PERMISSION_DENIED). Null: anyone.
  std::function<absl::Status(const grpc::ServerContextBase& context)> authorize;
  // Longest a Get is held open, whatever wait_ms asks; clients loop for longer waits.
  absl::Duration max_wait = absl::Seconds(30);
  // How often parked calls are checked against their deadline and scopes against check_scope.
  absl::Duration sweep_period = absl::Milliseconds(20);
  absl::Duration scope_check_period = absl::Seconds(1);
  // Limits per scope, so a runaway trainer cannot fill the coordinator's memory.
  size_t max_keys_per_scope = 4096;
  size_t max_value_bytes = 1 << 20;
};

class RendezvousService final : public v1::RendezvousService::CallbackService {
 public:
  // `metrics` is not owned and may be null (tests).
  RendezvousService(RendezvousOptions options, ServerMetrics* metrics);
  ~RendezvousService() override;
  RendezvousService(const RendezvousService&) = delete;
  RendezvousService& operator=(const RendezvousService&) = delete;

  grpc::ServerUnaryReactor* RendezvousSet(grpc::CallbackServerContext* context,
                                          const v1::RendezvousSetRequest* request,
                                          v1::RendezvousSetResponse* response) override;
  grpc::ServerUnaryReactor* RendezvousGet(grpc::CallbackServerContext* context,
                                          const v1::RendezvousGetRequest* request,
                                          v1::RendezvousGetResponse* response) override;

  // Scopes currently holding keys (for tests and metrics).
  size_t NumScopes();

 private:
  using Scope = std::pair<int64_t, int32_t>;
  struct Waiter {
    Scope scope;
    std::vector<std::string> keys;
    int32_t rank = 0;
    v1::RendezvousGetResponse* response = nullptr;
    grpc::ServerUnaryReactor* reactor = nullptr;
    absl::Time deadline;
    absl::Time start;
  };

  // Fills w.response and returns true when every key of `w` is present. REQUIRES: mu_ held.
  bool TryFill(const Waiter& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finish(const Waiter& w, const absl::Status& status);
  void SweepLoop();

  const RendezvousOptions options_;
  ServerMetrics* const metrics_;
  absl::Mutex mu_;
  std::map<Scope, std::map<std::string, std::string>> table_ ABSL_GUARDED_BY(mu_);
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread sweeper_;
};

}  // namespace boulder::server

#endif  // BOULDER_SERVER_RENDEZVOUS_H_
