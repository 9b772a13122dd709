// A 1-rank NCCL run goes through the whole data-parallel path (rendezvous through an
// in-process coordinator service, ncclCommInitRank, the unique-id exchange, the parameter
// broadcast, bucketed all-reduces on the communicator's stream, the loss all-reduce and the
// replica checksum) and must train exactly like the run without a communicator. Skips without
// a usable GPU.
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "worker/comm/comm_test_util.h"
#include "worker/engine/trainer.h"

namespace boulder::engine {
namespace {

v1::JobSpec Spec() {
  v1::JobSpec s;
  v1::ModelSpec* m = s.mutable_model();
  m->set_preset("minigpt");
  m->set_vocab_size(96);
  m->set_hidden(256);
  m->set_heads(4);
  m->set_layers(4);
  m->set_ffn(1024);
  m->set_context(128);
  m->set_tie_embeddings(false);
  s.mutable_data()->set_source("arithmetic");
  s.mutable_data()->set_max_stride(6);
  v1::TrainingSpec* t = s.mutable_training();
  t->set_steps(30);
  t->set_batch_size(8);
  t->set_seq_len(128);
  t->set_lr(1e-3);
  t->set_beta1(0.9);
  t->set_beta2(0.95);
  t->set_eps(1e-8);
  t->set_weight_decay(0.1);
  t->set_warmup_steps(5);
  t->set_schedule("cosine");
  t->set_min_lr_ratio(0.1);
  t->set_grad_accum_steps(2);
  t->set_grad_clip(1.0);
  t->set_seed(3);
  t->set_deterministic(true);
  t->set_log_every_steps(1);
  s.set_precision("bf16");
  s.mutable_resources()->set_workers(1);
  s.mutable_resources()->set_backend("cuda");
  s.mutable_resources()->set_collective_timeout_seconds(60);
  s.mutable_resources()->set_checksum_every_steps(5);
  s.mutable_generation()->set_prompt_len(4);
  s.mutable_generation()->set_tokens(0);
  return s;
}

// precision fp8 with delayed scaling on the GPU (not emulated), the recipe's defaults.
void SetFp8(v1::JobSpec* spec) {
  spec->set_precision("fp8");
  v1::Fp8Spec* f = spec->mutable_fp8();
  f->set_format("hybrid");
  f->set_amax_history_len(16);
  f->set_amax_compute_algo("max");
  f->set_margin(0);
  f->set_emulate(false);
  f->set_max_consecutive_skips(10);
}

TEST(DataParallelGpuTest, OneRankNcclMatchesTheRunWithoutACommunicator) {
  if (!kernels::NewCudaBackend(0).ok()) GTEST_SKIP() << "no usable CUDA device";
  comm::TestRendezvousServer server;
  std::vector<v1::StepReport> plain, nccl;
  std::vector<std::string> info;
  TrainerOptions o;
  o.spec = Spec();
  o.job_id = 1;
  o.on_step = [&plain](const v1::StepReport& r) { plain.push_back(r); };
  ASSERT_TRUE(RunTrainer(o).ok());

  o.force_communicator = true;
  o.coordinator = server.address();
  o.security.insecure = true;  // the test server is plaintext
  o.on_step = [&nccl](const v1::StepReport& r) { nccl.push_back(r); };
  o.on_info = [&info](absl::string_view line) { info.emplace_back(line); };
  absl::Status s = RunTrainer(o);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_THAT(info, ::testing::Contains(::testing::HasSubstr("over nccl")));
  // NVLink multicast stays off unless asked for.
  ASSERT_NE(std::getenv("NCCL_NVLS_ENABLE"), nullptr);

  // Averaging over one rank is the identity and the data and kernels are the same, so the
  // curves agree to the kernels' own run-to-run noise; 1e-3 absolute is far below what a
  // wrong bucket, a missed all-reduce or a stream race would cost (1e-2 and up).
  ASSERT_EQ(nccl.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_NEAR(nccl[i].loss(), plain[i].loss(), 1e-3) << "step " << i + 1;
  }
  EXPECT_LT(plain.back().loss(), plain.front().loss());
}

// The same in FP8 (delayed scaling on a GPU of compute capability 8.9 or higher): the amax
// all-reduce (MAX) and the agreed skip decision run on the NCCL path; over one rank both are
// the identity, so losses and every FP8 tensor's scale agree with the run without a
// communicator to the kernels' run-to-run noise (deterministic: 1e-3 on the loss, 1e-3
// relative on the scales).
TEST(DataParallelGpuTest, OneRankNcclFp8MatchesTheRunWithoutACommunicator) {
  absl::StatusOr<std::unique_ptr<kernels::Backend>> gpu = kernels::NewCudaBackend(0);
  if (!gpu.ok()) GTEST_SKIP() << "no usable CUDA device";
  if (absl::Status s = (*gpu)->Fp8Supported(); !s.ok()) GTEST_SKIP() << s.message();
  gpu->reset();
  comm::TestRendezvousServer server;
  v1::JobSpec spec = Spec();
  SetFp8(&spec);
  std::vector<v1::StepReport> plain, nccl;
  TrainerOptions o;
  o.spec = spec;
  o.job_id = 1;
  o.on_step = [&plain](const v1::StepReport& r) { plain.push_back(r); };
  absl::Status s = RunTrainer(o);
  ASSERT_TRUE(s.ok()) << s;

  o.force_communicator = true;
  o.coordinator = server.address();
  o.security.insecure = true;  // the test server is plaintext
  o.on_step = [&nccl](const v1::StepReport& r) { nccl.push_back(r); };
  s = RunTrainer(o);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(nccl.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_NEAR(nccl[i].loss(), plain[i].loss(), 1e-3) << "step " << i + 1;
    EXPECT_EQ(nccl[i].skipped_steps(), plain[i].skipped_steps());
  }
  ASSERT_EQ(nccl.back().fp8_size(), plain.back().fp8_size());
  ASSERT_GT(plain.back().fp8_size(), 0);
  for (int t = 0; t < plain.back().fp8_size(); ++t) {
    const double want = plain.back().fp8(t).scale();
    EXPECT_NEAR(nccl.back().fp8(t).scale(), want, 1e-3 * want) << "tensor " << t;
  }
  EXPECT_LT(plain.back().loss(), plain.front().loss());
}

// The data-parallel step recorded in CUDA graphs (training.cuda_graph: on; grad_accum_steps 1,
// or 2: the last micro-batch's graph holds the all-reduces): the bucket all-reduces and FP8's amax reduction are NCCL nodes of the graph, joined on
// the device, and every replay is waited for with the collective timeout. Over one rank the
// reductions are the identity, so the run is bit-identical to the replayed run without a
// communicator (deterministic), and every step from the third on is replayed.
TEST(DataParallelGpuTest, OneRankNcclStepReplaysFromAGraphBitIdentical) {
  absl::StatusOr<std::unique_ptr<kernels::Backend>> gpu = kernels::NewCudaBackend(0);
  if (!gpu.ok()) GTEST_SKIP() << "no usable CUDA device";
  const bool fp8_ok = (*gpu)->Fp8Supported().ok();
  gpu->reset();
  for (const auto& [precision, accum] : std::vector<std::pair<std::string, int>>{
           {"bf16", 1}, {"fp8", 1}, {"bf16", 2}, {"fp8", 2}}) {
    if (precision == "fp8" && !fp8_ok) continue;
    SCOPED_TRACE(absl::StrCat(precision, " grad_accum_steps ", accum));
    comm::TestRendezvousServer server;
    v1::JobSpec spec = Spec();
    spec.mutable_training()->set_grad_accum_steps(accum);
    spec.mutable_training()->set_steps(12);
    spec.mutable_training()->set_cuda_graph("on");
    if (precision == "fp8") SetFp8(&spec);
    std::vector<v1::StepReport> plain, nccl;
    std::vector<std::string> info;
    TrainerOptions o;
    o.spec = spec;
    o.job_id = 1;
    o.on_step = [&plain](const v1::StepReport& r) { plain.push_back(r); };
    absl::Status s = RunTrainer(o);
    ASSERT_TRUE(s.ok()) << s;
    o.force_communicator = true;
    o.coordinator = server.address();
    o.security.insecure = true;
    o.on_step = [&nccl](const v1::StepReport& r) { nccl.push_back(r); };
    o.on_info = [&info](absl::string_view line) { info.emplace_back(line); };
    s = RunTrainer(o);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_THAT(info, ::testing::Contains(::testing::HasSubstr("over nccl")));
    EXPECT_THAT(info, ::testing::Contains(::testing::HasSubstr("captured the training step")));
    ASSERT_EQ(nccl.size(), plain.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(nccl[i].cuda_graph(), i >= 2) << "step " << i + 1;
      EXPECT_EQ(nccl[i].loss(), plain[i].loss()) << "step " << i + 1;
      EXPECT_EQ(nccl[i].grad_norm(), plain[i].grad_norm()) << "step " << i + 1;
    }
    EXPECT_NE(nccl.back().param_checksum(), 0u);
    if (precision == "fp8") {
      ASSERT_EQ(nccl.back().fp8_size(), plain.back().fp8_size());
      for (int t = 0; t < plain.back().fp8_size(); ++t) {
        EXPECT_EQ(nccl.back().fp8(t).scale(), plain.back().fp8(t).scale()) << "tensor " << t;
      }
    }
  }
}

}  // namespace
}  // namespace boulder::engine
