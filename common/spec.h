// Job specs: YAML <-> boulder.v1.JobSpec, defaults and validation. The one owner of job-spec
// validation: the coordinator, the trainer and the CLI all call these.
//
// YAML keys are the JobSpec field names (snake_case); mapping is by protobuf reflection, so a
// new field in spec.proto is accepted without code here (but needs a default and a check).
//
// Errors are INVALID_ARGUMENT with the field's path first, e.g.
//   "model.heads: 7 does not divide hidden 768"
//   "training.stepz: unknown field (did you mean 'steps'?)"
//   "training.steps: expected an integer, got 'ten'"
// Thread-safe: plain functions over values.
#ifndef BOULDER_COMMON_SPEC_H_
#define BOULDER_COMMON_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "boulder/v1/spec.pb.h"

namespace boulder::common {

// Largest spec document accepted (bytes).
inline constexpr size_t kMaxSpecBytes = 1 << 20;

// Parses a YAML (or JSON) document into an unresolved JobSpec: only the fields written are set.
// Rejects unknown fields, wrong types, duplicate keys and non-mapping documents.
absl::StatusOr<v1::JobSpec> ParseJobSpecYaml(absl::string_view yaml);

// Applies one "path=value" override (value parsed as YAML scalar), e.g. "training.steps=50".
absl::Status ApplyOverride(v1::JobSpec* spec, absl::string_view path_equals_value);

// Expands the model preset, fills every unset field with its default and validates the
// result. The returned spec has every field set. Does not modify `spec`.
absl::StatusOr<v1::JobSpec> ResolveJobSpec(const v1::JobSpec& spec);

// Parse + overrides + resolve.
absl::StatusOr<v1::JobSpec> LoadJobSpec(absl::string_view yaml,
                                        const std::vector<std::string>& overrides);

// A resolved spec as YAML (for `boulder get` and for the trainer's spec file). Round-trips
// through ParseJobSpecYaml.
std::string JobSpecToYaml(const v1::JobSpec& spec);

}  // namespace boulder::common

#endif  // BOULDER_COMMON_SPEC_H_
