#include "client/format.h"

#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace boulder::client {

std::string HumanBytes(int64_t bytes) {
  if (bytes < 0) return absl::StrCat("-", HumanBytes(-bytes));
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  // Round first so that e.g. 1023.9 KiB moves up to "1.00 MiB" rather than "1024 KiB".
  while (unit < 5 && std::round(value * 10.0) / 10.0 >= 1024.0) {
    value /= 1024.0;
    ++unit;
  }
  if (value < 10.0) return absl::StrFormat("%.2f %s", value, kUnits[unit]);
  if (value < 100.0) return absl::StrFormat("%.1f %s", value, kUnits[unit]);
  return absl::StrFormat("%.0f %s", value, kUnits[unit]);
}

std::string WithThousands(int64_t value) {
  // The magnitude as unsigned so that INT64_MIN does not overflow.
  uint64_t magnitude = value < 0 ? 0 - static_cast<uint64_t>(value) : value;
  std::string digits = absl::StrCat(magnitude);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return value < 0 ? absl::StrCat("-", out) : out;
}

std::string ClockDuration(absl::Duration d) {
  if (d < absl::ZeroDuration() || d == absl::InfiniteDuration()) return "--:--";
  int64_t total = absl::ToInt64Seconds(d + absl::Milliseconds(500));
  int64_t hours = total / 3600;
  int64_t minutes = (total / 60) % 60;
  int64_t seconds = total % 60;
  if (hours > 0) return absl::StrFormat("%d:%02d:%02d", hours, minutes, seconds);
  return absl::StrFormat("%d:%02d", minutes, seconds);
}

std::string ShortAge(absl::Duration d) {
  if (d < absl::ZeroDuration()) return "0s";
  int64_t seconds = absl::ToInt64Seconds(d);
  if (seconds < 60) return absl::StrCat(seconds, "s");
  if (seconds < 3600) return absl::StrCat(seconds / 60, "m");
  if (seconds < 86400) return absl::StrCat(seconds / 3600, "h");
  return absl::StrCat(seconds / 86400, "d");
}

std::string HumanDuration(absl::Duration d) {
  if (d < absl::ZeroDuration()) return absl::StrCat("-", HumanDuration(-d));
  if (d < absl::Seconds(1)) return absl::StrFormat("%.0f ms", absl::ToDoubleMilliseconds(d));
  if (d < absl::Minutes(1)) return absl::StrFormat("%.2f s", absl::ToDoubleSeconds(d));
  int64_t total = absl::ToInt64Seconds(d);
  if (total < 3600) return absl::StrFormat("%dm%02ds", total / 60, total % 60);
  return absl::StrFormat("%dh%02dm", total / 3600, (total / 60) % 60);
}

std::string Scientific(double value) { return absl::StrFormat("%.2e", value); }

absl::Time ToAbslTime(const google::protobuf::Timestamp& ts) {
  if (ts.seconds() == 0 && ts.nanos() == 0) return absl::InfinitePast();
  return absl::FromUnixSeconds(ts.seconds()) + absl::Nanoseconds(ts.nanos());
}

std::string FormatTimestamp(const google::protobuf::Timestamp& ts, absl::TimeZone zone) {
  absl::Time t = ToAbslTime(ts);
  if (t == absl::InfinitePast()) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S %Z", t, zone);
}

}  // namespace boulder::client
