// The coordinator's Prometheus metrics: one registry, every family built in the constructor,
// children kept as references. Labels come only from small bounded sets (job state, worker
// state, RPC method, status code).
//
// Thread-safe: every method may be called from any thread.
#ifndef BOULDER_SERVER_METRICS_H_
#define BOULDER_SERVER_METRICS_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "boulder/v1/job.pb.h"
#include "boulder/v1/worker.pb.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace boulder::server {

class ServerMetrics {
 public:
  ServerMetrics();
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  // The registry to expose (shared with the HTTP exposer, which holds a weak reference).
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // One finished RPC: counts it under (method, code) and records its duration.
  void ObserveRpc(absl::string_view method, absl::StatusCode code, double seconds);

  // Replaces the per-state job counts; states absent from `counts` read 0. The QUEUED count
  // is also the queue length.
  void SetJobCounts(const std::map<v1::JobState, int64_t>& counts);

  // Replaces the per-state worker counts; states absent from `counts` read 0.
  void SetWorkerCounts(const std::map<v1::WorkerState, int64_t>& counts);

  // A job went from submission to its first step report in `seconds`.
  void ObserveSubmitToRunning(double seconds);

  // A worker was declared lost after missing its heartbeats.
  void IncHeartbeatsMissed();

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Gauge& queue_length_;
  prometheus::Family<prometheus::Gauge>& workers_;
  prometheus::Family<prometheus::Counter>& rpc_requests_;
  prometheus::Family<prometheus::Histogram>& rpc_duration_;
  prometheus::Histogram& submit_to_running_;
  prometheus::Counter& heartbeats_missed_;
  // Children built at start-up, by label value.
  std::map<v1::JobState, prometheus::Gauge*> jobs_by_state_;
  std::map<v1::WorkerState, prometheus::Gauge*> workers_by_state_;
  std::map<std::string, prometheus::Histogram*, std::less<>> duration_by_method_;
};

}  // namespace boulder::server

#endif  // BOULDER_SERVER_METRICS_H_
