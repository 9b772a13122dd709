// boulder-worker: the worker agent. Flags become AgentOptions; everything else is Run().
#include <iostream>
#include <string>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "common/env.h"
#include "common/grpc_security.h"
#include "worker/agent/agent.h"
#include "worker/agent/run.h"

int main(int argc, char** argv) {
  CLI::App app{
      "boulder-worker: registers this machine with a Boulder coordinator and runs the training "
      "jobs it assigns, one boulder-trainer process per job."};
  boulder::agent::AgentOptions options;
  app.add_option("--coordinator", options.coordinator, "The coordinator's address, HOST:PORT")
      ->required();
  app.add_option("--backend", options.backend,
                 "Compute backend: auto (cuda on a GPU of compute capability 8.0+ when this "
                 "build has the CUDA backend, else cpu), cpu or cuda")
      ->capture_default_str();
  app.add_option("--metrics-listen", options.metrics_listen,
                 "Serve Prometheus /metrics at HOST:PORT (port 0: any free port)");
  app.add_option("--trainer", options.trainer_path,
                 "The trainer executable (default: boulder-trainer beside this binary)");
  app.add_option("--work-dir", options.work_dir,
                 "Directory for the jobs' files (default: a fresh directory under $TMPDIR)");
  app.add_option(
      "--checkpoint-root", options.checkpoint_root,
      "Directory for the jobs' checkpoints, <root>/job-<id>; put it on storage every "
      "worker shares so a restarted job resumes anywhere (default: WORK_DIR/checkpoints)");
  app.add_option("--id", options.id,
                 "Register under this worker id (default: the coordinator chooses)");
  app.add_option("--threads", options.threads, "Threads per trainer; 0: all cores")
      ->capture_default_str();
  app.add_option("--tls-ca", options.security.ca_file,
                 "PEM CA bundle that signed the coordinator's certificate (default: system roots)");
  app.add_option("--tls-cert", options.security.cert_file,
                 "PEM client certificate, for a coordinator that requires one (mutual TLS)");
  app.add_option("--tls-key", options.security.key_file, "PEM private key of --tls-cert");
  app.add_option(
      "--tls-server-name", options.security.server_name_override,
      "Verify the coordinator's certificate for this name instead of the address's host");
  std::string join_token_file;
  app.add_option("--join-token-file", join_token_file,
                 std::string("File holding the worker join token (default: $") +
                     boulder::common::kEnvJoinToken + ")");
  app.add_flag("--insecure", options.security.insecure,
               "Plaintext gRPC to the coordinator, without TLS: for development only");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  auto token = boulder::common::LoadToken(join_token_file, boulder::common::kEnvJoinToken,
                                          "--join-token-file");
  if (!token.ok()) {
    std::cerr << "boulder-worker: " << token.status().message() << std::endl;
    return 1;
  }
  options.security.token = *std::move(token);
  if (options.security.insecure) std::cerr << boulder::common::kInsecureWarning << std::endl;
  const absl::Status status = boulder::agent::Run(std::move(options));
  if (!status.ok()) {
    std::cerr << "boulder-worker: " << status.message() << std::endl;
    return 1;
  }
  return 0;
}
