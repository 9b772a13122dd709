#include "client/proto_output.h"

#include <string>

#include "boulder/v1/job.pb.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "yaml-cpp/yaml.h"

namespace boulder::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::Job FinishedJob() {
  v1::Job job;
  job.set_id(7);
  job.set_name("minigpt");
  job.set_state(v1::SUCCEEDED);
  job.mutable_latest_report()->set_step(200);
  job.mutable_latest_report()->set_loss(0.25);
  job.mutable_generation()->add_prompt(5);
  job.mutable_generation()->add_prompt(9);
  job.mutable_generation()->add_tokens(13);
  job.mutable_create_time()->set_seconds(1764667200);
  return job;
}

TEST(ToJsonTest, ProtoFieldNamesEnumNamesAndZeroPrimitives) {
  absl::StatusOr<std::string> json = ToJson(FinishedJob());
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, HasSubstr("\"state\": \"SUCCEEDED\""));
  EXPECT_THAT(*json, HasSubstr("\"latest_report\": {"));  // not "latestReport"
  EXPECT_THAT(*json, HasSubstr("\"loss\": 0.25"));
  EXPECT_THAT(*json, HasSubstr("\"attempt\": 0"));  // printed although zero
  EXPECT_THAT(*json, HasSubstr("\"id\": \"7\""));   // int64 as a string, per the mapping
  EXPECT_THAT(*json, HasSubstr("\"create_time\": \"2025-12-02T09:20:00Z\""));
  EXPECT_THAT(*json, Not(HasSubstr("latestReport")));
  EXPECT_EQ(json->back(), '\n');

  v1::Job parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(*json, &parsed).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(parsed, FinishedJob()));
}

TEST(ToYamlTest, BlockStyleDocumentWithTheSameFields) {
  absl::StatusOr<std::string> yaml = ToYaml(FinishedJob());
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  EXPECT_THAT(*yaml, Not(HasSubstr("{")));
  EXPECT_THAT(*yaml, HasSubstr("\nlatest_report:\n"));
  EXPECT_THAT(*yaml, HasSubstr("\n  fp8: []\n"));  // empty lists stay valid YAML
  YAML::Node node = YAML::Load(*yaml);
  EXPECT_EQ(node["state"].as<std::string>(), "SUCCEEDED");
  EXPECT_EQ(node["id"].as<int64_t>(), 7);
  EXPECT_DOUBLE_EQ(node["latest_report"]["loss"].as<double>(), 0.25);
  ASSERT_TRUE(node["generation"]["tokens"].IsSequence());
  EXPECT_EQ(node["generation"]["tokens"][0].as<int>(), 13);
}

}  // namespace
}  // namespace boulder::client
