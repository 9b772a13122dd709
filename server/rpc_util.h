// The RPC edge shared by the coordinator's services: each RPC's outcome is counted in the
// metrics and its absl::Status converted to a grpc::Status in exactly one place.
#ifndef BOULDER_SERVER_RPC_UTIL_H_
#define BOULDER_SERVER_RPC_UTIL_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_util.h"
#include "server/metrics.h"

namespace boulder::server {

// Times one RPC from construction. Not thread-safe; one per call.
class RpcScope {
 public:
  RpcScope(ServerMetrics* metrics, const char* method)
      : metrics_(metrics), method_(method), start_(absl::Now()) {}

  // Records the outcome and returns it as a grpc::Status.
  grpc::Status Done(const absl::Status& status) {
    metrics_->ObserveRpc(method_, status.code(), absl::ToDoubleSeconds(absl::Now() - start_));
    return common::ToGrpcStatus(status);
  }

  // Finishes a unary callback RPC with `status`.
  grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context,
                                   const absl::Status& status) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(Done(status));
    return reactor;
  }

 private:
  ServerMetrics* metrics_;
  const char* method_;
  absl::Time start_;
};

}  // namespace boulder::server

#endif  // BOULDER_SERVER_RPC_UTIL_H_
