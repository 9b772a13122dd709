#include "worker/comm/rendezvous_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/env.h"
#include "common/status_util.h"

namespace boulder::comm {
namespace {

// One Get RPC waits at most this long; longer waits loop (the server caps it too).
constexpr absl::Duration kMaxWaitPerCall = absl::Seconds(10);
// Pause before retrying a coordinator that could not be reached.
constexpr absl::Duration kRetryPause = absl::Milliseconds(200);

void SetDeadline(grpc::ClientContext* ctx, absl::Duration d) {
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d));
}

// One call's outcome: a connection closed after the TLS handshake explained
// (ExplainClosedConnection); a refused token named by its code, with where the token comes from.
absl::Status CallStatus(const grpc::Status& status,
                        const common::ChannelSecurityOptions& security) {
  absl::Status s = common::ExplainClosedConnection(common::FromGrpcStatus(status), security);
  if (!absl::IsUnauthenticated(s) && !absl::IsPermissionDenied(s)) return s;
  return absl::Status(
      s.code(), absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message(),
                             " (the rendezvous needs the worker join token: --join-token-file or $",
                             common::kEnvJoinToken, "; a worker agent passes its own)"));
}

}  // namespace

RendezvousClient::RendezvousClient(RendezvousClientOptions options,
                                   std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)), stub_(v1::RendezvousService::NewStub(std::move(channel))) {}

absl::StatusOr<std::unique_ptr<RendezvousClient>> RendezvousClient::Create(
    RendezvousClientOptions options) {
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError(
        "coordinator: empty (data-parallel training rendezvous through the coordinator; pass "
        "--coordinator HOST:PORT)");
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      common::CreateSecureChannel(options.coordinator, options.security, grpc::ChannelArguments());
  if (!channel.ok()) return channel.status();
  return std::unique_ptr<RendezvousClient>(
      new RendezvousClient(std::move(options), *std::move(channel)));
}

absl::Status RendezvousClient::Set(const std::string& key, const std::string& value) {
  v1::RendezvousSetRequest request;
  request.set_job_id(options_.job_id);
  request.set_attempt(options_.attempt);
  request.set_rank(options_.rank);
  request.set_key(key);
  request.set_value(value);
  v1::RendezvousSetResponse response;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.rpc_slack);
  absl::Status s = CallStatus(stub_->RendezvousSet(&ctx, request, &response), options_.security);
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("rendezvous set '", key, "' at ",
                                               options_.coordinator, ": ", s.message()));
  }
  return s;
}

absl::StatusOr<std::vector<std::string>> RendezvousClient::Get(const std::vector<std::string>& keys,
                                                               absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last;
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    v1::RendezvousGetRequest request;
    request.set_job_id(options_.job_id);
    request.set_attempt(options_.attempt);
    request.set_rank(options_.rank);
    for (const std::string& k : keys) request.add_keys(k);
    const absl::Duration wait = std::max(absl::ZeroDuration(), std::min(left, kMaxWaitPerCall));
    request.set_wait_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(wait)));
    v1::RendezvousGetResponse response;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, wait + options_.rpc_slack);
    last = CallStatus(stub_->RendezvousGet(&ctx, request, &response), options_.security);
    if (last.ok()) {
      if (response.values_size() != static_cast<int>(keys.size())) {
        return absl::InternalError(absl::StrCat("rendezvous get: asked for ", keys.size(),
                                                " keys, got ", response.values_size()));
      }
      return std::vector<std::string>(response.values().begin(), response.values().end());
    }
    const bool retry = absl::IsDeadlineExceeded(last) || absl::IsUnavailable(last);
    if (!retry || absl::Now() >= deadline) break;
    if (absl::IsUnavailable(last)) absl::SleepFor(std::min(kRetryPause, deadline - absl::Now()));
  }
  return absl::Status(last.code(),
                      absl::StrCat("rendezvous get at ", options_.coordinator, " (waited ",
                                   absl::FormatDuration(timeout), "): ", last.message()));
}

absl::StatusOr<std::vector<bool>> RendezvousClient::Present(const std::vector<std::string>& keys) {
  std::vector<bool> present;
  for (const std::string& key : keys) {
    v1::RendezvousGetRequest request;
    request.set_job_id(options_.job_id);
    request.set_attempt(options_.attempt);
    request.set_rank(options_.rank);
    request.add_keys(key);
    request.set_wait_ms(0);
    v1::RendezvousGetResponse response;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, options_.rpc_slack);
    absl::Status s = CallStatus(stub_->RendezvousGet(&ctx, request, &response), options_.security);
    if (!s.ok() && !absl::IsDeadlineExceeded(s)) {
      return absl::Status(s.code(),
                          absl::StrCat("rendezvous at ", options_.coordinator, ": ", s.message()));
    }
    present.push_back(s.ok());
  }
  return present;
}

absl::Status ArriveAll(RendezvousClient* client, int world_size, absl::Duration timeout) {
  const int rank = client->options().rank;
  if (absl::Status s = client->Set(absl::StrCat("arrive/", rank), "1"); !s.ok()) return s;
  const absl::Time deadline = absl::Now() + timeout;
  for (int r = 0; r < world_size; ++r) {
    if (r == rank) continue;
    absl::StatusOr<std::vector<std::string>> got = client->Get(
        {absl::StrCat("arrive/", r)}, std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (got.ok()) continue;
    if (!absl::IsDeadlineExceeded(got.status())) return got.status();
    // Name every rank still missing, not only the first.
    std::vector<std::string> keys;
    std::vector<int> ranks;
    for (int q = r; q < world_size; ++q) {
      if (q == rank) continue;
      keys.push_back(absl::StrCat("arrive/", q));
      ranks.push_back(q);
    }
    absl::StatusOr<std::vector<bool>> present = client->Present(keys);
    std::vector<int> missing;
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (!present.ok() || !(*present)[i]) missing.push_back(ranks[i]);
    }
    return absl::DeadlineExceededError(
        absl::StrCat("rendezvous: rank", missing.size() == 1 ? " " : "s ",
                     absl::StrJoin(missing, ", "), " of ", world_size, " never arrived within ",
                     absl::FormatDuration(timeout), " (rank ", rank, " waited)"));
  }
  return absl::OkStatus();
}

absl::Status ExplainFailure(RendezvousClient* client, int world_size, absl::Duration grace,
                            const std::string& operation, const absl::Status& cause) {
  const int rank = client->options().rank;
  std::string message = absl::StrCat(operation, " failed on rank ", rank, ": ", cause.message());
  if (world_size <= 1) return absl::Status(cause.code(), message);
  absl::Status posted = client->Set(absl::StrCat("failed/", rank), std::string(cause.message()));
  if (!posted.ok()) {
    // The attempt is already over (another rank's failure was recorded first) or the
    // coordinator is gone: nothing more to learn.
    return absl::Status(cause.code(), message);
  }
  const absl::Time deadline = absl::Now() + grace;
  std::vector<int> silent;
  for (int r = 0; r < world_size; ++r) {
    if (r == rank) continue;
    absl::StatusOr<std::vector<std::string>> got = client->Get(
        {absl::StrCat("failed/", r)}, std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (!got.ok()) {
      if (!absl::IsDeadlineExceeded(got.status())) return absl::Status(cause.code(), message);
      silent.push_back(r);
    }
  }
  if (!silent.empty()) {
    absl::StrAppend(&message, "; rank", silent.size() == 1 ? " " : "s ",
                    absl::StrJoin(silent, ", "), silent.size() == 1 ? " is" : " are",
                    " dead or hung (no failure report within ", absl::FormatDuration(grace), ")");
  }
  return absl::Status(cause.code(), message);
}

}  // namespace boulder::comm
