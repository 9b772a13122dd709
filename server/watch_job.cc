#include "server/watch_job.h"

#include <utility>

#include "absl/time/clock.h"
#include "common/status_util.h"

namespace boulder::server {
namespace {

bool IsTerminalEvent(const v1::JobEvent& e) {
  return e.has_state_change() && IsTerminal(e.state_change().state());
}

}  // namespace

WatchJobReactor::WatchJobReactor(Coordinator* coordinator, ServerMetrics* metrics,
                                 const v1::WatchJobRequest& request)
    : coordinator_(coordinator),
      metrics_(metrics),
      job_id_(request.job_id()),
      start_(absl::Now()),
      cursor_(request.after_seq()),
      last_seq_(request.after_seq()) {}

void WatchJobReactor::Start() {
  subscription_ =
      coordinator_->hub().Subscribe(job_id_, [this](const v1::JobEvent& e) { OnLive(e); });
  {
    absl::MutexLock lock(&mu_);
    fetching_ = true;
  }
  FetchPage();
}

void WatchJobReactor::FetchPage() {
  int64_t cursor;
  {
    absl::MutexLock lock(&mu_);
    cursor = cursor_;
  }
  // The Coordinator's lock is taken here; mu_ must not be held (publishers take the
  // Coordinator's lock, then the hub's, then mu_).
  absl::StatusOr<EventPage> page = coordinator_->ReadEvents(job_id_, cursor, kPageSize);
  Next next;
  grpc::Status status;
  {
    absl::MutexLock lock(&mu_);
    fetching_ = false;
    if (!page.ok()) {
      status = EndLocked(page.status());
      next = Next::kFinish;
    } else {
      for (const v1::JobEvent& e : page->events) {
        cursor_ = e.seq();
        Enqueue(e);
      }
      if (page->events.size() < static_cast<size_t>(kPageSize)) {
        // This page was read after subscribing: everything later arrives live.
        backlog_done_ = true;
        for (const v1::JobEvent& e : live_pending_) Enqueue(e);
        live_pending_.clear();
        if (page->job_finished) end_after_queue_ = true;
      }
      next = Advance();
      if (next == Next::kFinish) status = final_status_;
    }
  }
  Act(next, status);
}

void WatchJobReactor::OnLive(const v1::JobEvent& event) {
  absl::MutexLock lock(&mu_);
  if (finished_ || cancelled_) return;
  if (!backlog_done_) {
    live_pending_.push_back(event);
    return;
  }
  Enqueue(event);
  if (!writing_ && !fetching_ && !queue_.empty()) {
    current_ = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    StartWrite(&current_);
  }
}

void WatchJobReactor::Enqueue(const v1::JobEvent& event) {
  if (end_after_queue_ || event.seq() <= last_seq_) return;
  last_seq_ = event.seq();
  queue_.push_back(event);
  if (IsTerminalEvent(event)) end_after_queue_ = true;
}

WatchJobReactor::Next WatchJobReactor::Advance() {
  if (finished_ || writing_ || fetching_) return Next::kWait;
  if (cancelled_) {
    final_status_ = EndLocked(absl::CancelledError("watch cancelled"));
    return Next::kFinish;
  }
  if (!queue_.empty()) {
    current_ = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    StartWrite(&current_);
    return Next::kWait;
  }
  if (!backlog_done_) {
    fetching_ = true;
    return Next::kFetch;
  }
  if (end_after_queue_) {
    final_status_ = EndLocked(absl::OkStatus());
    return Next::kFinish;
  }
  return Next::kWait;
}

grpc::Status WatchJobReactor::EndLocked(const absl::Status& status) {
  finished_ = true;
  final_code_ = status.code();
  final_status_ = common::ToGrpcStatus(status);
  return final_status_;
}

void WatchJobReactor::Act(Next next, const grpc::Status& status) {
  // Finish may run OnDone (which deletes this) before it returns: it must come last.
  if (next == Next::kFetch) {
    FetchPage();
  } else if (next == Next::kFinish) {
    Finish(status);
  }
}

void WatchJobReactor::OnWriteDone(bool ok) {
  Next next;
  grpc::Status status;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      // The stream is broken (client gone or server shutting down): nobody will read more.
      status = EndLocked(absl::CancelledError("watch stream closed"));
      next = Next::kFinish;
    } else {
      next = Advance();
      if (next == Next::kFinish) status = final_status_;
    }
  }
  Act(next, status);
}

void WatchJobReactor::OnCancel() {
  grpc::Status status;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    // With a write or a fetch in flight, its completion finishes the stream instead.
    if (finished_ || writing_ || fetching_) return;
    status = EndLocked(absl::CancelledError("watch cancelled"));
  }
  Finish(status);
}

void WatchJobReactor::OnDone() {
  // After Unsubscribe returns no OnLive runs or will run, so deleting is safe.
  coordinator_->hub().Unsubscribe(subscription_);
  absl::StatusCode code;
  {
    absl::MutexLock lock(&mu_);
    code = final_code_;
  }
  metrics_->ObserveRpc("WatchJob", code, absl::ToDoubleSeconds(absl::Now() - start_));
  delete this;
}

}  // namespace boulder::server
