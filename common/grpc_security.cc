#include "common/grpc_security.h"

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/client_interceptor.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace boulder::common {
namespace {

constexpr size_t kMaxFileBytes = 1 << 20;

// Reads a PEM file; `what` is the option's name.
absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view what) {
  auto text = ReadSmallFile(path, what);
  if (!text.ok()) return text.status();
  if (!absl::StrContains(*text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", path, "' is not a PEM file (no -----BEGIN line)"));
  }
  return text;
}

class BearerTokenPlugin final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit BearerTokenPlugin(std::string token) : value_(absl::StrCat("Bearer ", token)) {}
  bool IsBlocking() const override { return false; }
  const char* GetType() const override { return "boulder-bearer-token"; }
  grpc::Status GetMetadata(grpc::string_ref /*service_url*/, grpc::string_ref /*method_name*/,
                           const grpc::AuthContext& /*channel_auth_context*/,
                           std::multimap<grpc::string, grpc::string>* metadata) override {
    metadata->insert({kAuthMetadataKey, value_});
    return grpc::Status::OK;
  }
  grpc::string DebugString() override { return "boulder bearer token (value hidden)"; }

 private:
  const std::string value_;
};

// Adds the bearer token to plaintext channels, where gRPC does not compose call credentials.
class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string* value) : value_(value) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({kAuthMetadataKey, *value_});
    }
    methods->Proceed();
  }

 private:
  const std::string* value_;  // owned by the factory, which the channel keeps
};

class BearerTokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(const std::string& token)
      : value_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new BearerTokenInterceptor(&value_);
  }

 private:
  const std::string value_;
};

}  // namespace

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": cannot read '", path, "': ", std::strerror(errno)));
  }
  std::string text;
  text.resize(kMaxFileBytes + 1);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cannot read '", path, "'"));
  }
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", path, "' is larger than ", kMaxFileBytes, " bytes"));
  }
  return text;
}

absl::Status ValidateToken(absl::string_view token, absl::string_view what) {
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": the token is empty"));
  for (char c : token) {
    if (c < '!' || c > '~') {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": the token may contain only printable ASCII characters without spaces"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> LoadToken(const std::string& file, const char* env_name,
                                      absl::string_view what) {
  std::string token;
  if (!file.empty()) {
    auto text = ReadSmallFile(file, what);
    if (!text.ok()) return text.status();
    token = std::string(absl::StripAsciiWhitespace(*text));
    if (token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": '", file, "' is empty"));
    }
  } else {
    const char* env = env_name == nullptr ? nullptr : std::getenv(env_name);
    if (env == nullptr || env[0] == '\0') return std::string();
    token = std::string(absl::StripAsciiWhitespace(env));
    what = env_name;
  }
  if (absl::Status s = ValidateToken(token, what); !s.ok()) return s;
  return token;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerSecurityOptions& options) {
  const bool any_tls =
      !options.cert_file.empty() || !options.key_file.empty() || !options.client_ca_file.empty();
  if (options.insecure) {
    if (any_tls) {
      return absl::InvalidArgumentError(
          "insecure: plaintext was asked for together with TLS files; choose one");
    }
    return grpc::InsecureServerCredentials();
  }
  if (options.cert_file.empty() || options.key_file.empty()) {
    return absl::InvalidArgumentError(
        "tls_cert, tls_key: a server certificate and key are required (or run with --insecure "
        "for plaintext)");
  }
  auto cert = ReadPem(options.cert_file, "tls_cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(options.key_file, "tls_key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  if (!options.client_ca_file.empty()) {
    auto ca = ReadPem(options.client_ca_file, "tls_client_ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<std::shared_ptr<grpc::CallCredentials>> MakeTokenCallCredentials(
    const std::string& token, bool allow_insecure) {
  if (absl::Status s = ValidateToken(token, "token"); !s.ok()) return s;
  auto plugin = std::make_unique<BearerTokenPlugin>(token);
  if (allow_insecure) {
    return grpc::experimental::MetadataCredentialsFromPlugin(std::move(plugin), GRPC_SECURITY_NONE);
  }
  return grpc::MetadataCredentialsFromPlugin(std::move(plugin));
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ChannelSecurityOptions& options) {
  std::shared_ptr<grpc::ChannelCredentials> channel;
  if (options.insecure) {
    if (!options.ca_file.empty() || !options.cert_file.empty() || !options.key_file.empty()) {
      return absl::InvalidArgumentError(
          "insecure: plaintext was asked for together with TLS files; choose one");
    }
    channel = grpc::InsecureChannelCredentials();
  } else {
    if (options.cert_file.empty() != options.key_file.empty()) {
      return absl::InvalidArgumentError(
          "tls_cert, tls_key: a client certificate needs its key and a key its certificate");
    }
    grpc::SslCredentialsOptions ssl;
    if (!options.ca_file.empty()) {
      auto ca = ReadPem(options.ca_file, "tls_ca");
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *std::move(ca);
    }
    if (!options.cert_file.empty()) {
      auto cert = ReadPem(options.cert_file, "tls_cert");
      if (!cert.ok()) return cert.status();
      auto key = ReadPem(options.key_file, "tls_key");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *std::move(cert);
      ssl.pem_private_key = *std::move(key);
    }
    channel = grpc::SslCredentials(ssl);
  }
  if (options.token.empty()) return channel;
  if (options.insecure) {
    return absl::InvalidArgumentError(
        "token: over plaintext a token is sent only by channels from CreateSecureChannel");
  }
  auto call = MakeTokenCallCredentials(options.token, /*allow_insecure=*/false);
  if (!call.ok()) return call.status();
  return grpc::CompositeChannelCredentials(channel, *call);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateSecureChannel(
    const std::string& target, const ChannelSecurityOptions& security,
    grpc::ChannelArguments args) {
  ChannelSecurityOptions without_token = security;
  // Plaintext: the token goes in through an interceptor instead of call credentials.
  const bool intercept = security.insecure && !security.token.empty();
  if (intercept) {
    if (absl::Status s = ValidateToken(security.token, "token"); !s.ok()) return s;
    without_token.token.clear();
  }
  auto credentials = MakeChannelCredentials(without_token);
  if (!credentials.ok()) return credentials.status();
  args.SetMaxReceiveMessageSize(kMaxClientReceiveBytes);
  args.SetMaxSendMessageSize(kMaxServerReceiveBytes);
  if (!security.server_name_override.empty()) {
    args.SetSslTargetNameOverride(security.server_name_override);
  }
  if (intercept) {
    std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
    factories.push_back(std::make_unique<BearerTokenInterceptorFactory>(security.token));
    return grpc::experimental::CreateCustomChannelWithInterceptors(target, *credentials, args,
                                                                   std::move(factories));
  }
  return grpc::CreateCustomChannel(target, *credentials, args);
}

absl::Status ExplainClosedConnection(const absl::Status& status,
                                     const ChannelSecurityOptions& security) {
  if (security.insecure || !absl::IsUnavailable(status) ||
      !absl::StrContains(absl::AsciiStrToLower(status.message()), "socket closed")) {
    return status;
  }
  const std::string hint =
      security.cert_file.empty()
          ? "the coordinator closed the connection after the TLS handshake: if it requires "
            "client certificates (--tls-client-ca), pass --tls-cert and --tls-key signed by "
            "that CA"
          : absl::StrCat(
                "the coordinator closed the connection after the TLS handshake: it may "
                "not accept the client certificate '",
                security.cert_file, "' (is it signed by the coordinator's --tls-client-ca?)");
  return absl::Status(status.code(), absl::StrCat(status.message(), " (", hint, ")"));
}

void SetServerMessageLimits(grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(kMaxServerReceiveBytes);
  builder->SetMaxSendMessageSize(kMaxClientReceiveBytes);
}

}  // namespace boulder::common
