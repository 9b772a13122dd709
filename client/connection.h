// The CLI's connection to the coordinator: address resolution, a quick reachability check and
// the translation of failed RPCs into the one-line messages `boulder` prints.
//
// Every message returned here is a complete sentence without the "boulder: " prefix, e.g.
//   "cannot reach the coordinator at 127.0.0.1:7070 (connection refused); start one with
//    boulder-coordinator or set --coordinator / BOULDER_COORDINATOR"
//
// Thread-safety: a Connection may be shared by threads (gRPC stubs and channels are
// thread-safe); the free functions are pure.
#ifndef BOULDER_CLIENT_CONNECTION_H_
#define BOULDER_CLIENT_CONNECTION_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "boulder/v1/job.grpc.pb.h"
#include "boulder/v1/worker.grpc.pb.h"
#include "common/grpc_security.h"

namespace boulder::client {

// Where the CLI looks for the coordinator when neither --coordinator nor BOULDER_COORDINATOR
// is given.
inline constexpr char kDefaultCoordinator[] = "127.0.0.1:7070";

// The coordinator address: `flag` if non-empty, else `env_value` if non-null and non-empty,
// else kDefaultCoordinator.
std::string ResolveCoordinator(absl::string_view flag, const char* env_value);

// Accepts HOST:PORT (HOST a name, an IPv4 address or a bracketed IPv6 address, PORT 1-65535)
// or a gRPC target with an explicit scheme ("dns:///host:port", "unix:/path").
// INVALID_ARGUMENT "--coordinator: expected HOST:PORT, got '...'" otherwise.
absl::Status ValidateCoordinatorAddress(absl::string_view address);

// A short lower-case reason from the status of an RPC that could not connect, e.g.
// "connection refused", "cannot resolve the host name"; the status's own last clause when it
// is not one of the known ones.
std::string ConnectFailureReason(const grpc::Status& status);

struct ConnectOptions {
  // Coordinator address (see ValidateCoordinatorAddress).
  std::string address = kDefaultCoordinator;
  // How long Open() waits for the first connection before reporting the coordinator
  // unreachable. A refused connection is reported at once.
  absl::Duration connect_timeout = absl::Seconds(3);
  // Deadline of each unary RPC.
  absl::Duration rpc_timeout = absl::Seconds(30);
  // TLS (or, explicitly, plaintext) and the user's bearer token.
  common::ChannelSecurityOptions security;
};

class Connection {
 public:
  // Creates a channel with options.security and waits until it is connected.
  // INVALID_ARGUMENT for a malformed address or bad TLS options; UNAUTHENTICATED or
  // PERMISSION_DENIED when the coordinator refuses the token; UNAVAILABLE ("cannot reach the
  // coordinator at ...") when no connection is made within options.connect_timeout.
  static absl::StatusOr<std::unique_ptr<Connection>> Open(const ConnectOptions& options);

  v1::JobService::Stub& jobs() { return *jobs_; }
  v1::WorkerService::Stub& workers() { return *workers_; }
  const std::string& address() const { return options_.address; }

  // Sets the unary-call deadline on a fresh context.
  void SetUnaryDeadline(grpc::ClientContext* context) const;

  // Blocks until the channel is connected (reconnecting as needed) or `deadline` passes;
  // returns whether it is connected.
  bool WaitForConnected(absl::Time deadline);

  // The error to print for a failed call of `method` (e.g. "GetJob"): UNAVAILABLE as the
  // unreachable message, DEADLINE_EXCEEDED and UNIMPLEMENTED explained, any other code with
  // the server's own message. The code is kept.
  absl::Status RpcError(const grpc::Status& status, absl::string_view method) const;

  // The unreachable message with `reason`, as an UNAVAILABLE status.
  absl::Status Unreachable(absl::string_view reason) const;

 private:
  Connection(ConnectOptions options, std::shared_ptr<grpc::Channel> channel);

  ConnectOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
};

}  // namespace boulder::client

#endif  // BOULDER_CLIENT_CONNECTION_H_
