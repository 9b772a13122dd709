#include "server/event_hub.h"

#include <utility>

namespace boulder::server {

uint64_t EventHub::Subscribe(int64_t job_id, Callback callback) {
  absl::MutexLock lock(&mu_);
  uint64_t id = next_id_++;
  subscriptions_.emplace(id, Subscription{job_id, std::move(callback)});
  by_job_.emplace(job_id, id);
  return id;
}

void EventHub::Unsubscribe(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = subscriptions_.find(id);
  if (it == subscriptions_.end()) return;
  auto [begin, end] = by_job_.equal_range(it->second.job_id);
  for (auto j = begin; j != end; ++j) {
    if (j->second == id) {
      by_job_.erase(j);
      break;
    }
  }
  subscriptions_.erase(it);
}

void EventHub::Publish(const v1::JobEvent& event) {
  absl::MutexLock lock(&mu_);
  auto [begin, end] = by_job_.equal_range(event.job_id());
  for (auto j = begin; j != end; ++j) subscriptions_.at(j->second).callback(event);
}

size_t EventHub::size() const {
  absl::MutexLock lock(&mu_);
  return subscriptions_.size();
}

bool EventHub::AwaitSize(size_t n, absl::Duration timeout) const {
  auto reached = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return subscriptions_.size() == n; };
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

}  // namespace boulder::server
