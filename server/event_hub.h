// EventHub: fans committed job events out to live watchers (WatchJob streams).
//
// The Coordinator publishes each event after its transaction commits, in seq order per job
// (it publishes under its own lock). A watcher subscribes BEFORE reading a job's stored
// backlog, so every event is either in the backlog or delivered live (possibly both: the
// watcher de-duplicates by seq).
//
// Thread-safe. Callbacks run synchronously inside Publish, on the publisher's thread, under
// the hub's lock: they must be quick, must not block and must not call into the hub or the
// Coordinator.
#ifndef BOULDER_SERVER_EVENT_HUB_H_
#define BOULDER_SERVER_EVENT_HUB_H_

#include <cstdint>
#include <functional>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "boulder/v1/job.pb.h"

namespace boulder::server {

class EventHub {
 public:
  using Callback = std::function<void(const v1::JobEvent&)>;

  // Calls `callback` for every event of `job_id` published from now on, until Unsubscribe.
  // Returns the subscription's id.
  uint64_t Subscribe(int64_t job_id, Callback callback);

  // After this returns the callback is not running and will not be called again. Unknown ids
  // are ignored.
  void Unsubscribe(uint64_t id);

  // Calls the callbacks subscribed to event.job_id().
  void Publish(const v1::JobEvent& event);

  // Live subscriptions (for tests and diagnostics).
  size_t size() const;

  // Waits up to `timeout` for size() to equal `n`; returns whether it did.
  bool AwaitSize(size_t n, absl::Duration timeout) const;

 private:
  struct Subscription {
    int64_t job_id;
    Callback callback;
  };
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Subscription> subscriptions_ ABSL_GUARDED_BY(mu_);
  std::multimap<int64_t, uint64_t> by_job_ ABSL_GUARDED_BY(mu_);
};

}  // namespace boulder::server

#endif  // BOULDER_SERVER_EVENT_HUB_H_
