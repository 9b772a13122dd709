#include "client/connection.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/env.h"

namespace boulder::client {
namespace {

std::string SecondsText(absl::Duration d) {
  return absl::StrFormat("%g s", absl::ToDoubleSeconds(d));
}

// The gRPC code's canonical name, e.g. "UNAVAILABLE".
std::string CodeName(grpc::StatusCode code) {
  return absl::AsciiStrToUpper(
      absl::StatusCodeToString(static_cast<absl::StatusCode>(static_cast<int>(code))));
}

}  // namespace

std::string ResolveCoordinator(absl::string_view flag, const char* env_value) {
  if (!flag.empty()) return std::string(flag);
  if (env_value != nullptr && env_value[0] != '\0') return env_value;
  return kDefaultCoordinator;
}

absl::Status ValidateCoordinatorAddress(absl::string_view address) {
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("--coordinator: expected HOST:PORT, got '", address, "'"));
  };
  if (absl::StrContains(address, "://") || absl::StartsWith(address, "unix:")) {
    return absl::OkStatus();
  }
  size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return bad();
  absl::string_view host = address.substr(0, colon);
  absl::string_view port_text = address.substr(colon + 1);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return bad();
  } else if (absl::StrContains(host, ':')) {
    return bad();  // An IPv6 address needs brackets.
  }
  for (char c : host) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c))) return bad();
  }
  int port = 0;
  if (port_text.empty() || !absl::SimpleAtoi(port_text, &port) || port < 1 || port > 65535) {
    return bad();
  }
  return absl::OkStatus();
}

std::string ConnectFailureReason(const grpc::Status& status) {
  const std::string lower = absl::AsciiStrToLower(status.error_message());
  struct Known {
    const char* needle;
    const char* reason;
  };
  static constexpr Known kKnown[] = {
      {"connection refused", "connection refused"},
      {"dns resolution failed", "cannot resolve the host name"},
      {"domain name not found", "cannot resolve the host name"},
      {"name or service not known", "cannot resolve the host name"},
      {"no route to host", "no route to host"},
      {"network is unreachable", "network is unreachable"},
      {"connection reset", "connection reset"},
      {"timed out", "connection timed out"},
      {"no such file or directory", "no such socket file"},
      {"cancelling all calls", "the coordinator shut down"},  // grpc::Server::Shutdown
      {"socket closed", "connection closed"},
      {"handshake failed",
       "TLS handshake failed: check --tls-ca (and --tls-cert for mutual TLS), or use --insecure "
       "only against a plaintext coordinator"},
  };
  for (const Known& k : kKnown) {
    if (absl::StrContains(lower, k.needle)) return k.reason;
  }
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) return "no answer";
  size_t last = lower.rfind(": ");
  std::string tail = last == std::string::npos ? lower : lower.substr(last + 2);
  return tail.empty() ? absl::AsciiStrToLower(CodeName(status.error_code())) : tail;
}

Connection::Connection(ConnectOptions options, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      jobs_(v1::JobService::NewStub(channel_)),
      workers_(v1::WorkerService::NewStub(channel_)) {}

absl::StatusOr<std::unique_ptr<Connection>> Connection::Open(const ConnectOptions& options) {
  absl::Status valid = ValidateCoordinatorAddress(options.address);
  if (!valid.ok()) return valid;
  grpc::ChannelArguments args;
  // Reconnect promptly after a coordinator restart (gRPC's default backoff grows to 2 min).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 250);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 250);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  auto channel = common::CreateSecureChannel(options.address, options.security, args);
  if (!channel.ok()) return channel.status();
  std::unique_ptr<Connection> conn(new Connection(options, *std::move(channel)));

  // Wait for READY, but give up at the first TRANSIENT_FAILURE: a refused connection is
  // reported at once instead of after the whole timeout.
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  grpc_connectivity_state state = conn->channel_->GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY && state != GRPC_CHANNEL_TRANSIENT_FAILURE &&
         state != GRPC_CHANNEL_SHUTDOWN) {
    if (!conn->channel_->WaitForStateChange(state, absl::ToChronoTime(deadline))) break;
    state = conn->channel_->GetState(/*try_to_connect=*/true);
  }
  if (state == GRPC_CHANNEL_READY) return conn;

  // The channel's state carries no reason; a read-only call does, in its status. It fails
  // at once (not wait-for-ready) when the channel is in TRANSIENT_FAILURE.
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  v1::ListWorkersResponse ignored;
  grpc::Status probe = conn->workers().ListWorkers(&context, v1::ListWorkersRequest(), &ignored);
  if (probe.ok()) return conn;
  if (probe.error_code() == grpc::StatusCode::UNIMPLEMENTED ||
      probe.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
      probe.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    return conn->RpcError(probe, "ListWorkers");
  }
  if (state != GRPC_CHANNEL_TRANSIENT_FAILURE &&
      probe.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return conn->Unreachable(
        absl::StrCat("no answer within ", SecondsText(options.connect_timeout)));
  }
  return conn->Unreachable(ConnectFailureReason(probe));
}

void Connection::SetUnaryDeadline(grpc::ClientContext* context) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
}

bool Connection::WaitForConnected(absl::Time deadline) {
  return channel_->WaitForConnected(absl::ToChronoTime(deadline));
}

absl::Status Connection::Unreachable(absl::string_view reason) const {
  return absl::UnavailableError(absl::StrCat(
      "cannot reach the coordinator at ", options_.address, " (", reason,
      "); start one with boulder-coordinator or set --coordinator / ", common::kEnvCoordinator));
}

absl::Status Connection::RpcError(const grpc::Status& status, absl::string_view method) const {
  switch (status.error_code()) {
    case grpc::StatusCode::OK:
      return absl::OkStatus();
    case grpc::StatusCode::UNAVAILABLE:
      return Unreachable(ConnectFailureReason(status));
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::DeadlineExceededError(absl::StrCat("the coordinator at ", options_.address,
                                                      " did not answer ", method, " within ",
                                                      SecondsText(options_.rpc_timeout)));
    case grpc::StatusCode::UNAUTHENTICATED:
      return absl::UnauthenticatedError(
          absl::StrCat("the coordinator at ", options_.address, " refused ", method, ": ",
                       status.error_message(), " (set --token-file or ", common::kEnvToken, ")"));
    case grpc::StatusCode::UNIMPLEMENTED:
      return absl::UnimplementedError(
          absl::StrCat("the server at ", options_.address, " does not implement ", method,
                       "; is it a Boulder coordinator of a matching version?"));
    default:
      break;
  }
  const auto code = static_cast<absl::StatusCode>(static_cast<int>(status.error_code()));
  if (status.error_message().empty()) {
    return absl::Status(code, absl::StrCat(method, " failed: ", CodeName(status.error_code())));
  }
  return absl::Status(code, status.error_message());
}

}  // namespace boulder::client
