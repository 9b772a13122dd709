#include "worker/agent/attempt.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace boulder::agent {
namespace {

using ::testing::ElementsAre;

v1::Assignment MakeAssignment() {
  v1::Assignment a;
  a.set_job_id(7);
  a.set_attempt(2);
  a.set_rank(0);
  a.set_world_size(1);
  return a;
}

TEST(TrainerArgsTest, PinsTheWorkersBackend) {
  EXPECT_THAT(TrainerArgs(MakeAssignment(), "/w/spec.json", 2, "cpu"),
              ElementsAre("--spec", "/w/spec.json", "--report-fd", "3", "--job-id", "7",
                          "--attempt", "2", "--rank", "0", "--world-size", "1", "--threads", "2",
                          "--weights-out", "weights.safetensors", "--quiet", "--backend", "cpu"));
  v1::Assignment rank1 = MakeAssignment();
  rank1.set_rank(1);
  EXPECT_THAT(TrainerArgs(rank1, "/w/spec.json", 2),
              ::testing::Not(::testing::Contains("--weights-out")));
}

TEST(TrainerArgsTest, LeavesTheBackendToTheSpecWhenUnset) {
  const std::vector<std::string> args = TrainerArgs(MakeAssignment(), "/w/spec.json", 0);
  EXPECT_THAT(args, ::testing::Not(::testing::Contains("--backend")));
  EXPECT_EQ(args.back(), "--quiet");
}

TEST(TrainerArgsTest, PassesTheJobsCheckpointDirectory) {
  EXPECT_THAT(TrainerArgs(MakeAssignment(), "/w/spec.json", 1, "cpu", "/shared/ckpt/job-7"),
              ElementsAre("--spec", "/w/spec.json", "--report-fd", "3", "--job-id", "7",
                          "--attempt", "2", "--rank", "0", "--world-size", "1", "--threads", "1",
                          "--weights-out", "weights.safetensors", "--quiet", "--backend", "cpu",
                          "--checkpoint-dir", "/shared/ckpt/job-7"));
}

TEST(TrainerArgsTest, PassesTheAgentsSecurityToTheRendezvous) {
  common::ChannelSecurityOptions tls;
  tls.ca_file = "/etc/boulder/tls/ca.crt";
  tls.token = "secret-join-token-0123";
  EXPECT_THAT(
      RendezvousSecurityArgs(tls, "/w/join.token"),
      ElementsAre("--tls-ca", "/etc/boulder/tls/ca.crt", "--join-token-file", "/w/join.token"));
  common::ChannelSecurityOptions plain;
  plain.insecure = true;
  EXPECT_THAT(RendezvousSecurityArgs(plain, ""), ElementsAre("--insecure"));
}

TEST(TrainerArgsTest, PassesTheCoordinatorForTheRendezvous) {
  const std::vector<std::string> args =
      TrainerArgs(MakeAssignment(), "/w/spec.json", 0, "cpu", "", "10.0.0.5:7070");
  EXPECT_THAT(std::vector<std::string>(args.end() - 2, args.end()),
              ElementsAre("--coordinator", "10.0.0.5:7070"));
}

}  // namespace
}  // namespace boulder::agent
