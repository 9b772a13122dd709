// Coordinator: restarts of failed attempts and the submit-time memory check.
#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/memory_estimate.h"
#include "common/spec.h"
#include "server/coordinator.h"

namespace boulder::server {

void Coordinator::FailAttempt(Update& u, v1::Job* job, const std::string& cause) {
  if (job->state() != v1::SCHEDULED && job->state() != v1::RUNNING) return;
  const int32_t attempt = job->attempt();
  const int32_t max_restarts = job->spec().max_restarts();
  // Attempt 1 is the first run; attempt a+1 is restart a.
  if (attempt <= max_restarts) {
    SetState(u, job, v1::RESTARTING,
             absl::StrCat("attempt ", attempt, " failed: ", cause, "; restart ", attempt, " of ",
                          max_restarts, " from the latest checkpoint"));
    return;
  }
  SetState(u, job, v1::FAILED,
           max_restarts == 0 ? cause
                             : absl::StrCat(cause, " (attempt ", attempt, "; all ", max_restarts,
                                            " restarts used)"));
}

bool Coordinator::AnyWorkerBusyWith(int64_t job_id) const {
  return std::any_of(workers_.begin(), workers_.end(), [&](const auto& kv) {
    return kv.second.info.job_id() == job_id && kv.second.info.state() == v1::WORKER_BUSY;
  });
}

absl::Status Coordinator::CheckMemoryAtSubmit(const v1::JobSpec& spec) {
  if (common::RequiredBackend(spec) != "cuda") return absl::OkStatus();
  absl::StatusOr<std::string> precision = common::EffectivePrecision(spec, "cuda");
  if (!precision.ok()) return absl::OkStatus();  // the scheduler and trainer say why
  absl::StatusOr<common::MemoryEstimate> estimate =
      common::EstimateTrainingMemory(spec, *precision, "cuda");
  if (!estimate.ok()) return absl::OkStatus();  // no estimate for this precision
  const WorkerEntry* largest = nullptr;
  int cuda_workers = 0;
  for (const auto& [id, e] : workers_) {
    const v1::WorkerCapabilities& c = e.info.capabilities();
    if (c.backend() != "cuda" || c.gpu_memory_bytes() <= 0 || e.info.state() == v1::WORKER_LOST) {
      continue;
    }
    ++cuda_workers;
    if (largest == nullptr ||
        c.gpu_memory_bytes() > largest->info.capabilities().gpu_memory_bytes()) {
      largest = &e;
    }
  }
  if (largest == nullptr) return absl::OkStatus();
  const int64_t have = largest->info.capabilities().gpu_memory_bytes();
  if (estimate->total_bytes <= have) return absl::OkStatus();
  const auto gib = [](int64_t b) { return absl::StrFormat("%.2f GiB", b / 1073741824.0); };
  return absl::FailedPreconditionError(
      absl::StrCat("model: this job needs an estimated ", common::FormatMemoryEstimate(*estimate),
                   " of GPU memory per worker at ", *precision, "; the largest GPU of the ",
                   cuda_workers, " registered cuda worker(s) has ", gib(have), " (",
                   largest->info.id(), ", ", largest->info.capabilities().gpu_name(),
                   "); reduce training.batch_size, training.seq_len or the model"));
}

}  // namespace boulder::server
