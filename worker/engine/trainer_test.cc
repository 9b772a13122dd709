#include "worker/engine/trainer.h"

#include <atomic>
#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "worker/engine/data.h"
#include "worker/engine/test_specs.h"

namespace boulder::engine {
namespace {

using ::testing::HasSubstr;

// A resolved spec (every field set) for a small model that learns the task in seconds.
v1::JobSpec SmallSpec() { return SmallTestSpec(300, "fp32", "cpu"); }

struct Collected {
  std::vector<v1::StepReport> steps;
  std::vector<v1::GenerationResult> generations;
};

TrainerOptions Collect(const v1::JobSpec& spec, Collected* out) {
  TrainerOptions o;
  o.spec = spec;
  // One thread: deterministic either way, and robust on a loaded CI machine.
  o.threads = 1;
  o.job_id = 42;
  o.attempt = 1;
  o.rank = 0;
  o.on_step = [out](const v1::StepReport& r) { out->steps.push_back(r); };
  o.on_generation = [out](const v1::GenerationResult& g) { out->generations.push_back(g); };
  return o;
}

TEST(TrainerTest, LearnsTheStrideAndGeneratesIt) {
  // With max_stride 6 and T = 32 only the first target of a row is uncertain, so the loss
  // floor is ln(6)/32 = 0.056; an untrained model sits at ln(96) = 4.56. This config reaches
  // ~0.11 after 300 steps (seeds 1-3; about 2.6 s of CPU on one core).
  Collected c;
  const absl::Status s = RunTrainer(Collect(SmallSpec(), &c));
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(c.steps.size(), 30u);  // every 10 steps
  const v1::StepReport& first = c.steps.front();
  const v1::StepReport& last = c.steps.back();
  EXPECT_EQ(first.step(), 10);
  EXPECT_EQ(last.step(), 300);
  EXPECT_EQ(last.total_steps(), 300);
  EXPECT_EQ(last.job_id(), 42);
  EXPECT_EQ(last.attempt(), 1);
  EXPECT_EQ(last.tokens_processed(), 300 * 16 * 32);
  EXPECT_GT(last.tokens_per_second(), 0);
  EXPECT_GT(last.memory().allocated_bytes(), 0);
  EXPECT_GT(last.time().seconds(), 0);
  EXPECT_NEAR(last.lr(), 5e-4, 1e-12);  // cosine floor at the last step
  EXPECT_GT(first.loss(), 3.0);
  EXPECT_LT(last.loss(), 0.2) << "loss did not approach the floor ln(6)/32 = 0.056";

  ASSERT_EQ(c.generations.size(), 1u);
  const v1::GenerationResult& g = c.generations[0];
  ASSERT_EQ(g.prompt_size(), 8);
  ASSERT_EQ(g.tokens_size(), 16);
  std::vector<int32_t> all(g.prompt().begin(), g.prompt().end());
  all.insert(all.end(), g.tokens().begin(), g.tokens().end());
  int32_t stride = 0;
  EXPECT_TRUE(HasConstantStride(all, 96, &stride));
  int32_t prompt_stride = 0;
  ArithmeticData(96, 6, 1).Prompt(8, &prompt_stride);
  EXPECT_EQ(stride, prompt_stride);
}

TEST(TrainerTest, SameSeedGivesBitIdenticalLosses) {
  v1::JobSpec spec = SmallSpec();
  spec.mutable_training()->set_steps(6);
  spec.mutable_training()->set_log_every_steps(1);
  spec.mutable_training()->set_grad_accum_steps(2);
  spec.mutable_generation()->set_tokens(0);
  Collected a, b;
  ASSERT_TRUE(RunTrainer(Collect(spec, &a)).ok());
  ASSERT_TRUE(RunTrainer(Collect(spec, &b)).ok());
  ASSERT_EQ(a.steps.size(), 6u);
  ASSERT_EQ(b.steps.size(), 6u);
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].loss(), b.steps[i].loss()) << "step " << i + 1;
    EXPECT_EQ(a.steps[i].grad_norm(), b.steps[i].grad_norm()) << "step " << i + 1;
  }
  EXPECT_TRUE(a.generations.empty());
  EXPECT_EQ(a.steps.back().tokens_processed(), 6 * 2 * 16 * 32);
}

TEST(TrainerTest, StopFlagCancelsAtTheNextMicroBatch) {
  v1::JobSpec spec = SmallSpec();
  spec.mutable_training()->set_log_every_steps(1);
  std::atomic<bool> stop{false};
  Collected c;
  TrainerOptions o = Collect(spec, &c);
  o.stop = &stop;
  o.on_step = [&](const v1::StepReport& r) {
    c.steps.push_back(r);
    if (r.step() == 3) stop.store(true);
  };
  const absl::Status s = RunTrainer(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(s.message(), HasSubstr("stopped at step 3 of 300"));
  EXPECT_EQ(c.steps.size(), 3u);
  EXPECT_TRUE(c.generations.empty());
}

TEST(TrainerTest, NonFiniteLossFailsNamingTheStep) {
  v1::JobSpec spec = SmallSpec();
  spec.mutable_training()->set_lr(1e30);
  spec.mutable_training()->set_warmup_steps(0);
  spec.mutable_training()->set_grad_clip(0);
  Collected c;
  const absl::Status s = RunTrainer(Collect(spec, &c));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("step 2: loss is"));
}

TEST(TrainerTest, RejectsWhatThisBuildCannotRun) {
  if (kernels::NewCudaBackend(0).ok()) GTEST_SKIP() << "a usable GPU is present: cuda runs here";
  Collected c;
  v1::JobSpec spec = SmallSpec();
  spec.set_precision("bf16");
  absl::Status s = RunTrainer(Collect(spec, &c));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("precision: bf16 needs the cuda backend"));

  spec = SmallSpec();
  spec.mutable_resources()->set_backend("cuda");
  s = RunTrainer(Collect(spec, &c));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("backend cuda: "));

  // --backend overrides the spec.
  TrainerOptions o = Collect(SmallSpec(), &c);
  o.backend = "cuda";
  EXPECT_EQ(RunTrainer(o).code(), absl::StatusCode::kFailedPrecondition);

  o = Collect(SmallSpec(), &c);
  o.world_size = 2;
  s = RunTrainer(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--coordinator HOST:PORT"));
  o.rank = 2;
  s = RunTrainer(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("rank 2 is not in [0, world size 2)"));

  spec = SmallSpec();
  spec.mutable_training()->set_seq_len(64);
  s = RunTrainer(Collect(spec, &c));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("training.seq_len: 64"));
  EXPECT_TRUE(c.steps.empty());
}

}  // namespace
}  // namespace boulder::engine
