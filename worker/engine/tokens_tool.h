// boulder-tokens: writes llm.c .bin token shards (see token_files.h) from a text file, with a
// byte-level tokenizer (each byte is a token, vocab 256), or from a file of integer token ids
// (decimal, separated by whitespace or commas).
//
// Output: the first val_tokens tokens go to PREFIX_val_000000.bin (and further val shards),
// the rest to PREFIX_train_000000.bin, PREFIX_train_000001.bin, ... of at most shard_tokens
// tokens each. The input is streamed: memory stays O(shard_tokens).
#ifndef BOULDER_WORKER_ENGINE_TOKENS_TOOL_H_
#define BOULDER_WORKER_ENGINE_TOKENS_TOOL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace boulder::engine {

struct TokensToolOptions {
  std::string text_path;  // byte-level tokenization of this file; or
  std::string ids_path;   // integer ids, in [0, 65535]
  std::string prefix;     // output path prefix
  int64_t shard_tokens = 100'000'000;
  int64_t val_tokens = 0;
};

struct TokensToolResult {
  std::vector<std::string> train_files;
  std::vector<std::string> val_files;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
};

// INVALID_ARGUMENT: not exactly one input, shard_tokens < 1, val_tokens < 0, a malformed id or
// an id outside [0, 65535] (naming the file and the id's byte offset), no training tokens.
// NOT_FOUND / INTERNAL for I/O errors (naming the path).
absl::StatusOr<TokensToolResult> RunTokensTool(const TokensToolOptions& options);

}  // namespace boulder::engine

#endif  // BOULDER_WORKER_ENGINE_TOKENS_TOOL_H_
