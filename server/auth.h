// Authentication and authorization of the coordinator's callers.
//
// The tokens file (boulder-coordinator --auth-file) is text, one entry per line, '#' starts
// a comment, fields separated by spaces or tabs:
//
//   user NAME TOKEN [admin]    a CLI user; `admin` may read and cancel every job
//   worker TOKEN               a worker join token (several lines: any of them is accepted)
//
// NAME is 1-64 characters of [A-Za-z0-9._@-]; TOKEN is at least kMinTokenLength printable
// ASCII characters without spaces (e.g. `openssl rand -hex 32`) and unique in the file. A user
// may have several tokens (one line each, same admin flag).
//
// Callers send "authorization: Bearer TOKEN". The rules the services apply:
//  - no or an unknown token: UNAUTHENTICATED;
//  - job RPCs need a user token; a user reads, watches and cancels only their own jobs
//    (PERMISSION_DENIED otherwise) unless admin, and lists only their own jobs unless admin;
//  - worker RPCs (register, heartbeat, reports) need a join token (a user token:
//    PERMISSION_DENIED); ListWorkers accepts either;
//  - health checking and reflection stay open: probes carry no token and the API's schema is
//    public.
// Without an authenticator (a coordinator run with --insecure and no --auth-file) every caller
// is an anonymous admin ("" as owner).
//
// Thread-safe after construction (immutable).
#ifndef BOULDER_SERVER_AUTH_H_
#define BOULDER_SERVER_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "boulder/v1/job.pb.h"

namespace boulder::server {

inline constexpr size_t kMinTokenLength = 16;

// Who made a call.
struct Principal {
  enum class Kind { kUser, kWorker };
  Kind kind = Kind::kUser;
  // The user's name ("" for workers and for the anonymous caller without authentication).
  std::string user;
  bool admin = false;
};

class Authenticator {
 public:
  // Parses a tokens file's text; `source` names it in errors. INVALID_ARGUMENT
  // "SOURCE:LINE: why" for malformed lines, short or duplicate tokens, and a file without
  // any entry.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Parse(absl::string_view text,
                                                              absl::string_view source);
  static absl::StatusOr<std::unique_ptr<Authenticator>> LoadFile(const std::string& path);

  // The caller named by the metadata's bearer token. UNAUTHENTICATED when there is none, it is
  // not "Bearer TOKEN", or the token is unknown (compared in constant time per entry).
  absl::StatusOr<Principal> Authenticate(
      const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const;

  size_t user_count() const { return users_; }
  size_t worker_token_count() const { return entries_.size() - users_; }

 private:
  struct Entry {
    std::string token;
    Principal principal;
  };
  Authenticator() = default;

  std::vector<Entry> entries_;
  size_t users_ = 0;
};

// The caller of `context`: Authenticate() with `auth`, or the anonymous admin when `auth` is
// null (authentication off).
absl::StatusOr<Principal> Caller(const Authenticator* auth, const grpc::ServerContextBase& context);

// PERMISSION_DENIED unless `p` is a user (job RPCs).
absl::Status RequireUser(const Principal& p);
// PERMISSION_DENIED unless `p` holds a join token (worker RPCs).
absl::Status RequireWorker(const Principal& p);
// PERMISSION_DENIED unless `p` is an admin or owns `job`; `action` is e.g. "read", "cancel".
absl::Status CheckJobAccess(const Principal& p, const v1::Job& job, absl::string_view action);

}  // namespace boulder::server

#endif  // BOULDER_SERVER_AUTH_H_
