#include "worker/agent/report_buffer.h"

#include <algorithm>
#include <utility>

namespace boulder::agent {

ReportBuffer::ReportBuffer(Limits limits) : limits_(limits) {}

void ReportBuffer::AddStep(v1::StepReport step) {
  std::lock_guard<std::mutex> lock(mu_);
  steps_.push_back(std::move(step));
  TrimLocked();
}

void ReportBuffer::AddLog(v1::LogLine log) {
  std::lock_guard<std::mutex> lock(mu_);
  logs_.push_back(std::move(log));
  TrimLocked();
}

void ReportBuffer::SetGeneration(v1::GenerationResult generation) {
  std::lock_guard<std::mutex> lock(mu_);
  generation_ = std::move(generation);
}

ReportBatch ReportBuffer::Take(size_t max_steps, size_t max_logs) {
  std::lock_guard<std::mutex> lock(mu_);
  ReportBatch batch;
  const size_t n_steps = std::min(max_steps, steps_.size());
  batch.steps.reserve(n_steps);
  for (size_t i = 0; i < n_steps; ++i) {
    batch.steps.push_back(std::move(steps_.front()));
    steps_.pop_front();
  }
  const size_t n_logs = std::min(max_logs, logs_.size());
  batch.logs.reserve(n_logs);
  for (size_t i = 0; i < n_logs; ++i) {
    batch.logs.push_back(std::move(logs_.front()));
    logs_.pop_front();
  }
  // The generation follows the last step report, as the trainer wrote them.
  if (steps_.empty() && generation_.has_value()) {
    batch.generation = std::move(generation_);
    generation_.reset();
  }
  return batch;
}

void ReportBuffer::Restore(ReportBatch batch) {
  std::lock_guard<std::mutex> lock(mu_);
  steps_.insert(steps_.begin(), std::make_move_iterator(batch.steps.begin()),
                std::make_move_iterator(batch.steps.end()));
  logs_.insert(logs_.begin(), std::make_move_iterator(batch.logs.begin()),
               std::make_move_iterator(batch.logs.end()));
  if (batch.generation.has_value() && !generation_.has_value()) {
    generation_ = std::move(batch.generation);
  }
  TrimLocked();
}

void ReportBuffer::TrimLocked() {
  while (steps_.size() > limits_.max_steps) {
    steps_.pop_front();
    ++dropped_steps_;
  }
  while (logs_.size() > limits_.max_logs) {
    logs_.pop_front();
    ++dropped_logs_;
  }
}

bool ReportBuffer::empty() const {
  std::lock_guard<std::mutex> lock(mu_);
  return steps_.empty() && logs_.empty() && !generation_.has_value();
}

int64_t ReportBuffer::dropped_steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_steps_;
}

int64_t ReportBuffer::dropped_logs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_logs_;
}

}  // namespace boulder::agent
