// Coordinator load benchmark (not a test): fills a running coordinator's queue with jobs no
// worker can run (they need a CUDA worker; the simulated workers are CPU ones), registers
// simulated workers that heartbeat on a fixed period, and meanwhile measures SubmitJob and
// Heartbeat latency and the coordinator process's CPU time. Prints a markdown report.
// bench/coordinator_load.sh starts the coordinator (TLS and tokens on) and runs this.
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "boulder/v1/job.grpc.pb.h"
#include "boulder/v1/worker.grpc.pb.h"
#include "common/grpc_security.h"

namespace {

using boulder::v1::JobService;
using boulder::v1::WorkerService;

struct Options {
  std::string coordinator;
  std::string ca_file;
  std::string token_file;
  std::string join_token_file;
  bool insecure = false;
  int jobs = 10000;
  int workers = 500;
  int heartbeat_ms = 1000;
  int measure_seconds = 60;
  double submit_per_second = 10;
  int coordinator_pid = 0;
  std::string spec_file;
};

// Clock ticks of CPU time (user + system) of process `pid`; -1 when unreadable.
long long CpuTicks(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t paren = text.rfind(')');
  if (paren == std::string::npos) return -1;
  std::vector<std::string> f = absl::StrSplit(text.substr(paren + 2), ' ');
  if (f.size() < 15) return -1;
  return std::stoll(f[11]) + std::stoll(f[12]);  // utime, stime (fields 14, 15)
}

// Busy and total ticks of the whole machine (/proc/stat "cpu" line).
std::pair<long long, long long> MachineTicks() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  long long v[10] = {};
  in >> cpu;
  for (long long& x : v) in >> x;
  long long total = 0;
  for (int i = 0; i < 8; ++i) total += v[i];
  return {total - v[3] - v[4], total};  // minus idle and iowait
}

long long RssKiB(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

std::string LoadAvg() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return absl::StrCat(a, " ", b, " ", c);
}

struct Latencies {
  std::mutex mu;
  std::vector<double> ms;
  int errors = 0;
  std::string last_error;
  void Add(double v) {
    std::lock_guard<std::mutex> l(mu);
    ms.push_back(v);
  }
  void Error(const grpc::Status& s) {
    std::lock_guard<std::mutex> l(mu);
    ++errors;
    last_error = absl::StrCat(s.error_code(), " ", s.error_message());
  }
  // "p50 / p99 / max" in ms.
  std::string Summary() {
    std::lock_guard<std::mutex> l(mu);
    if (ms.empty()) return "no samples";
    std::vector<double> v = ms;
    std::sort(v.begin(), v.end());
    auto q = [&](double p) { return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))]; };
    return absl::StrFormat("%.2f ms / %.2f ms / %.2f ms (%d samples)", q(0.50), q(0.99), v.back(),
                           v.size());
  }
};

std::shared_ptr<grpc::Channel> Channel(const Options& o, const std::string& token, int index) {
  boulder::common::ChannelSecurityOptions s;
  s.insecure = o.insecure;
  s.ca_file = o.ca_file;
  s.token = token;
  grpc::ChannelArguments args;
  // A connection of its own per simulated worker, as separate agents would have.
  args.SetInt("boulder.bench.channel", index);
  auto c = boulder::common::CreateSecureChannel(o.coordinator, s, args);
  if (!c.ok()) {
    std::cerr << c.status() << "\n";
    std::exit(1);
  }
  return *c;
}

double MsSince(absl::Time t) { return absl::ToDoubleMilliseconds(absl::Now() - t); }

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Boulder coordinator load benchmark"};
  app.add_option("--coordinator", o.coordinator)->required();
  app.add_option("--tls-ca", o.ca_file);
  app.add_option("--token-file", o.token_file);
  app.add_option("--join-token-file", o.join_token_file);
  app.add_flag("--insecure", o.insecure);
  app.add_option("--jobs", o.jobs, "queued jobs to hold")->capture_default_str();
  app.add_option("--workers", o.workers, "simulated workers")->capture_default_str();
  app.add_option("--heartbeat-ms", o.heartbeat_ms)->capture_default_str();
  app.add_option("--measure-seconds", o.measure_seconds)->capture_default_str();
  app.add_option("--submit-per-second", o.submit_per_second)->capture_default_str();
  app.add_option("--coordinator-pid", o.coordinator_pid)->required();
  app.add_option("--spec", o.spec_file, "job spec YAML")->required();
  CLI11_PARSE(app, argc, argv);

  auto read = [](const std::string& f) {
    auto t = boulder::common::LoadToken(f, nullptr, f);
    if (!t.ok()) {
      std::cerr << t.status() << "\n";
      std::exit(1);
    }
    return *t;
  };
  const std::string user_token = o.token_file.empty() ? "" : read(o.token_file);
  const std::string join_token = o.join_token_file.empty() ? "" : read(o.join_token_file);
  std::ifstream spec_in(o.spec_file);
  const std::string spec((std::istreambuf_iterator<char>(spec_in)),
                         std::istreambuf_iterator<char>());

  boulder::v1::SubmitJobRequest submit;
  submit.set_spec_yaml(spec);
  // CPU workers cannot run these: they stay QUEUED for the whole run.
  submit.add_overrides("resources.backend=cuda");

  // 1. Fill the queue, four submitters at a time.
  std::atomic<int> next{0};
  Latencies fill;
  const absl::Time fill_start = absl::Now();
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        auto stub = JobService::NewStub(Channel(o, user_token, 100000 + t));
        while (next.fetch_add(1) < o.jobs) {
          grpc::ClientContext c;
          c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
          boulder::v1::SubmitJobResponse r;
          absl::Time t0 = absl::Now();
          grpc::Status s = stub->SubmitJob(&c, submit, &r);
          if (s.ok()) {
            fill.Add(MsSince(t0));
          } else {
            fill.Error(s);
          }
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  const double fill_seconds = absl::ToDoubleSeconds(absl::Now() - fill_start);
  std::cerr << "filled " << o.jobs << " jobs in " << fill_seconds << " s\n";

  // 2. Register the workers, each on its own connection.
  std::vector<std::unique_ptr<WorkerService::Stub>> stubs;
  std::vector<std::string> ids;
  Latencies reg;
  for (int i = 0; i < o.workers; ++i) {
    stubs.push_back(WorkerService::NewStub(Channel(o, join_token, i)));
    boulder::v1::RegisterWorkerRequest r;
    r.mutable_capabilities()->set_backend("cpu");
    r.mutable_capabilities()->set_cpu_cores(1);
    r.mutable_capabilities()->set_hostname(absl::StrCat("sim-", i));
    r.set_requested_id(absl::StrCat("sim-", i));
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    boulder::v1::RegisterWorkerResponse resp;
    absl::Time t0 = absl::Now();
    grpc::Status s = stubs.back()->RegisterWorker(&c, r, &resp);
    if (!s.ok()) {
      reg.Error(s);
      std::cerr << "register: " << s.error_message() << "\n";
      return 1;
    }
    reg.Add(MsSince(t0));
    ids.push_back(resp.worker_id());
  }
  std::cerr << "registered " << o.workers << " workers\n";

  // 3. Heartbeats: worker i beats at i/W of each period, asynchronously.
  std::atomic<bool> stop{false};
  std::atomic<bool> measuring{false};
  Latencies beats;
  std::atomic<int> in_flight{0};
  std::thread beater([&] {
    const absl::Duration period = absl::Milliseconds(o.heartbeat_ms);
    absl::Time round = absl::Now();
    while (!stop.load()) {
      for (int i = 0; i < o.workers && !stop.load(); ++i) {
        absl::SleepFor(round + period * i / o.workers - absl::Now());
        struct Call {
          grpc::ClientContext context;
          boulder::v1::HeartbeatRequest request;
          boulder::v1::HeartbeatResponse response;
          absl::Time start;
        };
        auto* call = new Call();
        call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        call->request.set_worker_id(ids[i]);
        call->start = absl::Now();
        in_flight.fetch_add(1);
        stubs[i]->async()->Heartbeat(&call->context, &call->request, &call->response,
                                     [&, call](grpc::Status s) {
                                       if (measuring.load()) {
                                         if (s.ok()) {
                                           beats.Add(MsSince(call->start));
                                         } else {
                                           beats.Error(s);
                                         }
                                       }
                                       in_flight.fetch_sub(1);
                                       delete call;
                                     });
      }
      round += period;
    }
  });

  // Let the heartbeats settle for one period, then measure.
  absl::SleepFor(absl::Milliseconds(2 * o.heartbeat_ms));
  const long long cpu0 = CpuTicks(o.coordinator_pid);
  const long long self0 = CpuTicks(getpid());
  const auto machine0 = MachineTicks();
  const std::string load0 = LoadAvg();
  measuring.store(true);
  const absl::Time m0 = absl::Now();
  Latencies submits;
  {
    auto stub = JobService::NewStub(Channel(o, user_token, 200000));
    const absl::Duration gap = absl::Seconds(1.0 / o.submit_per_second);
    absl::Time due = absl::Now();
    while (absl::Now() - m0 < absl::Seconds(o.measure_seconds)) {
      absl::SleepFor(due - absl::Now());
      due += gap;
      grpc::ClientContext c;
      c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      boulder::v1::SubmitJobResponse r;
      absl::Time t0 = absl::Now();
      grpc::Status s = stub->SubmitJob(&c, submit, &r);
      if (s.ok()) {
        submits.Add(MsSince(t0));
      } else {
        submits.Error(s);
      }
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - m0);
  measuring.store(false);
  const long long cpu1 = CpuTicks(o.coordinator_pid);
  const long long self1 = CpuTicks(getpid());
  const auto machine1 = MachineTicks();
  const std::string load1 = LoadAvg();
  const long long rss = RssKiB(o.coordinator_pid);
  stop.store(true);
  beater.join();
  while (in_flight.load() > 0) absl::SleepFor(absl::Milliseconds(10));

  // Workers still listed as not LOST at the end.
  int lost = 0;
  {
    auto stub = WorkerService::NewStub(Channel(o, user_token, 300000));
    grpc::ClientContext c;
    boulder::v1::ListWorkersResponse r;
    if (stub->ListWorkers(&c, boulder::v1::ListWorkersRequest(), &r).ok()) {
      for (const auto& w : r.workers()) lost += w.state() == boulder::v1::WORKER_LOST;
    }
  }

  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double coord_cores = (cpu1 - cpu0) / tick / seconds;
  const double self_cores = (self1 - self0) / tick / seconds;
  const double machine_busy =
      static_cast<double>(machine1.first - machine0.first) / (machine1.second - machine0.second);
  const int cores = get_nprocs();
  std::cout << absl::StrFormat(
      "| queued jobs held | %d (filled in %.1f s: %.0f SubmitJob/s with 4 clients) |\n"
      "| simulated workers | %d, heartbeat every %d ms, one connection each (%.0f heartbeats/s) "
      "|\n"
      "| measured for | %.1f s, SubmitJob at %.0f/s from one client |\n"
      "| SubmitJob latency p50 / p99 / max | %s; errors: %d |\n"
      "| Heartbeat latency p50 / p99 / max | %s; errors: %d |\n"
      "| SubmitJob latency while filling p50 / p99 / max | %s |\n"
      "| coordinator CPU | %.2f cores (%.0f%% of the machine's %d) |\n"
      "| coordinator RSS at the end | %.0f MiB |\n"
      "| this load generator's CPU | %.2f cores |\n"
      "| whole machine busy | %.0f%% (so others used about %.2f cores) |\n"
      "| load average before / after | %s / %s |\n"
      "| workers LOST at the end | %d |\n",
      o.jobs, fill_seconds, o.jobs / fill_seconds, o.workers, o.heartbeat_ms,
      o.workers * 1000.0 / o.heartbeat_ms, seconds, o.submit_per_second, submits.Summary(),
      submits.errors, beats.Summary(), beats.errors, fill.Summary(), coord_cores,
      100.0 * coord_cores / cores, cores, rss / 1024.0, self_cores, 100.0 * machine_busy,
      std::max(0.0, machine_busy * cores - coord_cores - self_cores), load0, load1, lost);
  if (submits.errors + beats.errors > 0) {
    std::cout << "\nLast errors: SubmitJob: " << submits.last_error
              << "; Heartbeat: " << beats.last_error << "\n";
  }
  return 0;
}
