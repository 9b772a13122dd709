#include "server/services.h"

#include <optional>
#include <string>
#include <utility>

#include "server/rpc_util.h"
#include "server/watch_job.h"

namespace boulder::server {
namespace {

// A WatchJob refused before it started: finishes with `status` at once.
class RefusedWatch final : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  explicit RefusedWatch(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

absl::StatusOr<Principal> JobServiceImpl::UserCaller(grpc::CallbackServerContext* context) const {
  auto caller = Caller(auth_, *context);
  if (!caller.ok()) return caller.status();
  if (absl::Status s = RequireUser(*caller); !s.ok()) return s;
  return caller;
}

absl::Status JobServiceImpl::Authorize(grpc::CallbackServerContext* context, int64_t job_id,
                                       absl::string_view action) const {
  auto caller = UserCaller(context);
  if (!caller.ok()) return caller.status();
  if (auth_ == nullptr || caller->admin) return absl::OkStatus();
  auto job = coordinator_->GetJob(job_id);
  if (!job.ok()) return job.status();
  return CheckJobAccess(*caller, *job, action);
}

absl::Status WorkerServiceImpl::Authorize(grpc::CallbackServerContext* context) const {
  auto caller = Caller(auth_, *context);
  if (!caller.ok()) return caller.status();
  return RequireWorker(*caller);
}

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* context,
                                                    const v1::SubmitJobRequest* request,
                                                    v1::SubmitJobResponse* response) {
  RpcScope rpc(metrics_, "SubmitJob");
  auto caller = UserCaller(context);
  if (!caller.ok()) return rpc.Finish(context, caller.status());
  auto job = coordinator_->SubmitJob(*request, caller->user);
  if (job.ok()) response->mutable_job()->Swap(&*job);
  return rpc.Finish(context, job.status());
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* context,
                                                 const v1::GetJobRequest* request,
                                                 v1::Job* response) {
  RpcScope rpc(metrics_, "GetJob");
  auto caller = UserCaller(context);
  if (!caller.ok()) return rpc.Finish(context, caller.status());
  auto job = coordinator_->GetJob(request->job_id());
  if (job.ok()) {
    if (absl::Status s = CheckJobAccess(*caller, *job, "read"); !s.ok()) {
      return rpc.Finish(context, s);
    }
    response->Swap(&*job);
  }
  return rpc.Finish(context, job.status());
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* context,
                                                   const v1::ListJobsRequest* request,
                                                   v1::ListJobsResponse* response) {
  RpcScope rpc(metrics_, "ListJobs");
  auto caller = UserCaller(context);
  if (!caller.ok()) return rpc.Finish(context, caller.status());
  // Users who are not admins see only their own jobs.
  std::optional<std::string> owner;
  if (!caller->admin) owner = caller->user;
  auto jobs = coordinator_->ListJobs(*request, owner);
  if (jobs.ok()) {
    for (v1::Job& job : *jobs) *response->add_jobs() = std::move(job);
  }
  return rpc.Finish(context, jobs.status());
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* context,
                                                    const v1::CancelJobRequest* request,
                                                    v1::Job* response) {
  RpcScope rpc(metrics_, "CancelJob");
  if (absl::Status s = Authorize(context, request->job_id(), "cancel"); !s.ok()) {
    return rpc.Finish(context, s);
  }
  auto job = coordinator_->CancelJob(request->job_id());
  if (job.ok()) response->Swap(&*job);
  return rpc.Finish(context, job.status());
}

grpc::ServerWriteReactor<v1::JobEvent>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  if (absl::Status s = Authorize(context, request->job_id(), "watch"); !s.ok()) {
    RpcScope rpc(metrics_, "WatchJob");
    return new RefusedWatch(rpc.Done(s));
  }
  // Metrics are recorded when the stream ends (WatchJobReactor::OnDone).
  auto* reactor = new WatchJobReactor(coordinator_, metrics_, *request);
  reactor->Start();
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJobLogs(grpc::CallbackServerContext* context,
                                                     const v1::GetJobLogsRequest* request,
                                                     v1::GetJobLogsResponse* response) {
  RpcScope rpc(metrics_, "GetJobLogs");
  if (absl::Status s = Authorize(context, request->job_id(), "read the logs of"); !s.ok()) {
    return rpc.Finish(context, s);
  }
  auto lines = coordinator_->GetJobLogs(request->job_id());
  if (lines.ok()) {
    for (v1::LogLine& line : *lines) *response->add_lines() = std::move(line);
  }
  return rpc.Finish(context, lines.status());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::RegisterWorker(
    grpc::CallbackServerContext* context, const v1::RegisterWorkerRequest* request,
    v1::RegisterWorkerResponse* response) {
  RpcScope rpc(metrics_, "RegisterWorker");
  if (absl::Status s = Authorize(context); !s.ok()) return rpc.Finish(context, s);
  auto r = coordinator_->RegisterWorker(*request);
  if (r.ok()) response->Swap(&*r);
  return rpc.Finish(context, r.status());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Heartbeat(grpc::CallbackServerContext* context,
                                                       const v1::HeartbeatRequest* request,
                                                       v1::HeartbeatResponse* response) {
  RpcScope rpc(metrics_, "Heartbeat");
  if (absl::Status s = Authorize(context); !s.ok()) return rpc.Finish(context, s);
  auto r = coordinator_->Heartbeat(*request);
  if (r.ok()) response->Swap(&*r);
  return rpc.Finish(context, r.status());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReportSteps(grpc::CallbackServerContext* context,
                                                         const v1::ReportStepsRequest* request,
                                                         v1::ReportStepsResponse* response) {
  RpcScope rpc(metrics_, "ReportSteps");
  if (absl::Status s = Authorize(context); !s.ok()) return rpc.Finish(context, s);
  auto r = coordinator_->ReportSteps(*request);
  if (r.ok()) response->Swap(&*r);
  return rpc.Finish(context, r.status());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReportExit(grpc::CallbackServerContext* context,
                                                        const v1::ReportExitRequest* request,
                                                        v1::ReportExitResponse* /*response*/) {
  RpcScope rpc(metrics_, "ReportExit");
  if (absl::Status s = Authorize(context); !s.ok()) return rpc.Finish(context, s);
  return rpc.Finish(context, coordinator_->ReportExit(*request));
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ListWorkers(grpc::CallbackServerContext* context,
                                                         const v1::ListWorkersRequest* /*request*/,
                                                         v1::ListWorkersResponse* response) {
  RpcScope rpc(metrics_, "ListWorkers");
  // Users and workers alike may list workers.
  if (auto caller = Caller(auth_, *context); !caller.ok()) {
    return rpc.Finish(context, caller.status());
  }
  for (v1::Worker& w : coordinator_->ListWorkers()) *response->add_workers() = std::move(w);
  return rpc.Finish(context, absl::OkStatus());
}

}  // namespace boulder::server
