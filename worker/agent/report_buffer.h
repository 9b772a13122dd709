// What a trainer produced and the coordinator has not acknowledged yet: step reports, log
// lines and the generation result, held for the next ReportSteps call.
//
// Bounded: while the coordinator is unreachable the oldest step reports and log lines are
// dropped (and counted) instead of growing without limit or blocking the trainer's pipe. The
// generation result is one message and is never dropped.
//
// Thread-safe: the trainer's reader thread adds, the reporter takes and restores.
#ifndef BOULDER_WORKER_AGENT_REPORT_BUFFER_H_
#define BOULDER_WORKER_AGENT_REPORT_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

#include "boulder/v1/job.pb.h"

namespace boulder::agent {

struct ReportBatch {
  std::vector<v1::StepReport> steps;  // oldest first
  std::vector<v1::LogLine> logs;      // oldest first
  std::optional<v1::GenerationResult> generation;

  bool empty() const { return steps.empty() && logs.empty() && !generation.has_value(); }
};

class ReportBuffer {
 public:
  struct Limits {
    size_t max_steps = 4096;  // step reports held; the oldest go first
    size_t max_logs = 4096;   // log lines held; the oldest go first
  };

  explicit ReportBuffer(Limits limits);

  void AddStep(v1::StepReport step);
  void AddLog(v1::LogLine log);
  void SetGeneration(v1::GenerationResult generation);

  // Removes and returns up to `max_steps` step reports and `max_logs` log lines, oldest first,
  // and the generation result once the steps before it have all been taken.
  ReportBatch Take(size_t max_steps, size_t max_logs);

  // Puts a batch whose sending failed back in front of what arrived since, then drops the
  // oldest entries beyond the limits.
  void Restore(ReportBatch batch);

  bool empty() const;
  int64_t dropped_steps() const;
  int64_t dropped_logs() const;

 private:
  void TrimLocked();

  const Limits limits_;
  mutable std::mutex mu_;
  std::deque<v1::StepReport> steps_;
  std::deque<v1::LogLine> logs_;
  std::optional<v1::GenerationResult> generation_;
  int64_t dropped_steps_ = 0;
  int64_t dropped_logs_ = 0;
};

}  // namespace boulder::agent

#endif  // BOULDER_WORKER_AGENT_REPORT_BUFFER_H_
