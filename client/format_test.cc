#include "client/format.h"

#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace boulder::client {
namespace {

TEST(HumanBytesTest, PicksBinaryUnitWithThreeSignificantDigits) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(512), "512 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1024), "1.00 KiB");
  EXPECT_EQ(HumanBytes(1536), "1.50 KiB");
  EXPECT_EQ(HumanBytes(int64_t{12} * 1024 * 1024 + 300 * 1024), "12.3 MiB");
  EXPECT_EQ(HumanBytes(int64_t{141} * 1024 * 1024 * 1024), "141 GiB");
  EXPECT_EQ(HumanBytes(-2048), "-2.00 KiB");
}

TEST(HumanBytesTest, RoundsUpIntoTheNextUnit) {
  // 1048575 B is 1023.999 KiB: shown as the next unit, not as "1024 KiB".
  EXPECT_EQ(HumanBytes(1048575), "1.00 MiB");
}

TEST(WithThousandsTest, GroupsDigits) {
  EXPECT_EQ(WithThousands(0), "0");
  EXPECT_EQ(WithThousands(999), "999");
  EXPECT_EQ(WithThousands(1000), "1,000");
  EXPECT_EQ(WithThousands(12345), "12,345");
  EXPECT_EQ(WithThousands(1234567), "1,234,567");
  EXPECT_EQ(WithThousands(-1234), "-1,234");
  EXPECT_EQ(WithThousands(std::numeric_limits<int64_t>::min()), "-9,223,372,036,854,775,808");
}

TEST(ClockDurationTest, MinutesSecondsAndHours) {
  EXPECT_EQ(ClockDuration(absl::Seconds(42)), "0:42");
  EXPECT_EQ(ClockDuration(absl::Milliseconds(41600)), "0:42");
  EXPECT_EQ(ClockDuration(absl::Seconds(723)), "12:03");
  EXPECT_EQ(ClockDuration(absl::Seconds(3723)), "1:02:03");
  EXPECT_EQ(ClockDuration(absl::ZeroDuration()), "0:00");
  EXPECT_EQ(ClockDuration(absl::InfiniteDuration()), "--:--");
  EXPECT_EQ(ClockDuration(absl::Seconds(-1)), "--:--");
}

TEST(ShortAgeTest, LargestUnitTruncated) {
  EXPECT_EQ(ShortAge(absl::Seconds(12)), "12s");
  EXPECT_EQ(ShortAge(absl::Seconds(359)), "5m");
  EXPECT_EQ(ShortAge(absl::Hours(3) + absl::Minutes(59)), "3h");
  EXPECT_EQ(ShortAge(absl::Hours(49)), "2d");
  EXPECT_EQ(ShortAge(absl::Seconds(-5)), "0s");
}

TEST(HumanDurationTest, ScalesUnits) {
  EXPECT_EQ(HumanDuration(absl::Milliseconds(850)), "850 ms");
  EXPECT_EQ(HumanDuration(absl::Milliseconds(1520)), "1.52 s");
  EXPECT_EQ(HumanDuration(absl::Seconds(133)), "2m13s");
  EXPECT_EQ(HumanDuration(absl::Seconds(3720)), "1h02m");
}

TEST(ScientificTest, TwoDecimals) {
  EXPECT_EQ(Scientific(3e-4), "3.00e-04");
  EXPECT_EQ(Scientific(0.0), "0.00e+00");
}

TEST(TimestampTest, FormatsInZoneAndDashWhenUnset) {
  google::protobuf::Timestamp ts;
  EXPECT_EQ(FormatTimestamp(ts, absl::UTCTimeZone()), "-");
  EXPECT_EQ(ToAbslTime(ts), absl::InfinitePast());
  ts.set_seconds(1764667200);  // 2025-12-02 09:20:00 UTC
  ts.set_nanos(500000000);
  EXPECT_EQ(FormatTimestamp(ts, absl::UTCTimeZone()), "2025-12-02 09:20:00 UTC");
  EXPECT_EQ(ToAbslTime(ts), absl::FromUnixMillis(1764667200500));
}

}  // namespace
}  // namespace boulder::client
