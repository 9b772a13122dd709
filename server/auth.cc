#include "server/auth.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/grpc_security.h"

namespace boulder::server {
namespace {

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-' &&
        c != '@') {
      return false;
    }
  }
  return true;
}

// Compares without an early exit, so the time taken does not say how much of a guess matched.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Parse(absl::string_view text,
                                                                    absl::string_view source) {
  std::unique_ptr<Authenticator> auth(new Authenticator());
  int line_number = 0;
  std::vector<Entry> workers;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    auto error = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_number, ": ", why));
    };
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    Entry entry;
    absl::string_view token;
    if (fields[0] == "user") {
      if (fields.size() < 3 || fields.size() > 4 || (fields.size() == 4 && fields[3] != "admin")) {
        return error("expected 'user NAME TOKEN [admin]'");
      }
      if (!ValidName(fields[1])) {
        return error(absl::StrCat("user name '", fields[1],
                                  "': use 1-64 characters of letters, digits and . _ - @"));
      }
      entry.principal.kind = Principal::Kind::kUser;
      entry.principal.user = std::string(fields[1]);
      entry.principal.admin = fields.size() == 4;
      token = fields[2];
    } else if (fields[0] == "worker") {
      if (fields.size() != 2) return error("expected 'worker TOKEN'");
      entry.principal.kind = Principal::Kind::kWorker;
      token = fields[1];
    } else {
      return error(absl::StrCat("unknown entry '", fields[0], "' (expected user or worker)"));
    }
    if (absl::Status s = common::ValidateToken(token, "token"); !s.ok()) return error(s.message());
    if (token.size() < kMinTokenLength) {
      return error(absl::StrCat("token: at least ", kMinTokenLength,
                                " characters required (e.g. openssl rand -hex 32)"));
    }
    for (const std::vector<Entry>* list : {&auth->entries_, &workers}) {
      for (const Entry& e : *list) {
        if (e.token == token) return error("token: used by an earlier line too");
        if (entry.principal.kind == Principal::Kind::kUser &&
            e.principal.kind == Principal::Kind::kUser &&
            e.principal.user == entry.principal.user &&
            e.principal.admin != entry.principal.admin) {
          return error(absl::StrCat("user ", entry.principal.user,
                                    ": admin on one line and not on another"));
        }
      }
    }
    entry.token = std::string(token);
    if (entry.principal.kind == Principal::Kind::kUser) {
      auth->entries_.push_back(std::move(entry));
    } else {
      workers.push_back(std::move(entry));
    }
  }
  auth->users_ = auth->entries_.size();
  for (Entry& e : workers) auth->entries_.push_back(std::move(e));
  if (auth->entries_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": no 'user' or 'worker' entries; nobody could call the coordinator"));
  }
  return auth;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::LoadFile(const std::string& path) {
  auto text = common::ReadSmallFile(path, "auth_file");
  if (!text.ok()) return text.status();
  return Parse(*text, path);
}

absl::StatusOr<Principal> Authenticator::Authenticate(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
  auto it = metadata.find(common::kAuthMetadataKey);
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(
        "no credentials: this coordinator requires a bearer token (boulder --token-file or "
        "BOULDER_TOKEN; boulder-worker --join-token-file or BOULDER_JOIN_TOKEN)");
  }
  absl::string_view value(it->second.data(), it->second.size());
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWith(value, kBearer)) {
    return absl::UnauthenticatedError("malformed authorization metadata: expected 'Bearer TOKEN'");
  }
  absl::string_view token = value.substr(kBearer.size());
  const Entry* found = nullptr;
  for (const Entry& e : entries_) {
    if (ConstantTimeEquals(e.token, token)) found = &e;
  }
  if (found == nullptr) return absl::UnauthenticatedError("invalid token");
  return found->principal;
}

absl::StatusOr<Principal> Caller(const Authenticator* auth,
                                 const grpc::ServerContextBase& context) {
  if (auth == nullptr) {
    Principal anonymous;
    anonymous.admin = true;
    return anonymous;
  }
  return auth->Authenticate(context.client_metadata());
}

absl::Status RequireUser(const Principal& p) {
  if (p.kind == Principal::Kind::kUser) return absl::OkStatus();
  return absl::PermissionDeniedError("a worker join token cannot be used for job requests");
}

absl::Status RequireWorker(const Principal& p) {
  if (p.kind == Principal::Kind::kWorker || (p.user.empty() && p.admin)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("user ", p.user, ": worker requests need a worker join token"));
}

absl::Status CheckJobAccess(const Principal& p, const v1::Job& job, absl::string_view action) {
  if (absl::Status s = RequireUser(p); !s.ok()) return s;
  if (p.admin || job.owner() == p.user) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("user ", p.user, " may not ", action, " job ",
                                                  job.id(), ": it belongs to another user"));
}

}  // namespace boulder::server
