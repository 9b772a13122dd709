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
#include "worker/engine/test_temp_dir.h"
#include "worker/engine/trainer.h"
#include "worker/engine/trainer_checkpoint.h"

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

// FP8 (emulated on the cpu backend): the checkpoint carries the scaling state, so the
// resumed run continues with the same scales and amax histories and reproduces the
// uninterrupted run bit for bit, FP8 statistics included.
const std::vector<std::string> kFp8 = {"precision=fp8", "fp8.emulate=true",
                                       "fp8.amax_history_len=3"};

TEST(ResumeTest, Fp8InterruptedAndResumedRunMatchesUninterruptedBitForBit) {
  const v1::JobSpec spec = Spec(kFp8);
  TempDir full_dir("resume-test"), cut_dir("resume-test");
  const TrainRun full = Train(spec, full_dir.path());
  ASSERT_TRUE(full.status.ok()) << full.status;
  ASSERT_EQ(full.steps.size(), 12u);
  const TrainRun first = Train(spec, cut_dir.path(), /*stop_after=*/6);
  ASSERT_EQ(first.status.code(), absl::StatusCode::kCancelled) << first.status;
  const TrainRun second = Train(spec, cut_dir.path());
  ASSERT_TRUE(second.status.ok()) << second.status;
  ASSERT_EQ(second.notices.size(), 1u) << second.notices.back();
  EXPECT_THAT(second.notices[0], HasSubstr("at step 4 of 12"));
  ASSERT_EQ(second.steps.size(), 8u);
  for (size_t i = 0; i < second.steps.size(); ++i) {
    const v1::StepReport& want = full.steps[i + 4];
    const v1::StepReport& got = second.steps[i];
    ASSERT_EQ(got.step(), want.step());
    EXPECT_EQ(got.loss(), want.loss()) << "step " << got.step();
    EXPECT_EQ(got.grad_norm(), want.grad_norm()) << "step " << got.step();
    EXPECT_EQ(got.skipped_steps(), want.skipped_steps());
    ASSERT_EQ(got.fp8_size(), 24);
    ASSERT_EQ(want.fp8_size(), 24);
    for (int t = 0; t < 24; ++t) {
      EXPECT_EQ(got.fp8(t).scale(), want.fp8(t).scale()) << "step " << got.step() << " " << t;
      EXPECT_EQ(got.fp8(t).amax(), want.fp8(t).amax()) << "step " << got.step() << " " << t;
      EXPECT_EQ(got.fp8(t).amax_history_max(), want.fp8(t).amax_history_max());
      EXPECT_EQ(got.fp8(t).saturated_ratio(), want.fp8(t).saturated_ratio());
      EXPECT_EQ(got.fp8(t).underflow_ratio(), want.fp8(t).underflow_ratio());
    }
  }
  EXPECT_EQ(second.generated, full.generated);
}

TEST(ResumeTest, Fp8JobFromACheckpointWithoutScalingStateStartsItsScalesAfreshAndSaysSo) {
  // A checkpoint with no "fp8_scaling" section (here an FP32 run's; an older build's FP8
  // checkpoint looks the same) still loads into an FP8 job on the same (cpu) dtype.
  TempDir dir("resume-test");
  const TrainRun fp32 = Train(Spec(), dir.path(), /*stop_after=*/5);
  ASSERT_EQ(fp32.status.code(), absl::StatusCode::kCancelled);
  const TrainRun fp8 = Train(Spec(kFp8), dir.path());
  ASSERT_TRUE(fp8.status.ok()) << fp8.status;
  ASSERT_EQ(fp8.notices.size(), 2u);
  EXPECT_THAT(fp8.notices[0], HasSubstr("has no FP8 scaling state"));
  EXPECT_THAT(fp8.notices[0], HasSubstr("the FP8 scales start afresh"));
  EXPECT_THAT(fp8.notices[1], HasSubstr("at step 4 of 12"));
  ASSERT_EQ(fp8.steps.size(), 8u);
  // The first resumed step casts with the initial scales, then the recipe takes over.
  EXPECT_EQ(fp8.steps[0].skipped_steps(), 0);
  EXPECT_GT(fp8.steps[0].fp8(0).scale(), 1.0f);

  // And the other way: an FP8 checkpoint resumed by an FP32 job ignores the section, saying so.
  TempDir dir8("resume-test");
  ASSERT_EQ(Train(Spec(kFp8), dir8.path(), 5).status.code(), absl::StatusCode::kCancelled);
  const TrainRun back = Train(Spec(), dir8.path());
  ASSERT_TRUE(back.status.ok()) << back.status;
  ASSERT_EQ(back.notices.size(), 2u);
  EXPECT_THAT(back.notices[0], HasSubstr("holds an FP8 scaling state; ignored, precision is fp32"));
}

TEST(ResumeTest, Fp8ScalingStateOfAnotherHistoryLengthOrFormatIsRefused) {
  TempDir dir("resume-test");
  ASSERT_EQ(Train(Spec(kFp8), dir.path(), 5).status.code(), absl::StatusCode::kCancelled);
  std::vector<std::string> longer = kFp8;
  longer.push_back("fp8.amax_history_len=8");
  const TrainRun a = Train(Spec(longer), dir.path());
  EXPECT_EQ(a.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(a.status.message(),
              HasSubstr("fp8_scaling: written with fp8.amax_history_len 3, this job has 8"));
  std::vector<std::string> e4m3 = kFp8;
  e4m3.push_back("fp8.format=e4m3");
  const TrainRun b = Train(Spec(e4m3), dir.path());
  EXPECT_EQ(b.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(b.status.message(), HasSubstr("written with fp8.format hybrid, this job has e4m3"));
}

// The loop's counters round-trip through a checkpoint: AdamW's step count (which FP8 skips
// hold back) and the skip counters; the scaling state too, with a model fresh from Create.
TEST(ResumeTest, Fp8ProgressAndScalingStateRoundTrip) {
  const v1::JobSpec spec = Spec(kFp8);
  std::unique_ptr<kernels::Backend> cpu = kernels::NewCpuBackend(1);
  absl::StatusOr<ModelConfig> config = ModelConfigFromSpec(spec.model());
  ASSERT_TRUE(config.ok());
  ModelOptions mo;
  mo.config = *config;
  mo.batch_size = spec.training().batch_size();
  mo.seq_len = spec.training().seq_len();
  mo.fp8.enabled = true;
  mo.fp8.amax_history_len = 3;
  auto trained = Model::Create(cpu.get(), mo);
  ASSERT_TRUE(trained.ok()) << trained.status();
  std::vector<int32_t> ids(static_cast<size_t>(mo.batch_size) * mo.seq_len);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((3 * i) % 96);
  for (int step = 0; step < 2; ++step) {
    (*trained)->ZeroGrad();
    ASSERT_TRUE((*trained)->Forward(ids, ids).ok());
    ASSERT_TRUE((*trained)->Backward().ok());
    ASSERT_TRUE((*trained)->OptimizerStep(1e-3f, step + 1).ok());
    ASSERT_TRUE((*trained)->Fp8EndStep(true, nullptr).ok());
  }
  TempDir dir("resume-test");
  TrainerProgress p;
  p.step = 7;
  p.tokens_processed = 4096;
  p.optimizer_steps = 5;
  p.fp8_skipped_steps = 2;
  p.fp8_consecutive_skips = 1;
  p.fp8_first_overflow = "layer 1 fc2 grad_output";
  ASSERT_TRUE(SaveTrainerCheckpoint(*cpu, **trained, spec, dir.path(), p, 2).ok());

  auto fresh = Model::Create(cpu.get(), mo);
  ASSERT_TRUE(fresh.ok());
  auto resumed = RestoreTrainerCheckpoint(*cpu, **fresh, spec, dir.path(), nullptr);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_TRUE(resumed->has_value());
  const ResumePoint& r = **resumed;
  EXPECT_EQ(r.step, 7);
  EXPECT_EQ(r.tokens_processed, 4096);
  EXPECT_EQ(r.optimizer_steps, 5);
  EXPECT_EQ(r.fp8_skipped_steps, 2);
  EXPECT_EQ(r.fp8_consecutive_skips, 1);
  EXPECT_EQ(r.fp8_first_overflow, "layer 1 fc2 grad_output");
  auto want = (*trained)->fp8_state()->ReadStats();
  auto got = (*fresh)->fp8_state()->ReadStats();
  ASSERT_TRUE(want.ok() && got.ok());
  ASSERT_EQ(got->size(), want->size());
  for (size_t i = 0; i < want->size(); ++i) {
    EXPECT_NE((*want)[i].scale, 1.0f) << i;  // two updates moved it
    EXPECT_EQ((*got)[i].scale, (*want)[i].scale) << i;
    EXPECT_EQ((*got)[i].amax, (*want)[i].amax) << i;
    EXPECT_EQ((*got)[i].amax_history_max, (*want)[i].amax_history_max) << i;
  }
}

// The common/ estimate the coordinator checks at submit equals what the model allocates.
TEST(MemoryEstimateTest, MatchesTheModelsAllocationOnCpu) {
  for (const std::vector<std::string>& sets :
       {std::vector<std::string>{},
        {"model.tie_embeddings=true", "training.batch_size=1"},
        {"model.vocab_size=1500", "model.layers=3", "training.seq_len=8"},
        {"training.activation_checkpointing=gelu"},
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
    absl::StatusOr<Recompute> recompute =
        ParseRecompute(spec.training().activation_checkpointing());
    ASSERT_TRUE(recompute.ok()) << recompute.status();
    mo.recompute = *recompute;
    absl::StatusOr<std::unique_ptr<Model>> model = Model::Create(backend->get(), mo);
    ASSERT_TRUE(model.ok());
    absl::StatusOr<common::MemoryEstimate> e = common::EstimateTrainingMemory(spec, "fp32", "cpu");
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->num_params, static_cast<int64_t>((*model)->num_params()));
    EXPECT_EQ(e->activations_bytes, static_cast<int64_t>((*model)->activation_bytes()));
    EXPECT_EQ(e->total_bytes, static_cast<int64_t>((*model)->total_bytes()));
  }
}

// The same with the FP8 buffers (precision fp8, emulated on the cpu): the estimate's fp8_bytes
// equals what AllocateFp8 and the scaling state allocate, for several shapes and histories.
TEST(MemoryEstimateTest, CountsTheFp8BuffersOfTheModelOnCpuEmulation) {
  for (const std::vector<std::string>& sets :
       {std::vector<std::string>{},
        {"model.ffn=48", "training.batch_size=1", "fp8.amax_history_len=1"},
        {"model.layers=3", "model.hidden=64", "model.heads=4", "training.seq_len=8",
         "fp8.amax_history_len=1024", "fp8.format=e4m3"},
        {"training.activation_checkpointing=gelu"},
        {"training.activation_checkpointing=mlp"},
        {"training.activation_checkpointing=full", "model.ffn=48"}}) {
    std::vector<std::string> all = kFp8;
    all.insert(all.end(), sets.begin(), sets.end());
    const v1::JobSpec spec = Spec(all);
    absl::StatusOr<std::unique_ptr<kernels::Backend>> backend = kernels::NewCpuBackend(1);
    ASSERT_TRUE(backend.ok());
    absl::StatusOr<ModelConfig> config = ModelConfigFromSpec(spec.model());
    ASSERT_TRUE(config.ok());
    ModelOptions mo;
    mo.config = *config;
    mo.batch_size = spec.training().batch_size();
    mo.seq_len = spec.training().seq_len();
    mo.fp8.enabled = true;
    mo.fp8.amax_history_len = spec.fp8().amax_history_len();
    mo.fp8.hybrid = spec.fp8().format() == "hybrid";
    absl::StatusOr<Recompute> recompute =
        ParseRecompute(spec.training().activation_checkpointing());
    ASSERT_TRUE(recompute.ok()) << recompute.status();
    mo.recompute = *recompute;
    absl::StatusOr<std::unique_ptr<Model>> model = Model::Create(backend->get(), mo);
    ASSERT_TRUE(model.ok()) << model.status();
    absl::StatusOr<common::MemoryEstimate> e = common::EstimateTrainingMemory(spec, "fp8", "cpu");
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_GT(e->fp8_bytes, 0);
    EXPECT_EQ(e->fp8_bytes, static_cast<int64_t>((*model)->fp8_bytes()));
    EXPECT_EQ(e->activations_bytes, static_cast<int64_t>((*model)->activation_bytes()));
    EXPECT_EQ(e->total_bytes, static_cast<int64_t>((*model)->total_bytes()));
  }
}

}  // namespace
}  // namespace boulder::engine
