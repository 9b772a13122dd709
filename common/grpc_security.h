// Transport security and call credentials for every Boulder gRPC endpoint, in one place: the
// coordinator's server credentials (TLS, optionally requiring client certificates), the
// clients' channel credentials (TLS with a CA to verify the server, an optional client
// certificate, a bearer token sent with every call), message size limits and bearer-token
// loading. A new client (the trainer, a tool) gets a channel with one call:
//
//   common::ChannelSecurityOptions security = ...;   // from its flags
//   auto channel = common::CreateSecureChannel(address, security, args);
//
// Plaintext is used only when `insecure` is set explicitly; every binary then prints
// kInsecureWarning.
//
// Bearer tokens travel as the "authorization: Bearer TOKEN" metadata entry (kAuthMetadataKey).
//
// Errors (all INVALID_ARGUMENT, naming the option, e.g. "tls_cert: cannot read 'x.pem': No such
// file or directory"): unreadable files, files that are not PEM, options that contradict each
// other (a key without a certificate, TLS files together with insecure, a server without a
// certificate), tokens that are empty or contain characters outside printable ASCII.
// Thread-safe: plain functions.
#ifndef BOULDER_COMMON_GRPC_SECURITY_H_
#define BOULDER_COMMON_GRPC_SECURITY_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace boulder::common {

// Largest message a Boulder server accepts. Requests are small (a spec is at most
// kMaxSpecBytes, a batch of step reports and log lines a few hundred KiB).
inline constexpr int kMaxServerReceiveBytes = 8 << 20;
// Largest message a Boulder client accepts: a ListJobs of tens of thousands of jobs fits.
inline constexpr int kMaxClientReceiveBytes = 256 << 20;

// The metadata key bearer tokens travel under (lower case, as gRPC requires).
inline constexpr char kAuthMetadataKey[] = "authorization";

// Printed (to stderr) by every binary that runs without TLS.
inline constexpr char kInsecureWarning[] =
    "WARNING: --insecure: gRPC traffic is plaintext (no TLS); tokens and job data can be read "
    "and altered on the network. Use only on a trusted host or network.";

struct ServerSecurityOptions {
  // Plaintext, no TLS. When set, the TLS files below must be empty.
  bool insecure = false;
  // PEM certificate chain and private key of the server. Required unless insecure.
  std::string cert_file;
  std::string key_file;
  // PEM CA bundle for client certificates. When set, every client must present a certificate
  // signed by it (mutual TLS); empty: client certificates are not requested.
  std::string client_ca_file;
};

struct ChannelSecurityOptions {
  // Plaintext, no TLS. When set, the TLS files below must be empty (a token is still sent:
  // for tests and trusted networks only).
  bool insecure = false;
  // PEM CA bundle to verify the server's certificate; empty: the system's roots.
  std::string ca_file;
  // PEM client certificate and key, for servers that require them (mutual TLS). Both or none.
  std::string cert_file;
  std::string key_file;
  // Sent as "authorization: Bearer TOKEN" with every call; empty: none.
  std::string token;
  // Verify the server certificate against this name instead of the address's host (the
  // grpc.ssl_target_name_override channel argument); empty: the host.
  std::string server_name_override;
};

// Server credentials from `options`, after reading and checking its files.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerSecurityOptions& options);

// Channel credentials from `options` (the token, if any, as call credentials composed in).
// gRPC does not compose call credentials with plaintext: insecure with a token is
// INVALID_ARGUMENT here; CreateSecureChannel sends the token then through an interceptor.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ChannelSecurityOptions& options);

// Call credentials that add "authorization: Bearer TOKEN" to every call. With
// `allow_insecure` they are sent over plaintext channels too (gRPC refuses otherwise).
// INVALID_ARGUMENT for an empty token or one with characters outside '!'..'~'.
absl::StatusOr<std::shared_ptr<grpc::CallCredentials>> MakeTokenCallCredentials(
    const std::string& token, bool allow_insecure);

// A channel to `target` with MakeChannelCredentials(security), `args` (reconnect backoff and
// the like) and the client message size limit; the token is sent over plaintext channels too.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateSecureChannel(
    const std::string& target, const ChannelSecurityOptions& security,
    grpc::ChannelArguments args = {});

// `status`, from a call on a channel made with `security`, with a hint appended when it is
// what gRPC reports for a connection the server closed right after the TLS handshake
// (UNAVAILABLE, "Socket closed"). With TLS 1.3 the client's side of the handshake is done
// before the server has checked the client's certificate, so a coordinator that requires one
// (--tls-client-ca) and gets none, or one its CA did not sign, shows up this way rather than as
// a handshake failure. Any other status is returned unchanged.
absl::Status ExplainClosedConnection(const absl::Status& status,
                                     const ChannelSecurityOptions& security);

// Sets the server's message size limits on `builder`.
void SetServerMessageLimits(grpc::ServerBuilder* builder);

// The bearer token from `file` when non-empty (its content, surrounding whitespace trimmed),
// else from the environment variable `env_name` when set and non-empty, else "". `what` names
// the source in errors (e.g. "--token-file"). INVALID_ARGUMENT for an unreadable or empty file
// and for a malformed token.
absl::StatusOr<std::string> LoadToken(const std::string& file, const char* env_name,
                                      absl::string_view what);

// OK when `token` can be sent as metadata: non-empty, printable ASCII without spaces.
absl::Status ValidateToken(absl::string_view token, absl::string_view what);

// The whole of a small file (at most 1 MiB). INVALID_ARGUMENT "WHAT: cannot read 'PATH': why".
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, absl::string_view what);

}  // namespace boulder::common

#endif  // BOULDER_COMMON_GRPC_SECURITY_H_
