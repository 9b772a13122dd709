#include "client/proto_output.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "yaml-cpp/yaml.h"

namespace boulder::client {
namespace {

// Empty collections keep the flow style ("[]", "{}"): block style has no empty form.
void SetBlockStyle(YAML::Node node) {
  if ((node.IsMap() || node.IsSequence()) && node.size() > 0) {
    node.SetStyle(YAML::EmitterStyle::Block);
    for (auto it = node.begin(); it != node.end(); ++it) {
      SetBlockStyle(node.IsMap() ? it->second : *it);
    }
  }
}

}  // namespace

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!status.ok()) {
    return absl::InternalError(
        absl::StrCat("cannot print ", message.GetTypeName(), " as JSON: ", status.ToString()));
  }
  if (out.empty() || out.back() != '\n') out.push_back('\n');
  return out;
}

absl::StatusOr<std::string> ToYaml(const google::protobuf::Message& message) {
  absl::StatusOr<std::string> json = ToJson(message);
  if (!json.ok()) return json.status();
  // JSON is YAML: parse it and re-emit in block style. yaml-cpp reports failures by throwing.
  try {
    YAML::Node node = YAML::Load(*json);
    SetBlockStyle(node);
    YAML::Emitter emitter;
    emitter << node;
    if (!emitter.good()) {
      return absl::InternalError(absl::StrCat("cannot print ", message.GetTypeName(),
                                              " as YAML: ", emitter.GetLastError()));
    }
    return absl::StrCat(emitter.c_str(), "\n");
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("cannot print ", message.GetTypeName(), " as YAML: ", e.what()));
  }
}

}  // namespace boulder::client
