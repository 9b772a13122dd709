// Gloo collectives among ranks run as threads of this test, connected through an in-process
// rendezvous service on 127.0.0.1.
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/comm_test_util.h"
#include "worker/comm/communicator.h"

namespace boulder::comm {
namespace {

using kernels::DType;
using ::testing::HasSubstr;

CommOptions Options(const TestRendezvousServer& server, int rank, int world,
                    absl::Duration timeout = absl::Seconds(20)) {
  CommOptions o;
  o.rank = rank;
  o.world_size = world;
  o.job_id = 1;
  o.coordinator = server.address();
  o.security.insecure = true;  // the test server is plaintext
  o.timeout = timeout;
  o.failure_grace = absl::Milliseconds(500);
  return o;
}

// Runs body(rank, comm) on `world` threads, each with its own connected communicator.
void RunRanks(const TestRendezvousServer& server, int world,
              const std::function<void(int, Communicator*)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<Communicator>> comm =
          NewGlooCommunicator(Options(server, r, world));
      ASSERT_TRUE(comm.ok()) << comm.status();
      EXPECT_STREQ((*comm)->name(), "gloo");
      EXPECT_EQ((*comm)->rank(), r);
      body(r, comm->get());
    });
  }
  for (auto& t : threads) t.join();
}

TEST(GlooCommunicatorTest, AllReduceSumAndAverage) {
  TestRendezvousServer server;
  RunRanks(server, 3, [](int r, Communicator* c) {
    std::vector<float> f = {1.0f + r, 10.0f * r, -2.0f};
    ASSERT_TRUE(c->AllReduce(f.data(), f.size(), DType::kF32, ReduceOp::kSum).ok());
    EXPECT_EQ(f, (std::vector<float>{6.0f, 30.0f, -6.0f}));
    std::vector<double> d = {3.0 * r, 1.5};
    ASSERT_TRUE(c->AllReduce(d.data(), d.size(), DType::kF64, ReduceOp::kAvg).ok());
    EXPECT_EQ(d, (std::vector<double>{3.0, 1.5}));
  });
}

TEST(GlooCommunicatorTest, AllReduceMax) {
  TestRendezvousServer server;
  RunRanks(server, 3, [](int r, Communicator* c) {
    // Each rank holds the largest value in a different slot; zeros and negatives stay ordered.
    std::vector<float> f = {r == 0 ? 7.5f : 1.0f, r == 1 ? 3e38f : 0.0f, r == 2 ? -1.0f : -4.0f,
                            0.0f};
    ASSERT_TRUE(c->AllReduce(f.data(), f.size(), DType::kF32, ReduceOp::kMax).ok());
    EXPECT_EQ(f, (std::vector<float>{7.5f, 3e38f, -1.0f, 0.0f}));
    std::vector<double> d = {static_cast<double>(r)};
    ASSERT_TRUE(c->AllReduceAsync(d.data(), d.size(), DType::kF64, ReduceOp::kMax).ok());
    ASSERT_TRUE(c->WaitAll().ok());
    EXPECT_EQ(d[0], 2.0);
  });
}

TEST(GlooCommunicatorTest, BroadcastAndBarrier) {
  TestRendezvousServer server;
  RunRanks(server, 3, [](int r, Communicator* c) {
    std::string bytes = r == 1 ? "from rank 1" : "xxxxxxxxxxx";
    ASSERT_TRUE(c->Broadcast(bytes.data(), bytes.size(), 1).ok());
    EXPECT_EQ(bytes, "from rank 1");
    EXPECT_TRUE(c->Barrier().ok());
    EXPECT_EQ(c->Broadcast(bytes.data(), bytes.size(), 3).code(),
              absl::StatusCode::kInvalidArgument);
  });
}

TEST(GlooCommunicatorTest, AsyncBucketsCompleteInOrderAndWaitAllReportsTheBlockedTime) {
  TestRendezvousServer server;
  RunRanks(server, 2, [](int r, Communicator* c) {
    // Two buckets of one flat buffer, issued in reverse order as a backward pass does.
    std::vector<float> grads(1000);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i * (r + 1));
    ASSERT_TRUE(c->AllReduceAsync(grads.data() + 600, 400, DType::kF32, ReduceOp::kAvg).ok());
    ASSERT_TRUE(c->AllReduceAsync(grads.data(), 600, DType::kF32, ReduceOp::kAvg).ok());
    absl::StatusOr<double> blocked = c->WaitAll();
    ASSERT_TRUE(blocked.ok()) << blocked.status();
    EXPECT_GE(*blocked, 0.0);
    for (size_t i = 0; i < grads.size(); ++i) ASSERT_EQ(grads[i], 1.5f * i) << i;
    EXPECT_EQ(c->AllReduceAsync(grads.data(), 1, DType::kBF16, ReduceOp::kSum).code(),
              absl::StatusCode::kInvalidArgument);
  });
}

TEST(GlooCommunicatorTest, NamesTheRankThatNeverArrived) {
  TestRendezvousServer server;
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      NewGlooCommunicator(Options(server, 0, 2, absl::Milliseconds(500)));
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(comm.status().message(), HasSubstr("rank 1 of 2 never arrived"));
}

TEST(GlooCommunicatorTest, AHungRankTimesOutTheCollectiveAndIsNamed) {
  TestRendezvousServer server;
  absl::Status status;
  absl::Notification rank0_done;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto comm = NewGlooCommunicator(Options(server, r, 2, absl::Seconds(1)));
      ASSERT_TRUE(comm.ok()) << comm.status();
      if (r == 1) {
        // Alive but never joins the collective: rank 0 must give up, not hang.
        rank0_done.WaitForNotification();
        return;
      }
      float x = 1.0f;
      const absl::Time start = absl::Now();
      status = (*comm)->AllReduce(&x, 1, DType::kF32, ReduceOp::kSum);
      EXPECT_LT(absl::Now() - start, absl::Seconds(10));
      // Broken for good: the next call fails the same way, at once.
      EXPECT_EQ((*comm)->Barrier().message(), status.message());
      rank0_done.Notify();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(status.message(), HasSubstr("all-reduce failed on rank 0"));
  EXPECT_THAT(status.message(), HasSubstr("rank 1 is dead or hung"));
}

TEST(GlooCommunicatorTest, ADeadPeerFailsTheCollectiveAndIsNamed) {
  TestRendezvousServer server;
  absl::Status status;
  absl::Notification rank1_gone;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto comm = NewGlooCommunicator(Options(server, r, 2, absl::Seconds(20)));
      ASSERT_TRUE(comm.ok()) << comm.status();
      if (r == 1) {
        comm->reset();  // closes its connections, as a killed process's kernel would
        rank1_gone.Notify();
        return;
      }
      rank1_gone.WaitForNotification();
      std::vector<float> x(1 << 16, 1.0f);
      const absl::Time start = absl::Now();
      status = (*comm)->AllReduce(x.data(), x.size(), DType::kF32, ReduceOp::kSum);
      // Well before the 20 s collective timeout: the closed connection is noticed at once.
      EXPECT_LT(absl::Now() - start, absl::Seconds(10));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("all-reduce failed on rank 0"));
  EXPECT_THAT(status.message(), HasSubstr("rank 1 is dead or hung"));
}

TEST(DefaultCommHostTest, LoopbackCoordinatorMeansLoopbackPeers) {
  EXPECT_EQ(DefaultCommHost("127.0.0.1:7070"), "127.0.0.1");
  EXPECT_EQ(DefaultCommHost("localhost:7070"), "127.0.0.1");
  EXPECT_EQ(DefaultCommHost("[::1]:7070"), "127.0.0.1");
  EXPECT_NE(DefaultCommHost("coordinator.boulder.svc:7070"), "");
}

}  // namespace
}  // namespace boulder::comm
