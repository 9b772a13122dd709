#include "worker/engine/tokens_tool.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/engine/token_files.h"

namespace boulder::engine {
namespace {

// Collects tokens into shards: val first, then train.
class ShardSink {
 public:
  ShardSink(const TokensToolOptions& o, TokensToolResult* result) : o_(o), result_(result) {}

  absl::Status Add(int32_t token) {
    buffer_.push_back(token);
    ++in_section_;
    const bool val = in_val_;
    if ((val && in_section_ == o_.val_tokens) ||
        static_cast<int64_t>(buffer_.size()) == o_.shard_tokens) {
      if (absl::Status s = Flush(); !s.ok()) return s;
      if (val && in_section_ == o_.val_tokens) {
        in_val_ = false;
        in_section_ = 0;
      }
    }
    return absl::OkStatus();
  }

  absl::Status Flush() {
    if (buffer_.empty()) return absl::OkStatus();
    std::vector<std::string>& files = in_val_ ? result_->val_files : result_->train_files;
    const std::string path =
        absl::StrFormat("%s_%s_%06d.bin", o_.prefix, in_val_ ? "val" : "train", files.size());
    if (absl::Status s = WriteTokenFile(path, buffer_); !s.ok()) return s;
    files.push_back(path);
    (in_val_ ? result_->val_tokens : result_->train_tokens) += buffer_.size();
    buffer_.clear();
    return absl::OkStatus();
  }

 private:
  const TokensToolOptions& o_;
  TokensToolResult* result_;
  std::vector<int32_t> buffer_;
  bool in_val_ = o_.val_tokens > 0;
  int64_t in_section_ = 0;
};

absl::Status ReadError(const std::string& path) {
  const std::string message = absl::StrCat(path, ": ", std::strerror(errno));
  return errno == ENOENT ? absl::NotFoundError(message) : absl::InternalError(message);
}

// Calls `on_byte` for every byte of the file, with its offset.
absl::Status ForEachByte(const std::string& path,
                         const std::function<absl::Status(uint8_t, int64_t)>& on_byte) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return ReadError(path);
  std::vector<uint8_t> chunk(1 << 20);
  int64_t offset = 0;
  absl::Status status;
  while (status.ok()) {
    const size_t n = std::fread(chunk.data(), 1, chunk.size(), f);
    for (size_t i = 0; i < n && status.ok(); ++i) status = on_byte(chunk[i], offset++);
    if (n < chunk.size()) {
      if (std::ferror(f)) status = ReadError(path);
      break;
    }
  }
  std::fclose(f);
  return status;
}

}  // namespace

absl::StatusOr<TokensToolResult> RunTokensTool(const TokensToolOptions& o) {
  if (o.text_path.empty() == o.ids_path.empty()) {
    return absl::InvalidArgumentError("give exactly one input: --text FILE or --ids FILE");
  }
  if (o.prefix.empty()) return absl::InvalidArgumentError("--output PREFIX: empty");
  if (o.shard_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shard-tokens: must be at least 1, got ", o.shard_tokens));
  }
  if (o.shard_tokens > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shard-tokens: at most ", INT32_MAX, " (the header's count is int32)"));
  }
  if (o.val_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--val-tokens: must be at least 0, got ", o.val_tokens));
  }
  TokensToolResult result;
  ShardSink sink(o, &result);
  absl::Status status;
  if (!o.text_path.empty()) {
    status = ForEachByte(o.text_path, [&](uint8_t byte, int64_t) { return sink.Add(byte); });
  } else {
    int64_t value = -1, start = 0;
    auto finish = [&]() -> absl::Status {
      if (value < 0) return absl::OkStatus();
      if (value > 65535) {
        return absl::InvalidArgumentError(absl::StrCat(o.ids_path, ": byte offset ", start, ": id ",
                                                       value, " is outside [0, 65535]"));
      }
      absl::Status s = sink.Add(static_cast<int32_t>(value));
      value = -1;
      return s;
    };
    status = ForEachByte(o.ids_path, [&](uint8_t c, int64_t offset) -> absl::Status {
      if (c >= '0' && c <= '9') {
        if (value < 0) {
          value = 0;
          start = offset;
        }
        value = std::min<int64_t>(value * 10 + (c - '0'), 1 << 20);
        return absl::OkStatus();
      }
      if (c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == ',') return finish();
      return absl::InvalidArgumentError(
          absl::StrCat(o.ids_path, ": byte offset ", offset, ": unexpected character '",
                       absl::CHexEscape(std::string(1, static_cast<char>(c))),
                       "' (expected decimal ids separated by whitespace or commas)"));
    });
    if (status.ok()) status = finish();
  }
  if (status.ok()) status = sink.Flush();
  if (!status.ok()) return status;
  if (result.train_tokens == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("no training tokens: the input has ", result.val_tokens,
                     " tokens and --val-tokens takes ", o.val_tokens));
  }
  return result;
}

}  // namespace boulder::engine
