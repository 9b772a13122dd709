// The worker node's Prometheus metrics: what its trainers report (loss, learning rate, grad
// norm, step, step time, tokens, tokens/s, model FLOP utilisation, memory) labelled
// {job_id, rank}; FP8 scaling statistics labelled {job_id, rank, layer, tensor, role}; trainer
// exits by {code}; and the age of the last heartbeat the coordinator acknowledged. The job's
// label is job_id, not job: Prometheus gives every scraped series the target's `job` label
// (the scrape job's name) and would rename ours to exported_job.
//
// One registry; every family is built in the constructor. A (job, rank) pair's series are
// created at its first step report and kept after its trainer exits, so the last values stay
// scrapeable; the label set stays small because a worker runs few jobs in its lifetime.
//
// Thread-safe. A scrape sees one step report's values together: it never mixes the loss of
// one step with the step number of another.
#ifndef BOULDER_WORKER_AGENT_METRICS_H_
#define BOULDER_WORKER_AGENT_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "boulder/v1/job.pb.h"
#include "boulder/v1/spec.pb.h"
#include "boulder/v1/worker.pb.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace boulder::agent {

// Model FLOPs of training on one token (forward and backward) with `spec`'s model: 6 per weight
// of every matrix multiply, N = L*(4*C^2 + 2*C*F) + V*C (attention and MLP projections and the
// LM head, tied or not; embedding lookups, biases and LayerNorms are not multiplies), plus
// 12*L*T*C for the attention scores and their product with the values at sequence length T
// (PaLM's estimate, which does not halve for the causal mask). REQUIRES: `spec` is resolved
// (every model field set). 0 when a dimension is missing.
double ModelFlopsPerToken(const v1::JobSpec& spec);

// The peak FLOP/s the MFU ratio divides by: for a CUDA worker, the dense tensor-core peak of its
// GPU (SXM parts; BF16, FP8 twice that on Hopper and Ada, TF32 half that for fp32 jobs), from a
// table of known GPUs (0 for others: no MFU is exported); for a CPU worker, an estimate:
// `threads` (0: all of capabilities.cpu_cores) x the clock /proc/cpuinfo reports x the FP32
// FLOPs one core's fused multiply-adds retire per cycle (64 with AVX-512, 32 with AVX2 and
// FMA, 16 with AVX or AVX2 alone, 8 otherwise).
double PeakFlops(const v1::WorkerCapabilities& capabilities, absl::string_view precision,
                 int threads);

// The CPU estimate above from the text of /proc/cpuinfo, for `cores` cores; 0 when it names no
// clock.
double CpuPeakFlops(absl::string_view cpuinfo, int cores);

// What turns a step's tokens/s into model FLOP utilisation; MFU is exported only when both are
// positive.
struct MfuInputs {
  double model_flops_per_token = 0;  // ModelFlopsPerToken
  double peak_flops = 0;             // PeakFlops
};

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

  // One step report of rank `rank` of job `job_id`; `mfu` says how to turn its tokens/s into
  // boulder_trainer_mfu_ratio.
  void RecordStep(int64_t job_id, int32_t rank, const v1::StepReport& step, MfuInputs mfu = {});
  // exit_code as in ReportExitRequest: -1 with `signal` set when killed by a signal.
  void RecordExit(int exit_code, int signal);
  // The coordinator acknowledged a heartbeat (or a registration) at `when`.
  void RecordHeartbeat(absl::Time when);

  // Everything, in the Prometheus text exposition format (what a scrape returns).
  std::string Render() const;

 private:
  class Collector;
  struct Fp8Series {
    prometheus::Gauge* scale;
    prometheus::Gauge* amax;
    prometheus::Gauge* saturated_ratio;
    prometheus::Gauge* underflow_ratio;
  };
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
    prometheus::Gauge* mfu = nullptr;  // created at the first report with MfuInputs
    prometheus::Gauge* val_loss = nullptr;  // created at the first report with a val_loss
    // Created at the first report with FP8 statistics or a skipped step.
    prometheus::Gauge* skipped_steps = nullptr;
    int64_t last_tokens_processed = 0;
    // By (layer, tensor, role).
    std::map<std::tuple<int32_t, std::string, std::string>, Fp8Series> fp8;
  };

  TrainerSeries& SeriesLocked(int64_t job_id, int32_t rank);
  void RecordFp8Locked(int64_t job_id, int32_t rank, TrainerSeries& s, const v1::StepReport& step);

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
  prometheus::Family<prometheus::Gauge>& mfu_;
  prometheus::Family<prometheus::Gauge>& val_loss_;
  prometheus::Family<prometheus::Gauge>& fp8_scale_;
  prometheus::Family<prometheus::Gauge>& fp8_amax_;
  prometheus::Family<prometheus::Gauge>& fp8_saturated_;
  prometheus::Family<prometheus::Gauge>& fp8_underflow_;
  prometheus::Family<prometheus::Gauge>& skipped_steps_;
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
