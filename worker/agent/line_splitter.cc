#include "worker/agent/line_splitter.h"

#include <cassert>

namespace boulder::agent {

LineSplitter::LineSplitter(size_t max_line_bytes) : max_line_bytes_(max_line_bytes) {
  assert(max_line_bytes_ > 0);
}

void LineSplitter::EmitPending(const Emit& emit) {
  absl::string_view line = pending_;
  if (!pending_truncated_ && !line.empty() && line.back() == '\r') line.remove_suffix(1);
  emit(line, pending_truncated_);
  pending_.clear();
  pending_truncated_ = false;
}

void LineSplitter::Append(absl::string_view bytes, const Emit& emit) {
  while (!bytes.empty()) {
    const size_t newline = bytes.find('\n');
    const absl::string_view piece = bytes.substr(0, newline);
    if (!pending_truncated_) {
      const size_t room = max_line_bytes_ - pending_.size();
      if (piece.size() <= room) {
        pending_.append(piece.data(), piece.size());
      } else {
        pending_.append(piece.data(), room);
        pending_truncated_ = true;
      }
    }
    if (newline == absl::string_view::npos) return;
    EmitPending(emit);
    bytes.remove_prefix(newline + 1);
  }
}

void LineSplitter::Finish(const Emit& emit) {
  if (!pending_.empty() || pending_truncated_) EmitPending(emit);
}

}  // namespace boulder::agent
