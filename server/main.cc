// boulder-coordinator: flags -> ServerOptions -> Run().
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "server/server.h"

int main(int argc, char** argv) {
  boulder::server::ServerOptions options;
  options.listen.clear();
  int64_t heartbeat_timeout_ms = 10000;
  int64_t heartbeat_interval_ms = 500;

  CLI::App app{"Boulder coordinator: accepts training jobs and gang-schedules them on workers."};
  app.add_option("--listen", options.listen, "gRPC address HOST:PORT (port 0: any free port)")
      ->required();
  app.add_option("--db", options.db_path, "SQLite database file (created if missing)")->required();
  app.add_option("--weights-dir", options.weights_dir,
                 "where finished jobs' trained weights are stored (default: DB.weights)");
  app.add_option("--metrics-listen", options.metrics_listen,
                 "Prometheus endpoint HOST:PORT (/metrics); none when not given");
  app.add_option("--heartbeat-timeout-ms", heartbeat_timeout_ms,
                 "A worker silent this long is lost and its job failed")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--heartbeat-interval-ms", heartbeat_interval_ms,
                 "How often workers are told to heartbeat")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--health-listen", options.health_listen,
                 "Plaintext gRPC address serving only grpc.health.v1.Health (for probes that "
                 "cannot speak TLS); none when not given");
  app.add_option("--tls-cert", options.security.cert_file,
                 "PEM certificate chain the coordinator presents (TLS)");
  app.add_option("--tls-key", options.security.key_file, "PEM private key of --tls-cert");
  app.add_option("--tls-client-ca", options.security.client_ca_file,
                 "PEM CA bundle: require client certificates signed by it (mutual TLS)");
  app.add_option("--auth-file", options.auth_file,
                 "Users and worker join tokens (see README, Security); required unless --insecure");
  app.add_flag("--insecure", options.security.insecure,
               "Plaintext gRPC without TLS (and no authentication unless --auth-file): for "
               "development on a trusted host only");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  options.heartbeat_timeout = absl::Milliseconds(heartbeat_timeout_ms);
  options.heartbeat_interval = absl::Milliseconds(heartbeat_interval_ms);
  return boulder::server::Run(options);
}
