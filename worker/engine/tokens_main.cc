// boulder-tokens: makes llm.c .bin token shards for data.source token_files (see
// tokens_tool.h). Exit codes: 0 written; 1 failed; 2 bad flags.
#include <cstdio>
#include <string>

#include "CLI/CLI.hpp"
#include "worker/engine/tokens_tool.h"

int main(int argc, char** argv) {
  CLI::App app{
      "boulder-tokens: writes llm.c .bin token shards from text (byte-level tokens, vocab 256) "
      "or from integer token ids"};
  boulder::engine::TokensToolOptions o;
  auto* text = app.add_option("--text", o.text_path, "text file: every byte is one token (0-255)");
  app.add_option("--ids", o.ids_path, "file of decimal token ids (0-65535), whitespace/commas")
      ->excludes(text);
  app.add_option("-o,--output", o.prefix, "output prefix: PREFIX_train_000000.bin, ...")
      ->required();
  app.add_option("--shard-tokens", o.shard_tokens, "tokens per shard (default 100000000)");
  app.add_option("--val-tokens", o.val_tokens,
                 "the first N tokens go to PREFIX_val_*.bin (default 0)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  auto result = boulder::engine::RunTokensTool(o);
  if (!result.ok()) {
    std::fprintf(stderr, "boulder-tokens: %s\n", std::string(result.status().message()).c_str());
    return result.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  for (const std::string& f : result->val_files) std::printf("%s\n", f.c_str());
  for (const std::string& f : result->train_files) std::printf("%s\n", f.c_str());
  std::printf("%lld train tokens in %zu shards, %lld val tokens in %zu shards\n",
              static_cast<long long>(result->train_tokens), result->train_files.size(),
              static_cast<long long>(result->val_tokens), result->val_files.size());
  return 0;
}
