// The `boulder` CLI: flags -> Options -> the Run functions of client/commands.h.
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "client/commands.h"
#include "client/connection.h"
#include "client/keyboard.h"
#include "common/env.h"
#include "common/grpc_security.h"

namespace boulder::client {
namespace {

// The terminal's columns and lines; 80x24 where the terminal does not say.
void TerminalSize(int* width, int* height) {
  winsize size{};
  const bool known = ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0;
  *width = known && size.ws_col > 0 ? size.ws_col : 80;
  *height = known && size.ws_row > 0 ? size.ws_row : 24;
}

void AddJobId(CLI::App* command, int64_t* job_id) {
  const CLI::Validator positive_id(
      [](std::string& text) -> std::string {
        int64_t id = 0;
        if (absl::SimpleAtoi(text, &id) && id > 0) return "";
        return "expected a job id (a positive integer), got '" + text + "'";
      },
      "ID");
  command->add_option("JOB", *job_id, "job id")->required()->check(positive_id);
}

// CLI11 reports an unknown command as a missing one; name it instead. Returns the first
// argument that is neither an option nor an option's value when it is not a command.
std::string UnknownCommand(const CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--coordinator" || arg == "--token-file" || arg == "--tls-ca" ||
        arg == "--tls-cert" || arg == "--tls-key" || arg == "--tls-server-name") {
      ++i;  // its value
      continue;
    }
    if (!arg.empty() && arg[0] == '-') continue;
    for (const CLI::App* command : app.get_subcommands({})) {
      if (command->check_name(arg)) return "";
    }
    return arg;
  }
  return "";
}

int Main(int argc, char** argv) {
  CLI::App app{"Submit, watch and manage training jobs on a Boulder coordinator.", "boulder"};
  app.require_subcommand(1);
  std::string coordinator;
  app.add_option("--coordinator", coordinator,
                 std::string("coordinator address HOST:PORT (default: $") +
                     common::kEnvCoordinator + ", else " + kDefaultCoordinator + ")");
  std::string token_file;
  common::ChannelSecurityOptions security;
  app.add_option(
      "--token-file", token_file,
      std::string("file holding your bearer token (default: $") + common::kEnvToken + ")");
  app.add_option("--tls-ca", security.ca_file,
                 std::string("PEM CA that signed the coordinator's certificate (default: $") +
                     common::kEnvTlsCa + ", else the system's roots)");
  app.add_option(
      "--tls-cert", security.cert_file,
      std::string("PEM client certificate for mutual TLS (default: $") + common::kEnvTlsCert + ")");
  app.add_option("--tls-key", security.key_file,
                 std::string("PEM key of --tls-cert (default: $") + common::kEnvTlsKey + ")");
  app.add_option("--tls-server-name", security.server_name_override,
                 "verify the coordinator's certificate for this name instead of the host");
  app.add_flag("--insecure", security.insecure,
               std::string("plaintext, no TLS (also $") + common::kEnvInsecure +
                   "=1): only against a coordinator started with --insecure");

  SubmitOptions submit;
  CLI::App* submit_cmd = app.add_subcommand("submit", "submit a job spec (YAML)");
  submit_cmd->add_option("FILE", submit.file, "the job spec")->required();
  submit_cmd
      ->add_option("--set", submit.overrides,
                   "override one spec field, e.g. --set training.steps=50 (repeatable)")
      ->type_name("PATH=VALUE")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  submit_cmd->add_flag("-q,--quiet", submit.quiet, "print only the job id");
  submit_cmd->add_flag("-f,--follow", submit.follow, "then follow the job like `watch`");

  JobsOptions jobs;
  std::string jobs_output = "table";
  CLI::App* jobs_cmd = app.add_subcommand("jobs", "list jobs");
  jobs_cmd->add_option("-o,--output", jobs_output, "table or json")
      ->check(CLI::IsMember({"table", "json"}));
  jobs_cmd->add_option("--state", jobs.states, "only jobs in this state (repeatable), e.g. running")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);

  GetOptions get;
  std::string get_output;
  CLI::App* get_cmd = app.add_subcommand("get", "describe a job");
  AddJobId(get_cmd, &get.job_id);
  CLI::Option* get_output_opt =
      get_cmd->add_option("-o,--output", get_output, "yaml or json (default: a description)")
          ->check(CLI::IsMember({"yaml", "json"}));
  get_cmd
      ->add_flag("--fp8", get.fp8,
                 "the FP8 scaling statistics of the latest step (layer, tensor, role, format, "
                 "scale, amax, saturated, underflow)")
      ->excludes(get_output_opt);

  WatchOptions watch;
  CLI::App* watch_cmd = app.add_subcommand("watch",
                                           "follow a job to its end (exit 0 succeeded, 1 failed, 2 "
                                           "cancelled)");
  AddJobId(watch_cmd, &watch.job_id);

  LogsOptions logs;
  CLI::App* logs_cmd = app.add_subcommand("logs", "print a job's log lines");
  AddJobId(logs_cmd, &logs.job_id);
  logs_cmd->add_flag("-f,--follow", logs.follow, "keep printing new lines until the job ends");

  CancelOptions cancel;
  CLI::App* cancel_cmd = app.add_subcommand("cancel", "cancel a job");
  AddJobId(cancel_cmd, &cancel.job_id);

  WorkersOptions workers;
  std::string workers_output = "table";
  CLI::App* workers_cmd = app.add_subcommand("workers", "list registered workers");
  workers_cmd->add_option("-o,--output", workers_output, "table or json")
      ->check(CLI::IsMember({"table", "json"}));

  PlotOptions plot;
  CLI::App* plot_cmd =
      app.add_subcommand("plot", "write a job's loss and learning-rate curves as an SVG");
  AddJobId(plot_cmd, &plot.job_id);
  plot_cmd->add_option("-o,--output", plot.output, "the SVG file, - for stdout (default: loss.svg)")
      ->type_name("FILE");

  ExportOptions export_options;
  CLI::App* export_cmd = app.add_subcommand(
      "export", "download a finished job's trained weights (Hugging Face GPT-2 safetensors)");
  AddJobId(export_cmd, &export_options.job_id);
  export_cmd->add_option("--format", export_options.format, "safetensors (the only format)")
      ->check(CLI::IsMember({"safetensors"}));
  export_cmd->add_option("-o,--output", export_options.output, "the file to write")
      ->type_name("FILE")
      ->required();

  TopOptions top;
  CLI::App* top_cmd = app.add_subcommand(
      "top", "live table of workers and jobs (q or Ctrl-C quits; once when not a terminal)");

  if (std::string unknown = UnknownCommand(app, argc, argv); !unknown.empty()) {
    std::cerr << "boulder: unknown command '" << unknown << "' (see boulder --help)\n";
    return kExitUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    if (app.get_subcommands().empty()) {
      std::cerr << "boulder: a command is required: submit, jobs, get, watch, logs, cancel, "
                   "workers, plot, export or top (see boulder --help)\n";
      return kExitUsage;
    }
    std::cerr << "boulder: " << e.what() << " (see boulder --help)\n";
    return kExitUsage;
  }

  ConnectOptions connect;
  connect.address = ResolveCoordinator(coordinator, std::getenv(common::kEnvCoordinator));
  auto env_or = [](std::string* value, const char* env) {
    const char* v = std::getenv(env);
    if (value->empty() && v != nullptr) *value = v;
  };
  if (!security.insecure) {
    const char* v = std::getenv(common::kEnvInsecure);
    security.insecure = v != nullptr && (std::string(v) == "1" || std::string(v) == "true");
    if (!security.insecure) {
      env_or(&security.ca_file, common::kEnvTlsCa);
      env_or(&security.cert_file, common::kEnvTlsCert);
      env_or(&security.key_file, common::kEnvTlsKey);
    }
  }
  auto token = common::LoadToken(token_file, common::kEnvToken, "--token-file");
  if (!token.ok()) {
    std::cerr << "boulder: " << token.status().message() << "\n";
    return kExitUsage;
  }
  security.token = *std::move(token);
  connect.security = std::move(security);
  if (connect.security.insecure) std::cerr << "boulder: " << common::kInsecureWarning << "\n";
  Io io;
  io.out = &std::cout;
  io.err = &std::cerr;
  io.out_is_terminal = isatty(STDOUT_FILENO) == 1;
  if (io.out_is_terminal) TerminalSize(&io.terminal_width, &io.terminal_height);

  auto format = [](const std::string& name) {
    if (name == "json") return OutputFormat::kJson;
    if (name == "yaml") return OutputFormat::kYaml;
    return OutputFormat::kHuman;
  };
  if (submit_cmd->parsed()) return RunSubmit(connect, submit, io);
  if (jobs_cmd->parsed()) {
    jobs.format = format(jobs_output);
    return RunJobs(connect, jobs, io);
  }
  if (get_cmd->parsed()) {
    get.format = format(get_output);
    return RunGet(connect, get, io);
  }
  if (watch_cmd->parsed()) return RunWatch(connect, watch, io);
  if (logs_cmd->parsed()) return RunLogs(connect, logs, io);
  if (cancel_cmd->parsed()) return RunCancel(connect, cancel, io);
  if (plot_cmd->parsed()) return RunPlot(connect, plot, io);
  if (export_cmd->parsed()) return RunExport(connect, export_options, io);
  if (top_cmd->parsed()) {
    std::optional<QuitKeys> keys;  // only where there is a screen to restore
    if (io.out_is_terminal) {
      keys.emplace();
      top.wait_for_quit = [&keys](absl::Duration timeout) { return keys->WaitForQuit(timeout); };
      top.terminal_size = TerminalSize;
    }
    return RunTop(connect, top, io);
  }
  workers.format = format(workers_output);
  return RunWorkers(connect, workers, io);
}

}  // namespace
}  // namespace boulder::client

int main(int argc, char** argv) {
  try {
    return boulder::client::Main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "boulder: " << e.what() << "\n";
    return boulder::client::kExitError;
  }
}
