// File paths in job specs (data files, initial weights, checkpoint directories): the one check
// every path field of a spec goes through, so a spec cannot make a worker read or write outside
// the directory it allows.
//
// A spec path is relative to a root the worker chooses (its data or work directory) and stays
// below it: ValidateSpecPath refuses, with the field's path first,
//   - an empty path, one longer than kMaxSpecPathBytes, NUL or other control characters,
//   - an absolute path ("/etc/passwd") unless the policy allows absolute paths,
//   - a "~" first component (shell expansion is never done, so it could only surprise),
//   - any ".." component ("data/../../x"), and a backslash (a Windows separator in disguise).
// e.g. "data.token_files[0]: '../secrets' leaves the data directory ('..' is not allowed)".
//
// The check is lexical: a symbolic link below the root can still point elsewhere; workers
// that must also rule that out resolve the result with realpath and compare the prefix
// (ResolveSpecPath does when `resolve_links` is set).
// Thread-safe: plain functions.
#ifndef BOULDER_COMMON_SPEC_PATH_H_
#define BOULDER_COMMON_SPEC_PATH_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace boulder::common {

inline constexpr size_t kMaxSpecPathBytes = 4096;

struct SpecPathPolicy {
  // Accept absolute paths (e.g. a cluster-wide mount named in the spec); ".." is refused even
  // then.
  bool allow_absolute = false;
  // What the root is called in messages ("the data directory").
  std::string root_name = "the job's directory";
};

// INVALID_ARGUMENT "FIELD: 'VALUE' why" for a path the policy refuses; `field` is the spec
// field's path, e.g. "data.token_files[2]".
absl::Status ValidateSpecPath(absl::string_view field, absl::string_view value,
                              const SpecPathPolicy& policy = {});

// ValidateSpecPath, then the path joined under `root` (absolute paths, where allowed, as
// given). With `resolve_links`, the result is resolved with realpath (it must exist) and
// must still lie under realpath(root): NOT_FOUND for a missing file, INVALID_ARGUMENT for one
// that leaves the root through a link.
absl::StatusOr<std::string> ResolveSpecPath(absl::string_view field, absl::string_view value,
                                            const std::string& root,
                                            const SpecPathPolicy& policy = {},
                                            bool resolve_links = false);

}  // namespace boulder::common

#endif  // BOULDER_COMMON_SPEC_PATH_H_
