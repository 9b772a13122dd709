#include "server/scheduler.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace boulder::server {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

MATCHER_P2(Placed, job_id, workers, "") {
  return arg.job_id == job_id && arg.workers == std::vector<std::string>(workers);
}

TEST(SchedulerTest, FifoOrderWhenWorkersAreScarce) {
  std::vector<QueuedJob> queue = {{7, "cpu", 1}, {8, "cpu", 1}, {9, "cpu", 1}};
  std::vector<IdleWorker> idle = {{"a", "cpu"}, {"b", "cpu"}};
  EXPECT_THAT(Schedule(queue, idle), ElementsAre(Placed(7, std::vector<std::string>{"a"}),
                                                 Placed(8, std::vector<std::string>{"b"})));
}

TEST(SchedulerTest, GpuSmallerThanTheJobsEstimateIsSkipped) {
  const int64_t gib = int64_t{1} << 30;
  std::vector<IdleWorker> idle = {{"small", "cuda", 8 * gib}, {"big", "cuda", 80 * gib}};
  EXPECT_THAT(Schedule({{1, "cuda", 1, 20 * gib}}, idle),
              ElementsAre(Placed(1, std::vector<std::string>{"big"})));
  // Nothing large enough: it waits (an "auto" job falls back to a cpu worker).
  EXPECT_THAT(Schedule({{1, "cuda", 1, 100 * gib}}, idle), IsEmpty());
  EXPECT_THAT(Schedule({{1, "", 1, 100 * gib}}, {{"small", "cuda", 8 * gib}, {"c", "cpu"}}),
              ElementsAre(Placed(1, std::vector<std::string>{"c"})));
  // Unknown sizes are not checked.
  EXPECT_THAT(Schedule({{1, "cuda", 1, 100 * gib}}, {{"g", "cuda"}}),
              ElementsAre(Placed(1, std::vector<std::string>{"g"})));
}

TEST(SchedulerTest, NothingIdleNothingPlaced) {
  EXPECT_THAT(Schedule({{1, "", 1}}, {}), IsEmpty());
  EXPECT_THAT(Schedule({}, {{"a", "cpu"}}), IsEmpty());
}

TEST(SchedulerTest, BackendMatching) {
  std::vector<IdleWorker> idle = {{"c1", "cpu"}, {"g1", "cuda"}};
  // A cuda job skips the cpu worker listed first; a cpu job gets the cpu worker.
  EXPECT_THAT(Schedule({{1, "cuda", 1}, {2, "cpu", 1}}, idle),
              ElementsAre(Placed(1, std::vector<std::string>{"g1"}),
                          Placed(2, std::vector<std::string>{"c1"})));
  // With only cpu workers a cuda job waits.
  EXPECT_THAT(Schedule({{1, "cuda", 1}}, {{"c1", "cpu"}}), IsEmpty());
  // A job that needs no particular backend prefers cuda, and takes cpu when that is all.
  EXPECT_THAT(Schedule({{1, "", 1}}, idle), ElementsAre(Placed(1, std::vector<std::string>{"g1"})));
  EXPECT_THAT(Schedule({{1, "", 1}}, {{"c1", "cpu"}}),
              ElementsAre(Placed(1, std::vector<std::string>{"c1"})));
  // An unknown kind runs nowhere.
  EXPECT_THAT(Schedule({{1, "tpu", 1}}, idle), IsEmpty());
}

TEST(SchedulerTest, GangIsNeverHalfPlaced) {
  // One idle cpu worker, a gang of 2: nothing is placed.
  EXPECT_THAT(Schedule({{1, "cpu", 2}}, {{"a", "cpu"}, {"g", "cuda"}}), IsEmpty());
  // Two of them: ranks follow the idle list's order.
  EXPECT_THAT(Schedule({{1, "cpu", 2}}, {{"a", "cpu"}, {"g", "cuda"}, {"b", "cpu"}}),
              ElementsAre(Placed(1, std::vector<std::string>{"a", "b"})));
}

TEST(SchedulerTest, GangNeverMixesBackends) {
  EXPECT_THAT(Schedule({{1, "", 2}}, {{"a", "cpu"}, {"g", "cuda"}}), IsEmpty());
  EXPECT_THAT(Schedule({{1, "", 2}}, {{"a", "cpu"}, {"g", "cuda"}, {"b", "cpu"}}),
              ElementsAre(Placed(1, std::vector<std::string>{"a", "b"})));
}

TEST(SchedulerTest, BlockedJobHoldsBackLaterJobsOfTheSameKind) {
  // Job 1 (2 cpu workers) cannot be placed: job 2 (1 cpu worker) must not jump ahead and
  // take the worker job 1 is waiting for.
  EXPECT_THAT(Schedule({{1, "cpu", 2}, {2, "cpu", 1}}, {{"a", "cpu"}}), IsEmpty());
  // A job that could use either kind competes for cpu workers too: also held back.
  EXPECT_THAT(Schedule({{1, "cpu", 2}, {2, "", 1}}, {{"a", "cpu"}, {"g", "cuda"}}), IsEmpty());
}

TEST(SchedulerTest, BlockedJobDoesNotHoldBackOtherKinds) {
  EXPECT_THAT(Schedule({{1, "cpu", 2}, {2, "cuda", 1}}, {{"a", "cpu"}, {"g", "cuda"}}),
              ElementsAre(Placed(2, std::vector<std::string>{"g"})));
  // A job nothing can run holds back nothing.
  EXPECT_THAT(Schedule({{1, "tpu", 1}, {2, "cpu", 1}}, {{"a", "cpu"}}),
              ElementsAre(Placed(2, std::vector<std::string>{"a"})));
}

TEST(SchedulerTest, BlockedFlexibleJobHoldsBackEverything) {
  EXPECT_THAT(Schedule({{1, "", 3}, {2, "cpu", 1}, {3, "cuda", 1}}, {{"a", "cpu"}, {"g", "cuda"}}),
              IsEmpty());
}

TEST(SchedulerTest, EachWorkerPlacedOnce) {
  std::vector<Placement> p =
      Schedule({{1, "cpu", 2}, {2, "cpu", 2}, {3, "cpu", 1}},
               {{"a", "cpu"}, {"b", "cpu"}, {"c", "cpu"}, {"d", "cpu"}, {"e", "cpu"}});
  EXPECT_THAT(p, ElementsAre(Placed(1, std::vector<std::string>{"a", "b"}),
                             Placed(2, std::vector<std::string>{"c", "d"}),
                             Placed(3, std::vector<std::string>{"e"})));
}

}  // namespace
}  // namespace boulder::server
