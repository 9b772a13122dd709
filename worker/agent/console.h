// Where the agent's lines go by default: user-facing lines to stdout, diagnostics to stderr
// with a timestamp. One mutex keeps lines from different threads whole.
#ifndef BOULDER_WORKER_AGENT_CONSOLE_H_
#define BOULDER_WORKER_AGENT_CONSOLE_H_

#include "absl/strings/string_view.h"

namespace boulder::agent {

// Thread-safe; each call writes one line and flushes it.
void PrintToStdout(absl::string_view line);
// "2026-12-02 10:11:12.345 boulder-worker: <line>" on stderr. Thread-safe.
void LogToStderr(absl::string_view line);

}  // namespace boulder::agent

#endif  // BOULDER_WORKER_AGENT_CONSOLE_H_
