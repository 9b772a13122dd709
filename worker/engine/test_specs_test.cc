// The GPU tests' "seed job" (test_specs.h, SeedJobSpec) is the job users run:
// examples/minigpt.yaml, resolved, equals SeedJobSpec resolved, apart from the fields the tests
// set for themselves (the name and how often a step is reported).
#include <fstream>
#include <sstream>
#include <string>

#include "common/spec.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "worker/engine/test_specs.h"

namespace boulder::engine {
namespace {

TEST(TestSpecsTest, SeedJobSpecIsExamplesMinigpt) {
  std::ifstream in(std::string(BOULDER_EXAMPLES_DIR) + "/minigpt.yaml");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<v1::JobSpec> parsed = common::ParseJobSpecYaml(text.str());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  // The example leaves the backend to the worker ("auto"); the GPU tests ask for cuda.
  parsed->mutable_resources()->set_backend("cuda");
  absl::StatusOr<v1::JobSpec> example = common::ResolveJobSpec(*parsed);
  ASSERT_TRUE(example.ok()) << example.status();
  absl::StatusOr<v1::JobSpec> seed = common::ResolveJobSpec(SeedJobSpec("bf16", "cuda"));
  ASSERT_TRUE(seed.ok()) << seed.status();
  seed->set_name(example->name());
  seed->mutable_training()->set_log_every_steps(example->training().log_every_steps());
  std::string diff;
  google::protobuf::util::MessageDifferencer d;
  d.ReportDifferencesToString(&diff);
  EXPECT_TRUE(d.Compare(*example, *seed)) << diff;
}

}  // namespace
}  // namespace boulder::engine
