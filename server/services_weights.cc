// The weights RPCs: WorkerService.UploadWeights and JobService.ExportWeights (see
// server/weights_store.h for how weights travel).
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/rpc_util.h"
#include "server/services.h"

namespace boulder::server {
namespace {

constexpr char kFormat[] = "safetensors";

absl::Status CheckFormat(const std::string& format) {
  if (format.empty() || format == kFormat) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("format '", format, "' is not supported (only safetensors)"));
}

}  // namespace

grpc::ServerUnaryReactor* WorkerServiceImpl::UploadWeights(grpc::CallbackServerContext* context,
                                                           const v1::UploadWeightsRequest* request,
                                                           v1::UploadWeightsResponse* response) {
  RpcScope rpc(metrics_, "UploadWeights");
  if (weights_ == nullptr) {
    return rpc.Finish(context, absl::UnimplementedError("this coordinator stores no weights"));
  }
  absl::Status status = CheckFormat(request->format());
  absl::StatusOr<v1::Job> job = coordinator_->GetJob(request->job_id());
  if (status.ok()) status = job.status();
  // Only rank 0 of the job's current attempt uploads.
  if (status.ok() && (job->attempt() != request->attempt() || job->workers().empty() ||
                      job->workers(0) != request->worker_id())) {
    status = absl::FailedPreconditionError(
        absl::StrCat("job ", request->job_id(), ": worker ", request->worker_id(), " attempt ",
                     request->attempt(), " is not rank 0 of the current attempt ", job->attempt()));
  }
  if (status.ok()) {
    absl::StatusOr<int64_t> received =
        weights_->Append(request->job_id(), request->attempt(), request->total_bytes(),
                         request->offset(), request->data(), request->last());
    if (received.ok()) response->set_received_bytes(*received);
    status = received.status();
  }
  return rpc.Finish(context, status);
}

grpc::ServerUnaryReactor* JobServiceImpl::ExportWeights(grpc::CallbackServerContext* context,
                                                        const v1::ExportWeightsRequest* request,
                                                        v1::ExportWeightsResponse* response) {
  RpcScope rpc(metrics_, "ExportWeights");
  if (weights_ == nullptr) {
    return rpc.Finish(context, absl::UnimplementedError("this coordinator stores no weights"));
  }
  absl::Status status = CheckFormat(request->format());
  absl::StatusOr<v1::Job> job = coordinator_->GetJob(request->job_id());
  if (status.ok()) status = job.status();
  if (status.ok()) {
    absl::StatusOr<WeightsStore::Chunk> chunk =
        weights_->Read(request->job_id(), request->offset(), request->max_bytes());
    if (chunk.ok()) {
      response->set_data(std::move(chunk->data));
      response->set_total_bytes(chunk->total_bytes);
    } else if (absl::IsNotFound(chunk.status())) {
      status = absl::FailedPreconditionError(absl::StrCat(
          "job ", request->job_id(), " (", v1::JobState_Name(job->state()),
          ") has no weights yet: its rank-0 trainer uploads them when it finishes training"));
    } else {
      status = chunk.status();
    }
  }
  return rpc.Finish(context, status);
}

}  // namespace boulder::server
