// Coordinator: construction, the staging/commit machinery and the job API. The worker API,
// the scheduler pass and liveness are in coordinator_workers.cc.
#include "server/coordinator.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/spec.h"
#include "google/protobuf/util/time_util.h"

namespace boulder::server {

using google::protobuf::util::TimeUtil;

namespace {

google::protobuf::Timestamp ToProto(absl::Time t) {
  return TimeUtil::MicrosecondsToTimestamp(absl::ToUnixMicros(t));
}

}  // namespace

bool IsActive(v1::JobState state) {
  return state == v1::SCHEDULED || state == v1::RUNNING || state == v1::RESTARTING;
}

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

Coordinator::Coordinator(std::unique_ptr<JobStore> store, ServerMetrics* metrics,
                         CoordinatorOptions options)
    : options_([&] {
        if (!options.clock) options.clock = [] { return absl::Now(); };
        return std::move(options);
      }()),
      metrics_(metrics),
      store_(std::move(store)) {}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(std::unique_ptr<JobStore> store,
                                                                 ServerMetrics* metrics,
                                                                 CoordinatorOptions options) {
  std::unique_ptr<Coordinator> c(new Coordinator(std::move(store), metrics, std::move(options)));
  if (absl::Status s = c->Load(); !s.ok()) return s;
  return c;
}

absl::Status Coordinator::Load() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = Now();
  auto workers = store_->ListWorkers();
  if (!workers.ok()) return workers.status();
  for (v1::Worker& w : *workers) {
    // The process that heard this worker's heartbeats is gone: the grace period starts now.
    WorkerEntry& e = workers_[w.id()];
    e.info = std::move(w);
    e.last_seen = now;
    int64_t n = 0;
    absl::string_view id = e.info.id();
    if (absl::ConsumePrefix(&id, "worker-") && absl::SimpleAtoi(id, &n)) {
      next_worker_number_ = std::max(next_worker_number_, n + 1);
    }
  }
  auto active = store_->ListJobs({v1::SCHEDULED, v1::RUNNING, v1::RESTARTING}, 0,
                                 JobStore::Order::kOldestFirst);
  if (!active.ok()) return active.status();
  for (const v1::Job& job : *active) restart_jobs_.insert(job.id());
  restart_deadline_ = now + options_.heartbeat_timeout;
  RefreshGauges(/*jobs=*/true, /*workers=*/true);
  return absl::OkStatus();
}

absl::StatusOr<v1::Job*> Coordinator::StageJob(Update& u, int64_t job_id) {
  auto it = u.jobs.find(job_id);
  if (it != u.jobs.end()) return &it->second;
  auto job = store_->GetJob(job_id);
  if (!job.ok()) return job.status();
  return &u.jobs.emplace(job_id, *std::move(job)).first->second;
}

v1::Worker* Coordinator::StageWorker(Update& u, const std::string& id) {
  auto it = u.workers.find(id);
  if (it != u.workers.end()) return &it->second;
  v1::Worker& w = u.workers[id];
  auto known = workers_.find(id);
  if (known != workers_.end()) {
    w = known->second.info;
  } else {
    w.set_id(id);
  }
  return &w;
}

v1::JobEvent* Coordinator::AddEvent(Update& u, int64_t job_id) {
  v1::JobEvent& e = u.events.emplace_back();
  e.set_job_id(job_id);
  *e.mutable_time() = ToProto(Now());
  return &e;
}

void Coordinator::SetState(Update& u, v1::Job* job, v1::JobState state,
                           const std::string& message) {
  job->set_state(state);
  if (IsTerminal(state)) {
    job->set_message(message);
    *job->mutable_end_time() = ToProto(Now());
  } else {
    job->clear_message();
  }
  v1::JobStateChange* change = AddEvent(u, job->id())->mutable_state_change();
  change->set_state(state);
  change->set_message(message);
}

void Coordinator::Release(Update& u, const std::string& worker_id) {
  v1::Worker* w = StageWorker(u, worker_id);
  if (w->state() != v1::WORKER_LOST) w->set_state(v1::WORKER_IDLE);
  w->set_job_id(0);
  w->set_rank(0);
}

absl::Status Coordinator::Commit(Update& u) {
  if (u.jobs.empty() && u.workers.empty() && u.events.empty()) return absl::OkStatus();
  // Any committed change of jobs or workers may make a placement possible.
  schedule_needed_ = true;
  absl::Status s = store_->Transaction([&]() -> absl::Status {
    for (auto& [id, job] : u.jobs) {
      if (absl::Status s = store_->UpdateJob(job); !s.ok()) return s;
    }
    for (v1::JobEvent& e : u.events) {
      if (absl::Status s = store_->AppendEvent(&e); !s.ok()) return s;
    }
    for (auto& [id, w] : u.workers) {
      if (absl::Status s = store_->PutWorker(w); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  for (auto& [id, w] : u.workers) {
    WorkerEntry& e = workers_[id];
    if (e.info.job_id() != w.job_id()) {
      e.acked = false;
      e.missing_since = absl::InfiniteFuture();
    }
    e.info = std::move(w);
  }
  bool state_changed = false;
  for (const v1::JobEvent& e : u.events) {
    state_changed |= e.has_state_change();
    hub_.Publish(e);
  }
  RefreshGauges(state_changed, !u.workers.empty());
  return absl::OkStatus();
}

void Coordinator::RefreshGauges(bool jobs, bool workers) {
  if (metrics_ == nullptr) return;
  if (jobs) {
    // A failed count leaves the gauges one change behind; the next change refreshes them.
    if (auto counts = store_->CountJobsByState(); counts.ok()) metrics_->SetJobCounts(*counts);
  }
  if (workers) {
    std::map<v1::WorkerState, int64_t> counts;
    for (const auto& [id, e] : workers_) ++counts[e.info.state()];
    metrics_->SetWorkerCounts(counts);
  }
}

absl::StatusOr<v1::Job> Coordinator::SubmitJob(const v1::SubmitJobRequest& request,
                                               const std::string& owner) {
  absl::StatusOr<v1::JobSpec> spec;
  if (!request.spec_yaml().empty()) {
    if (request.spec_yaml().size() > common::kMaxSpecBytes) {
      return absl::InvalidArgumentError(absl::StrCat("spec_yaml: ", request.spec_yaml().size(),
                                                     " bytes, more than the ",
                                                     common::kMaxSpecBytes, " allowed"));
    }
    if (request.has_spec()) {
      return absl::InvalidArgumentError("spec: give either spec_yaml or spec, not both");
    }
    spec = common::LoadJobSpec(request.spec_yaml(),
                               {request.overrides().begin(), request.overrides().end()});
  } else {
    v1::JobSpec raw = request.spec();
    for (const std::string& o : request.overrides()) {
      if (absl::Status s = common::ApplyOverride(&raw, o); !s.ok()) return s;
    }
    spec = common::ResolveJobSpec(raw);
  }
  if (!spec.ok()) return spec.status();

  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckMemoryAtSubmit(*spec); !s.ok()) return s;
  v1::Job job;
  job.set_name(spec->name());
  job.set_state(v1::QUEUED);
  job.set_owner(owner);
  *job.mutable_spec() = *std::move(spec);
  *job.mutable_create_time() = ToProto(Now());
  Update u;
  absl::Status s = store_->Transaction([&]() -> absl::Status {
    auto id = store_->InsertJob(job);
    if (!id.ok()) return id.status();
    job.set_id(*id);
    v1::JobEvent* e = AddEvent(u, job.id());
    e->mutable_state_change()->set_state(v1::QUEUED);
    e->mutable_state_change()->set_message("submitted");
    return store_->AppendEvent(e);
  });
  if (!s.ok()) return s;
  schedule_needed_ = true;
  hub_.Publish(u.events.front());
  RefreshGauges(/*jobs=*/true, /*workers=*/false);
  return job;
}

absl::StatusOr<v1::Job> Coordinator::GetJob(int64_t job_id) {
  absl::MutexLock lock(&mu_);
  return store_->GetJob(job_id);
}

absl::StatusOr<std::vector<v1::Job>> Coordinator::ListJobs(
    const v1::ListJobsRequest& request, const std::optional<std::string>& owner) {
  if (request.limit() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: must not be negative, got ", request.limit()));
  }
  std::vector<v1::JobState> states;
  for (int s : request.states()) states.push_back(static_cast<v1::JobState>(s));
  absl::MutexLock lock(&mu_);
  return store_->ListJobs(states, request.limit(), JobStore::Order::kNewestFirst, owner);
}

absl::StatusOr<v1::Job> Coordinator::CancelJob(int64_t job_id) {
  absl::MutexLock lock(&mu_);
  Update u;
  auto job = StageJob(u, job_id);
  if (!job.ok()) return job.status();
  if (IsTerminal((*job)->state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " already ", v1::JobState_Name((*job)->state())));
  }
  // Workers of an active job stay BUSY: they are told to stop on their next heartbeat and are
  // freed by the trainer's exit report.
  SetState(u, *job, v1::CANCELLED, "cancelled by user");
  v1::Job result = **job;
  if (absl::Status s = Commit(u); !s.ok()) return s;
  return result;
}

absl::StatusOr<std::vector<v1::LogLine>> Coordinator::GetJobLogs(int64_t job_id) {
  absl::MutexLock lock(&mu_);
  if (auto job = store_->GetJob(job_id); !job.ok()) return job.status();
  auto events = store_->ListEvents(job_id, 0, 0, v1::JobEvent::kLog);
  if (!events.ok()) return events.status();
  std::vector<v1::LogLine> lines;
  lines.reserve(events->size());
  for (v1::JobEvent& e : *events) lines.push_back(std::move(*e.mutable_log()));
  return lines;
}

absl::StatusOr<EventPage> Coordinator::ReadEvents(int64_t job_id, int64_t after_seq, int limit) {
  absl::MutexLock lock(&mu_);
  auto job = store_->GetJob(job_id);
  if (!job.ok()) return job.status();
  auto events = store_->ListEvents(job_id, after_seq, limit);
  if (!events.ok()) return events.status();
  EventPage page;
  page.events = *std::move(events);
  page.job_finished = IsTerminal(job->state());
  return page;
}

}  // namespace boulder::server
