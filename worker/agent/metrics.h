// The worker node's Prometheus metrics: what its trainers report (loss, learning rate, grad
// norm, step, step time, tokens, memory) labelled {job, rank}, trainer exits by {code}, and
// the age of the last heartbeat the coordinator acknowledged.
//
// One registry; every family is built in the constructor. A (job, rank) pair's series are
// created at its first step report and kept after its trainer exits, so the last values stay
// scrapeable; the label set stays small because a worker runs few jobs in its lifetime.
//
// Thread-safe.
#ifndef BOULDER_WORKER_AGENT_METRICS_H_
#define BOULDER_WORKER_AGENT_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "boulder/v1/job.pb.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace boulder::agent {

class AgentMetrics {
 public:
  AgentMetrics();
  ~AgentMetrics();
  AgentMetrics(const AgentMetrics&) = delete;
  AgentMetrics& operator=(const AgentMetrics&) = delete;

  // Serves GET /metrics over HTTP at `listen` ("HOST:PORT"; port 0 picks a free one) until
  // destruction, and returns the port bound.
  // INVALID_ARGUMENT: not HOST:PORT. UNAVAILABLE: the address cannot be bound (in use, not
  // local). FAILED_PRECONDITION: already serving.
  absl::StatusOr<int> Serve(const std::string& listen);

  void RecordStep(int64_t job_id, int32_t rank, const v1::StepReport& step);
  // exit_code as in ReportExitRequest: -1 with `signal` set when killed by a signal.
  void RecordExit(int exit_code, int signal);
  // The coordinator acknowledged a heartbeat (or a registration) at `when`.
  void RecordHeartbeat(absl::Time when);

  // Everything, in the Prometheus text exposition format (what a scrape returns).
  std::string Render() const;

 private:
  class Collector;
  struct TrainerSeries {
    prometheus::Gauge* loss;
    prometheus::Gauge* learning_rate;
    prometheus::Gauge* grad_norm;
    prometheus::Gauge* step;
    prometheus::Histogram* step_duration;
    prometheus::Counter* tokens;
    prometheus::Gauge* tokens_per_second;
    prometheus::Gauge* memory_allocated;
    prometheus::Gauge* memory_peak;
    prometheus::Gauge* memory_reserved;
    prometheus::Gauge* device_memory_total;
    int64_t last_tokens_processed = 0;
  };

  TrainerSeries& SeriesLocked(int64_t job_id, int32_t rank);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& learning_rate_;
  prometheus::Family<prometheus::Gauge>& grad_norm_;
  prometheus::Family<prometheus::Gauge>& step_;
  prometheus::Family<prometheus::Histogram>& step_duration_;
  prometheus::Family<prometheus::Counter>& tokens_;
  prometheus::Family<prometheus::Gauge>& tokens_per_second_;
  prometheus::Family<prometheus::Gauge>& memory_allocated_;
  prometheus::Family<prometheus::Gauge>& memory_peak_;
  prometheus::Family<prometheus::Gauge>& memory_reserved_;
  prometheus::Family<prometheus::Gauge>& device_memory_total_;
  prometheus::Family<prometheus::Counter>& exits_;
  prometheus::Gauge& heartbeat_age_;
  std::shared_ptr<Collector> collector_;  // the registry, with the heartbeat age refreshed

  mutable std::mutex mu_;
  std::map<std::pair<int64_t, int32_t>, TrainerSeries> series_;  // guarded by mu_
  absl::Time last_heartbeat_;                                    // guarded by mu_
  std::unique_ptr<prometheus::Exposer> exposer_;                 // guarded by mu_
};

}  // namespace boulder::agent

#endif  // BOULDER_WORKER_AGENT_METRICS_H_
