#include "common/spec_checkpoint.h"

#include <string>

#include "absl/status/status.h"
#include "common/memory_estimate.h"
#include "common/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace boulder::common {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

absl::StatusOr<v1::JobSpec> Load(const std::string& yaml) { return LoadJobSpec(yaml, {}); }

TEST(SpecCheckpointTest, DefaultsAreFilled) {
  absl::StatusOr<v1::JobSpec> spec = Load("{}");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->checkpoint().every_steps(), 100);
  EXPECT_EQ(spec->checkpoint().keep_last(), 2);
  EXPECT_TRUE(spec->checkpoint().has_dir());
  EXPECT_EQ(spec->checkpoint().dir(), "");
  EXPECT_EQ(spec->max_restarts(), 3);
}

TEST(SpecCheckpointTest, WrittenValuesAreKeptAndRoundTripThroughYaml) {
  absl::StatusOr<v1::JobSpec> spec =
      Load("checkpoint: {every_steps: 0, keep_last: 5, dir: runs/a}\nmax_restarts: 0\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->checkpoint().every_steps(), 0);
  EXPECT_EQ(spec->checkpoint().keep_last(), 5);
  EXPECT_EQ(spec->checkpoint().dir(), "runs/a");
  EXPECT_EQ(spec->max_restarts(), 0);
  absl::StatusOr<v1::JobSpec> again = Load(JobSpecToYaml(*spec));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->SerializeAsString(), spec->SerializeAsString());
}

struct BadCase {
  std::string yaml;
  std::string error_start;
};

class SpecCheckpointErrorTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(SpecCheckpointErrorTest, RejectsWithFieldPath) {
  absl::StatusOr<v1::JobSpec> spec = Load(GetParam().yaml);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), StartsWith(GetParam().error_start));
}

INSTANTIATE_TEST_SUITE_P(
    All, SpecCheckpointErrorTest,
    ::testing::Values(
        BadCase{"checkpoint: {every_steps: -1}", "checkpoint.every_steps: must be at least 0"},
        BadCase{"checkpoint: {keep_last: 0}", "checkpoint.keep_last: must be in [1, 1000]"},
        BadCase{"checkpoint: {dir: /etc}", "checkpoint.dir: '/etc' is absolute"},
        BadCase{"checkpoint: {dir: a/../../b}", "checkpoint.dir: 'a/../../b' contains '..'"},
        BadCase{"checkpoint: {dir: ..}", "checkpoint.dir: '..' contains '..'"},
        BadCase{"checkpoint: {dir: 'a//b'}", "checkpoint.dir: 'a//b' has an empty"},
        BadCase{"checkpoint: {dir: 'a\\\\b'}", "checkpoint.dir: must not contain '\\'"},
        BadCase{"checkpoint: {evry_steps: 3}", "checkpoint.evry_steps: unknown field"},
        BadCase{"max_restarts: -1", "max_restarts: must be in [0, 100]"},
        BadCase{"max_restarts: 101", "max_restarts: must be in [0, 100]"}));

TEST(SpecCheckpointTest, DirectoryIsUnderTheRoot) {
  absl::StatusOr<v1::JobSpec> spec = Load("{}");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(CheckpointDirectory("/shared/ckpt", *spec, 42), "/shared/ckpt/job-42");
  EXPECT_EQ(CheckpointDirectory("/shared/ckpt/", *spec, 42), "/shared/ckpt/job-42");
  spec->mutable_checkpoint()->set_dir("team/run1");
  EXPECT_EQ(CheckpointDirectory("/shared/ckpt", *spec, 42), "/shared/ckpt/team/run1");
}

TEST(MemoryEstimateTest, SeedModelOnCpuAndCuda) {
  absl::StatusOr<v1::JobSpec> spec = Load("{}");
  ASSERT_TRUE(spec.ok());
  absl::StatusOr<MemoryEstimate> cpu = EstimateTrainingMemory(*spec, "fp32", "cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  // minigpt: vocab 96 (padded 96), hidden 768, 4 layers, ffn 3072, context 256, untied head.
  const int64_t per_layer =
      2 * 768 + 3 * 768 * 768 + 3 * 768 + 768 * 768 + 768 + 2 * 768 + 2 * 768 * 3072 + 3072 + 768;
  const int64_t n = 2 * 96 * 768 + 256 * 768 + 4 * per_layer + 2 * 768;
  EXPECT_EQ(cpu->num_params, n);
  EXPECT_EQ(cpu->params_bytes, 4 * n);
  EXPECT_EQ(cpu->optimizer_bytes, 8 * n + (n + 7) / 8);
  EXPECT_EQ(cpu->runtime_bytes, 0);
  EXPECT_EQ(cpu->total_bytes,
            cpu->params_bytes + cpu->grads_bytes + cpu->optimizer_bytes + cpu->activations_bytes);
  absl::StatusOr<MemoryEstimate> gpu = EstimateTrainingMemory(*spec, "bf16", "cuda");
  ASSERT_TRUE(gpu.ok());
  EXPECT_EQ(gpu->params_bytes, 2 * n);
  // m, v, the master's 16-bit low halves (the cuda backend's split master), decay bits.
  EXPECT_EQ(gpu->optimizer_bytes, 10 * n + (n + 7) / 8);
  EXPECT_EQ(gpu->runtime_bytes, kCudaRuntimeReserveBytes);
  EXPECT_THAT(FormatMemoryEstimate(*gpu), HasSubstr("CUDA runtime 1.00 GiB"));
}

TEST(MemoryEstimateTest, Fp8AddsItsBuffersToTheBf16Estimate) {
  // The seed job in FP8 on the GPU: BF16 parameters, gradients, optimizer state and
  // activations, plus the FP8 buffers (worker/engine/resume_test.cc checks them against the
  // model's allocation). FP8 never keeps GELU's output, so activation_checkpointing "gelu" and
  // "none" are one FP8 layout; BF16 "none" keeps GELU's output per layer, which leaves FP8
  // room for more kept transposes.
  for (const std::string ckpt : {"gelu", "none"}) {
    SCOPED_TRACE(ckpt);
    absl::StatusOr<v1::JobSpec> spec =
        Load("precision: fp8\ntraining: {activation_checkpointing: " + ckpt + "}");
    ASSERT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<MemoryEstimate> bf16 = EstimateTrainingMemory(*spec, "bf16", "cuda");
    absl::StatusOr<MemoryEstimate> fp8 = EstimateTrainingMemory(*spec, "fp8", "cuda");
    ASSERT_TRUE(bf16.ok() && fp8.ok()) << fp8.status();
    EXPECT_EQ(bf16->fp8_bytes, 0);
    EXPECT_EQ(fp8->params_bytes, bf16->params_bytes);
    // FP8 without recompute keeps one pair of LayerNorm outputs for all 4 layers (its backward
    // reads the FP8 transposes): 3 layers x 2 x [8192 x 768] BF16 fewer; against BF16 "none"
    // also 3 layers' GELU outputs [8192 x 3072] fewer.
    // The FP8 cast scratch fits in the arena's GELU buffer (2·N·max(3C,F) bytes against
    // [8192 x 3072] BF16) and dqkv (N·max(C,F) against [8192 x 2304] BF16) as they are.
    const int64_t shared_ln = 3 * 2 * int64_t{8192} * 768 * 2;
    const int64_t gelu = ckpt == "none" ? 3 * int64_t{8192} * 3072 * 2 : 0;
    EXPECT_EQ(fp8->activations_bytes, bf16->activations_bytes - shared_ln - gelu);
    // 4 layers, C 768, F 3072, history 16: per layer the FP8 weights 3C² + C² + 2CF bytes (no
    // input transposes: the backward recomputes them) and, since FP8 stays under BF16 with
    // them, their transposes as many bytes (else one shared weight transpose C·max(3C,F)), and
    // 48 tensors' scaling state (3 float vectors, scale_inv on a 256-byte slot, a 16-entry
    // history, 3 uint64 counters each; every region 256-byte aligned).
    const int64_t C = 768, F = 3072, L = 4, N = 8192;
    const int64_t layers = L * (4 * C * C + 2 * C * F);
    const int64_t discard = 32;      // the recompute's discard slot
    const int64_t shared_t = C * F;  // F > 3C
    const int64_t state = 3 * 256 + 48 * 256 + 3072 + 1280;
    EXPECT_TRUE(fp8->fp8_keeps_weight_transposes);
    // The LayerNorms' input transposes, 4 x 2 x [768 x 8192], take FP8 past BF16 "gelu" but
    // fit within BF16 "none".
    const int64_t ln_t = L * 2 * C * N;
    EXPECT_EQ(fp8->fp8_keeps_ln_input_transposes, ckpt == "none");
    EXPECT_EQ(fp8->fp8_bytes, 2 * layers + discard + state + (ckpt == "none" ? ln_t : 0));
    EXPECT_EQ(fp8->total_bytes, bf16->total_bytes + fp8->fp8_bytes - shared_ln - gelu);
    EXPECT_LE(fp8->total_bytes, bf16->total_bytes);
    EXPECT_THAT(FormatMemoryEstimate(*fp8), HasSubstr(", FP8 0."));
    // Emulated on the cpu: FP32 elsewhere, and the shared transpose.
    absl::StatusOr<MemoryEstimate> emulated = EstimateTrainingMemory(*spec, "fp8", "cpu");
    ASSERT_TRUE(emulated.ok());
    EXPECT_EQ(emulated->params_bytes, 2 * fp8->params_bytes);
    EXPECT_FALSE(emulated->fp8_keeps_weight_transposes);
    EXPECT_EQ(emulated->fp8_bytes, layers + shared_t + discard + state);
  }
}

// The weight transposes are kept only where FP8 then still fits in the job's BF16 memory: the
// benchmark's hidden-2048 job (8 x 1024 rows, 8 layers of 2048 / 8192) with GELU recomputed
// ("gelu") has 48 MiB between the two, less than its 403 MB of transposes. Without
// recompute BF16 keeps 7 more [8192 x 8192] GELU outputs (896 MiB), and FP8 keeps both the
// weight transposes and qkv's and fc1's input transposes (256 MiB).
TEST(MemoryEstimateTest, Fp8KeepsWeightTransposesOnlyWithinBf16Memory) {
  const int64_t C = 2048, F = 8192, L = 8;
  for (const std::string ckpt : {"gelu", "none"}) {
    SCOPED_TRACE(ckpt);
    absl::StatusOr<v1::JobSpec> spec = Load(
        "precision: fp8\nmodel: {hidden: 2048, heads: 16, layers: 8, ffn: 8192, context: "
        "1024}\ntraining: {batch_size: 8, seq_len: 1024, activation_checkpointing: " +
        ckpt + "}");
    ASSERT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<MemoryEstimate> bf16 = EstimateTrainingMemory(*spec, "bf16", "cuda");
    absl::StatusOr<MemoryEstimate> fp8 = EstimateTrainingMemory(*spec, "fp8", "cuda");
    ASSERT_TRUE(bf16.ok() && fp8.ok()) << fp8.status();
    EXPECT_EQ(fp8->fp8_keeps_weight_transposes, ckpt == "none");
    EXPECT_EQ(fp8->fp8_keeps_ln_input_transposes, ckpt == "none");
    EXPECT_LE(fp8->total_bytes, bf16->total_bytes);
    if (ckpt == "gelu") {
      EXPECT_GT(fp8->total_bytes + L * (4 * C * C + 2 * C * F) - C * F, bf16->total_bytes);
    }
  }
}

// GPT-2 (16 x 1024 rows, 12 layers of 768 / 3072, untied head) has room for both: 81 MiB of
// weight transposes, then 288 MiB of qkv's and fc1's input transposes, and FP8 still takes no
// more than BF16; with activation checkpointing the input transposes are never kept.
TEST(MemoryEstimateTest, Fp8KeepsBothTransposesOnGpt2) {
  const std::string gpt2 =
      "precision: fp8\nmodel: {preset: gpt2, tie_embeddings: false}\n"
      "training: {batch_size: 16, seq_len: 1024";
  absl::StatusOr<v1::JobSpec> spec = Load(gpt2 + "}");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<MemoryEstimate> bf16 = EstimateTrainingMemory(*spec, "bf16", "cuda");
  absl::StatusOr<MemoryEstimate> fp8 = EstimateTrainingMemory(*spec, "fp8", "cuda");
  ASSERT_TRUE(bf16.ok() && fp8.ok()) << fp8.status();
  EXPECT_TRUE(fp8->fp8_keeps_weight_transposes);
  EXPECT_TRUE(fp8->fp8_keeps_ln_input_transposes);
  EXPECT_LE(fp8->total_bytes, bf16->total_bytes);
  absl::StatusOr<v1::JobSpec> mlp = Load(gpt2 + ", activation_checkpointing: mlp}");
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  absl::StatusOr<MemoryEstimate> fp8_mlp = EstimateTrainingMemory(*mlp, "fp8", "cuda");
  ASSERT_TRUE(fp8_mlp.ok());
  EXPECT_FALSE(fp8_mlp->fp8_keeps_ln_input_transposes);
}

TEST(MemoryEstimateTest, RejectsUnknownPrecisionAndBackend) {
  absl::StatusOr<v1::JobSpec> spec = Load("{}");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(EstimateTrainingMemory(*spec, "fp16", "cuda").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EstimateTrainingMemory(*spec, "fp32", "tpu").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EstimateTrainingMemory(v1::JobSpec(), "fp32", "cpu").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace boulder::common
