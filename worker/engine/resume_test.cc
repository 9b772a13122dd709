// Resume exactness: a run stopped mid-way and resumed from its checkpoint reproduces the
// uninterrupted run's losses bit for bit on the cpu backend; corrupt checkpoints are skipped
// with a notice; another job's checkpoint is refused.
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/memory_estimate.h"
#include "common/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "worker/engine/checkpoint.h"
#include "worker/engine/model.h"
#include "worker/engine/param_layout.h"
#include "worker/engine/trainer.h"
#include "worker/engine/test_temp_dir.h"

namespace boulder::engine {
namespace {

using ::testing::HasSubstr;

v1::JobSpec Spec(std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {"model.hidden=32",
                                   "model.heads=2",
                                   "model.layers=2",
                                   "model.ffn=64",
                                   "model.context=16",
                                   "training.batch_size=4",
                                   "training.steps=12",
                                   "training.lr=0.005",
                                   "training.warmup_steps=3",
                                   "training.schedule=cosine",
                                   "checkpoint.every_steps=4",
                                   "checkpoint.keep_last=2",
                                   "generation.tokens=4",
                                   "resources.backend=cpu",
                                   "precision=fp32"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  absl::StatusOr<v1::JobSpec> spec = common::LoadJobSpec("{}", sets);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

struct TrainRun {
  absl::Status status;
  std::vector<v1::StepReport> steps;
  std::vector<std::string> notices;
  std::vector<int32_t> generated;
};

// Trains `spec` with checkpoints in `dir`; stops after the report of `stop_after` (0: never).
TrainRun Train(const v1::JobSpec& spec, const std::string& dir, int64_t stop_after = 0) {
  TrainRun run;
  std::atomic<bool> stop{false};
  TrainerOptions o;
  o.spec = spec;
  o.backend = "cpu";
  o.threads = 1;
  o.checkpoint_dir = dir;
  o.stop = &stop;
  o.on_step = [&](const v1::StepReport& r) {
    run.steps.push_back(r);
    if (r.step() == stop_after) stop = true;
  };
  o.on_notice = [&](absl::string_view line) { run.notices.emplace_back(line); };
  o.on_generation = [&](const v1::GenerationResult& g) {
    run.generated.assign(g.tokens().begin(), g.tokens().end());
  };
  run.status = RunTrainer(o);
  return run;
}

TEST(ResumeTest, InterruptedAndResumedRunMatchesUninterruptedBitForBit) {
  const v1::JobSpec spec = Spec();
  TempDir full_dir("resume-test"), cut_dir("resume-test");
  const TrainRun full = Train(spec, full_dir.path());
  ASSERT_TRUE(full.status.ok()) << full.status;
  ASSERT_EQ(full.steps.size(), 12u);
  EXPECT_TRUE(full.notices.empty());
  // Checkpoints at 4 and 8 (never at the last step), keep_last 2.
  auto files = ListCheckpoints(full_dir.path());
  ASSERT_TRUE(files.ok());
  ASSERT_EQ(files->size(), 2u);
  EXPECT_EQ((*files)[0].first, 8);
  EXPECT_EQ((*files)[1].first, 4);

  // Interrupted after step 6: the newest checkpoint is step 4.
  const TrainRun first = Train(spec, cut_dir.path(), /*stop_after=*/6);
  ASSERT_EQ(first.status.code(), absl::StatusCode::kCancelled) << first.status;
  ASSERT_EQ(first.steps.size(), 6u);
  const TrainRun second = Train(spec, cut_dir.path());
  ASSERT_TRUE(second.status.ok()) << second.status;
  ASSERT_EQ(second.notices.size(), 1u);
  EXPECT_THAT(second.notices[0], HasSubstr("resumed from checkpoint"));
  EXPECT_THAT(second.notices[0], HasSubstr("at step 4 of 12"));
  ASSERT_EQ(second.steps.size(), 8u);
  for (size_t i = 0; i < second.steps.size(); ++i) {
    const v1::StepReport& want = full.steps[i + 4];
    const v1::StepReport& got = second.steps[i];
    ASSERT_EQ(got.step(), want.step());
    // Exact equality: the same bits, not a tolerance.
    EXPECT_EQ(got.loss(), want.loss()) << "step " << got.step();
    EXPECT_EQ(got.grad_norm(), want.grad_norm()) << "step " << got.step();
    EXPECT_EQ(got.lr(), want.lr());
    EXPECT_EQ(got.tokens_processed(), want.tokens_processed());
  }
  EXPECT_EQ(second.generated, full.generated);
}

TEST(ResumeTest, CorruptLatestCheckpointIsSkippedWithANotice) {
  const v1::JobSpec spec = Spec();
  TempDir full_dir("resume-test"), dir("resume-test");
  const TrainRun full = Train(spec, full_dir.path());
  ASSERT_TRUE(full.status.ok());
  const TrainRun first = Train(spec, dir.path(), /*stop_after=*/10);  // checkpoints 4 and 8
  ASSERT_EQ(first.status.code(), absl::StatusCode::kCancelled);
  const std::string latest = dir.path() + "/" + CheckpointFileName(8);
  ASSERT_TRUE(std::filesystem::exists(latest));
  std::filesystem::resize_file(latest, std::filesystem::file_size(latest) / 2);

  const TrainRun second = Train(spec, dir.path());
  ASSERT_TRUE(second.status.ok()) << second.status;
  ASSERT_EQ(second.notices.size(), 2u);
  EXPECT_THAT(second.notices[0], HasSubstr("warning: checkpoint " + latest + " is corrupt"));
  EXPECT_THAT(second.notices[0], HasSubstr("truncated"));
  EXPECT_THAT(second.notices[1], HasSubstr("at step 4 of 12"));
  ASSERT_EQ(second.steps.size(), 8u);
  EXPECT_EQ(second.steps.back().loss(), full.steps.back().loss());
}

TEST(ResumeTest, AnotherJobsCheckpointIsRefused) {
  TempDir dir("resume-test");
  const TrainRun first = Train(Spec(), dir.path(), /*stop_after=*/5);
  ASSERT_EQ(first.status.code(), absl::StatusCode::kCancelled);
  const TrainRun other = Train(Spec({"model.hidden=48"}), dir.path());
  EXPECT_EQ(other.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status.message(), HasSubstr("another job's directory"));
  const TrainRun reseeded = Train(Spec({"training.seed=9"}), dir.path());
  EXPECT_EQ(reseeded.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(reseeded.status.message(), HasSubstr("written for seed 1337"));
}

TEST(ResumeTest, FinishedRunResumesAtItsLastCheckpointAndEndsTheSame) {
  // A restart after training ended (killed during generation, say) redoes the steps after the
  // newest checkpoint only.
  const v1::JobSpec spec = Spec();
  TempDir dir("resume-test");
  const TrainRun full = Train(spec, dir.path());
  ASSERT_TRUE(full.status.ok());
  const TrainRun again = Train(spec, dir.path());
  ASSERT_TRUE(again.status.ok());
  ASSERT_EQ(again.steps.size(), 4u);
  EXPECT_EQ(again.steps.front().step(), 9);
  EXPECT_EQ(again.steps.back().loss(), full.steps.back().loss());
  EXPECT_EQ(again.generated, full.generated);
}

TEST(ResumeTest, CheckpointsOffWithoutADirectoryOrWithEveryStepsZero) {
  TempDir dir("resume-test");
  const TrainRun off = Train(Spec({"checkpoint.every_steps=0"}), dir.path());
  ASSERT_TRUE(off.status.ok());
  EXPECT_TRUE(ListCheckpoints(dir.path())->empty());
}

// The common/ estimate the coordinator checks at submit equals what the model allocates.
TEST(MemoryEstimateTest, MatchesTheModelsAllocationOnCpu) {
  for (const std::vector<std::string>& sets :
       {std::vector<std::string>{},
        {"model.tie_embeddings=true", "training.batch_size=1"},
        {"model.vocab_size=1500", "model.layers=3", "training.seq_len=8"},
        {"training.activation_checkpointing=mlp"},
        {"training.activation_checkpointing=full", "model.layers=3"}}) {
    const v1::JobSpec spec = Spec(sets);
    absl::StatusOr<std::unique_ptr<kernels::Backend>> backend = kernels::NewCpuBackend(1);
    ASSERT_TRUE(backend.ok());
    absl::StatusOr<ModelConfig> config = ModelConfigFromSpec(spec.model());
    ASSERT_TRUE(config.ok());
    ModelOptions mo;
    mo.config = *config;
    mo.batch_size = spec.training().batch_size();
    mo.seq_len = spec.training().seq_len();
    const std::string& ckpt = spec.training().activation_checkpointing();
    mo.recompute =
        ckpt == "full" ? Recompute::kFull : (ckpt == "mlp" ? Recompute::kMlp : Recompute::kNone);
    absl::StatusOr<std::unique_ptr<Model>> model = Model::Create(backend->get(), mo);
    ASSERT_TRUE(model.ok());
    absl::StatusOr<common::MemoryEstimate> e = common::EstimateTrainingMemory(spec, "fp32", "cpu");
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->num_params, static_cast<int64_t>((*model)->num_params()));
    EXPECT_EQ(e->activations_bytes, static_cast<int64_t>((*model)->activation_bytes()));
    EXPECT_EQ(e->total_bytes, static_cast<int64_t>((*model)->total_bytes()));
  }
}

}  // namespace
}  // namespace boulder::engine
