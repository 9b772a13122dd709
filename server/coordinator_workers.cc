// Coordinator: the worker API, the scheduling pass and liveness.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/memory_estimate.h"
#include "common/spec.h"
#include "google/protobuf/util/time_util.h"
#include "server/coordinator.h"
#include "server/scheduler.h"

namespace boulder::server {

using google::protobuf::util::TimeUtil;

namespace {

constexpr size_t kMaxWorkerIdLength = 64;
constexpr char kLostInRestart[] = "lost during coordinator restart";

google::protobuf::Timestamp ToProto(absl::Time t) {
  return TimeUtil::MicrosecondsToTimestamp(absl::ToUnixMicros(t));
}

// Ids appear in job rows ('\n'-separated), messages and logs: keep them plain.
absl::Status ValidateWorkerId(const std::string& id) {
  bool plain = std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.';
  });
  if (!plain || id.size() > kMaxWorkerIdLength) {
    return absl::InvalidArgumentError(absl::StrCat("requested_id: '", id, "' must be 1 to ",
                                                   kMaxWorkerIdLength,
                                                   " characters from [A-Za-z0-9._-]"));
  }
  return absl::OkStatus();
}

// The rank `worker_id` holds in `job`'s current attempt, or -1.
int RankOf(const v1::Job& job, const std::string& worker_id) {
  for (int r = 0; r < job.workers_size(); ++r) {
    if (job.workers(r) == worker_id) return r;
  }
  return -1;
}

bool Lists(const google::protobuf::RepeatedPtrField<v1::RunningTrainer>& running, int64_t job_id,
           int32_t attempt) {
  return std::any_of(running.begin(), running.end(), [&](const v1::RunningTrainer& t) {
    return t.job_id() == job_id && t.attempt() == attempt;
  });
}

std::string ExitMessage(const v1::ReportExitRequest& r, int rank) {
  std::string msg = absl::StrCat("rank ", rank, " on worker ", r.worker_id());
  if (r.signal() > 0) {
    absl::StrAppend(&msg, " killed by signal ", r.signal());
  } else if (r.cancelled()) {
    absl::StrAppend(&msg, " was stopped by its agent");
  } else {
    absl::StrAppend(&msg, " exited with code ", r.exit_code());
  }
  if (!r.message().empty()) absl::StrAppend(&msg, ": ", r.message());
  return msg;
}

// The GPU memory a job needs per rank on a cuda worker; 0 when it cannot run there or has no
// estimate (the scheduler then does not check).
int64_t GpuBytesNeeded(const v1::JobSpec& spec) {
  if (common::RequiredBackend(spec) == "cpu") return 0;
  absl::StatusOr<std::string> precision = common::EffectivePrecision(spec, "cuda");
  if (!precision.ok()) return 0;
  absl::StatusOr<common::MemoryEstimate> e =
      common::EstimateTrainingMemory(spec, *precision, "cuda");
  return e.ok() ? e->total_bytes : 0;
}

}  // namespace

std::string Coordinator::NewWorkerId() {
  std::string id;
  do {
    id = absl::StrCat("worker-", next_worker_number_++);
  } while (workers_.count(id) > 0);
  return id;
}

absl::StatusOr<Coordinator::WorkerEntry*> Coordinator::FindRegistered(const std::string& id) {
  auto it = workers_.find(id);
  if (it == workers_.end() || !it->second.registered) {
    return absl::NotFoundError(absl::StrCat("worker ", id, " is not registered"));
  }
  if (it->second.info.state() == v1::WORKER_LOST) {
    return absl::NotFoundError(absl::StrCat("worker ", id, " was declared lost; register again"));
  }
  return &it->second;
}

absl::StatusOr<v1::RegisterWorkerResponse> Coordinator::RegisterWorker(
    const v1::RegisterWorkerRequest& request) {
  const std::string& backend = request.capabilities().backend();
  if (backend != "cpu" && backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("capabilities.backend: must be \"cpu\" or \"cuda\", got \"", backend, "\""));
  }
  if (!request.requested_id().empty()) {
    if (absl::Status s = ValidateWorkerId(request.requested_id()); !s.ok()) return s;
  }
  absl::MutexLock lock(&mu_);
  schedule_needed_ = true;  // a new or returning worker may take a queued job
  const absl::Time now = Now();
  const std::string id = request.requested_id().empty() ? NewWorkerId() : request.requested_id();
  const auto prior_it = workers_.find(id);
  const WorkerEntry* prior = prior_it == workers_.end() ? nullptr : &prior_it->second;

  Update u;
  v1::Worker* w = StageWorker(u, id);
  *w->mutable_capabilities() = request.capabilities();
  w->set_state(v1::WORKER_IDLE);
  w->set_job_id(0);
  w->set_rank(0);
  *w->mutable_register_time() = ToProto(now);
  *w->mutable_last_heartbeat() = ToProto(now);

  // Reattach: a trainer the store places on this worker, at the job's current attempt. A
  // finished job's trainer is reattached too, so the worker stays BUSY until it has stopped.
  bool attached_active = false;
  for (const v1::RunningTrainer& t : request.running()) {
    auto job = store_->GetJob(t.job_id());
    if (!job.ok()) continue;
    int rank = RankOf(*job, id);
    if (rank < 0 || job->attempt() != t.attempt() || job->state() == v1::QUEUED) continue;
    w->set_state(v1::WORKER_BUSY);
    w->set_job_id(t.job_id());
    w->set_rank(rank);
    attached_active = IsActive(job->state());
    break;
  }

  // The job this worker held before, if it did not come back with it.
  bool redeliver = false;
  if (prior != nullptr && prior->info.job_id() != 0 && prior->info.job_id() != w->job_id()) {
    auto job = store_->GetJob(prior->info.job_id());
    const int rank = job.ok() ? RankOf(*job, id) : -1;
    if (job.ok() && IsActive(job->state()) && rank >= 0) {
      if (prior->registered && !prior->acked && w->job_id() == 0) {
        // The agent restarted before it started the assignment: hand it out again.
        w->set_state(v1::WORKER_BUSY);
        w->set_job_id(job->id());
        w->set_rank(rank);
        redeliver = true;
      } else {
        auto staged = StageJob(u, job->id());
        if (!staged.ok()) return staged.status();
        FailAttempt(u, *staged,
                    prior->registered
                        ? absl::StrCat("rank ", rank, " on worker ", id,
                                       " lost: the worker registered again without its trainer")
                        : kLostInRestart);
      }
    }
  }
  if (absl::Status s = Commit(u); !s.ok()) return s;

  WorkerEntry& e = workers_[id];
  e.registered = true;
  e.last_seen = now;
  e.acked = attached_active && !redeliver;
  e.missing_since = absl::InfiniteFuture();
  v1::RegisterWorkerResponse response;
  response.set_worker_id(id);
  response.set_heartbeat_interval_ms(
      static_cast<int32_t>(absl::ToInt64Milliseconds(options_.heartbeat_interval)));
  return response;
}

absl::Status Coordinator::RunScheduler() {
  std::vector<const WorkerEntry*> idle_entries;
  for (const auto& [id, e] : workers_) {
    if (e.registered && e.info.state() == v1::WORKER_IDLE) idle_entries.push_back(&e);
  }
  if (idle_entries.empty()) return absl::OkStatus();
  std::sort(idle_entries.begin(), idle_entries.end(),
            [](const WorkerEntry* a, const WorkerEntry* b) {
              int64_t ta = TimeUtil::TimestampToMicroseconds(a->info.register_time());
              int64_t tb = TimeUtil::TimestampToMicroseconds(b->info.register_time());
              return ta != tb ? ta < tb : a->info.id() < b->info.id();
            });
  // RESTARTING jobs wait here, in id order with the queued ones, until no worker still runs
  // their failed attempt.
  auto queued = store_->ListJobs({v1::QUEUED, v1::RESTARTING}, 0, JobStore::Order::kOldestFirst);
  if (!queued.ok()) return queued.status();
  if (queued->empty()) return absl::OkStatus();

  std::vector<QueuedJob> queue;
  queue.reserve(queued->size());
  for (const v1::Job& job : *queued) {
    if (job.state() == v1::RESTARTING && AnyWorkerBusyWith(job.id())) continue;
    QueuedJob& q = queue.emplace_back();
    q.id = job.id();
    q.backend = common::RequiredBackend(job.spec());
    q.workers = job.spec().resources().workers();
    q.gpu_bytes = GpuBytesNeeded(job.spec());
  }
  std::vector<IdleWorker> idle;
  idle.reserve(idle_entries.size());
  for (const WorkerEntry* e : idle_entries) {
    idle.push_back({e->info.id(), e->info.capabilities().backend(),
                    e->info.capabilities().gpu_memory_bytes()});
  }
  std::vector<Placement> placements = Schedule(queue, idle);
  if (placements.empty()) return absl::OkStatus();

  Update u;
  for (const Placement& p : placements) {
    auto job = StageJob(u, p.job_id);
    if (!job.ok()) return job.status();
    const bool restart = (*job)->state() == v1::RESTARTING;
    (*job)->set_attempt((*job)->attempt() + 1);
    (*job)->clear_workers();
    for (size_t rank = 0; rank < p.workers.size(); ++rank) {
      (*job)->add_workers(p.workers[rank]);
      v1::Worker* w = StageWorker(u, p.workers[rank]);
      w->set_state(v1::WORKER_BUSY);
      w->set_job_id(p.job_id);
      w->set_rank(static_cast<int32_t>(rank));
    }
    SetState(u, *job, v1::SCHEDULED,
             absl::StrCat(restart ? absl::StrCat("attempt ", (*job)->attempt(), " ") : "",
                          "scheduled on ", absl::StrJoin(p.workers, ", ")));
  }
  return Commit(u);
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  auto entry = FindRegistered(request.worker_id());
  if (!entry.ok()) return entry.status();
  const absl::Time now = Now();
  (*entry)->last_seen = now;
  *(*entry)->info.mutable_last_heartbeat() = ToProto(now);
  // The scheduler reads every queued job from the store: run it only when something it reads
  // changed since it last ran (a submit, a registration or any committed update), not on each
  // of hundreds of idle heartbeats (bench/coordinator-load-*.md).
  if (schedule_needed_) {
    schedule_needed_ = false;
    if (absl::Status s = RunScheduler(); !s.ok()) {
      schedule_needed_ = true;
      return s;
    }
  }

  // RunScheduler may have given this worker a job; read its entry afresh.
  WorkerEntry& e = workers_.at(request.worker_id());
  const std::string& id = e.info.id();
  v1::HeartbeatResponse response;
  Update u;
  bool mark_acked = false;
  absl::Time missing_since = e.missing_since;
  int64_t current_job = 0;
  int32_t current_attempt = 0;
  if (e.info.job_id() != 0) {
    // Read, not staged: most heartbeats change nothing and must not rewrite the job row.
    auto job = store_->GetJob(e.info.job_id());
    if (!job.ok()) return job.status();
    const v1::Job& j = *job;
    const bool listed = Lists(request.running(), j.id(), j.attempt());
    // A RESTARTING job's failed attempt is not current: its trainers are stopped and the
    // worker released once they are gone.
    if (IsActive(j.state()) && j.state() != v1::RESTARTING) {
      current_job = j.id();
      current_attempt = j.attempt();
      if (listed) {
        mark_acked = true;
        missing_since = absl::InfiniteFuture();
      } else if (!e.acked) {
        v1::Assignment* a = response.add_assignments();
        a->set_job_id(j.id());
        a->set_attempt(j.attempt());
        a->set_rank(e.info.rank());
        a->set_world_size(j.workers_size());
        *a->mutable_spec() = j.spec();
      } else if (missing_since == absl::InfiniteFuture()) {
        missing_since = now;
      } else if (now - missing_since > options_.heartbeat_timeout) {
        auto staged = StageJob(u, j.id());
        if (!staged.ok()) return staged.status();
        FailAttempt(u, *staged,
                    absl::StrCat("rank ", e.info.rank(), " on worker ", id,
                                 " lost: its trainer stopped without an exit report"));
        Release(u, id);
        current_job = 0;
      }
    } else if (!listed) {
      // The job ended and its trainer is gone (or never started): the worker is free.
      Release(u, id);
    }
  }
  for (const v1::RunningTrainer& t : request.running()) {
    if (t.job_id() != current_job || t.attempt() != current_attempt) {
      *response.add_cancel() = t;
    }
  }
  if (absl::Status s = Commit(u); !s.ok()) return s;
  WorkerEntry& after = workers_.at(id);
  if (after.info.job_id() == current_job && current_job != 0) {
    after.acked = after.acked || mark_acked;
    after.missing_since = missing_since;
  }
  return response;
}

absl::StatusOr<v1::ReportStepsResponse> Coordinator::ReportSteps(
    const v1::ReportStepsRequest& request) {
  absl::MutexLock lock(&mu_);
  auto entry = FindRegistered(request.worker_id());
  if (!entry.ok()) return entry.status();
  WorkerEntry& e = **entry;
  const absl::Time now = Now();
  e.last_seen = now;
  Update u;
  auto staged = StageJob(u, request.job_id());
  if (!staged.ok()) return staged.status();
  v1::Job* job = *staged;
  v1::ReportStepsResponse response;
  const int rank = e.info.rank();
  if (e.info.job_id() != job->id() || job->attempt() != request.attempt() ||
      RankOf(*job, e.info.id()) != rank || !IsActive(job->state()) ||
      job->state() == v1::RESTARTING) {
    response.set_cancel(true);
    return response;
  }
  bool started = false;
  if (job->state() == v1::SCHEDULED) {
    *job->mutable_start_time() = ToProto(now);
    SetState(u, job, v1::RUNNING, absl::StrCat("running on ", absl::StrJoin(job->workers(), ", ")));
    started = true;
  }
  for (const v1::StepReport& step : request.steps()) {
    v1::StepReport* stored = AddEvent(u, job->id())->mutable_step();
    *stored = step;
    // The coordinator's view of who reports wins over what the trainer wrote.
    stored->set_job_id(job->id());
    stored->set_rank(rank);
    stored->set_attempt(job->attempt());
    if (rank == 0) *job->mutable_latest_report() = *stored;
  }
  for (const v1::LogLine& line : request.logs()) {
    v1::LogLine* stored = AddEvent(u, job->id())->mutable_log();
    *stored = line;
    stored->set_rank(rank);
    if (!stored->has_time()) *stored->mutable_time() = ToProto(now);
  }
  if (request.has_generation()) {
    *job->mutable_generation() = request.generation();
    *AddEvent(u, job->id())->mutable_generation() = request.generation();
  }
  const double queued_seconds = absl::ToDoubleSeconds(
      now - absl::FromUnixMicros(TimeUtil::TimestampToMicroseconds(job->create_time())));
  if (absl::Status s = Commit(u); !s.ok()) return s;
  e.acked = true;
  e.missing_since = absl::InfiniteFuture();
  if (!request.steps().empty()) *e.info.mutable_latest_report() = *request.steps().rbegin();
  if (started && metrics_ != nullptr) metrics_->ObserveSubmitToRunning(queued_seconds);
  return response;
}

absl::Status Coordinator::ReportExit(const v1::ReportExitRequest& request) {
  absl::MutexLock lock(&mu_);
  // Unlike the other worker RPCs this one is accepted from a worker not (yet) registered with
  // this process: the job row says whether the report is current, and dropping it would lose
  // the job's outcome.
  auto it = workers_.find(request.worker_id());
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker ", request.worker_id(), " is not registered"));
  }
  WorkerEntry& e = it->second;
  Update u;
  auto staged = StageJob(u, request.job_id());
  if (!staged.ok()) return staged.status();
  v1::Job* job = *staged;
  const int rank = RankOf(*job, e.info.id());
  if (rank < 0 || job->attempt() != request.attempt()) return absl::OkStatus();
  if (e.info.job_id() == job->id()) Release(u, e.info.id());
  if (IsActive(job->state()) && job->state() != v1::RESTARTING) {
    if (request.exit_code() == 0 && request.signal() == 0 && !request.cancelled()) {
      bool others_running = std::any_of(workers_.begin(), workers_.end(), [&](const auto& kv) {
        return kv.first != e.info.id() && kv.second.info.job_id() == job->id() &&
               kv.second.info.state() == v1::WORKER_BUSY;
      });
      if (!others_running) SetState(u, job, v1::SUCCEEDED, "");
    } else {
      FailAttempt(u, job, ExitMessage(request, rank));
    }
  }
  return Commit(u);
}

std::vector<v1::Worker> Coordinator::ListWorkers() {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Worker> out;
  out.reserve(workers_.size());
  for (const auto& [id, e] : workers_) out.push_back(e.info);
  std::sort(out.begin(), out.end(), [](const v1::Worker& a, const v1::Worker& b) {
    int64_t ta = TimeUtil::TimestampToMicroseconds(a.register_time());
    int64_t tb = TimeUtil::TimestampToMicroseconds(b.register_time());
    return ta != tb ? ta < tb : a.id() < b.id();
  });
  return out;
}

absl::Status Coordinator::CheckLiveness() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = Now();
  Update u;
  int lost = 0;
  for (auto& [id, e] : workers_) {
    if (e.info.state() == v1::WORKER_LOST || now - e.last_seen <= options_.heartbeat_timeout) {
      continue;
    }
    ++lost;
    v1::Worker* w = StageWorker(u, id);
    w->set_state(v1::WORKER_LOST);
    if (w->job_id() != 0) {
      auto job = StageJob(u, w->job_id());
      if (job.ok() && IsActive((*job)->state()) && RankOf(**job, id) >= 0) {
        FailAttempt(u, *job,
                    e.registered
                        ? absl::StrFormat("worker %s lost: no heartbeat for %.1f s", id,
                                          absl::ToDoubleSeconds(options_.heartbeat_timeout))
                        : kLostInRestart);
      }
    }
    Release(u, id);
  }
  const bool restart_check = !restart_jobs_.empty() && now >= restart_deadline_;
  if (restart_check) {
    for (int64_t job_id : restart_jobs_) {
      // Jobs failed above are already staged; the others are only read unless they fail.
      auto staged = u.jobs.find(job_id);
      absl::StatusOr<v1::Job> job =
          staged != u.jobs.end() ? staged->second : store_->GetJob(job_id);
      if (!job.ok() || !IsActive(job->state()) || job->state() == v1::RESTARTING) continue;
      bool all_back = true;
      for (const std::string& worker_id : job->workers()) {
        auto w = workers_.find(worker_id);
        all_back &= w != workers_.end() && w->second.registered &&
                    w->second.info.state() != v1::WORKER_LOST && w->second.info.job_id() == job_id;
      }
      if (all_back) continue;
      auto to_fail = StageJob(u, job_id);
      if (!to_fail.ok()) return to_fail.status();
      FailAttempt(u, *to_fail, kLostInRestart);
    }
  }
  if (absl::Status s = Commit(u); !s.ok()) return s;
  if (restart_check) restart_jobs_.clear();
  if (metrics_ != nullptr) {
    for (int i = 0; i < lost; ++i) metrics_->IncHeartbeatsMissed();
  }
  return absl::OkStatus();
}

absl::Status Coordinator::Flush() {
  absl::MutexLock lock(&mu_);
  return store_->Transaction([&]() -> absl::Status {
    for (const auto& [id, e] : workers_) {
      if (absl::Status s = store_->PutWorker(e.info); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
}

}  // namespace boulder::server
