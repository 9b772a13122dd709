#include "common/spec.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace boulder::common {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// INVALID_ARGUMENT whose message matches `matcher` (a string means the exact message).
MATCHER_P(IsInvalid, matcher, "") {
  const absl::Status& status = arg;
  if (status.code() != absl::StatusCode::kInvalidArgument) {
    *result_listener << "status is " << status;
    return false;
  }
  return ::testing::ExplainMatchResult(matcher, std::string(status.message()), result_listener);
}

std::string ReadExample(const std::string& name) {
  std::ifstream in(std::string(BOULDER_EXAMPLES_DIR) + "/" + name);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status ParseStatus(absl::string_view yaml) { return ParseJobSpecYaml(yaml).status(); }
absl::Status LoadStatus(absl::string_view yaml) { return LoadJobSpec(yaml, {}).status(); }

v1::JobSpec MustLoad(absl::string_view yaml, const std::vector<std::string>& overrides = {}) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpec(yaml, overrides);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::JobSpec();
}

// Every singular field of `message` and of its sections is set.
void ExpectAllSet(const Message& message, const std::string& path) {
  const Descriptor* descriptor = message.GetDescriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    const std::string field_path = absl::StrCat(path, field->name());
    if (field->is_repeated()) continue;  // lists have no presence; empty is their default
    EXPECT_TRUE(message.GetReflection()->HasField(message, field)) << field_path;
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      ExpectAllSet(message.GetReflection()->GetMessage(message, field), field_path + ".");
    }
  }
}

TEST(SpecDescriptorTest, OnlySingularScalarsWithPresenceAndSections) {
  // The parser and emitter handle exactly these field kinds; another repeated, map or enum field
  // in spec.proto needs its YAML form written in spec.cc first.
  std::vector<const Descriptor*> pending = {v1::JobSpec::descriptor()};
  while (!pending.empty()) {
    const Descriptor* descriptor = pending.back();
    pending.pop_back();
    for (int i = 0; i < descriptor->field_count(); ++i) {
      const FieldDescriptor* field = descriptor->field(i);
      EXPECT_NE(field->cpp_type(), FieldDescriptor::CPPTYPE_ENUM) << field->full_name();
      if (field->is_repeated()) {
        // Lists of integers (training.freeze_layers) are the one repeated kind supported.
        EXPECT_EQ(field->cpp_type(), FieldDescriptor::CPPTYPE_INT32) << field->full_name();
        continue;
      }
      EXPECT_TRUE(field->has_presence()) << field->full_name();
      if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        pending.push_back(field->message_type());
      }
    }
  }
}

TEST(SpecExamplesTest, MinigptIsTheGpuSeedJob) {
  const v1::JobSpec spec = MustLoad(ReadExample("minigpt.yaml"));
  EXPECT_EQ(spec.name(), "minigpt");
  EXPECT_EQ(spec.model().preset(), "minigpt");
  EXPECT_EQ(spec.model().hidden(), 768);
  EXPECT_EQ(spec.training().batch_size(), 32);
  EXPECT_EQ(spec.training().seq_len(), 256);
  EXPECT_EQ(spec.training().steps(), 200);
  EXPECT_EQ(spec.training().lr(), 3e-4);
  EXPECT_EQ(spec.precision(), "bf16");
  EXPECT_EQ(spec.resources().backend(), "auto");
  EXPECT_EQ(RequiredBackend(spec), "cuda");
  EXPECT_EQ(EffectivePrecision(spec, "cuda").value(), "bf16");
  ExpectAllSet(spec, "");
}

TEST(SpecExamplesTest, MinigptCpuIsTheSameModelSmaller) {
  const v1::JobSpec gpu = MustLoad(ReadExample("minigpt.yaml"));
  const v1::JobSpec cpu = MustLoad(ReadExample("minigpt-cpu.yaml"));
  EXPECT_TRUE(MessageDifferencer::Equals(cpu.model(), gpu.model()));
  EXPECT_EQ(cpu.training().batch_size(), 8);
  EXPECT_EQ(cpu.training().seq_len(), 64);
  EXPECT_EQ(cpu.training().steps(), 150);
  EXPECT_EQ(cpu.precision(), "fp32");
  EXPECT_EQ(cpu.resources().backend(), "cpu");
  EXPECT_EQ(cpu.generation().prompt_len(), 8);
  EXPECT_EQ(cpu.generation().tokens(), 16);
  EXPECT_EQ(RequiredBackend(cpu), "cpu");
  EXPECT_EQ(EffectivePrecision(cpu, "cpu").value(), "fp32");
}

TEST(SpecExamplesTest, MinigptFp8IsTheSeedJobInFp8) {
  const v1::JobSpec gpu = MustLoad(ReadExample("minigpt.yaml"));
  const v1::JobSpec fp8 = MustLoad(ReadExample("minigpt-fp8.yaml"));
  EXPECT_TRUE(MessageDifferencer::Equals(fp8.model(), gpu.model()));
  EXPECT_TRUE(MessageDifferencer::Equals(fp8.training(), gpu.training()));
  EXPECT_EQ(fp8.precision(), "fp8");
  EXPECT_EQ(fp8.fp8().format(), "hybrid");
  EXPECT_FALSE(fp8.fp8().emulate());
  EXPECT_EQ(RequiredBackend(fp8), "cuda");
  const v1::JobSpec emulated = MustLoad(ReadExample("minigpt-fp8.yaml"), {"fp8.emulate=true"});
  EXPECT_EQ(RequiredBackend(emulated), "cpu");
  ExpectAllSet(fp8, "");
}

TEST(SpecExamplesTest, Fp8WithSeveralWorkersOrActivationCheckpointingIsAccepted) {
  // The ranks all-reduce their amaxes and agree on skipped steps (worker/engine/data_parallel.h).
  const v1::JobSpec gpu = MustLoad(ReadExample("minigpt-fp8.yaml"), {"resources.workers=4"});
  EXPECT_EQ(gpu.resources().workers(), 4);
  EXPECT_EQ(RequiredBackend(gpu), "cuda");
  const v1::JobSpec cpu =
      MustLoad(ReadExample("minigpt-fp8.yaml"), {"resources.workers=2", "fp8.emulate=true"});
  EXPECT_EQ(cpu.resources().workers(), 2);
  EXPECT_EQ(RequiredBackend(cpu), "cpu");
  // And with activation checkpointing (the recomputed FP8 Linears reuse the step's scales).
  const v1::JobSpec recompute =
      MustLoad(ReadExample("minigpt-fp8.yaml"), {"training.activation_checkpointing=mlp"});
  EXPECT_EQ(recompute.training().activation_checkpointing(), "mlp");
}

TEST(SpecDefaultsTest, EmptySpecResolvesToTheSeedJob) {
  const v1::JobSpec spec = MustLoad("{}");
  ExpectAllSet(spec, "");
  EXPECT_EQ(spec.name(), "minigpt");
  const v1::ModelSpec& m = spec.model();
  EXPECT_EQ(m.preset(), "minigpt");
  EXPECT_EQ(m.vocab_size(), 96);
  EXPECT_EQ(m.hidden(), 768);
  EXPECT_EQ(m.heads(), 12);
  EXPECT_EQ(m.layers(), 4);
  EXPECT_EQ(m.ffn(), 3072);
  EXPECT_EQ(m.context(), 256);
  EXPECT_FALSE(m.tie_embeddings());
  EXPECT_EQ(spec.data().source(), "arithmetic");
  EXPECT_EQ(spec.data().max_stride(), 6);
  const v1::TrainingSpec& t = spec.training();
  EXPECT_EQ(t.steps(), 200);
  EXPECT_EQ(t.batch_size(), 32);
  EXPECT_EQ(t.seq_len(), 256);
  EXPECT_EQ(t.lr(), 3e-4);
  EXPECT_EQ(t.beta1(), 0.9);
  EXPECT_EQ(t.beta2(), 0.95);
  EXPECT_EQ(t.eps(), 1e-8);
  EXPECT_EQ(t.weight_decay(), 0.0);
  EXPECT_EQ(t.warmup_steps(), 0);
  EXPECT_EQ(t.schedule(), "constant");
  EXPECT_EQ(t.min_lr_ratio(), 0.0);
  EXPECT_EQ(t.grad_accum_steps(), 1);
  EXPECT_EQ(t.grad_clip(), 1.0);
  EXPECT_EQ(t.seed(), 1337u);
  EXPECT_FALSE(t.deterministic());
  EXPECT_EQ(t.log_every_steps(), 1);
  EXPECT_EQ(spec.precision(), "auto");
  EXPECT_EQ(spec.resources().workers(), 1);
  EXPECT_EQ(spec.resources().backend(), "auto");
  EXPECT_EQ(spec.resources().collective_timeout_seconds(), 60.0);
  EXPECT_EQ(spec.resources().checksum_every_steps(), 10);
  EXPECT_EQ(spec.generation().prompt_len(), 8);
  EXPECT_EQ(spec.generation().tokens(), 16);
  const v1::Fp8Spec& f = spec.fp8();
  EXPECT_EQ(f.format(), "hybrid");
  EXPECT_EQ(f.amax_history_len(), 16);
  EXPECT_EQ(f.amax_compute_algo(), "max");
  EXPECT_EQ(f.margin(), 0);
  EXPECT_FALSE(f.emulate());
  EXPECT_EQ(f.max_consecutive_skips(), 10);
  EXPECT_EQ(RequiredBackend(spec), "");
  EXPECT_EQ(EffectivePrecision(spec, "cpu").value(), "fp32");
  EXPECT_EQ(EffectivePrecision(spec, "cuda").value(), "bf16");
}

TEST(SpecDefaultsTest, Gpt2PresetAndExplicitFieldsOverrideIt) {
  const v1::JobSpec spec = MustLoad("model:\n  preset: gpt2\n  layers: 2\n");
  EXPECT_EQ(spec.name(), "gpt2");
  EXPECT_EQ(spec.model().vocab_size(), 50257);
  EXPECT_EQ(spec.model().hidden(), 768);
  EXPECT_EQ(spec.model().heads(), 12);
  EXPECT_EQ(spec.model().layers(), 2);
  EXPECT_EQ(spec.model().ffn(), 3072);
  EXPECT_EQ(spec.model().context(), 1024);
  EXPECT_TRUE(spec.model().tie_embeddings());
  EXPECT_EQ(spec.training().seq_len(), 1024);
}

TEST(SpecDefaultsTest, ResolveKeepsWrittenValuesAndDoesNotModifyItsInput) {
  v1::JobSpec input;
  input.set_name("mine");
  input.mutable_training()->set_steps(7);
  const v1::JobSpec before = input;
  absl::StatusOr<v1::JobSpec> spec = ResolveJobSpec(input);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "mine");
  EXPECT_EQ(spec->training().steps(), 7);
  EXPECT_TRUE(MessageDifferencer::Equals(input, before));
  const absl::StatusOr<v1::JobSpec> again = ResolveJobSpec(*spec);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*again, *spec));
}

TEST(SpecParseTest, UnknownFieldSuggestsTheClosestName) {
  EXPECT_THAT(ParseStatus("training:\n  stepz: 10\n"),
              IsInvalid("training.stepz: unknown field (did you mean 'steps'?)"));
  EXPECT_THAT(ParseStatus("model:\n  Hiden: 10\n"),
              IsInvalid("model.Hiden: unknown field (did you mean 'hidden'?)"));
  EXPECT_THAT(ParseStatus("lr: 0.1\n"),
              IsInvalid("lr: unknown field (did you mean 'training.lr'?)"));
  EXPECT_THAT(ParseStatus("resources:\n  gpus: 1\n"),
              IsInvalid("resources.gpus: unknown field (valid fields: workers, backend, "
                        "collective_timeout_seconds, checksum_every_steps)"));
}

TEST(SpecParseTest, WrongTypesNameTheFieldAndTheValue) {
  EXPECT_THAT(ParseStatus("training:\n  steps: ten\n"),
              IsInvalid("training.steps: expected an integer, got 'ten'"));
  EXPECT_THAT(ParseStatus("training:\n  steps: 10.5\n"),
              IsInvalid("training.steps: expected an integer, got '10.5'"));
  EXPECT_THAT(ParseStatus("training:\n  steps:\n"),
              IsInvalid("training.steps: expected an integer, got an empty value"));
  EXPECT_THAT(ParseStatus("training:\n  steps: {a: 1}\n"),
              IsInvalid("training.steps: expected an integer, got a mapping"));
  EXPECT_THAT(ParseStatus("training:\n  lr: fast\n"),
              IsInvalid("training.lr: expected a number, got 'fast'"));
  EXPECT_THAT(ParseStatus("training:\n  deterministic: yes\n"),
              IsInvalid("training.deterministic: expected true or false, got 'yes'"));
  EXPECT_THAT(ParseStatus("training:\n  seed: -1\n"),
              IsInvalid("training.seed: expected a non-negative integer, got '-1'"));
  EXPECT_THAT(ParseStatus("name: [a, b]\n"), IsInvalid("name: expected a string, got a sequence"));
  EXPECT_THAT(ParseStatus("model: gpt2\n"),
              IsInvalid("model: expected a mapping of fields, got 'gpt2'"));
  EXPECT_THAT(ParseStatus("training:\n  - steps: 1\n"),
              IsInvalid("training: expected a mapping of fields, got a sequence"));
}

TEST(SpecParseTest, NumbersOutOfRangeOrNotFinite) {
  EXPECT_THAT(ParseStatus("training:\n  steps: 3000000000\n"),
              IsInvalid("training.steps: 3000000000 is out of range for a 32-bit integer "
                        "[-2147483648, 2147483647]"));
  EXPECT_THAT(ParseStatus("training:\n  seed: 18446744073709551616\n"),
              IsInvalid("training.seed: 18446744073709551616 is out of range (at most "
                        "18446744073709551615)"));
  EXPECT_THAT(ParseStatus("training:\n  lr: 1e999\n"),
              IsInvalid("training.lr: 1e999 is out of range"));
  EXPECT_THAT(ParseStatus("training:\n  lr: .nan\n"),
              IsInvalid("training.lr: must be a finite number, got '.nan'"));
  EXPECT_THAT(ParseStatus("training:\n  beta1: -.inf\n"),
              IsInvalid("training.beta1: must be a finite number, got '-.inf'"));
  EXPECT_THAT(ParseStatus("training:\n  eps: Infinity\n"),
              IsInvalid("training.eps: must be a finite number, got 'Infinity'"));
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpecYaml("training:\n  seed: 18446744073709551615\n  steps: -2147483648\n  lr: 1\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->training().seed(), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(spec->training().steps(), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(spec->training().lr(), 1.0);
}

TEST(SpecParseTest, ScalarFormsAccepted) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(
      "name: 123\nmodel:\ntraining:\n  steps: \"10\"\n  lr: 3e-4\n  beta2: 0.999\n"
      "  deterministic: True\n  batchSize: 4\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "123");
  EXPECT_TRUE(spec->has_model());
  EXPECT_FALSE(spec->model().has_preset());
  EXPECT_EQ(spec->training().steps(), 10);
  EXPECT_EQ(spec->training().lr(), 3e-4);
  EXPECT_EQ(spec->training().beta2(), 0.999);
  EXPECT_TRUE(spec->training().deterministic());
  EXPECT_EQ(spec->training().batch_size(), 4);
  EXPECT_FALSE(spec->has_data());
  EXPECT_FALSE(spec->training().has_seq_len());
}

TEST(SpecParseTest, HugeKeysAndValuesAreCutInMessages) {
  const std::string long_text(100000, 'x');
  // YAML caps implicit keys at 1024 characters; an explicit key ("? ") may be longer.
  const absl::Status key = ParseStatus(absl::StrCat("training:\n  ? ", long_text, "\n  : 1\n"));
  EXPECT_THAT(key, IsInvalid(absl::StrCat("training.", std::string(77, 'x'),
                                          "...: unknown field (valid fields: steps, batch_size, "
                                          "seq_len, lr, beta1, beta2, eps, weight_decay, "
                                          "warmup_steps, schedule, min_lr_ratio, "
                                          "grad_accum_steps, grad_clip, seed, deterministic, "
                                          "log_every_steps, freeze_layers, freeze_embeddings, "
                                          "activation_checkpointing, cuda_graph)")));
  EXPECT_THAT(ParseStatus(absl::StrCat("training:\n  steps: ", long_text, "\n")),
              IsInvalid(absl::StrCat("training.steps: expected an integer, got '",
                                     std::string(77, 'x'), "...'")));
  v1::JobSpec spec;
  EXPECT_THAT(ApplyOverride(&spec, long_text),
              IsInvalid(absl::StrCat("override '", std::string(77, 'x'),
                                     "...': expected PATH=VALUE, e.g. training.steps=50")));
}

TEST(SpecParseTest, DuplicateKeys) {
  EXPECT_THAT(ParseStatus("training:\n  steps: 1\n  steps: 2\n"),
              IsInvalid("training.steps: duplicate key"));
  EXPECT_THAT(ParseStatus("training:\n  batch_size: 1\n  batchSize: 2\n"),
              IsInvalid("training.batch_size: duplicate key"));
  EXPECT_THAT(ParseStatus("model: {}\nmodel: {}\n"), IsInvalid("model: duplicate key"));
}

// yaml-cpp 0.7 loops forever (allocating) on a ',' outside a flow collection; found by the
// fuzz target (common/fuzz). These must fail fast instead.
TEST(SpecParseTest, StrayCommaIsASyntaxErrorNotAHang) {
  EXPECT_THAT(ParseStatus(","), IsInvalid("spec: YAML syntax error at line 1, column 1: "
                                          "unexpected ','"));
  EXPECT_THAT(ParseStatus("# The seed job\n,FFN 307,2\n"),
              IsInvalid("spec: YAML syntax error at line 2, column 1: unexpected ','"));
  EXPECT_THAT(ParseStatus("model:\n  - a\n,"), IsInvalid(StartsWith("spec: YAML syntax error")));
  EXPECT_THAT(ParseStatus("name: a\n---\n,"), IsInvalid(StartsWith("spec: YAML syntax error")));
  EXPECT_THAT(ParseStatus("&a ,"), IsInvalid(StartsWith("spec: YAML syntax error")));
  v1::JobSpec spec;
  EXPECT_EQ(ApplyOverride(&spec, "model=,").code(), absl::StatusCode::kInvalidArgument);
  std::string many;
  for (int i = 0; i < 150; ++i) many += "---\nname: a\n";
  EXPECT_THAT(ParseStatus(many), IsInvalid("spec: more than 100 YAML documents; expected one"));
}

TEST(SpecParseTest, DocumentLevelErrors) {
  EXPECT_THAT(ParseStatus(""), IsInvalid(StartsWith("spec: empty document")));
  EXPECT_THAT(ParseStatus("# only a comment\n"), IsInvalid(StartsWith("spec: empty document")));
  EXPECT_THAT(ParseStatus("- a\n- b\n"),
              IsInvalid("spec: expected a mapping of fields, got a sequence"));
  EXPECT_THAT(ParseStatus("hello\n"), IsInvalid("spec: expected a mapping of fields, got 'hello'"));
  EXPECT_THAT(ParseStatus("name: a\n---\nname: b\n"),
              IsInvalid("spec: 2 YAML documents; expected one"));
  EXPECT_THAT(ParseStatus("? [a, b]\n: 1\n"),
              IsInvalid("spec: keys must be field names, got a sequence"));
  EXPECT_THAT(ParseStatus("training:\n  steps: [1,\n"),
              IsInvalid(StartsWith("spec: YAML syntax error at line 3, column 1: ")));
  EXPECT_THAT(ParseStatus("model: {preset: gpt2\n"),
              IsInvalid(StartsWith("spec: YAML syntax error at line ")));

  std::string big = "name: x\n";
  big.append(kMaxSpecBytes - big.size() + 1, '#');
  EXPECT_THAT(ParseStatus(big),
              IsInvalid(absl::StrCat("spec: document is ", kMaxSpecBytes + 1,
                                     " bytes, more than the ", kMaxSpecBytes, "-byte limit")));
}

TEST(SpecParseTest, JsonInput) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(
      R"({"name": "json-job", "model": {"preset": "gpt2", "layers": 2},
          "training": {"steps": 10, "lr": 3e-4, "deterministic": true, "seed": "42"},
          "precision": "fp32", "resources": {"backend": "cpu"}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "json-job");
  EXPECT_EQ(spec->model().preset(), "gpt2");
  EXPECT_EQ(spec->model().layers(), 2);
  EXPECT_EQ(spec->training().steps(), 10);
  EXPECT_EQ(spec->training().lr(), 3e-4);
  EXPECT_TRUE(spec->training().deterministic());
  EXPECT_EQ(spec->training().seed(), 42u);
  EXPECT_TRUE(ResolveJobSpec(*spec).ok());
  EXPECT_THAT(ParseStatus(R"({"training": {"steps": "ten"}})"),
              IsInvalid("training.steps: expected an integer, got 'ten'"));
}

TEST(SpecOverrideTest, SetsFieldsAndMergesSections) {
  const v1::JobSpec spec =
      MustLoad(ReadExample("minigpt-cpu.yaml"),
               {"training.steps=50", "training.lr=1e-3", "training.deterministic=true",
                "name=short run", "model={preset: gpt2, layers: 2}", "training.steps=60"});
  EXPECT_EQ(spec.training().steps(), 60);
  EXPECT_EQ(spec.training().lr(), 1e-3);
  EXPECT_TRUE(spec.training().deterministic());
  EXPECT_EQ(spec.name(), "short run");
  EXPECT_EQ(spec.model().preset(), "gpt2");
  EXPECT_EQ(spec.model().layers(), 2);
  EXPECT_EQ(spec.model().vocab_size(), 50257);
  EXPECT_EQ(spec.training().batch_size(), 8);
}

TEST(SpecOverrideTest, BadOverridesNameThePathAndLeaveTheSpecAlone) {
  v1::JobSpec spec;
  spec.mutable_training()->set_steps(10);
  const v1::JobSpec before = spec;
  EXPECT_THAT(ApplyOverride(&spec, "training.steps"),
              IsInvalid("override 'training.steps': expected PATH=VALUE, e.g. training.steps=50"));
  EXPECT_THAT(ApplyOverride(&spec, "=5"), IsInvalid(HasSubstr("empty field path")));
  EXPECT_THAT(ApplyOverride(&spec, "training.stepz=5"),
              IsInvalid("training.stepz: unknown field (did you mean 'steps'?)"));
  EXPECT_THAT(ApplyOverride(&spec, "modle.layers=5"),
              IsInvalid("modle: unknown field (did you mean 'model'?)"));
  EXPECT_THAT(ApplyOverride(&spec, "model.layers.x=5"),
              IsInvalid("model.layers.x: model.layers is a value, not a section with fields"));
  EXPECT_THAT(ApplyOverride(&spec, "training..steps=5"),
              IsInvalid("training..steps: empty name in field path"));
  EXPECT_THAT(ApplyOverride(&spec, "model.layers=ten"),
              IsInvalid("model.layers: expected an integer, got 'ten'"));
  EXPECT_THAT(ApplyOverride(&spec, "model.layers=[1"),
              IsInvalid(StartsWith("model.layers: YAML syntax error in the value at line 1")));
  EXPECT_THAT(ApplyOverride(&spec, "model={layers: 2, heds: 3}"),
              IsInvalid("model.heds: unknown field (did you mean 'heads'?)"));
  EXPECT_TRUE(MessageDifferencer::Equals(spec, before)) << spec.DebugString();
  EXPECT_FALSE(spec.has_model());
  EXPECT_THAT(LoadJobSpec("{}", {"training.steps=0"}).status(),
              IsInvalid("training.steps: must be at least 1, got 0"));
}

struct ResolveCase {
  const char* yaml;
  const char* message;
};

class SpecResolveErrorTest : public ::testing::TestWithParam<ResolveCase> {};

TEST_P(SpecResolveErrorTest, RejectsWithFieldPath) {
  EXPECT_THAT(LoadStatus(GetParam().yaml), IsInvalid(GetParam().message)) << GetParam().yaml;
}

INSTANTIATE_TEST_SUITE_P(
    Model, SpecResolveErrorTest,
    ::testing::Values(
        ResolveCase{"model: {preset: gpt3}",
                    "model.preset: unknown preset 'gpt3' (one of minigpt, gpt2)"},
        ResolveCase{"model: {vocab_size: 1}", "model.vocab_size: must be at least 2, got 1"},
        ResolveCase{"model: {vocab_size: 2000000}",
                    "model.vocab_size: must be at most 1048576, got 2000000"},
        ResolveCase{"model: {hidden: 0}", "model.hidden: must be at least 1, got 0"},
        ResolveCase{"model: {hidden: 70000}", "model.hidden: must be at most 65536, got 70000"},
        ResolveCase{"model: {heads: 7}", "model.heads: 7 does not divide hidden 768"},
        ResolveCase{"model: {heads: 0}", "model.heads: must be at least 1, got 0"},
        ResolveCase{"model: {layers: 0}", "model.layers: must be at least 1, got 0"},
        ResolveCase{"model: {layers: 2000}", "model.layers: must be at most 1024, got 2000"},
        ResolveCase{"model: {ffn: 0}", "model.ffn: must be at least 1, got 0"},
        ResolveCase{"model: {ffn: 300000}", "model.ffn: must be at most 262144, got 300000"},
        ResolveCase{"model: {context: 0}", "model.context: must be at least 1, got 0"},
        ResolveCase{"model: {context: 200000}",
                    "model.context: must be at most 131072, got 200000"},
        ResolveCase{"model: {hidden: 16384, heads: 1, layers: 256}",
                    "model: 3.0e11 parameters need 4.8 TB of parameter and optimizer state "
                    "(at most 1 TiB)"},
        ResolveCase{"model: {hidden: 65536, heads: 1, layers: 1024}",
                    "model: 1.8e13 parameters need 288 TB of parameter and optimizer state "
                    "(at most 1 TiB)"}));

INSTANTIATE_TEST_SUITE_P(
    DataAndTraining, SpecResolveErrorTest,
    ::testing::Values(
        ResolveCase{"data: {source: tokens}",
                    "data.source: unknown source 'tokens' (one of arithmetic, token_files)"},
        ResolveCase{"data: {source: token_files}",
                    "data.token_files: must name .bin shards (a glob) when data.source is "
                    "token_files"},
        ResolveCase{"data: {token_files: 'a/*.bin'}",
                    "data.token_files: is set but data.source is 'arithmetic' (set data.source: "
                    "token_files)"},
        ResolveCase{"eval: {every_steps: 0}", "eval.every_steps: must be at least 1, got 0"},
        ResolveCase{"eval: {batches: 0}", "eval.batches: must be at least 1, got 0"},
        ResolveCase{"training: {freeze_layers: [0, 4]}",
                    "training.freeze_layers[1]: layer 4 is not in [0, model.layers 4)"},
        ResolveCase{"training: {freeze_layers: [1, 1]}",
                    "training.freeze_layers[1]: layer 1 is listed twice"},
        ResolveCase{"training: {freeze_layers: 1}",
                    "training.freeze_layers: expected a list of integers, got '1'"},
        ResolveCase{"training: {freeze_layers: [a]}",
                    "training.freeze_layers[0]: expected a 32-bit integer, got 'a'"},
        ResolveCase{"training: {activation_checkpointing: some}",
                    "training.activation_checkpointing: unknown activation_checkpointing mode "
                    "'some' (one of none, gelu, mlp, full)"},
        ResolveCase{"data: {max_stride: 0}", "data.max_stride: must be at least 1, got 0"},
        ResolveCase{"data: {max_stride: 96}", "data.max_stride: must be at most 95, got 96"},
        ResolveCase{"training: {steps: 0}", "training.steps: must be at least 1, got 0"},
        ResolveCase{"training: {steps: 2000000000}",
                    "training.steps: must be at most 1000000000, got 2000000000"},
        ResolveCase{"training: {batch_size: 0}", "training.batch_size: must be at least 1, got 0"},
        ResolveCase{"training: {batch_size: 70000}",
                    "training.batch_size: must be at most 65536, got 70000"},
        ResolveCase{"training: {seq_len: 512}",
                    "training.seq_len: 512 is longer than model.context 256"},
        ResolveCase{"training: {seq_len: 0}", "training.seq_len: must be at least 1, got 0"},
        ResolveCase{"training: {lr: 0}", "training.lr: must be greater than 0, got 0"},
        ResolveCase{"training: {lr: -0.5}", "training.lr: must be greater than 0, got -0.5"},
        ResolveCase{"training: {beta1: 1}", "training.beta1: must be in [0, 1), got 1"},
        ResolveCase{"training: {beta2: -0.1}", "training.beta2: must be in [0, 1), got -0.1"},
        ResolveCase{"training: {eps: 0}", "training.eps: must be greater than 0, got 0"},
        ResolveCase{"training: {weight_decay: -0.1}",
                    "training.weight_decay: must be at least 0, got -0.1"},
        ResolveCase{"training: {warmup_steps: 300}",
                    "training.warmup_steps: 300 is more than training.steps 200"},
        ResolveCase{"training: {warmup_steps: -1}",
                    "training.warmup_steps: must be at least 0, got -1"},
        ResolveCase{"training: {schedule: step}",
                    "training.schedule: unknown schedule 'step' (one of constant, cosine, "
                    "linear)"},
        ResolveCase{"training: {min_lr_ratio: 1.5}",
                    "training.min_lr_ratio: must be in [0, 1], got 1.5"},
        ResolveCase{"training: {grad_accum_steps: 0}",
                    "training.grad_accum_steps: must be at least 1, got 0"},
        ResolveCase{"training: {grad_accum_steps: 5000}",
                    "training.grad_accum_steps: must be at most 4096, got 5000"},
        ResolveCase{"training: {grad_clip: -1}", "training.grad_clip: must be at least 0, got -1"},
        ResolveCase{"training: {log_every_steps: 0}",
                    "training.log_every_steps: must be at least 1, got 0"}));

INSTANTIATE_TEST_SUITE_P(
    PrecisionResourcesGeneration, SpecResolveErrorTest,
    ::testing::Values(
        ResolveCase{"precision: fp16",
                    "precision: unknown precision 'fp16' (one of auto, fp32, bf16, fp8)"},
        ResolveCase{"precision: fp8\nresources: {backend: cpu}",
                    "precision: fp8 on resources.backend cpu needs fp8.emulate: true (real FP8 "
                    "needs a GPU of compute capability 8.9 or higher)"},
        ResolveCase{"precision: fp8\nfp8: {emulate: true}\nresources: {backend: cuda}",
                    "fp8.emulate: true trains on the cpu backend (FP8 rounding emulated), but "
                    "resources.backend is cuda (set fp8.emulate: false for FP8 on the GPU)"},
        ResolveCase{"precision: fp8\nmodel: {hidden: 120, heads: 12}",
                    "model.hidden: 120 is not a multiple of 16 (needed by FP8 GEMMs)"},
        ResolveCase{"precision: fp8\nmodel: {ffn: 1000}",
                    "model.ffn: 1000 is not a multiple of 16 (needed by FP8 GEMMs)"},
        ResolveCase{"precision: fp8\ntraining: {batch_size: 3, seq_len: 5}",
                    "training.batch_size: batch_size x seq_len = 15 is not a multiple of 16 "
                    "(needed by FP8 GEMMs)"},
        ResolveCase{"fp8: {format: e5m2}",
                    "fp8.format: unknown fp8 format 'e5m2' (one of hybrid, e4m3)"},
        ResolveCase{"fp8: {amax_history_len: 0}",
                    "fp8.amax_history_len: must be at least 1, got 0"},
        ResolveCase{"fp8: {amax_history_len: 2000}",
                    "fp8.amax_history_len: must be at most 1024, got 2000"},
        ResolveCase{"fp8: {amax_compute_algo: mean}",
                    "fp8.amax_compute_algo: unknown amax algorithm 'mean' (one of max, "
                    "most_recent)"},
        ResolveCase{"fp8: {margin: -1}", "fp8.margin: must be at least 0, got -1"},
        ResolveCase{"fp8: {margin: 33}", "fp8.margin: must be at most 32, got 33"},
        ResolveCase{"fp8: {max_consecutive_skips: 0}",
                    "fp8.max_consecutive_skips: must be at least 1, got 0"},
        ResolveCase{"precision: bf16\nresources: {backend: cpu}",
                    "precision: bf16 needs resources.backend cuda (the cpu backend trains in "
                    "fp32)"},
        ResolveCase{"resources: {workers: 2000}",
                    "resources.workers: must be at most 1024, got 2000"},
        ResolveCase{"resources: {collective_timeout_seconds: 0}",
                    "resources.collective_timeout_seconds: must be in (0, 3600], got 0"},
        ResolveCase{"resources: {checksum_every_steps: -1}",
                    "resources.checksum_every_steps: must be at least 0, got -1"},
        ResolveCase{"resources: {workers: 0}", "resources.workers: must be at least 1, got 0"},
        ResolveCase{"resources: {backend: tpu}",
                    "resources.backend: unknown backend 'tpu' (one of auto, cpu, cuda)"},
        ResolveCase{"generation: {prompt_len: 0}",
                    "generation.prompt_len: must be at least 1, got 0"},
        ResolveCase{"generation: {tokens: -1}", "generation.tokens: must be at least 0, got -1"},
        ResolveCase{"generation: {prompt_len: 200, tokens: 100}",
                    "generation.tokens: prompt_len 200 + tokens 100 is longer than "
                    "model.context 256"},
        ResolveCase{"name: \"tab\\there\"", "name: must not contain control characters"},
        ResolveCase{"model: {init_from: ../../etc/weights.safetensors}",
                    "model.init_from: '../../etc/weights.safetensors' leaves the worker's "
                    "directory ('..' is not allowed)"},
        ResolveCase{"data: {source: token_files, token_files: \"shards/../../x/*.bin\"}",
                    "data.token_files: 'shards/../../x/*.bin' leaves the worker's directory "
                    "('..' is not allowed)"}));

TEST(SpecResolveTest, LongNamesAndNonFiniteDoublesFromTheWire) {
  v1::JobSpec spec;
  spec.set_name(std::string(129, 'a'));
  EXPECT_THAT(ResolveJobSpec(spec).status(), IsInvalid("name: 129 bytes is longer than 128"));
  spec.set_name(std::string(128, 'a'));
  EXPECT_TRUE(ResolveJobSpec(spec).ok());
  spec.mutable_training()->set_lr(std::nan(""));
  EXPECT_THAT(ResolveJobSpec(spec).status(),
              IsInvalid("training.lr: must be a finite number, got nan"));
  spec.mutable_training()->set_lr(-std::numeric_limits<double>::infinity());
  EXPECT_THAT(ResolveJobSpec(spec).status(),
              IsInvalid("training.lr: must be a finite number, got -inf"));
}

TEST(SpecResolveTest, EdgesOfTheRangesAreAccepted) {
  const v1::JobSpec spec = MustLoad(
      "model: {heads: 768, context: 16}\ndata: {max_stride: 95}\n"
      "training: {seq_len: 16, warmup_steps: 200, min_lr_ratio: 1, beta1: 0, grad_clip: 0}\n"
      "generation: {prompt_len: 16, tokens: 0}\n");
  EXPECT_EQ(spec.model().heads(), 768);
  EXPECT_EQ(spec.training().seq_len(), 16);
  EXPECT_EQ(spec.generation().tokens(), 0);
}

TEST(SpecBackendTest, EffectivePrecisionFollowsTheWorker) {
  const v1::JobSpec bf16 = MustLoad("precision: bf16\n");
  EXPECT_EQ(RequiredBackend(bf16), "cuda");
  EXPECT_THAT(EffectivePrecision(bf16, "cpu").status(),
              IsInvalid("resources.backend: this job (precision bf16, backend auto) needs a "
                        "cuda worker, not cpu"));
  const v1::JobSpec cuda_fp32 = MustLoad("precision: fp32\nresources: {backend: cuda}\n");
  EXPECT_EQ(RequiredBackend(cuda_fp32), "cuda");
  EXPECT_EQ(EffectivePrecision(cuda_fp32, "cuda").value(), "fp32");
  EXPECT_THAT(EffectivePrecision(cuda_fp32, "tpu").status(),
              IsInvalid("worker backend 'tpu' is neither cpu nor cuda"));
  const v1::JobSpec cpu_auto = MustLoad("resources: {backend: cpu}\n");
  EXPECT_EQ(EffectivePrecision(cpu_auto, "cpu").value(), "fp32");
}

TEST(SpecBackendTest, Fp8NeedsCudaUnlessEmulated) {
  const v1::JobSpec fp8 = MustLoad("precision: fp8\n");
  EXPECT_EQ(RequiredBackend(fp8), "cuda");
  EXPECT_EQ(EffectivePrecision(fp8, "cuda").value(), "fp8");
  EXPECT_THAT(EffectivePrecision(fp8, "cpu").status(),
              IsInvalid("resources.backend: this job (precision fp8, backend auto) needs a "
                        "cuda worker, not cpu"));
  const v1::JobSpec emulated = MustLoad(
      "precision: fp8\nfp8: {emulate: true, format: e4m3, margin: 2}\n"
      "training: {batch_size: 3, seq_len: 5}\n");
  EXPECT_EQ(RequiredBackend(emulated), "cpu");
  EXPECT_EQ(EffectivePrecision(emulated, "cpu").value(), "fp8");
  EXPECT_EQ(emulated.fp8().format(), "e4m3");
  EXPECT_EQ(emulated.fp8().margin(), 2);
  EXPECT_EQ(emulated.fp8().amax_history_len(), 16);
  // The fp8 section is validated but unused for other precisions.
  const v1::JobSpec bf16 = MustLoad("precision: bf16\nfp8: {margin: 1}\n");
  EXPECT_EQ(RequiredBackend(bf16), "cuda");
}

TEST(SpecYamlTest, ResolvedSpecRoundTrips) {
  const v1::JobSpec spec = MustLoad(ReadExample("minigpt.yaml"));
  const std::string yaml = JobSpecToYaml(spec);
  EXPECT_THAT(yaml, StartsWith("name: minigpt\nmodel:\n  preset: minigpt\n  vocab_size: 96\n"));
  EXPECT_THAT(yaml, HasSubstr("\n  lr: 0.0003\n"));
  EXPECT_THAT(yaml, HasSubstr("\n  eps: 1e-08\n"));
  EXPECT_THAT(yaml, HasSubstr("\nprecision: bf16\nresources:\n  workers: 1\n"));
  absl::StatusOr<v1::JobSpec> back = ParseJobSpecYaml(yaml);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << yaml;
  EXPECT_TRUE(MessageDifferencer::Equals(*back, spec)) << yaml;
}

TEST(SpecExamplesTest, TokensCpuTrainsOnTokenFiles) {
  const v1::JobSpec spec = MustLoad(ReadExample("tokens-cpu.yaml"));
  EXPECT_EQ(spec.data().source(), "token_files");
  EXPECT_EQ(spec.eval().every_steps(), 25);
  EXPECT_EQ(spec.model().vocab_size(), 256);
  EXPECT_EQ(spec.training().freeze_layers_size(), 0);
  ExpectAllSet(spec, "");
}

TEST(SpecIssue10Test, NewFieldsParseResolveAndRoundTrip) {
  const v1::JobSpec spec = MustLoad(
      "model: {init_from: /w/gpt2.safetensors}\n"
      "data: {source: token_files, token_files: 'data/train_*.bin'}\n"
      "eval: {token_files: data/val.bin, every_steps: 10, batches: 2}\n"
      "training: {freeze_layers: [0, 1], freeze_embeddings: true,"
      " activation_checkpointing: full}\n");
  EXPECT_EQ(spec.model().init_from(), "/w/gpt2.safetensors");
  EXPECT_EQ(spec.data().token_files(), "data/train_*.bin");
  EXPECT_EQ(spec.eval().every_steps(), 10);
  EXPECT_EQ(spec.eval().batches(), 2);
  ASSERT_EQ(spec.training().freeze_layers_size(), 2);
  EXPECT_EQ(spec.training().freeze_layers(1), 1);
  EXPECT_TRUE(spec.training().freeze_embeddings());
  EXPECT_EQ(spec.training().activation_checkpointing(), "full");
  const std::string yaml = JobSpecToYaml(spec);
  EXPECT_NE(yaml.find("freeze_layers: [0, 1]"), std::string::npos) << yaml;
  absl::StatusOr<v1::JobSpec> back = ParseJobSpecYaml(yaml);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), spec.SerializeAsString());

  // Defaults: evaluation off, nothing frozen, no recompute.
  const v1::JobSpec defaults = MustLoad("{}");
  EXPECT_EQ(defaults.eval().token_files(), "");
  EXPECT_EQ(defaults.training().freeze_layers_size(), 0);
  EXPECT_EQ(defaults.training().activation_checkpointing(), "none");
  EXPECT_EQ(defaults.model().init_from(), "");

  // An override replaces the list.
  const v1::JobSpec overridden =
      MustLoad("training: {freeze_layers: [0, 1]}", {"training.freeze_layers=[3]"});
  ASSERT_EQ(overridden.training().freeze_layers_size(), 1);
  EXPECT_EQ(overridden.training().freeze_layers(0), 3);
}

TEST(SpecYamlTest, UnresolvedSpecEmitsOnlyWhatIsSet) {
  v1::JobSpec spec;
  EXPECT_EQ(JobSpecToYaml(spec), "{}\n");
  EXPECT_TRUE(MessageDifferencer::Equals(ParseJobSpecYaml("{}\n").value(), spec));
  spec.mutable_model();
  spec.mutable_training()->set_steps(5);
  EXPECT_EQ(JobSpecToYaml(spec), "model: {}\ntraining:\n  steps: 5\n");
  EXPECT_TRUE(MessageDifferencer::Equals(ParseJobSpecYaml(JobSpecToYaml(spec)).value(), spec));
}

TEST(SpecYamlTest, DoublesRoundTripExactly) {
  std::mt19937_64 rng(20261202);
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-300, 300);
  std::vector<double> values = {
      3e-4, 0.1, 1.0 / 3.0, 1e-8, 0.95, 5e-324, std::numeric_limits<double>::max(), -0.0, 0.0};
  for (int i = 0; i < 200; ++i) values.push_back(std::ldexp(mantissa(rng), exponent(rng)));
  for (double value : values) {
    v1::JobSpec spec;
    spec.mutable_training()->set_lr(value);
    const std::string yaml = JobSpecToYaml(spec);
    absl::StatusOr<v1::JobSpec> back = ParseJobSpecYaml(yaml);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << yaml;
    EXPECT_EQ(back->training().lr(), value) << yaml;
    EXPECT_EQ(std::signbit(back->training().lr()), std::signbit(value)) << yaml;
  }
}

TEST(SpecYamlTest, StringsThatNeedQuotingRoundTrip) {
  for (const std::string name : {"",
                                 "plain-name_1.2",
                                 "true",
                                 "null",
                                 "~",
                                 "123",
                                 "3e-4",
                                 "a: b",
                                 "#hash",
                                 "- dash",
                                 "quote\"back\\slash",
                                 "line\nbreak\ttab",
                                 "bell\x07",
                                 "ünïcödé",
                                 " padded ",
                                 "[x]",
                                 "{y}",
                                 "*alias",
                                 "&anchor",
                                 "!tag",
                                 "%pct",
                                 "@at",
                                 "`tick",
                                 "'single'",
                                 "x,y"}) {
    v1::JobSpec spec;
    spec.set_name(name);
    const std::string yaml = JobSpecToYaml(spec);
    absl::StatusOr<v1::JobSpec> back = ParseJobSpecYaml(yaml);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << yaml;
    EXPECT_EQ(back->name(), name) << yaml;
  }
}

}  // namespace
}  // namespace boulder::common
