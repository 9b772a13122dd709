// A stand-in for boulder-trainer in the agent's tests. It takes the trainer's flags, writes a
// malformed line and then `steps` step reports on --report-fd, prints to stderr, and then does
// what its mode says. The mode comes from --mode, else from the spec's name, so a test can
// choose it through the agent too:
//   exit:C       write a generation (C == 0) or an error (C != 0), exit with code C
//   sleep        wait for SIGTERM, print "fake trainer: got SIGTERM", exit 143
//   ignore-term  ignore SIGTERM and wait to be killed
//   signal:N     die by signal N
//   grandchild   fork a child that holds the pipes and sleeps, print its pid, exit 0
// Its first stderr lines list its open fds, whether it leads its process group, its working
// directory and the files it was given (--tls-*, --join-token-file) with whether it can read
// them, so tests can check how the agent started it.
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "boulder/v1/spec.pb.h"
#include "boulder/v1/worker.pb.h"
#include "google/protobuf/util/json_util.h"

namespace {

volatile sig_atomic_t got_sigterm = 0;
void OnSigterm(int) { got_sigterm = 1; }

void WriteLine(int fd, const std::string& line) {
  const std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

void Report(int fd, const boulder::v1::TrainerMessage& message) {
  std::string json;
  google::protobuf::util::MessageToJsonString(message, &json);
  WriteLine(fd, json);
}

std::string OpenFds() {
  std::string fds;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return "?";
  std::map<int, bool> sorted;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    const int fd = atoi(entry->d_name);
    if (fd != dirfd(dir)) sorted[fd] = true;
  }
  closedir(dir);
  for (const auto& [fd, unused] : sorted) fds += (fds.empty() ? "" : " ") + std::to_string(fd);
  return fds;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quiet" || arg == "--insecure") continue;  // flags without a value
    if (arg.rfind("--", 0) == 0 && i + 1 < argc) flags[arg.substr(2)] = argv[++i];
  }
  fprintf(stderr, "fake trainer: fds %s\n", OpenFds().c_str());
  fprintf(stderr, "fake trainer: own process group %s\n", getpgrp() == getpid() ? "yes" : "no");
  char cwd[4096] = "?";
  if (getcwd(cwd, sizeof(cwd)) == nullptr) cwd[0] = '?';
  fprintf(stderr, "fake trainer: cwd %s\n", cwd);
  // Files the agent hands over by path: named, with whether they can be read from here (the
  // token file's content is never printed).
  for (const char* flag : {"tls-ca", "tls-cert", "tls-key", "join-token-file"}) {
    if (!flags.count(flag)) continue;
    const bool readable = std::ifstream(flags[flag]).good();
    fprintf(stderr, "fake trainer: --%s %s %s\n", flag, flags[flag].c_str(),
            readable ? "readable" : "unreadable");
  }

  boulder::v1::JobSpec spec;
  if (flags.count("spec")) {
    std::ifstream in(flags["spec"]);
    std::stringstream text;
    text << in.rdbuf();
    if (!google::protobuf::util::JsonStringToMessage(text.str(), &spec).ok()) {
      fprintf(stderr, "fake trainer: cannot parse %s\n", flags["spec"].c_str());
      return 2;
    }
  }
  const std::string mode = flags.count("mode") ? flags["mode"] : spec.name();
  int steps = 3;
  if (flags.count("steps")) {
    steps = atoi(flags["steps"].c_str());
  } else if (spec.training().has_steps()) {
    steps = spec.training().steps();
  }
  const int fd = flags.count("report-fd") ? atoi(flags["report-fd"].c_str()) : -1;
  const long job = flags.count("job-id") ? atol(flags["job-id"].c_str()) : 0;

  // Before the first report, so a test that waits for one can signal safely.
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  if (mode == "sleep") {
    sigprocmask(SIG_BLOCK, &term, &old);
    signal(SIGTERM, OnSigterm);
  } else if (mode == "ignore-term") {
    signal(SIGTERM, SIG_IGN);
  }

  WriteLine(fd, "this line is not json");
  for (int i = 1; i <= steps; ++i) {
    boulder::v1::TrainerMessage message;
    boulder::v1::StepReport* step = message.mutable_step();
    step->set_job_id(job);
    step->set_step(i);
    step->set_total_steps(steps);
    step->set_loss(4.0 / i);
    step->set_lr(1e-3);
    step->set_grad_norm(0.5);
    step->set_tokens_per_second(1000);
    step->set_step_time_seconds(0.02);
    step->set_tokens_processed(512L * i);
    step->mutable_memory()->set_allocated_bytes(1 << 20);
    step->mutable_memory()->set_peak_bytes(2 << 20);
    step->mutable_memory()->set_reserved_bytes(4 << 20);
    step->mutable_memory()->set_device_total_bytes(8L << 30);
    Report(fd, message);
    fprintf(stderr, "fake trainer: step %d\n", i);
  }

  if (mode.rfind("exit:", 0) == 0) {
    const int code = atoi(mode.c_str() + 5);
    boulder::v1::TrainerMessage message;
    if (code == 0) {
      for (int t : {1, 3, 5}) message.mutable_generation()->add_prompt(t);
      for (int t : {7, 9, 11}) message.mutable_generation()->add_tokens(t);
    } else {
      message.set_error("fake failure " + std::to_string(code));
    }
    Report(fd, message);
    fprintf(stderr, "fake trainer: exiting with %d\n", code);
    return code;
  }
  if (mode == "sleep") {
    while (!got_sigterm) sigsuspend(&old);
    fprintf(stderr, "fake trainer: got SIGTERM\n");
    return 143;
  }
  if (mode == "ignore-term") {
    while (true) pause();
  }
  if (mode.rfind("signal:", 0) == 0) {
    const rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    const int sig = atoi(mode.c_str() + 7);
    signal(sig, SIG_DFL);
    raise(sig);
    return 3;
  }
  if (mode == "grandchild") {
    const pid_t child = fork();
    if (child == 0) {
      while (true) pause();
    }
    fprintf(stderr, "fake trainer: grandchild %d\n", static_cast<int>(child));
    return 0;
  }
  fprintf(stderr, "fake trainer: unknown mode '%s'\n", mode.c_str());
  return 2;
}
