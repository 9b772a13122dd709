// The trainer on token files written by boulder-tokens' library: validation loss, bad shards
// before training, init_from and weights_out (issue 10).
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/safetensors.h"
#include "worker/engine/token_files.h"
#include "worker/engine/tokens_tool.h"
#include "worker/engine/trainer.h"

namespace boulder::engine {
namespace {

using ::testing::HasSubstr;

class TrainerFeaturesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/trainer_features_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // Text with structure a small model learns quickly: counting words.
    std::string text;
    for (int i = 0; text.size() < 40000; ++i) absl::StrAppend(&text, "item ", i % 97, "; ");
    std::ofstream(absl::StrCat(dir_, "/corpus.txt")) << text;
    auto written = WriteShards();
    ASSERT_TRUE(written.ok()) << written.status();
    ASSERT_EQ(written->train_files.size(), 3u);
  }

  // corpus_val_000000.bin (4000 tokens), corpus_train_00000{0,1,2}.bin (15000, 15000, rest).
  absl::StatusOr<TokensToolResult> WriteShards() const {
    TokensToolOptions t;
    t.text_path = absl::StrCat(dir_, "/corpus.txt");
    t.prefix = absl::StrCat(dir_, "/corpus");
    t.shard_tokens = 15000;
    t.val_tokens = 4000;
    return RunTokensTool(t);
  }
  void TearDown() override { std::system(absl::StrCat("rm -rf '", dir_, "'").c_str()); }

  v1::JobSpec Spec() const {
    v1::JobSpec s;
    v1::ModelSpec* m = s.mutable_model();
    m->set_vocab_size(256);
    m->set_hidden(32);
    m->set_heads(4);
    m->set_layers(2);
    m->set_ffn(128);
    m->set_context(32);
    m->set_tie_embeddings(true);
    m->set_init_from("");
    s.mutable_data()->set_source("token_files");
    s.mutable_data()->set_token_files(absl::StrCat(dir_, "/corpus_train_*.bin"));
    v1::TrainingSpec* t = s.mutable_training();
    t->set_steps(40);
    t->set_batch_size(8);
    t->set_seq_len(32);
    t->set_lr(1e-2);
    t->set_beta1(0.9);
    t->set_beta2(0.95);
    t->set_eps(1e-8);
    t->set_schedule("constant");
    t->set_grad_accum_steps(1);
    t->set_grad_clip(1.0);
    t->set_seed(3);
    t->set_log_every_steps(10);
    t->set_activation_checkpointing("none");
    s.set_precision("fp32");
    s.mutable_resources()->set_backend("cpu");
    s.mutable_generation()->set_prompt_len(4);
    s.mutable_generation()->set_tokens(0);
    s.mutable_eval()->set_token_files(absl::StrCat(dir_, "/corpus_val_*.bin"));
    s.mutable_eval()->set_every_steps(20);
    s.mutable_eval()->set_batches(4);
    return s;
  }

  TrainerOptions Options(const v1::JobSpec& spec, std::vector<v1::StepReport>* steps) {
    TrainerOptions o;
    o.spec = spec;
    o.threads = 1;
    o.on_step = [steps](const v1::StepReport& r) { steps->push_back(r); };
    return o;
  }

  std::string dir_;
};

TEST_F(TrainerFeaturesTest, TrainsFromTokenFilesAndReportsValidationLoss) {
  std::vector<v1::StepReport> steps;
  const absl::Status s = RunTrainer(Options(Spec(), &steps));
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(steps.size(), 4u);  // steps 10, 20, 30, 40
  EXPECT_FALSE(steps[0].has_val_loss());
  ASSERT_TRUE(steps[1].has_val_loss());
  EXPECT_FALSE(steps[2].has_val_loss());
  ASSERT_TRUE(steps[3].has_val_loss());
  // Untrained: ln(256) = 5.55. The counting text is learnt fast.
  EXPECT_LT(steps[3].val_loss(), 3.5);
  EXPECT_LT(steps[3].val_loss(), steps[1].val_loss());
  EXPECT_LT(steps[3].loss(), 3.5);
}

TEST_F(TrainerFeaturesTest, BadShardsFailBeforeTraining) {
  const std::string bad = absl::StrCat(dir_, "/corpus_train_000001.bin");
  struct Case {
    std::string shell;
    std::string message;
  };
  const std::vector<Case> cases = {
      {absl::StrCat("truncate -s -1 '", bad, "'"), "bytes, but the header's token count 15000"},
      {absl::StrCat("printf 'XXXX' | dd of='", bad, "' conv=notrunc status=none"),
       ": offset 0: magic 1482184792 is not 20240520"},
  };
  for (const Case& c : cases) {
    ASSERT_TRUE(WriteShards().ok());
    ASSERT_EQ(std::system(c.shell.c_str()), 0);
    std::vector<v1::StepReport> steps;
    const absl::Status s = RunTrainer(Options(Spec(), &steps));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("data.token_files: ", bad)));
    EXPECT_THAT(s.message(), HasSubstr(c.message));
    EXPECT_TRUE(steps.empty());
  }
  // A token beyond a smaller vocabulary, in the eval files.
  ASSERT_TRUE(WriteShards().ok());
  v1::JobSpec spec = Spec();
  spec.mutable_data()->set_token_files(absl::StrCat(dir_, "/corpus_val_*.bin"));
  spec.mutable_model()->set_vocab_size(100);  // ';' (59) fits, 'i' (105) does not
  std::vector<v1::StepReport> steps;
  const absl::Status s = RunTrainer(Options(spec, &steps));
  EXPECT_THAT(s.message(), HasSubstr("corpus_val_000000.bin: token 105 at token index 0 (byte "
                                     "offset 1024) is not below model.vocab_size 100"));
}

TEST_F(TrainerFeaturesTest, WeightsOutThenInitFromContinuesFromTheTrainedModel) {
  v1::JobSpec spec = Spec();
  spec.mutable_training()->set_steps(20);
  std::vector<v1::StepReport> first;
  TrainerOptions o = Options(spec, &first);
  o.weights_out = absl::StrCat(dir_, "/w.safetensors");
  ASSERT_TRUE(RunTrainer(o).ok());
  ASSERT_TRUE(first.back().has_val_loss());

  // lr tiny: the first evaluation of the loaded model is (almost) the trained model's.
  spec.mutable_model()->set_init_from(o.weights_out);
  spec.mutable_training()->set_lr(1e-9);
  spec.mutable_training()->set_steps(1);
  std::vector<v1::StepReport> second;
  ASSERT_TRUE(RunTrainer(Options(spec, &second)).ok());
  ASSERT_EQ(second.size(), 1u);
  EXPECT_NEAR(second[0].val_loss(), first.back().val_loss(), 1e-4);

  spec.mutable_model()->set_layers(3);
  const absl::Status s = RunTrainer(Options(spec, &second));
  EXPECT_THAT(s.message(), HasSubstr("model.init_from: "));
  EXPECT_THAT(s.message(), HasSubstr("missing tensors h.2.ln_1.weight"));
}

}  // namespace
}  // namespace boulder::engine
