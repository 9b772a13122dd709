#include "common/spec_path.h"

#include <limits.h>
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace boulder::common {
namespace {

// The value as it may be shown in a message: control characters escaped, long values cut.
std::string Shown(absl::string_view value) {
  std::string out;
  for (char c : value.substr(0, 200)) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      absl::StrAppend(&out, "\\x", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
    } else {
      out.push_back(c);
    }
  }
  if (value.size() > 200) out += "...";
  return out;
}

}  // namespace

absl::Status ValidateSpecPath(absl::string_view field, absl::string_view value,
                              const SpecPathPolicy& policy) {
  auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": '", Shown(value), "' ", why));
  };
  if (value.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": empty path"));
  if (value.size() > kMaxSpecPathBytes) {
    return refuse(absl::StrCat("is longer than ", kMaxSpecPathBytes, " bytes"));
  }
  for (char c : value) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return refuse("contains a control character");
    }
  }
  if (absl::StrContains(value, '\\')) return refuse("contains a backslash");
  if (value.front() == '/' && !policy.allow_absolute) {
    return refuse(absl::StrCat("is absolute; give a path relative to ", policy.root_name));
  }
  std::vector<absl::string_view> parts = absl::StrSplit(value, '/');
  if (parts.front() == "~" || absl::StartsWith(parts.front(), "~")) {
    return refuse("starts with '~' (no shell expansion is done)");
  }
  for (absl::string_view part : parts) {
    if (part == "..") {
      return refuse(absl::StrCat("leaves ", policy.root_name, " ('..' is not allowed)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ResolveSpecPath(absl::string_view field, absl::string_view value,
                                            const std::string& root, const SpecPathPolicy& policy,
                                            bool resolve_links) {
  if (absl::Status s = ValidateSpecPath(field, value, policy); !s.ok()) return s;
  std::string joined = value.front() == '/'        ? std::string(value)
                       : root.empty()              ? std::string(value)
                       : absl::EndsWith(root, "/") ? absl::StrCat(root, value)
                                                   : absl::StrCat(root, "/", value);
  if (!resolve_links) return joined;
  char buf[PATH_MAX];
  if (realpath(root.c_str(), buf) == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(field, ": ", policy.root_name, " '", root, "': ", std::strerror(errno)));
  }
  std::string real_root = buf;
  if (realpath(joined.c_str(), buf) == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(field, ": '", Shown(value), "': ", std::strerror(errno)));
  }
  std::string real = buf;
  if (value.front() != '/' && real != real_root &&
      !absl::StartsWith(real, real_root == "/" ? real_root : real_root + "/")) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": '", Shown(value), "' leaves ",
                                                   policy.root_name, " through a symbolic link"));
  }
  return real;
}

}  // namespace boulder::common
