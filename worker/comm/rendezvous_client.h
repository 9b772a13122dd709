// The trainer's side of the coordinator's rendezvous store (boulder.v1.RendezvousService):
// Set and wait-until-present Get of keys scoped to this trainer's (job, attempt).
//
// Thread-safe (a gRPC stub); one per trainer process.
#ifndef BOULDER_WORKER_COMM_RENDEZVOUS_CLIENT_H_
#define BOULDER_WORKER_COMM_RENDEZVOUS_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "boulder/v1/rendezvous.grpc.pb.h"
#include "common/grpc_security.h"

namespace boulder::comm {

struct RendezvousClientOptions {
  std::string coordinator;  // "HOST:PORT". Required.
  int64_t job_id = 0;
  int32_t attempt = 0;
  int32_t rank = 0;
  // Deadline of one RPC beyond the time it is asked to wait.
  absl::Duration rpc_slack = absl::Seconds(10);
  // TLS and the worker join token, as the worker agent talks to the coordinator
  // (common/grpc_security.h; the default is TLS with the system's roots and no token).
  common::ChannelSecurityOptions security;
};

class RendezvousClient {
 public:
  // INVALID_ARGUMENT: no coordinator address, or unusable TLS/token options. Connects lazily.
  static absl::StatusOr<std::unique_ptr<RendezvousClient>> Create(RendezvousClientOptions options);

  // Stores `value` under `key` (overwriting). Errors from the coordinator: FAILED_PRECONDITION
  // when the attempt no longer runs, UNAVAILABLE when it cannot be reached (with the likely
  // cause when it closed the connection after the TLS handshake: a missing or unaccepted
  // client certificate), UNAUTHENTICATED / PERMISSION_DENIED when it refused the token (the
  // message names the code and where the token comes from).
  absl::Status Set(const std::string& key, const std::string& value);

  // The values of `keys` (in order), waiting until all are set or `timeout` passes:
  // DEADLINE_EXCEEDED then, naming the keys still missing.
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               absl::Duration timeout);

  // Which of `keys` are set now, without waiting (one RPC per key).
  absl::StatusOr<std::vector<bool>> Present(const std::vector<std::string>& keys);

  const RendezvousClientOptions& options() const { return options_; }

 private:
  RendezvousClient(RendezvousClientOptions options, std::shared_ptr<grpc::Channel> channel);
  RendezvousClientOptions options_;
  std::unique_ptr<v1::RendezvousService::Stub> stub_;
};

// Announces `client`'s rank under "arrive/<rank>" and waits until all `world_size` ranks have.
// DEADLINE_EXCEEDED after `timeout` names the ranks that never arrived.
absl::Status ArriveAll(RendezvousClient* client, int world_size, absl::Duration timeout);

// After `cause` broke a collective on this rank: posts "failed/<rank>", waits up to `grace` for
// every other rank to do the same, and returns `cause` (its code) with a message naming this
// rank, the operation, and the ranks that posted nothing (dead or hung) when there are any.
absl::Status ExplainFailure(RendezvousClient* client, int world_size, absl::Duration grace,
                            const std::string& operation, const absl::Status& cause);

}  // namespace boulder::comm

#endif  // BOULDER_WORKER_COMM_RENDEZVOUS_CLIENT_H_
