#include "common/env_choice.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace boulder::common {
namespace {

enum class Mode { kAuto, kFast, kSlow };

constexpr char kVar[] = "BOULDER_ENV_CHOICE_TEST";

TEST(EnvChoiceTest, UnsetOrEmptyLeavesTheValue) {
  unsetenv(kVar);
  Mode m = Mode::kSlow;
  EXPECT_TRUE(ReadEnvChoice<Mode>(kVar, {{"auto", Mode::kAuto}, {"fast", Mode::kFast}}, &m).ok());
  EXPECT_EQ(m, Mode::kSlow);
  setenv(kVar, "", 1);
  EXPECT_TRUE(ReadEnvChoice<Mode>(kVar, {{"auto", Mode::kAuto}, {"fast", Mode::kFast}}, &m).ok());
  EXPECT_EQ(m, Mode::kSlow);
  unsetenv(kVar);
}

TEST(EnvChoiceTest, PicksTheNamedChoice) {
  for (const auto& [word, want] :
       {std::pair<const char*, Mode>{"auto", Mode::kAuto}, {"fast", Mode::kFast},
        {"slow", Mode::kSlow}}) {
    setenv(kVar, word, 1);
    Mode m = Mode::kSlow;
    ASSERT_TRUE(ReadEnvChoice<Mode>(
                    kVar, {{"auto", Mode::kAuto}, {"fast", Mode::kFast}, {"slow", Mode::kSlow}},
                    &m)
                    .ok());
    EXPECT_EQ(m, want) << word;
  }
  setenv(kVar, "off", 1);
  bool on = true;
  ASSERT_TRUE(ReadEnvSwitch(kVar, "on", "off", &on).ok());
  EXPECT_FALSE(on);
  setenv(kVar, "on", 1);
  ASSERT_TRUE(ReadEnvSwitch(kVar, "on", "off", &on).ok());
  EXPECT_TRUE(on);
  unsetenv(kVar);
}

TEST(EnvChoiceTest, AnyOtherValueNamesTheVariableAndTheChoices) {
  setenv(kVar, "fastest", 1);
  Mode m = Mode::kAuto;
  absl::Status s = ReadEnvChoice<Mode>(
      kVar, {{"auto", Mode::kAuto}, {"fast", Mode::kFast}, {"slow", Mode::kSlow}}, &m);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "BOULDER_ENV_CHOICE_TEST=fastest: expected auto, fast or slow");
  EXPECT_EQ(m, Mode::kAuto);
  bool on = true;
  s = ReadEnvSwitch(kVar, "on", "off", &on);
  EXPECT_EQ(s.message(), "BOULDER_ENV_CHOICE_TEST=fastest: expected on or off");
  EXPECT_TRUE(on);
  unsetenv(kVar);
}

}  // namespace
}  // namespace boulder::common
