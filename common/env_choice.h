// Reading common/env.h's benchmark switches: an environment variable naming one of a fixed set
// of choices. Header-only (the CUDA backend and the trainer read them; neither links the other).
// Thread-compatible: reads the environment (std::getenv).
#ifndef BOULDER_COMMON_ENV_CHOICE_H_
#define BOULDER_COMMON_ENV_CHOICE_H_

#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace boulder::common {

// Where the variable `name` is set and not empty, *out = the value of the choice it names
// (exactly); unset or empty leaves *out as it is. INVALID_ARGUMENT for any other value, naming
// the variable, the value and the choices in order: "NAME=x: expected a, b or c".
template <typename T>
absl::Status ReadEnvChoice(const char* name,
                           std::initializer_list<std::pair<const char*, T>> choices, T* out) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return absl::OkStatus();
  for (const auto& [word, value] : choices) {
    if (std::strcmp(v, word) == 0) {
      *out = value;
      return absl::OkStatus();
    }
  }
  std::string expected;
  size_t i = 0;
  for (const auto& choice : choices) {
    absl::StrAppend(&expected, i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ",
                    choice.first);
    ++i;
  }
  return absl::InvalidArgumentError(absl::StrCat(name, "=", v, ": expected ", expected));
}

// The two-way form: *out = (the value is `yes`); `no` sets it false.
inline absl::Status ReadEnvSwitch(const char* name, const char* yes, const char* no, bool* out) {
  return ReadEnvChoice<bool>(name, {{yes, true}, {no, false}}, out);
}

}  // namespace boulder::common

#endif  // BOULDER_COMMON_ENV_CHOICE_H_
