#include "worker/comm/rendezvous_client.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/comm_test_util.h"

namespace boulder::comm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<RendezvousClient> Client(const TestRendezvousServer& server, int rank,
                                         int64_t job = 1, int32_t attempt = 0) {
  RendezvousClientOptions o;
  o.coordinator = server.address();
  o.security.insecure = true;  // the test server is plaintext
  o.job_id = job;
  o.attempt = attempt;
  o.rank = rank;
  return *RendezvousClient::Create(o);
}

TEST(RendezvousClientTest, NeedsACoordinator) {
  absl::StatusOr<std::unique_ptr<RendezvousClient>> c = RendezvousClient::Create({});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("--coordinator"));
}

// A refused token fails at once, named by its code, with where the token comes from.
TEST(RendezvousClientTest, ARefusedTokenIsNamedByItsCode) {
  TestRendezvousServer server([](const grpc::ServerContextBase& context) -> absl::Status {
    auto it = context.client_metadata().find("authorization");
    if (it == context.client_metadata().end()) return absl::UnauthenticatedError("no credentials");
    if (it->second != "Bearer good-token") return absl::UnauthenticatedError("invalid token");
    return absl::OkStatus();
  });
  RendezvousClientOptions o;
  o.coordinator = server.address();
  o.security.insecure = true;
  o.job_id = 1;
  o.security.token = "good-token";
  ASSERT_TRUE((*RendezvousClient::Create(o))->Set("k", "v").ok());

  o.security.token = "bad-token";
  std::unique_ptr<RendezvousClient> bad = *RendezvousClient::Create(o);
  absl::Status s = bad->Set("k", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(s.message(),
              HasSubstr("rendezvous set 'k' at " + server.address() +
                        ": UNAUTHENTICATED: invalid token (the rendezvous needs the "
                        "worker join token: --join-token-file or $BOULDER_JOIN_TOKEN"));
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<std::string>> got = bad->Get({"k"}, absl::Seconds(20));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "retried a refused token";

  o.security.token.clear();
  EXPECT_THAT((*RendezvousClient::Create(o))->Set("k", "v").message(),
              HasSubstr("UNAUTHENTICATED: no credentials"));
}

TEST(RendezvousClientTest, SetThenGet) {
  TestRendezvousServer server;
  auto a = Client(server, 0), b = Client(server, 1);
  ASSERT_TRUE(a->Set("x", std::string("v\0w", 3)).ok());
  ASSERT_TRUE(a->Set("y", "2").ok());
  absl::StatusOr<std::vector<std::string>> got = b->Get({"y", "x"}, absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, ElementsAre("2", std::string("v\0w", 3)));
}

TEST(RendezvousClientTest, GetWaitsUntilAnotherRankSets) {
  TestRendezvousServer server;
  auto a = Client(server, 0), b = Client(server, 1);
  absl::StatusOr<std::vector<std::string>> got;
  std::thread waiter([&] { got = b->Get({"late"}, absl::Seconds(20)); });
  // The Get is parked at the server (or about to be): either way it must see this Set.
  ASSERT_TRUE(a->Set("late", "here").ok());
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, ElementsAre("here"));
}

TEST(RendezvousClientTest, GetTimesOutNamingTheMissingKeys) {
  TestRendezvousServer server;
  auto a = Client(server, 0);
  ASSERT_TRUE(a->Set("present", "1").ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<std::string>> got =
      a->Get({"present", "absent"}, absl::Milliseconds(300));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got.status().message(), HasSubstr("keys not set: absent"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(RendezvousClientTest, AttemptsAreSeparateScopes) {
  TestRendezvousServer server;
  auto first = Client(server, 0, 1, 0), second = Client(server, 0, 1, 1);
  ASSERT_TRUE(first->Set("k", "attempt 0").ok());
  EXPECT_EQ(second->Get({"k"}, absl::Milliseconds(100)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(RendezvousClientTest, EndedAttemptsAreRefusedAndTheirKeysDropped) {
  TestRendezvousServer server;
  auto other_job = Client(server, 0, 2, 0);
  absl::Status s = other_job->Set("k", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("job 2 attempt 0 is not running"));

  auto a = Client(server, 0);
  ASSERT_TRUE(a->Set("k", "v").ok());
  EXPECT_EQ(server.service()->NumScopes(), 1u);
  server.live = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (server.service()->NumScopes() != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));  // polling a condition, with a deadline
  }
  EXPECT_EQ(server.service()->NumScopes(), 0u);
  EXPECT_EQ(a->Get({"k"}, absl::Seconds(1)).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(RendezvousClientTest, ArriveAllNamesTheRanksThatNeverArrived) {
  TestRendezvousServer server;
  auto r0 = Client(server, 0), r1 = Client(server, 1);
  absl::Status s1;
  std::thread t([&] { s1 = ArriveAll(r1.get(), 4, absl::Milliseconds(500)); });
  absl::Status s0 = ArriveAll(r0.get(), 4, absl::Milliseconds(500));
  t.join();
  for (const absl::Status& s : {s0, s1}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(s.message(), HasSubstr("ranks 2, 3 of 4 never arrived"));
  }
}

TEST(RendezvousClientTest, ArriveAllSucceedsWhenEveryoneComes) {
  TestRendezvousServer server;
  std::vector<std::thread> threads;
  std::vector<absl::Status> status(3);
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      auto c = Client(server, r);
      status[r] = ArriveAll(c.get(), 3, absl::Seconds(20));
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : status) EXPECT_TRUE(s.ok()) << s;
}

TEST(RendezvousClientTest, ExplainFailureNamesSilentRanks) {
  TestRendezvousServer server;
  auto r0 = Client(server, 0), r1 = Client(server, 1);
  ASSERT_TRUE(r1->Set("failed/1", "peer gone").ok());
  absl::Status s = ExplainFailure(r0.get(), 3, absl::Milliseconds(300), "all-reduce",
                                  absl::UnavailableError("connection closed"));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("all-reduce failed on rank 0: connection closed; rank 2 is "
                                     "dead or hung"));
}

}  // namespace
}  // namespace boulder::comm
