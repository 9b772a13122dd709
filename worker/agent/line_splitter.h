// Splits a byte stream (a pipe from the trainer) into lines, bounding memory: a line longer
// than the limit is cut, its head delivered with `truncated` set and the rest discarded up to
// the next newline. "\n" ends a line; a trailing "\r" is dropped.
//
// Not thread-safe: one splitter per stream, used by the thread that reads it.
#ifndef BOULDER_WORKER_AGENT_LINE_SPLITTER_H_
#define BOULDER_WORKER_AGENT_LINE_SPLITTER_H_

#include <cstddef>
#include <functional>
#include <string>

#include "absl/strings/string_view.h"

namespace boulder::agent {

class LineSplitter {
 public:
  // Receives each line without its terminator. The view is valid only during the call.
  using Emit = std::function<void(absl::string_view line, bool truncated)>;

  // REQUIRES: max_line_bytes > 0.
  explicit LineSplitter(size_t max_line_bytes);

  // Consumes `bytes`; emits every line they complete.
  void Append(absl::string_view bytes, const Emit& emit);

  // At end of stream: emits the unterminated last line, if any.
  void Finish(const Emit& emit);

 private:
  void EmitPending(const Emit& emit);

  const size_t max_line_bytes_;
  std::string pending_;
  bool pending_truncated_ = false;  // pending_ holds a cut line's head: skip to the newline
};

}  // namespace boulder::agent

#endif  // BOULDER_WORKER_AGENT_LINE_SPLITTER_H_
