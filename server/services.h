// The coordinator's gRPC services (callback API): thin adapters from boulder.v1.JobService and
// boulder.v1.WorkerService onto the Coordinator. Each RPC is timed and counted in the metrics
// and its absl::Status converted to a grpc::Status at this edge only.
//
// Unary handlers run the Coordinator call inline on the gRPC callback thread: each is a short
// critical section plus at most one SQLite commit.
//
// Every RPC authenticates and authorizes its caller first with `auth` (server/auth.h says
// the rules); a null `auth` turns that off (every caller is an anonymous admin).
//
// Thread-safe. `coordinator`, `metrics` and `auth` are not owned and must outlive the
// grpc::Server.
#ifndef BOULDER_SERVER_SERVICES_H_
#define BOULDER_SERVER_SERVICES_H_

#include <grpcpp/grpcpp.h>

#include "boulder/v1/job.grpc.pb.h"
#include "boulder/v1/worker.grpc.pb.h"
#include "server/auth.h"
#include "server/coordinator.h"
#include "server/metrics.h"
#include "server/weights_store.h"

namespace boulder::server {

class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  // `weights` and `auth` are not owned; either may be null (ExportWeights is then
  // UNIMPLEMENTED; without an Authenticator every call is allowed).
  JobServiceImpl(Coordinator* coordinator, ServerMetrics* metrics, WeightsStore* weights = nullptr,
                 const Authenticator* auth = nullptr)
      : coordinator_(coordinator), metrics_(metrics), weights_(weights), auth_(auth) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const v1::SubmitJobRequest* request,
                                      v1::SubmitJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request, v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* request,
                                      v1::Job* response) override;
  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(grpc::CallbackServerContext* context,
                                                   const v1::WatchJobRequest* request) override;
  grpc::ServerUnaryReactor* GetJobLogs(grpc::CallbackServerContext* context,
                                       const v1::GetJobLogsRequest* request,
                                       v1::GetJobLogsResponse* response) override;
  grpc::ServerUnaryReactor* ExportWeights(grpc::CallbackServerContext* context,
                                          const v1::ExportWeightsRequest* request,
                                          v1::ExportWeightsResponse* response) override;

 private:
  // The caller, who must be a user.
  absl::StatusOr<Principal> UserCaller(grpc::CallbackServerContext* context) const;
  // The caller must be a user who may `action` job `job_id` (its owner or an admin).
  absl::Status Authorize(grpc::CallbackServerContext* context, int64_t job_id,
                         absl::string_view action) const;

  Coordinator* const coordinator_;
  ServerMetrics* const metrics_;
  WeightsStore* const weights_;
  const Authenticator* const auth_;
};

class WorkerServiceImpl final : public v1::WorkerService::CallbackService {
 public:
  WorkerServiceImpl(Coordinator* coordinator, ServerMetrics* metrics,
                    WeightsStore* weights = nullptr, const Authenticator* auth = nullptr)
      : coordinator_(coordinator), metrics_(metrics), weights_(weights), auth_(auth) {}

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* ReportSteps(grpc::CallbackServerContext* context,
                                        const v1::ReportStepsRequest* request,
                                        v1::ReportStepsResponse* response) override;
  grpc::ServerUnaryReactor* ReportExit(grpc::CallbackServerContext* context,
                                       const v1::ReportExitRequest* request,
                                       v1::ReportExitResponse* response) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override;
  grpc::ServerUnaryReactor* UploadWeights(grpc::CallbackServerContext* context,
                                          const v1::UploadWeightsRequest* request,
                                          v1::UploadWeightsResponse* response) override;

 private:
  // The caller must hold a worker join token.
  absl::Status Authorize(grpc::CallbackServerContext* context) const;

  Coordinator* const coordinator_;
  ServerMetrics* const metrics_;
  WeightsStore* const weights_;
  const Authenticator* const auth_;
};

}  // namespace boulder::server

#endif  // BOULDER_SERVER_SERVICES_H_
