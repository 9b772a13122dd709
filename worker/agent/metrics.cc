#include "worker/agent/metrics.h"

#include <exception>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace boulder::agent {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

// Step times from a few milliseconds (a small model on a GPU) to minutes (a large one on CPU).
const prometheus::Histogram::BucketBoundaries& StepBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
  return *buckets;
}

}  // namespace

// Refreshes the heartbeat age at scrape time, so it is exact whenever it is read.
class AgentMetrics::Collector : public prometheus::Collectable {
 public:
  explicit Collector(const AgentMetrics* metrics) : metrics_(metrics) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    absl::Time last;
    {
      std::lock_guard<std::mutex> lock(metrics_->mu_);
      last = metrics_->last_heartbeat_;
    }
    metrics_->heartbeat_age_.Set(absl::ToDoubleSeconds(absl::Now() - last));
    return metrics_->registry_->Collect();
  }

 private:
  const AgentMetrics* metrics_;
};

AgentMetrics::AgentMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      loss_(BuildGauge()
                .Name("boulder_trainer_loss")
                .Help("Training loss of the last optimizer step")
                .Register(*registry_)),
      learning_rate_(BuildGauge()
                         .Name("boulder_trainer_learning_rate")
                         .Help("Learning rate of the last optimizer step")
                         .Register(*registry_)),
      grad_norm_(BuildGauge()
                     .Name("boulder_trainer_grad_norm")
                     .Help("Global gradient norm of the last optimizer step, before clipping")
                     .Register(*registry_)),
      step_(BuildGauge()
                .Name("boulder_trainer_step")
                .Help("Last optimizer step finished (1-based)")
                .Register(*registry_)),
      step_duration_(BuildHistogram()
                         .Name("boulder_trainer_step_duration_seconds")
                         .Help("Wall time of one optimizer step")
                         .Register(*registry_)),
      tokens_(BuildCounter()
                  .Name("boulder_trainer_tokens_total")
                  .Help("Tokens trained on")
                  .Register(*registry_)),
      tokens_per_second_(BuildGauge()
                             .Name("boulder_trainer_tokens_per_second")
                             .Help("Training throughput of the last optimizer step")
                             .Register(*registry_)),
      memory_allocated_(BuildGauge()
                            .Name("boulder_trainer_memory_allocated_bytes")
                            .Help("Memory allocated by the trainer's backend")
                            .Register(*registry_)),
      memory_peak_(BuildGauge()
                       .Name("boulder_trainer_memory_peak_bytes")
                       .Help("High-water mark of the trainer's allocated memory")
                       .Register(*registry_)),
      memory_reserved_(BuildGauge()
                           .Name("boulder_trainer_memory_reserved_bytes")
                           .Help("Memory the trainer's backend holds from the system")
                           .Register(*registry_)),
      device_memory_total_(BuildGauge()
                               .Name("boulder_device_memory_total_bytes")
                               .Help("Memory of the trainer's device (cpu: physical RAM)")
                               .Register(*registry_)),
      exits_(BuildCounter()
                 .Name("boulder_trainer_exits_total")
                 .Help("Trainer processes that ended, by exit code (or signal_N)")
                 .Register(*registry_)),
      heartbeat_age_(
          BuildGauge()
              .Name("boulder_agent_heartbeat_age_seconds")
              .Help("Time since the coordinator last acknowledged a heartbeat (or since start)")
              .Register(*registry_)
              .Add({})),
      collector_(std::make_shared<Collector>(this)),
      last_heartbeat_(absl::Now()) {}

AgentMetrics::~AgentMetrics() {
  std::lock_guard<std::mutex> lock(mu_);
  exposer_.reset();
}

absl::StatusOr<int> AgentMetrics::Serve(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen: expected HOST:PORT, got '", listen, "'"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (exposer_ != nullptr) return absl::FailedPreconditionError("metrics already served");
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("--metrics-listen ", listen, ": cannot serve metrics: ", e.what()));
  }
  exposer_->RegisterCollectable(collector_);
  const std::vector<int> ports = exposer_->GetListeningPorts();
  if (ports.empty()) {
    exposer_.reset();
    return absl::UnavailableError(absl::StrCat("--metrics-listen ", listen, ": no port was bound"));
  }
  return ports.front();
}

AgentMetrics::TrainerSeries& AgentMetrics::SeriesLocked(int64_t job_id, int32_t rank) {
  const auto key = std::make_pair(job_id, rank);
  auto it = series_.find(key);
  if (it != series_.end()) return it->second;
  const std::map<std::string, std::string> labels = {{"job", absl::StrCat(job_id)},
                                                     {"rank", absl::StrCat(rank)}};
  TrainerSeries s;
  s.loss = &loss_.Add(labels);
  s.learning_rate = &learning_rate_.Add(labels);
  s.grad_norm = &grad_norm_.Add(labels);
  s.step = &step_.Add(labels);
  s.step_duration = &step_duration_.Add(labels, StepBuckets());
  s.tokens = &tokens_.Add(labels);
  s.tokens_per_second = &tokens_per_second_.Add(labels);
  s.memory_allocated = &memory_allocated_.Add(labels);
  s.memory_peak = &memory_peak_.Add(labels);
  s.memory_reserved = &memory_reserved_.Add(labels);
  s.device_memory_total = &device_memory_total_.Add(labels);
  return series_.emplace(key, s).first->second;
}

void AgentMetrics::RecordStep(int64_t job_id, int32_t rank, const v1::StepReport& step) {
  std::lock_guard<std::mutex> lock(mu_);
  TrainerSeries& s = SeriesLocked(job_id, rank);
  s.loss->Set(step.loss());
  s.learning_rate->Set(step.lr());
  s.grad_norm->Set(step.grad_norm());
  s.step->Set(static_cast<double>(step.step()));
  s.tokens_per_second->Set(step.tokens_per_second());
  if (step.step_time_seconds() > 0) s.step_duration->Observe(step.step_time_seconds());
  // tokens_processed is cumulative per attempt: count what is new since the last report, and
  // start over when a new attempt's count restarts lower.
  const int64_t processed = step.tokens_processed();
  if (processed > 0) {
    const int64_t last = s.last_tokens_processed;
    s.tokens->Increment(static_cast<double>(processed >= last ? processed - last : processed));
    s.last_tokens_processed = processed;
  } else if (step.tokens_per_second() > 0 && step.step_time_seconds() > 0) {
    s.tokens->Increment(step.tokens_per_second() * step.step_time_seconds());
  }
  if (step.has_memory()) {
    s.memory_allocated->Set(static_cast<double>(step.memory().allocated_bytes()));
    s.memory_peak->Set(static_cast<double>(step.memory().peak_bytes()));
    s.memory_reserved->Set(static_cast<double>(step.memory().reserved_bytes()));
    s.device_memory_total->Set(static_cast<double>(step.memory().device_total_bytes()));
  }
}

void AgentMetrics::RecordExit(int exit_code, int signal) {
  const std::string code =
      exit_code == -1 && signal > 0 ? absl::StrCat("signal_", signal) : absl::StrCat(exit_code);
  exits_.Add({{"code", code}}).Increment();
}

void AgentMetrics::RecordHeartbeat(absl::Time when) {
  std::lock_guard<std::mutex> lock(mu_);
  last_heartbeat_ = when;
}

std::string AgentMetrics::Render() const {
  return prometheus::TextSerializer().Serialize(collector_->Collect());
}

}  // namespace boulder::agent
