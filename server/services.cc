#include "server/services.h"

#include <utility>

#include "server/rpc_util.h"
#include "server/watch_job.h"

namespace boulder::server {

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* context,
                                                    const v1::SubmitJobRequest* request,
                                                    v1::SubmitJobResponse* response) {
  RpcScope rpc(metrics_, "SubmitJob");
  auto job = coordinator_->SubmitJob(*request);
  if (job.ok()) response->mutable_job()->Swap(&*job);
  return rpc.Finish(context, job.status());
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* context,
                                                 const v1::GetJobRequest* request,
                                                 v1::Job* response) {
  RpcScope rpc(metrics_, "GetJob");
  auto job = coordinator_->GetJob(request->job_id());
  if (job.ok()) response->Swap(&*job);
  return rpc.Finish(context, job.status());
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* context,
                                                   const v1::ListJobsRequest* request,
                                                   v1::ListJobsResponse* response) {
  RpcScope rpc(metrics_, "ListJobs");
  auto jobs = coordinator_->ListJobs(*request);
  if (jobs.ok()) {
    for (v1::Job& job : *jobs) *response->add_jobs() = std::move(job);
  }
  return rpc.Finish(context, jobs.status());
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* context,
                                                    const v1::CancelJobRequest* request,
                                                    v1::Job* response) {
  RpcScope rpc(metrics_, "CancelJob");
  auto job = coordinator_->CancelJob(request->job_id());
  if (job.ok()) response->Swap(&*job);
  return rpc.Finish(context, job.status());
}

grpc::ServerWriteReactor<v1::JobEvent>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* /*context*/, const v1::WatchJobRequest* request) {
  // Metrics are recorded when the stream ends (WatchJobReactor::OnDone).
  auto* reactor = new WatchJobReactor(coordinator_, metrics_, *request);
  reactor->Start();
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJobLogs(grpc::CallbackServerContext* context,
                                                     const v1::GetJobLogsRequest* request,
                                                     v1::GetJobLogsResponse* response) {
  RpcScope rpc(metrics_, "GetJobLogs");
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
  auto r = coordinator_->RegisterWorker(*request);
  if (r.ok()) response->Swap(&*r);
  return rpc.Finish(context, r.status());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Heartbeat(grpc::CallbackServerContext* context,
                                                       const v1::HeartbeatRequest* request,
                                                       v1::HeartbeatResponse* response) {
  RpcScope rpc(metrics_, "Heartbeat");
  auto r = coordinator_->Heartbeat(*request);
  if (r.ok()) response->Swap(&*r);
  return rpc.Finish(context, r.status());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReportSteps(grpc::CallbackServerContext* context,
                                                         const v1::ReportStepsRequest* request,
                                                         v1::ReportStepsResponse* response) {
  RpcScope rpc(metrics_, "ReportSteps");
  auto r = coordinator_->ReportSteps(*request);
  if (r.ok()) response->Swap(&*r);
  return rpc.Finish(context, r.status());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReportExit(grpc::CallbackServerContext* context,
                                                        const v1::ReportExitRequest* request,
                                                        v1::ReportExitResponse* /*response*/) {
  RpcScope rpc(metrics_, "ReportExit");
  return rpc.Finish(context, coordinator_->ReportExit(*request));
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ListWorkers(grpc::CallbackServerContext* context,
                                                         const v1::ListWorkersRequest* /*request*/,
                                                         v1::ListWorkersResponse* response) {
  RpcScope rpc(metrics_, "ListWorkers");
  for (v1::Worker& w : coordinator_->ListWorkers()) *response->add_workers() = std::move(w);
  return rpc.Finish(context, absl::OkStatus());
}

}  // namespace boulder::server
