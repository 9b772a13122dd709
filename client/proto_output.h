// Machine-readable output of API messages (`-o json`, `-o yaml`).
//
// JSON is protobuf's canonical JSON mapping with the proto field names (snake_case), every
// primitive field printed even when zero (so `state` and `loss` are always there for
// scripts), enums as names, int64 as strings, timestamps as RFC 3339, pretty-printed.
// YAML is the same document in block style.
//
// Thread-safe: plain functions.
#ifndef BOULDER_CLIENT_PROTO_OUTPUT_H_
#define BOULDER_CLIENT_PROTO_OUTPUT_H_

#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/message.h"

namespace boulder::client {

// The message as pretty JSON ending in '\n'. INTERNAL if protobuf cannot print it.
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message);

// The message as a block-style YAML document ending in '\n'. INTERNAL if it cannot be
// converted.
absl::StatusOr<std::string> ToYaml(const google::protobuf::Message& message);

}  // namespace boulder::client

#endif  // BOULDER_CLIENT_PROTO_OUTPUT_H_
