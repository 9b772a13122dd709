// libFuzzer target for the job-spec parser (common/spec.h): whatever bytes arrive as a spec,
// the parser returns OK or INVALID_ARGUMENT and never crashes, hangs or leaks (ASan, UBSan);
// what it accepts survives printing and parsing again unchanged; resolution and overrides on
// top of it keep the same promises.
//
// ctest runs it for a fixed number of runs with examples/*.yaml as seeds (common/CMakeLists.txt).
// By hand: build/fuzz/spec_fuzz -seed_inputs=examples/minigpt.yaml -max_total_time=60
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/spec.h"
#include "google/protobuf/util/message_differencer.h"

namespace {

using boulder::common::ApplyOverride;
using boulder::common::EffectivePrecision;
using boulder::common::JobSpecToYaml;
using boulder::common::ParseJobSpecYaml;
using boulder::common::RequiredBackend;
using boulder::common::ResolveJobSpec;
using boulder::v1::JobSpec;

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "spec_fuzz: %s\n%s\n", what, detail.c_str());
  std::abort();
}

// Parsing errors must be INVALID_ARGUMENT: anything else means an unexpected path.
void CheckError(const absl::Status& s, const char* what) {
  if (!s.ok() && s.code() != absl::StatusCode::kInvalidArgument) Fail(what, s.ToString());
}

void CheckRoundTrip(const JobSpec& spec, const char* what) {
  const std::string yaml = JobSpecToYaml(spec);
  auto again = ParseJobSpecYaml(yaml);
  if (!again.ok()) Fail(what, again.status().ToString() + "\n--- printed:\n" + yaml);
  if (!google::protobuf::util::MessageDifferencer::Equals(spec, *again)) {
    Fail(what, "printed and parsed again differs:\n" + spec.DebugString() + "---\n" +
                   again->DebugString() + "--- printed:\n" + yaml);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);

  // The whole input as a spec document.
  auto spec = ParseJobSpecYaml(input);
  CheckError(spec.status(), "ParseJobSpecYaml: unexpected error code");
  if (spec.ok()) {
    CheckRoundTrip(*spec, "parsed spec does not round-trip");
    auto resolved = ResolveJobSpec(*spec);
    CheckError(resolved.status(), "ResolveJobSpec: unexpected error code");
    if (resolved.ok()) {
      CheckRoundTrip(*resolved, "resolved spec does not round-trip");
      RequiredBackend(*resolved);
      for (const char* backend : {"cpu", "cuda"}) {
        CheckError(EffectivePrecision(*resolved, backend).status(),
                   "EffectivePrecision: unexpected error code");
      }
    }
  }

  // Each line as a --set override on the default spec; a refused one leaves it unchanged.
  JobSpec base;
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(input, '\n')) {
    if (++lines > 8) break;
    JobSpec before = base;
    absl::Status s = ApplyOverride(&base, line);
    CheckError(s, "ApplyOverride: unexpected error code");
    if (!s.ok() && !google::protobuf::util::MessageDifferencer::Equals(before, base)) {
      Fail("ApplyOverride changed the spec although it failed", std::string(line));
    }
  }
  if (lines > 0) {
    CheckRoundTrip(base, "spec built from overrides does not round-trip");
    CheckError(ResolveJobSpec(base).status(), "ResolveJobSpec (overrides): unexpected code");
  }
  return 0;
}
