// boulder-trainer: one training process. Spawned by the worker agent (with --report-fd and the
// job's identity), or run by hand on a spec file to train standalone.
//
// Exit codes: 0 trained; 1 training failed (the error is also sent on --report-fd);
// 2 bad flags or spec; 128+signal when stopped by SIGTERM/SIGINT.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/env.h"
#include "common/grpc_security.h"
#include "common/spec.h"
#include "worker/engine/report_format.h"
#include "worker/engine/trainer.h"

namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};

void OnSignal(int sig) {
  g_signal.store(sig);
  g_stop.store(true);
}

void Fail(const std::string& message) {
  std::fprintf(stderr, "boulder-trainer: %s\n", message.c_str());
}

// Writes whole TrainerMessages as JSON lines to the agent's pipe.
class ReportWriter {
 public:
  explicit ReportWriter(int fd) : fd_(fd) {}

  // False (and stops training) when the reader is gone.
  bool Write(const boulder::v1::TrainerMessage& message) {
    if (fd_ < 0 || failed_) return !failed_;
    absl::StatusOr<std::string> line = boulder::engine::ToJsonLine(message);
    if (!line.ok()) return Failed(std::string(line.status().message()));
    // One write per line: lines under PIPE_BUF reach a pipe's reader whole.
    size_t done = 0;
    while (done < line->size()) {
      const ssize_t n = write(fd_, line->data() + done, line->size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Failed(absl::StrCat("--report-fd ", fd_, ": ", std::strerror(errno)));
      done += static_cast<size_t>(n);
    }
    return true;
  }

  bool failed() const { return failed_; }
  const std::string& error() const { return error_; }

 private:
  bool Failed(std::string error) {
    failed_ = true;
    error_ = std::move(error);
    g_stop.store(true);
    return false;
  }

  int fd_;
  bool failed_ = false;
  std::string error_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"boulder-trainer: trains one job (standalone or under a boulder worker)"};
  std::string spec_path;
  std::vector<std::string> sets;
  std::string backend;
  int threads = 0;
  int report_fd = -1;
  int64_t job_id = 0;
  int attempt = 0, rank = 0, world_size = 1;
  bool quiet = false;
  std::string checkpoint_dir;
  std::string coordinator, comm_host;
  app.add_option("--spec", spec_path, "job spec file (YAML or JSON)")->required();
  app.add_option("--set", sets, "override one spec field: PATH=VALUE (repeatable)");
  app.add_option("--backend", backend, "auto|cpu|cuda (default: the spec's resources.backend)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--threads", threads, "CPU threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--report-fd", report_fd, "also write TrainerMessage JSON lines to this fd");
  app.add_option("--job-id", job_id, "job id copied into step reports");
  app.add_option("--attempt", attempt, "attempt copied into step reports");
  app.add_option("--rank", rank, "this process's rank");
  app.add_option("--world-size", world_size, "number of ranks");
  app.add_option("--checkpoint-dir", checkpoint_dir,
                 "resume from the newest valid checkpoint here and write the spec's "
                 "checkpoint.every_steps checkpoints here (default: none)");
  std::string weights_out;
  app.add_option("--weights-out", weights_out,
                 "write the trained weights here (safetensors, Hugging Face GPT-2 names)");
  bool eval_only = false;
  app.add_flag("--eval-only", eval_only,
               "only report the loss on eval.token_files (of model.init_from's weights)");
  app.add_option("--coordinator", coordinator,
                 "coordinator HOST:PORT for the data-parallel rendezvous (world size > 1)");
  app.add_option("--comm-host", comm_host,
                 "address this rank's Gloo listens on (default: 127.0.0.1 for a loopback "
                 "coordinator, else the host name)");
  // The rendezvous's connection to the coordinator, as the worker agent's (it passes its own).
  boulder::common::ChannelSecurityOptions security;
  std::string join_token_file;
  app.add_option("--tls-ca", security.ca_file,
                 "PEM CA bundle that signed the coordinator's certificate (default: system roots)");
  app.add_option("--tls-cert", security.cert_file, "PEM client certificate (mutual TLS)");
  app.add_option("--tls-key", security.key_file, "PEM private key of --tls-cert");
  app.add_option("--tls-server-name", security.server_name_override,
                 "verify the coordinator's certificate for this name instead of the host");
  app.add_option("--join-token-file", join_token_file,
                 std::string("file holding the worker join token for the rendezvous (default: $") +
                     boulder::common::kEnvJoinToken + ")");
  app.add_flag("--insecure", security.insecure,
               "plaintext gRPC to the coordinator's rendezvous, without TLS");
  app.add_flag("--quiet", quiet, "print nothing on stdout");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }

  if (report_fd >= 0 && fcntl(report_fd, F_GETFD) < 0) {
    Fail(absl::StrCat("--report-fd ", report_fd, ": ", std::strerror(errno)));
    return 2;
  }
  ReportWriter writer(report_fd);
  auto fatal = [&writer](const std::string& message, int code) {
    Fail(message);
    boulder::v1::TrainerMessage m;
    m.set_error(message);
    writer.Write(m);
    return code;
  };

  std::ifstream in(spec_path, std::ios::binary);
  if (!in) return fatal(absl::StrCat(spec_path, ": ", std::strerror(errno)), 2);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > boulder::common::kMaxSpecBytes) {
    return fatal(
        absl::StrCat(spec_path, ": larger than ", boulder::common::kMaxSpecBytes, " bytes"), 2);
  }
  absl::StatusOr<boulder::v1::JobSpec> spec = boulder::common::LoadJobSpec(text, sets);
  if (!spec.ok()) return fatal(absl::StrCat(spec_path, ": ", spec.status().message()), 2);

  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  // A vanished reader shows up as EPIPE from write(), handled by ReportWriter.
  std::signal(SIGPIPE, SIG_IGN);

  boulder::engine::TrainerOptions options;
  options.spec = *spec;
  options.backend = backend;
  options.threads = threads;
  options.job_id = job_id;
  options.attempt = attempt;
  options.rank = rank;
  options.world_size = world_size;
  options.coordinator = coordinator;
  options.comm_host = comm_host;
  if (!coordinator.empty()) {
    absl::StatusOr<std::string> token = boulder::common::LoadToken(
        join_token_file, boulder::common::kEnvJoinToken, "--join-token-file");
    if (!token.ok()) return fatal(std::string(token.status().message()), 2);
    security.token = *std::move(token);
  }
  options.security = std::move(security);
  options.stop = &g_stop;
  options.weights_out = weights_out;
  options.eval_only = eval_only;
  const char* profile = std::getenv(boulder::common::kEnvProfileKernels);
  options.profile_kernels = profile != nullptr && std::string(profile) != "0";
  options.checkpoint_dir = checkpoint_dir;
  // On stderr, which the agent forwards to the job's log even from a --quiet trainer.
  options.on_notice = [](absl::string_view line) {
    std::fprintf(stderr, "boulder-trainer: %.*s\n", static_cast<int>(line.size()), line.data());
    std::fflush(stderr);
  };
  options.on_info = [quiet](absl::string_view line) {
    if (!quiet) std::printf("%.*s\n", static_cast<int>(line.size()), line.data());
    std::fflush(stdout);
  };
  options.on_step = [&](const boulder::v1::StepReport& r) {
    if (!quiet) std::printf("%s\n", boulder::engine::FormatStepLine(r).c_str());
    std::fflush(stdout);
    boulder::v1::TrainerMessage m;
    *m.mutable_step() = r;
    writer.Write(m);
  };
  const int vocab = spec->model().vocab_size();
  options.on_generation = [&](const boulder::v1::GenerationResult& g) {
    if (!quiet) std::printf("%s", boulder::engine::FormatGeneration(g, vocab).c_str());
    std::fflush(stdout);
    boulder::v1::TrainerMessage m;
    *m.mutable_generation() = g;
    writer.Write(m);
  };

  const absl::Status status = boulder::engine::RunTrainer(options);
  if (writer.failed()) return fatal(writer.error(), 1);
  if (status.ok()) return 0;
  if (absl::IsCancelled(status) && g_signal.load() != 0) {
    Fail(std::string(status.message()));
    return 128 + g_signal.load();
  }
  return fatal(std::string(status.message()), 1);
}
