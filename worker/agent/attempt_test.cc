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
                          "--quiet", "--backend", "cpu"));
}

TEST(TrainerArgsTest, LeavesTheBackendToTheSpecWhenUnset) {
  const std::vector<std::string> args = TrainerArgs(MakeAssignment(), "/w/spec.json", 0);
  EXPECT_THAT(args, ::testing::Not(::testing::Contains("--backend")));
  EXPECT_EQ(args.back(), "--quiet");
}

TEST(TrainerArgsTest, PassesTheCoordinatorForTheRendezvous) {
  const std::vector<std::string> args =
      TrainerArgs(MakeAssignment(), "/w/spec.json", 0, "cpu", "10.0.0.5:7070");
  EXPECT_THAT(std::vector<std::string>(args.end() - 2, args.end()),
              ElementsAre("--coordinator", "10.0.0.5:7070"));
}

}  // namespace
}  // namespace boulder::agent
