// YAML <-> JobSpec by protobuf reflection. Resolution and validation are in spec_resolve.cc.
//
// yaml-cpp builds the whole document as a node tree and keeps repeated keys as separate
// pairs, so duplicates are found by walking each mapping. Its exceptions stop here.
#include "common/spec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

namespace boulder::common {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Path of the document itself, for errors that belong to no field.
constexpr char kRootPath[] = "spec";

std::string JoinPath(absl::string_view path, absl::string_view name) {
  return path.empty() ? std::string(name) : absl::StrCat(path, ".", name);
}

// User text echoed in an error, cut so that a huge key or value cannot make a huge message.
std::string Shorten(absl::string_view text) {
  constexpr size_t kMaxEcho = 80;
  if (text.size() <= kMaxEcho) return std::string(text);
  size_t cut = kMaxEcho - 3;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(text.substr(0, cut), "...");
}

absl::Status Invalid(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path.empty() ? kRootPath : path, ": ", what));
}

// Case-insensitive edit distance counting an adjacent transposition as one edit (optimal
// string alignment), for "did you mean" suggestions: "modle" is one edit from "model".
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  auto same = [&](size_t i, size_t j) {
    return absl::ascii_tolower(a[i]) == absl::ascii_tolower(b[j]);
  };
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (same(i - 1, j - 1) ? 0 : 1)});
      if (i > 1 && j > 1 && same(i - 1, j - 2) && same(i - 2, j - 1)) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// The field a key names: its proto name or its lowerCamelCase JSON name.
const FieldDescriptor* FindField(const Descriptor* descriptor, absl::string_view key) {
  if (const FieldDescriptor* field = descriptor->FindFieldByName(std::string(key))) return field;
  for (int i = 0; i < descriptor->field_count(); ++i) {
    if (descriptor->field(i)->json_name() == key) return descriptor->field(i);
  }
  return nullptr;
}

// "unknown field (did you mean 'steps'?)": the closest sibling when it is close, else a field
// of that name one section down (a key written at the wrong level), else the valid fields.
std::string UnknownField(const Descriptor* descriptor, absl::string_view key) {
  const FieldDescriptor* best = nullptr;
  size_t best_distance = 0;
  std::vector<std::string> names;
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    names.push_back(field->name());
    // A key much longer than every name is close to none; skip its quadratic distance.
    if (key.size() > field->name().size() + 3) continue;
    const size_t distance = EditDistance(key, field->name());
    if (best == nullptr || distance < best_distance) {
      best = field;
      best_distance = distance;
    }
  }
  const size_t allowed = std::min<size_t>(3, std::max<size_t>(1, key.size() / 3));
  if (best != nullptr && best_distance <= allowed) {
    return absl::StrCat("unknown field (did you mean '", best->name(), "'?)");
  }
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* section = descriptor->field(i);
    if (section->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (const FieldDescriptor* inner = FindField(section->message_type(), key)) {
      return absl::StrCat("unknown field (did you mean '", section->name(), ".", inner->name(),
                          "'?)");
    }
  }
  return absl::StrCat("unknown field (valid fields: ", absl::StrJoin(names, ", "), ")");
}

// What a field expects, for "expected X, got Y".
const char* Expected(const FieldDescriptor* field) {
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
      return "an integer";
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
      return "a non-negative integer";
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT:
      return "a number";
    case FieldDescriptor::CPPTYPE_BOOL:
      return "true or false";
    case FieldDescriptor::CPPTYPE_STRING:
      return "a string";
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return "a mapping of fields";
    case FieldDescriptor::CPPTYPE_ENUM:
      return "an enum value";
  }
  return "a value";
}

// What a node is, for "expected X, got Y": scalars are quoted with their text.
std::string Got(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return absl::StrCat("'", Shorten(node.Scalar()), "'");
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      break;
  }
  return "an empty value";
}

absl::Status WrongType(absl::string_view path, const FieldDescriptor* field,
                       const YAML::Node& node) {
  return Invalid(path, absl::StrCat("expected ", Expected(field), ", got ", Got(node)));
}

bool IsDecimalInteger(absl::string_view text) {
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) text.remove_prefix(1);
  if (text.empty()) return false;
  for (char c : text) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  return true;
}

absl::Status SetInteger(const std::string& text, const FieldDescriptor* field, Message* message,
                        absl::string_view path, const YAML::Node& node) {
  const Reflection* reflection = message->GetReflection();
  const absl::string_view digits = absl::StripAsciiWhitespace(text);
  if (!IsDecimalInteger(digits)) return WrongType(path, field, node);
  const FieldDescriptor::CppType type = field->cpp_type();
  if (type == FieldDescriptor::CPPTYPE_UINT32 || type == FieldDescriptor::CPPTYPE_UINT64) {
    if (digits[0] == '-') return WrongType(path, field, node);
    uint64_t value = 0;
    const uint64_t max = type == FieldDescriptor::CPPTYPE_UINT32
                             ? std::numeric_limits<uint32_t>::max()
                             : std::numeric_limits<uint64_t>::max();
    if (!absl::SimpleAtoi(digits, &value) || value > max) {
      return Invalid(path, absl::StrCat(Shorten(digits), " is out of range (at most ", max, ")"));
    }
    if (type == FieldDescriptor::CPPTYPE_UINT32) {
      reflection->SetUInt32(message, field, static_cast<uint32_t>(value));
    } else {
      reflection->SetUInt64(message, field, value);
    }
    return absl::OkStatus();
  }
  int64_t value = 0;
  const bool is32 = type == FieldDescriptor::CPPTYPE_INT32;
  const int64_t min =
      is32 ? std::numeric_limits<int32_t>::min() : std::numeric_limits<int64_t>::min();
  const int64_t max =
      is32 ? std::numeric_limits<int32_t>::max() : std::numeric_limits<int64_t>::max();
  if (!absl::SimpleAtoi(digits, &value) || value < min || value > max) {
    return Invalid(path, absl::StrCat(Shorten(digits), " is out of range for a ", is32 ? 32 : 64,
                                      "-bit integer [", min, ", ", max, "]"));
  }
  if (is32) {
    reflection->SetInt32(message, field, static_cast<int32_t>(value));
  } else {
    reflection->SetInt64(message, field, value);
  }
  return absl::OkStatus();
}

// YAML's and C's spellings of infinity and NaN, with an optional sign.
bool IsNonFiniteSpelling(absl::string_view text) {
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) text.remove_prefix(1);
  if (!text.empty() && text[0] == '.') text.remove_prefix(1);
  const std::string lower = absl::AsciiStrToLower(text);
  return lower == "inf" || lower == "infinity" || lower == "nan";
}

absl::Status SetNumber(const std::string& text, const FieldDescriptor* field, Message* message,
                       absl::string_view path, const YAML::Node& node) {
  const absl::string_view number = absl::StripAsciiWhitespace(text);
  if (IsNonFiniteSpelling(number)) {
    return Invalid(path, absl::StrCat("must be a finite number, got '", Shorten(number), "'"));
  }
  double value = 0;
  if (!absl::SimpleAtod(number, &value)) return WrongType(path, field, node);
  const bool is_float = field->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT;
  const double max =
      is_float ? std::numeric_limits<float>::max() : std::numeric_limits<double>::max();
  if (!std::isfinite(value) || std::fabs(value) > max) {
    return Invalid(path, absl::StrCat(Shorten(number), " is out of range"));
  }
  if (is_float) {
    message->GetReflection()->SetFloat(message, field, static_cast<float>(value));
  } else {
    message->GetReflection()->SetDouble(message, field, value);
  }
  return absl::OkStatus();
}

absl::Status FillMessage(const YAML::Node& node, Message* message, const std::string& path);

// A list of integers, `[0, 1]` (or a block sequence); an empty value is the empty list. The
// list replaces what the field held (so an override sets, not appends).
absl::Status SetRepeatedInt32(const YAML::Node& node, const FieldDescriptor* field,
                              Message* message, const std::string& path) {
  const Reflection* reflection = message->GetReflection();
  if (!node.IsNull() && !node.IsSequence()) {
    return Invalid(path, absl::StrCat("expected a list of integers, got ", Got(node)));
  }
  std::vector<int32_t> values;
  if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) {
      const std::string item_path = absl::StrCat(path, "[", i, "]");
      const YAML::Node item = node[i];
      const absl::string_view digits =
          item.IsScalar() ? absl::StripAsciiWhitespace(item.Scalar()) : absl::string_view();
      int32_t value = 0;
      if (!item.IsScalar() || !IsDecimalInteger(digits) || !absl::SimpleAtoi(digits, &value)) {
        return Invalid(item_path, absl::StrCat("expected a 32-bit integer, got ", Got(item)));
      }
      values.push_back(value);
    }
  }
  reflection->ClearField(message, field);
  for (int32_t value : values) reflection->AddInt32(message, field, value);
  return absl::OkStatus();
}

// Sets one field from its YAML value. Quoted and plain scalars are treated alike: the field's
// type decides, as protobuf's JSON parser does.
absl::Status SetField(const YAML::Node& node, const FieldDescriptor* field, Message* message,
                      const std::string& path) {
  const Reflection* reflection = message->GetReflection();
  if (field->is_repeated() && field->cpp_type() == FieldDescriptor::CPPTYPE_INT32) {
    return SetRepeatedInt32(node, field, message, path);
  }
  if (field->is_repeated() || field->cpp_type() == FieldDescriptor::CPPTYPE_ENUM) {
    // spec_test checks that JobSpec has no other such fields; supporting one means writing
    // its YAML form here and in Emit.
    return absl::InternalError(absl::StrCat(path, ": field kind not supported by the spec parser"));
  }
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    if (node.IsNull()) {
      reflection->MutableMessage(message, field);
      return absl::OkStatus();
    }
    if (!node.IsMap()) return WrongType(path, field, node);
    return FillMessage(node, reflection->MutableMessage(message, field), path);
  }
  if (!node.IsScalar()) return WrongType(path, field, node);
  const std::string& text = node.Scalar();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
      return SetInteger(text, field, message, path, node);
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT:
      return SetNumber(text, field, message, path, node);
    case FieldDescriptor::CPPTYPE_BOOL:
      if (text == "true" || text == "True" || text == "TRUE") {
        reflection->SetBool(message, field, true);
      } else if (text == "false" || text == "False" || text == "FALSE") {
        reflection->SetBool(message, field, false);
      } else {
        return WrongType(path, field, node);
      }
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_STRING:
      reflection->SetString(message, field, text);
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_MESSAGE:
    case FieldDescriptor::CPPTYPE_ENUM:
      break;
  }
  return absl::InternalError(absl::StrCat(path, ": unhandled field type"));
}

absl::Status FillMessage(const YAML::Node& node, Message* message, const std::string& path) {
  const Descriptor* descriptor = message->GetDescriptor();
  std::set<int> seen;
  for (const auto& entry : node) {
    const YAML::Node& key = entry.first;
    if (!key.IsScalar()) {
      return Invalid(path, absl::StrCat("keys must be field names, got ", Got(key)));
    }
    const FieldDescriptor* field = FindField(descriptor, key.Scalar());
    if (field == nullptr) {
      return Invalid(JoinPath(path, Shorten(key.Scalar())), UnknownField(descriptor, key.Scalar()));
    }
    const std::string field_path = JoinPath(path, field->name());
    if (!seen.insert(field->number()).second) return Invalid(field_path, "duplicate key");
    if (absl::Status status = SetField(entry.second, field, message, field_path); !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

// Counts a stream's documents without building them, and notices where yaml-cpp (0.7) stops
// making progress: on a ',' outside a flow collection its parser returns an empty document
// at the same place forever instead of failing, which YAML::LoadAll turns into an endless
// loop that allocates without bound.
class DocumentCounter final : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    stuck_ = documents_ > 0 && mark.pos == last_start_.pos;
    last_start_ = mark;
    ++documents_;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { last_null_ = mark; }
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

  int documents() const { return documents_; }
  bool stuck() const { return stuck_; }
  const YAML::Mark& stuck_at() const { return last_null_; }

 private:
  int documents_ = 0;
  bool stuck_ = false;
  YAML::Mark last_start_;
  YAML::Mark last_null_;
};

// Parses `text` as one YAML document; `what` names it in errors ("" for a spec document).
absl::StatusOr<YAML::Node> LoadYaml(absl::string_view text, absl::string_view path,
                                    absl::string_view what) {
  // More than this many documents is reported without counting on.
  constexpr int kMaxDocuments = 100;
  auto syntax_error = [&](const YAML::Mark& mark, absl::string_view msg) {
    return Invalid(path, absl::StrCat("YAML syntax error", what, " at line ", mark.line + 1,
                                      ", column ", mark.column + 1, ": ", msg));
  };
  const std::string owned(text);
  YAML::Node document;
  int documents = 0;
  try {
    std::istringstream stream(owned);
    YAML::Parser parser(stream);
    DocumentCounter counter;
    while (counter.documents() <= kMaxDocuments && parser.HandleNextDocument(counter)) {
      if (counter.stuck()) return syntax_error(counter.stuck_at(), "unexpected ','");
    }
    documents = counter.documents();
    if (documents == 1) document = YAML::Load(owned);
  } catch (const YAML::ParserException& e) {
    return syntax_error(e.mark, e.msg);
  } catch (const std::exception& e) {
    return Invalid(path, absl::StrCat("cannot read YAML", what, ": ", e.what()));
  }
  if (documents > kMaxDocuments) {
    return Invalid(
        path, absl::StrCat("more than ", kMaxDocuments, " YAML documents", what, "; expected one"));
  }
  if (documents > 1) {
    return Invalid(path, absl::StrCat(documents, " YAML documents", what, "; expected one"));
  }
  return document;
}

// Double and float text that reads back to the same value, as short as possible.
std::string FormatNumber(double value, bool is_float) {
  for (int digits = is_float ? 6 : 15; digits <= 17; ++digits) {
    std::string text = absl::StrFormat("%.*g", digits, value);
    double back = 0;
    if (absl::SimpleAtod(text, &back) &&
        (is_float ? static_cast<float>(back) == static_cast<float>(value) : back == value)) {
      return text;
    }
  }
  return absl::StrFormat("%.17g", value);
}

bool IsPlainSafe(absl::string_view text) {
  if (text.empty() || !(absl::ascii_isalpha(text[0]) || text[0] == '_' || text[0] == '/')) {
    return false;
  }
  for (char c : text) {
    if (!(absl::ascii_isalnum(c) || c == '_' || c == '-' || c == '.' || c == '/')) return false;
  }
  static const char* const kReserved[] = {"true", "false", "yes", "no", "on",
                                          "off",  "null",  "y",   "n"};
  const std::string lower = absl::AsciiStrToLower(text);
  for (const char* word : kReserved) {
    if (lower == word) return false;
  }
  return true;
}

std::string QuoteString(absl::string_view text) {
  if (IsPlainSafe(text)) return std::string(text);
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += absl::StrFormat("\\x%02x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += "\"";
  return out;
}

std::string ScalarText(const Message& message, const FieldDescriptor* field) {
  const Reflection* reflection = message.GetReflection();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return absl::StrCat(reflection->GetInt32(message, field));
    case FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(reflection->GetInt64(message, field));
    case FieldDescriptor::CPPTYPE_UINT32:
      return absl::StrCat(reflection->GetUInt32(message, field));
    case FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrCat(reflection->GetUInt64(message, field));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return FormatNumber(reflection->GetDouble(message, field), false);
    case FieldDescriptor::CPPTYPE_FLOAT:
      return FormatNumber(reflection->GetFloat(message, field), true);
    case FieldDescriptor::CPPTYPE_BOOL:
      return reflection->GetBool(message, field) ? "true" : "false";
    case FieldDescriptor::CPPTYPE_STRING:
      return QuoteString(reflection->GetString(message, field));
    case FieldDescriptor::CPPTYPE_ENUM:
      return reflection->GetEnum(message, field)->name();
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
  return "";
}

// Set fields in declaration order, sections as nested block mappings.
void Emit(const Message& message, int indent, std::string* out) {
  const Descriptor* descriptor = message.GetDescriptor();
  const Reflection* reflection = message.GetReflection();
  const std::string pad(indent, ' ');
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    if (field->is_repeated()) {
      const int n = reflection->FieldSize(message, field);
      if (n == 0 || field->cpp_type() != FieldDescriptor::CPPTYPE_INT32) continue;
      std::vector<int32_t> values;
      for (int j = 0; j < n; ++j) values.push_back(reflection->GetRepeatedInt32(message, field, j));
      absl::StrAppend(out, pad, field->name(), ": [", absl::StrJoin(values, ", "), "]\n");
      continue;
    }
    if (!reflection->HasField(message, field)) continue;
    if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) {
      absl::StrAppend(out, pad, field->name(), ": ", ScalarText(message, field), "\n");
      continue;
    }
    const Message& section = reflection->GetMessage(message, field);
    std::string body;
    Emit(section, indent + 2, &body);
    absl::StrAppend(out, pad, field->name(), body.empty() ? ": {}\n" : ":\n", body);
  }
}

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobSpecYaml(absl::string_view yaml) {
  if (yaml.size() > kMaxSpecBytes) {
    return Invalid(kRootPath, absl::StrCat("document is ", yaml.size(), " bytes, more than the ",
                                           kMaxSpecBytes, "-byte limit"));
  }
  absl::StatusOr<YAML::Node> root = LoadYaml(yaml, kRootPath, "");
  if (!root.ok()) return root.status();
  if (root->IsNull()) return Invalid(kRootPath, "empty document (expected a mapping of fields)");
  if (!root->IsMap()) {
    return Invalid(kRootPath, absl::StrCat("expected a mapping of fields, got ", Got(*root)));
  }
  v1::JobSpec spec;
  try {
    if (absl::Status status = FillMessage(*root, &spec, ""); !status.ok()) return status;
  } catch (const std::exception& e) {
    return Invalid(kRootPath, absl::StrCat("cannot read YAML: ", e.what()));
  }
  return spec;
}

absl::Status ApplyOverride(v1::JobSpec* spec, absl::string_view path_equals_value) {
  const size_t equals = path_equals_value.find('=');
  if (equals == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("override '", Shorten(path_equals_value),
                     "': expected PATH=VALUE, e.g. training.steps=50"));
  }
  const absl::string_view path = absl::StripAsciiWhitespace(path_equals_value.substr(0, equals));
  const absl::string_view value = path_equals_value.substr(equals + 1);
  if (path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("override '", Shorten(path_equals_value), "': empty field path before '='"));
  }
  if (value.size() > kMaxSpecBytes) {
    return Invalid(Shorten(path), absl::StrCat("value is ", value.size(), " bytes, more than the ",
                                               kMaxSpecBytes, "-byte limit"));
  }
  // Walk a copy so that a bad override leaves `spec` as it was.
  v1::JobSpec updated = *spec;
  Message* message = &updated;
  const FieldDescriptor* field = nullptr;
  std::string walked;
  const std::vector<absl::string_view> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].empty()) return Invalid(Shorten(path), "empty name in field path");
    if (field != nullptr) {
      if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) {
        return Invalid(Shorten(path),
                       absl::StrCat(walked, " is a value, not a section with fields"));
      }
      message = message->GetReflection()->MutableMessage(message, field);
    }
    field = FindField(message->GetDescriptor(), parts[i]);
    if (field == nullptr) {
      return Invalid(JoinPath(walked, Shorten(parts[i])),
                     UnknownField(message->GetDescriptor(), parts[i]));
    }
    walked = JoinPath(walked, field->name());
  }
  absl::StatusOr<YAML::Node> node = LoadYaml(value, walked, " in the value");
  if (!node.ok()) return node.status();
  try {
    if (absl::Status status = SetField(*node, field, message, walked); !status.ok()) {
      return status;
    }
  } catch (const std::exception& e) {
    return Invalid(walked, absl::StrCat("cannot read the value: ", e.what()));
  }
  *spec = std::move(updated);
  return absl::OkStatus();
}

absl::StatusOr<v1::JobSpec> LoadJobSpec(absl::string_view yaml,
                                        const std::vector<std::string>& overrides) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(yaml);
  if (!spec.ok()) return spec.status();
  for (const std::string& override_arg : overrides) {
    if (absl::Status status = ApplyOverride(&*spec, override_arg); !status.ok()) return status;
  }
  return ResolveJobSpec(*spec);
}

std::string JobSpecToYaml(const v1::JobSpec& spec) {
  std::string out;
  Emit(spec, 0, &out);
  return out.empty() ? "{}\n" : out;
}

}  // namespace boulder::common
