#include "server/auth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

namespace boulder::server {
namespace {

using ::testing::HasSubstr;

constexpr char kFile[] = R"(# users
user alice alice-token-0123456789
user root  root-token-0123456789 admin   # the operator
user alice alice-second-token-0123

worker join-token-0123456789abcdef
)";

std::multimap<grpc::string_ref, grpc::string_ref> Bearer(const std::string& value) {
  static std::string holder;  // string_refs point into it
  holder = value;
  return {{grpc::string_ref("authorization"), grpc::string_ref(holder)}};
}

TEST(AuthenticatorTest, MapsTokensToPrincipals) {
  auto auth = Authenticator::Parse(kFile, "tokens");
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ((*auth)->user_count(), 3u);
  EXPECT_EQ((*auth)->worker_token_count(), 1u);

  auto alice = (*auth)->Authenticate(Bearer("Bearer alice-second-token-0123"));
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(alice->kind, Principal::Kind::kUser);
  EXPECT_EQ(alice->user, "alice");
  EXPECT_FALSE(alice->admin);

  auto root = (*auth)->Authenticate(Bearer("Bearer root-token-0123456789"));
  ASSERT_TRUE(root.ok());
  EXPECT_TRUE(root->admin);

  auto worker = (*auth)->Authenticate(Bearer("Bearer join-token-0123456789abcdef"));
  ASSERT_TRUE(worker.ok());
  EXPECT_EQ(worker->kind, Principal::Kind::kWorker);
}

TEST(AuthenticatorTest, RefusesMissingMalformedAndUnknownTokens) {
  auto auth = Authenticator::Parse(kFile, "tokens");
  ASSERT_TRUE(auth.ok());
  auto none = (*auth)->Authenticate({});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(none.status().message(), HasSubstr("no credentials"));
  EXPECT_EQ((*auth)->Authenticate(Bearer("alice-token-0123456789")).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*auth)->Authenticate(Bearer("Bearer alice-token-012345678")).status().message(),
            "invalid token");
  EXPECT_EQ((*auth)->Authenticate(Bearer("Bearer alice-token-0123456789x")).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*auth)->Authenticate(Bearer("Bearer ")).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(AuthenticatorTest, FileErrorsNameTheLine) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"user alice short", "f:1: token: at least 16 characters required"},
      {"\nuser alice\n", "f:2: expected 'user NAME TOKEN [admin]'"},
      {"user alice aaaaaaaaaaaaaaaaaaaa root", "f:1: expected 'user NAME TOKEN [admin]'"},
      {"user al/ice aaaaaaaaaaaaaaaaaaaa", "f:1: user name 'al/ice'"},
      {"group x aaaaaaaaaaaaaaaaaaaa", "f:1: unknown entry 'group'"},
      {"worker a b", "f:1: expected 'worker TOKEN'"},
      {"user a aaaaaaaaaaaaaaaaaaaa\nworker aaaaaaaaaaaaaaaaaaaa",
       "f:2: token: used by an earlier line too"},
      {"user a aaaaaaaaaaaaaaaaaaaa\nuser a bbbbbbbbbbbbbbbbbbbb admin",
       "f:2: user a: admin on one line and not on another"},
      {"# nothing\n\n", "f: no 'user' or 'worker' entries"},
      {"user a aaaaaaaaaaaaaaaa\x01" "aaaa", "f:1: token: the token may contain only printable"},
  };
  for (const Case& c : cases) {
    auto auth = Authenticator::Parse(c.text, "f");
    EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(std::string(auth.status().message()), HasSubstr(c.message)) << c.text;
  }
  EXPECT_THAT(std::string(Authenticator::LoadFile("/nonexistent/tokens").status().message()),
              HasSubstr("auth_file: cannot read '/nonexistent/tokens'"));
}

TEST(AuthorizationTest, OwnersAndAdminsOnly) {
  Principal alice{Principal::Kind::kUser, "alice", false};
  Principal bob{Principal::Kind::kUser, "bob", false};
  Principal root{Principal::Kind::kUser, "root", true};
  Principal worker{Principal::Kind::kWorker, "", false};
  v1::Job job;
  job.set_id(7);
  job.set_owner("alice");
  EXPECT_TRUE(CheckJobAccess(alice, job, "read").ok());
  EXPECT_TRUE(CheckJobAccess(root, job, "cancel").ok());
  absl::Status denied = CheckJobAccess(bob, job, "cancel");
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(denied.message(), "user bob may not cancel job 7: it belongs to another user");
  EXPECT_EQ(CheckJobAccess(worker, job, "read").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(RequireWorker(alice).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(RequireWorker(root).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(RequireWorker(worker).ok());
  EXPECT_EQ(RequireUser(worker).code(), absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace boulder::server
