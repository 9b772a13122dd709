// Resume on the cuda backend (bf16): a run stopped after a checkpoint and resumed reproduces
// the uninterrupted run's losses. The CUDA kernels are deterministic run to run
// (model_gpu_test DeterministicLosses), so the comparison is exact. Skips without a GPU.
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "worker/engine/trainer.h"

namespace boulder::engine {
namespace {

using ::testing::HasSubstr;

std::string TempDir() {
  std::string pattern =
      (std::filesystem::temp_directory_path() / "resume-gpu-test-XXXXXX").string();
  return mkdtemp(pattern.data());
}

struct GpuRun {
  absl::Status status;
  std::vector<double> losses;
  std::vector<std::string> notices;
};

GpuRun Train(const v1::JobSpec& spec, const std::string& dir, int64_t stop_after) {
  GpuRun run;
  std::atomic<bool> stop{false};
  TrainerOptions o;
  o.spec = spec;
  o.backend = "cuda";
  o.checkpoint_dir = dir;
  o.stop = &stop;
  o.on_step = [&](const v1::StepReport& r) {
    run.losses.push_back(r.loss());
    if (r.step() == stop_after) stop = true;
  };
  o.on_notice = [&](absl::string_view line) { run.notices.emplace_back(line); };
  run.status = RunTrainer(o);
  return run;
}

TEST(ResumeGpuTest, ResumedRunMatchesUninterrupted) {
  if (!kernels::NewCudaBackend(0).ok()) GTEST_SKIP() << "no usable CUDA device";
  absl::StatusOr<v1::JobSpec> spec = common::LoadJobSpec(
      "{}", {"model.hidden=128", "model.heads=2", "model.layers=2", "model.ffn=512",
             "model.context=128", "training.batch_size=4", "training.steps=12",
             "checkpoint.every_steps=4", "generation.tokens=0", "training.deterministic=true",
             "precision=bf16", "resources.backend=cuda"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string full_dir = TempDir(), cut_dir = TempDir();
  const GpuRun full = Train(*spec, full_dir, 0);
  ASSERT_TRUE(full.status.ok()) << full.status;
  const GpuRun first = Train(*spec, cut_dir, 6);
  ASSERT_EQ(first.status.code(), absl::StatusCode::kCancelled) << first.status;
  const GpuRun second = Train(*spec, cut_dir, 0);
  ASSERT_TRUE(second.status.ok()) << second.status;
  ASSERT_THAT(second.notices, ::testing::ElementsAre(HasSubstr("at step 4 of 12")));
  ASSERT_EQ(second.losses.size(), 8u);
  EXPECT_EQ(second.losses, std::vector<double>(full.losses.begin() + 4, full.losses.end()));
  std::error_code ec;
  std::filesystem::remove_all(full_dir, ec);
  std::filesystem::remove_all(cut_dir, ec);
}

}  // namespace
}  // namespace boulder::engine
