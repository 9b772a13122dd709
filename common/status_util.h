// Conversions between absl::Status (used by all host code) and grpc::Status (only at the RPC
// edge). Canonical codes map one to one.
#ifndef BOULDER_COMMON_STATUS_UTIL_H_
#define BOULDER_COMMON_STATUS_UTIL_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace boulder::common {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace boulder::common

#endif  // BOULDER_COMMON_STATUS_UTIL_H_
