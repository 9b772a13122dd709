// The `boulder` commands, one Run function each. main.cc turns flags into these Options;
// tests call the Run functions directly with string streams.
//
// Every Run function returns the process exit code (kExit*), writes results to io.out and
// exactly one "boulder: <message>" line per error to io.err, and never throws.
// Thread-compatible: one command runs on one thread.
#ifndef BOULDER_CLIENT_COMMANDS_H_
#define BOULDER_CLIENT_COMMANDS_H_

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/connection.h"

namespace boulder::client {

// Exit codes. `watch` and `submit --follow` exit with the job's outcome instead:
// kExitOk when it SUCCEEDED, kExitError when it FAILED, kExitCancelled when CANCELLED.
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitCancelled = 2;

// Where a command writes, and what it knows about the terminal.
struct Io {
  std::ostream* out = nullptr;  // not owned; REQUIRES: non-null
  std::ostream* err = nullptr;  // not owned; REQUIRES: non-null
  // Whether `out` is a terminal: progress is then redrawn in place rather than printed as
  // one throttled line per step report.
  bool out_is_terminal = false;
  // Size of that terminal in columns and lines (ignored when not a terminal); the live
  // loss chart under the progress bar is fitted to them.
  int terminal_width = 80;
  int terminal_height = 24;
  // The current time: for ages and for throttling progress lines.
  std::function<absl::Time()> clock = [] { return absl::Now(); };
  // Zone of the times shown by `get`.
  absl::TimeZone zone = absl::LocalTimeZone();
};

enum class OutputFormat {
  kHuman,  // the table (jobs, workers) or the description (get)
  kJson,
  kYaml,
};

struct WatchOptions {
  int64_t job_id = 0;
  // How long to keep reconnecting after the event stream breaks (e.g. a coordinator restart)
  // before giving up with an error.
  absl::Duration reconnect_timeout = absl::Seconds(60);
  // Tokens of the prompt and of the generation shown on the final line (0: all).
  size_t max_tokens_shown = 16;
};

struct SubmitOptions {
  std::string file;                    // path of the YAML spec
  std::vector<std::string> overrides;  // "path=value", applied by the coordinator in order
  bool quiet = false;   // print only the job id, not "job 7 submitted (minigpt, QUEUED)"
  bool follow = false;  // then follow the job like `watch`
  WatchOptions watch;   // job_id is ignored (the submitted job's is used)
};

struct JobsOptions {
  OutputFormat format = OutputFormat::kHuman;  // kHuman or kJson
  std::vector<std::string> states;             // state names, any case; empty: all
};

struct GetOptions {
  int64_t job_id = 0;
  OutputFormat format = OutputFormat::kHuman;
  bool fp8 = false;  // print the FP8 statistics table instead (human format only)
};

struct LogsOptions {
  int64_t job_id = 0;
  bool follow = false;  // keep printing new lines until the job ends
  absl::Duration reconnect_timeout = absl::Seconds(60);
};

struct CancelOptions {
  int64_t job_id = 0;
};

struct WorkersOptions {
  OutputFormat format = OutputFormat::kHuman;  // kHuman or kJson
};

struct PlotOptions {
  int64_t job_id = 0;
  // Where the SVG goes; "-" for io.out.
  std::string output = "loss.svg";
  // How long reading the job's step reports may take before giving up.
  absl::Duration timeout = absl::Seconds(120);
};

struct ExportOptions {
  int64_t job_id = 0;
  std::string format = "safetensors";  // the only one
  std::string output;                  // REQUIRES: non-empty
};

struct TopOptions {
  // Time between refreshes on a terminal.
  absl::Duration interval = absl::Seconds(1);
  // On a terminal: waits up to the given time for the user to quit (q, Ctrl-C) and returns
  // whether they did. Unset: never quits early, so `top` refreshes until killed.
  std::function<bool(absl::Duration)> wait_for_quit;
  // On a terminal: the current width and height, asked before each refresh so that a resized
  // window is filled. Unset: io.terminal_width and io.terminal_height.
  std::function<void(int* width, int* height)> terminal_size;
};

int RunSubmit(const ConnectOptions& connect, const SubmitOptions& options, const Io& io);
int RunJobs(const ConnectOptions& connect, const JobsOptions& options, const Io& io);
int RunGet(const ConnectOptions& connect, const GetOptions& options, const Io& io);
int RunWatch(const ConnectOptions& connect, const WatchOptions& options, const Io& io);
int RunLogs(const ConnectOptions& connect, const LogsOptions& options, const Io& io);
int RunCancel(const ConnectOptions& connect, const CancelOptions& options, const Io& io);
int RunWorkers(const ConnectOptions& connect, const WorkersOptions& options, const Io& io);
// Writes the job's loss (and learning rate) curves from its step reports so far as an SVG,
// then "wrote loss.svg (200 steps)" on io.out (unless the SVG went to io.out). A job without
// step reports is an error.
int RunPlot(const ConnectOptions& connect, const PlotOptions& options, const Io& io);
// On a terminal: the top_view.h screen on the alternate screen, refreshed every
// options.interval until options.wait_for_quit says so; a failed refresh shows its error on
// the screen and the next one tries again. Otherwise: the screen once, and the error as
// usual.
int RunTop(const ConnectOptions& connect, const TopOptions& options, const Io& io);
// Downloads the job's trained weights (safetensors, Hugging Face GPT-2 names) to
// options.output, then "wrote FILE (SIZE, job N, safetensors)". FAILED_PRECONDITION from the
// coordinator while the job has no weights (still running, or failed before writing them).
int RunExport(const ConnectOptions& connect, const ExportOptions& options, const Io& io);

}  // namespace boulder::client

#endif  // BOULDER_CLIENT_COMMANDS_H_
