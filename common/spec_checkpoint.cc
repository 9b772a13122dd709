#include "common/spec_checkpoint.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace boulder::common {
namespace {

constexpr size_t kMaxDirBytes = 255;

absl::Status Invalid(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

absl::Status ValidateDir(const std::string& dir) {
  constexpr absl::string_view kPath = "checkpoint.dir";
  if (dir.empty()) return absl::OkStatus();
  if (dir.size() > kMaxDirBytes) {
    return Invalid(kPath, absl::StrCat(dir.size(), " bytes is longer than ", kMaxDirBytes));
  }
  for (unsigned char c : dir) {
    if (c < 0x20 || c == 0x7f) return Invalid(kPath, "must not contain control characters");
    if (c == '\\') return Invalid(kPath, "must not contain '\\' (use '/')");
  }
  if (dir.front() == '/') {
    return Invalid(kPath, absl::StrCat("'", dir,
                                       "' is absolute; it must be relative to the worker's "
                                       "--checkpoint-root"));
  }
  for (absl::string_view part : absl::StrSplit(dir, '/')) {
    if (part == "..") {
      return Invalid(kPath, absl::StrCat("'", dir,
                                         "' contains '..'; it must stay under the worker's "
                                         "--checkpoint-root"));
    }
    if (part.empty() || part == ".") {
      return Invalid(kPath, absl::StrCat("'", dir, "' has an empty or '.' component"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

void FillCheckpointDefaults(v1::JobSpec* spec) {
  v1::CheckpointSpec* c = spec->mutable_checkpoint();
  if (!c->has_every_steps()) c->set_every_steps(kDefaultCheckpointEverySteps);
  if (!c->has_keep_last()) c->set_keep_last(kDefaultCheckpointKeepLast);
  if (!c->has_dir()) c->set_dir("");
  if (!spec->has_max_restarts()) spec->set_max_restarts(kDefaultMaxRestarts);
}

absl::Status ValidateCheckpoint(const v1::JobSpec& spec) {
  const v1::CheckpointSpec& c = spec.checkpoint();
  if (c.every_steps() < 0) {
    return Invalid("checkpoint.every_steps",
                   absl::StrCat("must be at least 0 (0 disables), got ", c.every_steps()));
  }
  if (c.keep_last() < 1 || c.keep_last() > kMaxCheckpointKeepLast) {
    return Invalid("checkpoint.keep_last", absl::StrCat("must be in [1, ", kMaxCheckpointKeepLast,
                                                        "], got ", c.keep_last()));
  }
  if (absl::Status s = ValidateDir(c.dir()); !s.ok()) return s;
  if (spec.max_restarts() < 0 || spec.max_restarts() > kMaxMaxRestarts) {
    return Invalid("max_restarts", absl::StrCat("must be in [0, ", kMaxMaxRestarts, "], got ",
                                                spec.max_restarts()));
  }
  return absl::OkStatus();
}

std::string CheckpointDirectory(absl::string_view root, const v1::JobSpec& spec, int64_t job_id) {
  const std::string leaf =
      spec.checkpoint().dir().empty() ? absl::StrCat("job-", job_id) : spec.checkpoint().dir();
  if (root.empty()) return leaf;
  if (root.back() == '/') return absl::StrCat(root, leaf);
  return absl::StrCat(root, "/", leaf);
}

}  // namespace boulder::common
