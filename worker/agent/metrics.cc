#include "worker/agent/metrics.h"

#include <exception>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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

// FP8 series per trainer at most: layers x 4 tensors x 3 roles stays far below it; a trainer
// reporting more (a bug) must not grow the exposition without bound.
constexpr size_t kMaxFp8SeriesPerTrainer = 4096;

// Dense BF16 tensor-core peaks (FLOP/s, without sparsity) by a substring of the CUDA device
// name, first match wins: NVIDIA's data sheets, SXM figures where a part comes in several.
struct GpuPeak {
  const char* name;
  double bf16_flops;
};
constexpr GpuPeak kGpuPeaks[] = {
    {"GH200", 989.4e12}, {"H200", 989.4e12}, {"H100 PCIe", 756.5e12}, {"H100", 989.4e12},
    {"H800", 989.4e12},  {"A100", 312e12},   {"A800", 312e12},        {"L40S", 362.05e12},
    {"L40", 181.05e12},  {"L4", 121e12},
};

}  // namespace

double ModelFlopsPerToken(const v1::JobSpec& spec) {
  const double c = spec.model().hidden();
  const double layers = spec.model().layers();
  const double f = spec.model().ffn();
  const double v = spec.model().vocab_size();
  const double t = spec.training().seq_len();
  if (c <= 0 || layers <= 0 || f <= 0 || v <= 0 || t <= 0) return 0;
  const double matmul_weights = layers * (4 * c * c + 2 * c * f) + v * c;
  return 6 * matmul_weights + 12 * layers * t * c;
}

double CpuPeakFlops(absl::string_view cpuinfo, int cores) {
  double mhz = 0;
  std::set<std::string, std::less<>> flags;
  // The first processor's lines describe them all.
  for (absl::string_view line : absl::StrSplit(cpuinfo, '\n')) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    const absl::string_view key = absl::StripAsciiWhitespace(line.substr(0, colon));
    const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    if (key == "cpu MHz" && mhz == 0) {
      if (!absl::SimpleAtod(value, &mhz)) mhz = 0;
    } else if (key == "flags" && flags.empty()) {
      for (absl::string_view flag : absl::StrSplit(value, ' ', absl::SkipEmpty())) {
        flags.emplace(flag);
      }
    }
  }
  if (mhz <= 0 || cores <= 0) return 0;
  // FP32 lanes x 2 FMA pipes x 2 FLOPs per fused multiply-add.
  double per_cycle = 8;
  if (flags.count("avx512f") > 0) {
    per_cycle = 64;
  } else if (flags.count("avx2") > 0 && flags.count("fma") > 0) {
    per_cycle = 32;
  } else if (flags.count("avx") > 0 || flags.count("avx2") > 0) {
    per_cycle = 16;
  }
  return cores * mhz * 1e6 * per_cycle;
}

double PeakFlops(const v1::WorkerCapabilities& capabilities, absl::string_view precision,
                 int threads) {
  if (capabilities.backend() == "cuda") {
    for (const GpuPeak& gpu : kGpuPeaks) {
      if (!absl::StrContains(capabilities.gpu_name(), gpu.name)) continue;
      const int sm =
          capabilities.compute_capability_major() * 10 + capabilities.compute_capability_minor();
      const bool has_fp8 = sm >= 89;
      if (precision == "fp8" && has_fp8) return 2 * gpu.bf16_flops;
      if (precision == "fp32") return gpu.bf16_flops / 2;
      return gpu.bf16_flops;
    }
    return 0;
  }
  std::ifstream in("/proc/cpuinfo");
  const std::string cpuinfo((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return CpuPeakFlops(cpuinfo, threads > 0 ? threads : capabilities.cpu_cores());
}

// Refreshes the heartbeat age at scrape time, so it is exact whenever it is read, and collects
// under mu_, which RecordStep holds while it sets a report's values, so a scrape is consistent.
class AgentMetrics::Collector : public prometheus::Collectable {
 public:
  explicit Collector(const AgentMetrics* metrics) : metrics_(metrics) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::lock_guard<std::mutex> lock(metrics_->mu_);
    metrics_->heartbeat_age_.Set(absl::ToDoubleSeconds(absl::Now() - metrics_->last_heartbeat_));
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
      mfu_(BuildGauge()
               .Name("boulder_trainer_mfu_ratio")
               .Help("Model FLOP utilisation of the last optimizer step: tokens/s x model "
                     "FLOPs per token / the device's peak FLOP/s (cpu: an estimate)")
               .Register(*registry_)),
      val_loss_(BuildGauge()
                    .Name("boulder_trainer_validation_loss")
                    .Help("Mean loss on the eval token files at the last evaluation")
                    .Register(*registry_)),
      fp8_scale_(BuildGauge()
                     .Name("boulder_trainer_fp8_scale")
                     .Help("FP8 scaling factor of a tensor after the last step's update")
                     .Register(*registry_)),
      fp8_amax_(BuildGauge()
                    .Name("boulder_trainer_fp8_amax")
                    .Help("Largest absolute value of an FP8 tensor in the last step")
                    .Register(*registry_)),
      fp8_saturated_(BuildGauge()
                         .Name("boulder_trainer_fp8_saturated_ratio")
                         .Help("Fraction of an FP8 tensor's values clipped to the format's "
                               "maximum in the last step")
                         .Register(*registry_)),
      fp8_underflow_(BuildGauge()
                         .Name("boulder_trainer_fp8_underflow_ratio")
                         .Help("Fraction of an FP8 tensor's non-zero values that rounded to "
                               "zero in the last step")
                         .Register(*registry_)),
      skipped_steps_(BuildGauge()
                         .Name("boulder_trainer_skipped_steps")
                         .Help("Optimizer steps the attempt skipped so far because the loss or a "
                               "gradient was not finite (FP8 jobs)")
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
  std::unique_ptr<prometheus::Exposer> exposer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    exposer = std::move(exposer_);
  }
  // Outside mu_: stopping the exposer waits for a scrape in progress, which takes mu_.
  exposer.reset();
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
  const std::map<std::string, std::string> labels = {{"job_id", absl::StrCat(job_id)},
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

void AgentMetrics::RecordStep(int64_t job_id, int32_t rank, const v1::StepReport& step,
                              MfuInputs mfu) {
  std::lock_guard<std::mutex> lock(mu_);
  TrainerSeries& s = SeriesLocked(job_id, rank);
  s.loss->Set(step.loss());
  s.learning_rate->Set(step.lr());
  s.grad_norm->Set(step.grad_norm());
  s.step->Set(static_cast<double>(step.step()));
  s.tokens_per_second->Set(step.tokens_per_second());
  if (mfu.model_flops_per_token > 0 && mfu.peak_flops > 0) {
    if (s.mfu == nullptr) {
      s.mfu = &mfu_.Add({{"job_id", absl::StrCat(job_id)}, {"rank", absl::StrCat(rank)}});
    }
    s.mfu->Set(step.tokens_per_second() * mfu.model_flops_per_token / mfu.peak_flops);
  }
  if (step.has_val_loss()) {
    if (s.val_loss == nullptr) {
      s.val_loss = &val_loss_.Add({{"job_id", absl::StrCat(job_id)}, {"rank", absl::StrCat(rank)}});
    }
    s.val_loss->Set(step.val_loss());
  }
  RecordFp8Locked(job_id, rank, s, step);
  if (s.skipped_steps == nullptr && (step.fp8_size() > 0 || step.skipped_steps() > 0)) {
    s.skipped_steps =
        &skipped_steps_.Add({{"job_id", absl::StrCat(job_id)}, {"rank", absl::StrCat(rank)}});
  }
  if (s.skipped_steps != nullptr) s.skipped_steps->Set(static_cast<double>(step.skipped_steps()));
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

void AgentMetrics::RecordFp8Locked(int64_t job_id, int32_t rank, TrainerSeries& s,
                                   const v1::StepReport& step) {
  for (const v1::Fp8TensorStats& t : step.fp8()) {
    auto key = std::make_tuple(t.layer(), t.tensor(), t.role());
    auto it = s.fp8.find(key);
    if (it == s.fp8.end()) {
      if (s.fp8.size() >= kMaxFp8SeriesPerTrainer) continue;
      const std::map<std::string, std::string> labels = {{"job_id", absl::StrCat(job_id)},
                                                         {"rank", absl::StrCat(rank)},
                                                         {"layer", absl::StrCat(t.layer())},
                                                         {"tensor", t.tensor()},
                                                         {"role", t.role()}};
      Fp8Series f;
      f.scale = &fp8_scale_.Add(labels);
      f.amax = &fp8_amax_.Add(labels);
      f.saturated_ratio = &fp8_saturated_.Add(labels);
      f.underflow_ratio = &fp8_underflow_.Add(labels);
      it = s.fp8.emplace(std::move(key), f).first;
    }
    it->second.scale->Set(t.scale());
    it->second.amax->Set(t.amax());
    it->second.saturated_ratio->Set(t.saturated_ratio());
    it->second.underflow_ratio->Set(t.underflow_ratio());
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
