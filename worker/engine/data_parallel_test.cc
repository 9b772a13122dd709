// Data-parallel training through the real Gloo path, ranks as threads of this test, connected
// through an in-process rendezvous service on 127.0.0.1. (tests/data_parallel_test.py runs
// the same through coordinator, workers and trainer processes.)
#include "worker/engine/data_parallel.h"

#include <atomic>
#include <cmath>
#include <algorithm>
#include <functional>
#include <iostream>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/comm_test_util.h"
#include "worker/engine/trainer.h"

namespace boulder::engine {
namespace {

using ::testing::HasSubstr;

v1::JobSpec Spec(int batch, int workers) {
  v1::JobSpec s;
  v1::ModelSpec* m = s.mutable_model();
  m->set_preset("minigpt");
  m->set_vocab_size(96);
  m->set_hidden(32);
  m->set_heads(2);
  m->set_layers(2);
  m->set_ffn(64);
  m->set_context(16);
  m->set_tie_embeddings(false);
  s.mutable_data()->set_source("arithmetic");
  s.mutable_data()->set_max_stride(6);
  v1::TrainingSpec* t = s.mutable_training();
  t->set_steps(12);
  t->set_batch_size(batch);
  t->set_seq_len(16);
  t->set_lr(3e-3);
  t->set_beta1(0.9);
  t->set_beta2(0.95);
  t->set_eps(1e-8);
  t->set_weight_decay(0.1);
  t->set_warmup_steps(2);
  t->set_schedule("cosine");
  t->set_min_lr_ratio(0.1);
  t->set_grad_accum_steps(2);
  t->set_grad_clip(1.0);
  t->set_seed(5);
  t->set_deterministic(true);
  t->set_log_every_steps(1);
  s.set_precision("fp32");
  s.mutable_resources()->set_workers(workers);
  s.mutable_resources()->set_backend("cpu");
  s.mutable_resources()->set_collective_timeout_seconds(30);
  s.mutable_resources()->set_checksum_every_steps(3);
  s.mutable_generation()->set_prompt_len(4);
  s.mutable_generation()->set_tokens(0);
  return s;
}

// Runs `world` ranks of `spec` as threads; returns each rank's step reports. Each run is a new
// attempt of job 1, so its rendezvous keys start empty, as the coordinator's would.
std::vector<std::vector<v1::StepReport>> RunRanks(const comm::TestRendezvousServer& server,
                                                  const v1::JobSpec& spec, int world,
                                                  bool force_communicator,
                                                  std::vector<absl::Status>* status) {
  std::vector<std::vector<v1::StepReport>> reports(world);
  status->assign(world, absl::OkStatus());
  static std::atomic<int32_t> next_attempt{1};
  const int32_t attempt = next_attempt++;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      TrainerOptions o;
      o.spec = spec;
      o.threads = 1;
      o.job_id = 1;
      o.attempt = attempt;
      o.rank = r;
      o.world_size = world;
      o.coordinator = server.address();
      o.security.insecure = true;  // the test server is plaintext
      o.force_communicator = force_communicator;
      o.on_step = [&reports, r](const v1::StepReport& s) { reports[r].push_back(s); };
      (*status)[r] = RunTrainer(o);
    });
  }
  for (auto& t : threads) t.join();
  return reports;
}

// N ranks of micro-batch B reproduce 1 worker of micro-batch N*B: same sequences (the data is
// sliced by global row), gradients averaged. Only the FP32 summation order differs (per-rank
// partial sums, then the all-reduce): measured differences are ~4e-8 over 12 steps. 1e-5 leaves
// room for that drift on other CPUs and BLAS builds and still catches any real difference (a
// wrong slice or a missing average moves the loss by 1e-2 or more from the first steps).
constexpr double kLossTolerance = 1e-5;

void ExpectSameCurve(const std::vector<v1::StepReport>& got,
                     const std::vector<v1::StepReport>& want) {
  ASSERT_EQ(got.size(), want.size());
  double max_diff = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(got[i].loss() - want[i].loss()));
    EXPECT_NEAR(got[i].loss(), want[i].loss(), kLossTolerance) << "step " << i + 1;
    EXPECT_NEAR(got[i].grad_norm(), want[i].grad_norm(), 1e-3 * want[i].grad_norm() + 1e-5)
        << "step " << i + 1;
  }
  std::cout << "largest loss difference to 1 worker: " << max_diff << "\n";
}

TEST(DataParallelTest, TwoAndThreeRanksFollowTheOneWorkerCurve) {
  comm::TestRendezvousServer server;
  std::vector<absl::Status> status;
  const auto single = RunRanks(server, Spec(6, 1), 1, false, &status);
  ASSERT_TRUE(status[0].ok()) << status[0];
  for (int world : {2, 3}) {
    const auto ranks = RunRanks(server, Spec(6 / world, world), world, false, &status);
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(status[r].ok()) << "world " << world << " rank " << r << ": " << status[r];
      SCOPED_TRACE(testing::Message() << "world " << world << " rank " << r);
      ExpectSameCurve(ranks[r], single[0]);
      // The loss is averaged across ranks: every rank reports the same value.
      for (size_t i = 0; i < ranks[r].size(); ++i) {
        EXPECT_EQ(ranks[r][i].loss(), ranks[0][i].loss());
        EXPECT_EQ(ranks[r][i].rank(), r);
        EXPECT_GE(ranks[r][i].comm_exposed_seconds(), 0.0);
      }
      // Checked every 3 steps and at the end: all ranks agreed on the same parameters.
      EXPECT_NE(ranks[r].back().param_checksum(), 0u);
      EXPECT_EQ(ranks[r].back().param_checksum(), ranks[0].back().param_checksum());
      EXPECT_NE(ranks[r][2].param_checksum(), 0u);
      EXPECT_EQ(ranks[r][3].param_checksum(), 0u);
    }
  }
}

TEST(DataParallelTest, OneRankThroughTheCommunicatorMatchesThePlainRunExactly) {
  comm::TestRendezvousServer server;
  std::vector<absl::Status> status;
  const auto plain = RunRanks(server, Spec(4, 1), 1, false, &status);
  ASSERT_TRUE(status[0].ok()) << status[0];
  const auto forced = RunRanks(server, Spec(4, 1), 1, true, &status);
  ASSERT_TRUE(status[0].ok()) << status[0];
  ASSERT_EQ(forced[0].size(), plain[0].size());
  for (size_t i = 0; i < plain[0].size(); ++i) {
    EXPECT_EQ(forced[0][i].loss(), plain[0][i].loss()) << "step " << i + 1;
  }
}

TEST(DataParallelTest, ARankThatNeverArrivesFailsTheOthersNamingIt) {
  comm::TestRendezvousServer server;
  v1::JobSpec spec = Spec(2, 3);
  spec.mutable_resources()->set_collective_timeout_seconds(1);
  TrainerOptions o;
  o.spec = spec;
  o.threads = 1;
  o.job_id = 1;
  o.rank = 0;
  o.world_size = 3;
  o.coordinator = server.address();
  o.security.insecure = true;  // the test server is plaintext
  absl::Status s = RunTrainer(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("ranks 1, 2 of 3 never arrived"));
}

}  // namespace
}  // namespace boulder::engine
