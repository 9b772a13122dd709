#include "worker/engine/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace boulder::engine {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

absl::Status Bad(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

size_t DTypeBytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" ||
      dtype == "F8_E5M2") {
    return 1;
  }
  return 0;
}

// A JSON number that is a non-negative integer below 2^53 (exact in a double).
bool AsIndex(const Value& v, int64_t* out) {
  if (v.kind_case() != Value::kNumberValue) return false;
  const double d = v.number_value();
  if (!(d >= 0 && d <= 9007199254740992.0) || d != static_cast<double>(static_cast<int64_t>(d))) {
    return false;
  }
  *out = static_cast<int64_t>(d);
  return true;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const std::string message = absl::StrCat(path, ": ", std::strerror(errno));
    return errno == ENOENT ? absl::NotFoundError(message) : absl::InvalidArgumentError(message);
  }
  std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (file.size() < 8) return Bad(path, absl::StrCat("only ", file.size(), " bytes"));
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data(), 8);
  if (header_len > kMaxSafetensorsHeaderBytes || header_len > file.size() - 8) {
    return Bad(path, absl::StrCat("header length ", header_len, " is larger than the file (",
                                  file.size(), " bytes) or the ", kMaxSafetensorsHeaderBytes,
                                  "-byte limit: not a safetensors file"));
  }
  Struct header;
  const auto parsed =
      google::protobuf::util::JsonStringToMessage(file.substr(8, header_len), &header);
  if (!parsed.ok()) {
    return Bad(path, absl::StrCat("header is not JSON: ", std::string(parsed.message())));
  }
  const size_t data_start = 8 + header_len;
  const size_t data_size = file.size() - data_start;
  SafetensorsContents out;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& [name, value] : header.fields()) {
    if (name == "__metadata__") {
      if (value.kind_case() != Value::kStructValue) return Bad(path, "__metadata__ is not a map");
      for (const auto& [k, v] : value.struct_value().fields()) {
        if (v.kind_case() != Value::kStringValue) {
          return Bad(path, absl::StrCat("__metadata__.", k, " is not a string"));
        }
        out.metadata[k] = v.string_value();
      }
      continue;
    }
    const std::string where = absl::StrCat("tensor ", name);
    if (value.kind_case() != Value::kStructValue)
      return Bad(path, absl::StrCat(where, ": not a map"));
    const auto& f = value.struct_value().fields();
    auto dtype = f.find("dtype");
    auto shape = f.find("shape");
    auto offsets = f.find("data_offsets");
    if (dtype == f.end() || shape == f.end() || offsets == f.end() ||
        dtype->second.kind_case() != Value::kStringValue ||
        shape->second.kind_case() != Value::kListValue ||
        offsets->second.kind_case() != Value::kListValue ||
        offsets->second.list_value().values_size() != 2) {
      return Bad(path, absl::StrCat(where, ": needs dtype, shape and data_offsets [begin, end]"));
    }
    SafeTensor t;
    t.dtype = dtype->second.string_value();
    const size_t elem = DTypeBytes(t.dtype);
    if (elem == 0) return Bad(path, absl::StrCat(where, ": unknown dtype '", t.dtype, "'"));
    uint64_t numel = 1;
    for (const Value& d : shape->second.list_value().values()) {
      int64_t dim = 0;
      if (!AsIndex(d, &dim)) return Bad(path, absl::StrCat(where, ": bad shape"));
      t.shape.push_back(dim);
      numel *= static_cast<uint64_t>(dim);
      if (numel > data_size) return Bad(path, absl::StrCat(where, ": shape larger than the file"));
    }
    int64_t begin = 0, end = 0;
    if (!AsIndex(offsets->second.list_value().values(0), &begin) ||
        !AsIndex(offsets->second.list_value().values(1), &end) || begin > end ||
        static_cast<uint64_t>(end) > data_size) {
      return Bad(path, absl::StrCat(where, ": data_offsets outside the ", data_size,
                                    "-byte data section"));
    }
    if (static_cast<uint64_t>(end - begin) != numel * elem) {
      return Bad(path, absl::StrCat(where, ": ", end - begin, " bytes for ", t.dtype, " ",
                                    ShapeText(t.shape), " (expected ", numel * elem, ")"));
    }
    ranges.emplace_back(begin, end);
    t.bytes.assign(file.begin() + data_start + begin, file.begin() + data_start + end);
    out.tensors.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) return Bad(path, "tensors' data overlap");
  }
  return out;
}

absl::StatusOr<std::vector<float>> ToFloat32(const SafeTensor& t, const std::string& name) {
  std::vector<float> out;
  if (t.dtype == "F32") {
    out.resize(t.bytes.size() / 4);
    std::memcpy(out.data(), t.bytes.data(), out.size() * 4);
  } else if (t.dtype == "BF16") {
    out.resize(t.bytes.size() / 2);
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, t.bytes.data() + 2 * i, 2);
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      std::memcpy(&out[i], &bits, 4);
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": dtype ", t.dtype, " is not supported (F32 or BF16)"));
  }
  return out;
}

absl::Status WriteSafetensors(const std::string& path, const SafetensorsContents& contents) {
  std::string header = "{";
  if (!contents.metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : contents.metadata) {
      // Metadata here is ours (plain ASCII keys and values); quote and backslash still escape.
      auto quote = [](const std::string& s) {
        std::string q = "\"";
        for (char c : s) {
          if (c == '"' || c == '\\') q += '\\';
          q += c;
        }
        return q + "\"";
      };
      absl::StrAppend(&header, first ? "" : ",", quote(k), ":", quote(v));
      first = false;
    }
    header += "}";
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : contents.tensors) {
    absl::StrAppend(&header, header.size() > 1 ? "," : "", "\"", name, "\":{\"dtype\":\"", t.dtype,
                    "\",\"shape\":", ShapeText(t.shape), ",\"data_offsets\":[", offset, ",",
                    offset + t.bytes.size(), "]}");
    offset += t.bytes.size();
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  const uint64_t len = header.size();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::InternalError(absl::StrCat(path, ": ", std::strerror(errno)));
  bool ok = std::fwrite(&len, 8, 1, f) == 1;
  ok = ok && std::fwrite(header.data(), 1, header.size(), f) == header.size();
  for (const auto& [name, t] : contents.tensors) {
    ok = ok && std::fwrite(t.bytes.data(), 1, t.bytes.size(), f) == t.bytes.size();
  }
  if (std::fclose(f) != 0) ok = false;
  if (!ok) return absl::InternalError(absl::StrCat(path, ": write failed: ", std::strerror(errno)));
  return absl::OkStatus();
}

namespace {

bool IsConv1D(TensorKind kind) {
  return kind == TensorKind::kQkvWeight || kind == TensorKind::kAttnProjWeight ||
         kind == TensorKind::kFc1Weight || kind == TensorKind::kFc2Weight;
}

bool IsVocabRows(TensorKind kind) {
  return kind == TensorKind::kWte || kind == TensorKind::kLmHead;
}

// The tensor's shape in the file.
std::vector<int64_t> FileShape(const TensorInfo& t, int vocab) {
  if (IsConv1D(t.kind)) return {t.shape[1], t.shape[0]};
  if (IsVocabRows(t.kind)) return {vocab, t.shape[1]};
  return t.shape;
}

}  // namespace

absl::StatusOr<std::vector<float>> LoadGpt2Safetensors(const std::string& path,
                                                       const ParamLayout& layout) {
  absl::StatusOr<SafetensorsContents> contents = ReadSafetensors(path);
  if (!contents.ok()) return contents.status();
  // Strip "transformer." from every name that has it.
  std::map<std::string, const SafeTensor*> by_name;
  for (const auto& [name, t] : contents->tensors) {
    const std::string key =
        absl::StartsWith(name, "transformer.") ? name.substr(strlen("transformer.")) : name;
    if (!by_name.emplace(key, &t).second) {
      return Bad(path, absl::StrCat("tensor ", key, " appears with and without 'transformer.'"));
    }
  }
  const int V = layout.config().vocab_size;
  std::vector<float> flat(layout.num_params(), 0.0f);
  std::set<std::string> used;
  std::vector<std::string> missing;
  for (const TensorInfo& info : layout.tensors()) {
    auto it = by_name.find(info.name);
    if (it == by_name.end()) {
      missing.push_back(info.name);
      continue;
    }
    used.insert(info.name);
    const std::vector<int64_t> want = FileShape(info, V);
    if (it->second->shape != want) {
      return Bad(path, absl::StrCat("tensor ", info.name, ": shape ", ShapeText(it->second->shape),
                                    " does not fit the model (", ShapeText(want), ")"));
    }
    absl::StatusOr<std::vector<float>> values = ToFloat32(*it->second, info.name);
    if (!values.ok()) return Bad(path, values.status().message());
    float* dst = flat.data() + info.offset;
    if (IsConv1D(info.kind)) {  // file [in, out] -> ours [out, in]
      const int64_t out = info.shape[0], in = info.shape[1];
      for (int64_t i = 0; i < in; ++i) {
        for (int64_t o = 0; o < out; ++o) dst[o * in + i] = (*values)[i * out + o];
      }
    } else {
      std::copy(values->begin(), values->end(), dst);  // vocab rows: padding stays 0
    }
  }
  if (!missing.empty()) {
    return Bad(path, absl::StrCat("missing tensor", missing.size() > 1 ? "s " : " ",
                                  absl::StrJoin(missing, ", "),
                                  " (GPT-2 names, optionally prefixed 'transformer.')"));
  }
  std::vector<std::string> extra;
  for (const auto& [name, t] : by_name) {
    if (used.count(name) != 0) continue;
    // Causal-mask buffers, not parameters.
    if (absl::StartsWith(name, "h.") &&
        (absl::EndsWith(name, ".attn.bias") || absl::EndsWith(name, ".attn.masked_bias"))) {
      continue;
    }
    if (name == "lm_head.weight" && layout.config().tie_embeddings) {
      absl::StatusOr<std::vector<float>> head = ToFloat32(*t, name);
      const size_t C = layout.config().hidden;
      const float* wte = flat.data() + layout.Offset(TensorKind::kWte);
      if (head.ok() && head->size() == static_cast<size_t>(V) * C &&
          std::equal(head->begin(), head->end(), wte)) {
        continue;
      }
      return Bad(path,
                 "lm_head.weight differs from wte.weight, but model.tie_embeddings is true "
                 "(set model.tie_embeddings: false to load a separate head)");
    }
    extra.push_back(name);
  }
  if (!extra.empty()) {
    return Bad(path,
               absl::StrCat("unexpected tensor", extra.size() > 1 ? "s " : " ",
                            absl::StrJoin(extra, ", "), " (the model has ", layout.config().layers,
                            " layers", layout.config().tie_embeddings ? ", a tied head" : "", ")"));
  }
  return flat;
}

absl::Status WriteGpt2Safetensors(const std::string& path, const ParamLayout& layout,
                                  const std::vector<float>& params) {
  const int V = layout.config().vocab_size;
  SafetensorsContents contents;
  contents.metadata["format"] = "pt";
  for (const TensorInfo& info : layout.tensors()) {
    SafeTensor t;
    t.dtype = "F32";
    t.shape = FileShape(info, V);
    size_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<size_t>(d);
    std::vector<float> values(numel);
    const float* src = params.data() + info.offset;
    if (IsConv1D(info.kind)) {
      const int64_t out = info.shape[0], in = info.shape[1];
      for (int64_t i = 0; i < in; ++i) {
        for (int64_t o = 0; o < out; ++o) values[i * out + o] = src[o * in + i];
      }
    } else {
      std::copy(src, src + numel, values.begin());
    }
    t.bytes.resize(numel * 4);
    std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
    const std::string name =
        info.kind == TensorKind::kLmHead ? info.name : absl::StrCat("transformer.", info.name);
    contents.tensors.emplace(name, std::move(t));
  }
  return WriteSafetensors(path, contents);
}

}  // namespace boulder::engine
