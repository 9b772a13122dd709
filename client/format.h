// Human-readable renderings of numbers, sizes, durations and times for the `boulder` CLI.
//
// Pure functions over values; thread-safe.
#ifndef BOULDER_CLIENT_FORMAT_H_
#define BOULDER_CLIENT_FORMAT_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "google/protobuf/timestamp.pb.h"

namespace boulder::client {

// Binary units with three significant digits: 0 B, 512 B, 1.5 KiB, 12.3 MiB, 141 GiB.
std::string HumanBytes(int64_t bytes);

// Integer with thousands separators: 12345 -> "12,345", -1234 -> "-1,234".
std::string WithThousands(int64_t value);

// A clock-style duration for ETAs: "0:42", "12:03", "1:02:03" (rounded to whole seconds).
// Negative or infinite durations render as "--:--".
std::string ClockDuration(absl::Duration d);

// A short age like kubectl's: "12s", "5m", "3h", "2d" (largest unit, truncated); "0s" for
// negative durations (clock skew).
std::string ShortAge(absl::Duration d);

// A precise-enough duration for a human view: "850 ms", "1.52 s", "2m13s", "1h02m".
std::string HumanDuration(absl::Duration d);

// Learning-rate style scientific notation with two decimals: 3e-4 -> "3.00e-04".
std::string Scientific(double value);

// A timestamp in the local time zone, "2026-12-02 09:14:03 CET"; "-" when unset (zero).
std::string FormatTimestamp(const google::protobuf::Timestamp& ts, absl::TimeZone zone);

// Converts a protobuf timestamp; absl::InfinitePast() when unset (zero).
absl::Time ToAbslTime(const google::protobuf::Timestamp& ts);

}  // namespace boulder::client

#endif  // BOULDER_CLIENT_FORMAT_H_
