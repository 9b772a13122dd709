// Runs the boulder-trainer binary as the worker agent does: a pipe on --report-fd, signals,
// exit codes.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_replace.h"
#include "boulder/v1/worker.pb.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"

namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr auto kDeadline = std::chrono::seconds(60);

std::string SpecYaml(int steps, const std::string& precision = "fp32",
                     const std::string& backend = "cpu") {
  return absl::StrReplaceAll(
      R"(name: main-test
model: {preset: minigpt, vocab_size: 96, hidden: 32, heads: 2, layers: 1, ffn: 64, context: 16}
data: {source: arithmetic, max_stride: 6}
training: {steps: $STEPS, batch_size: 4, seq_len: 16, lr: 1e-3, seed: 3, log_every_steps: 10}
precision: $PRECISION
resources: {workers: 1, backend: $BACKEND}
generation: {prompt_len: 4, tokens: 5}
)",
      {{"$STEPS", std::to_string(steps)}, {"$PRECISION", precision}, {"$BACKEND", backend}});
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One trainer process with its report pipe; killed and reaped if the test ends early.
class Trainer {
 public:
  explicit Trainer(const std::vector<std::string>& flags) {
    stderr_path_ = ::testing::TempDir() + "/trainer_stderr_" + std::to_string(getpid()) + "_" +
                   std::to_string(counter_++);
    int fds[2];
    EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0);
    std::vector<std::string> args = {BOULDER_TRAINER_PATH, "--report-fd", "3",
                                     "--threads",          "1",           "--quiet"};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int err = open(stderr_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], 3);  // dup2 clears close-on-exec on the copy
      dup2(err, 2);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    close(err);
    read_fd_ = fds[0];
  }

  ~Trainer() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(read_fd_);
    unlink(stderr_path_.c_str());
  }

  // The next '\n'-terminated line from the report pipe; empty at EOF or after the deadline.
  std::string ReadLine() {
    const auto end = Clock::now() + kDeadline;
    while (true) {
      const size_t nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      const int left = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count());
      if (left <= 0) return "";
      pollfd p = {read_fd_, POLLIN, 0};
      if (poll(&p, 1, left) <= 0) continue;
      char chunk[4096];
      const ssize_t n = read(read_fd_, chunk, sizeof(chunk));
      if (n <= 0) return "";
      buffer_.append(chunk, n);
    }
  }

  // The exit status as a shell reports it (128+signal when killed), or -1 after the deadline.
  int Wait() {
    const auto end = Clock::now() + kDeadline;
    int status = 0;
    while (Clock::now() < end) {
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      // Polling a child's state: waitpid has no timeout.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }

  void Signal(int sig) { kill(pid_, sig); }
  std::string Stderr() const { return ReadFile(stderr_path_); }

 private:
  static inline int counter_ = 0;
  pid_t pid_ = -1;
  int read_fd_ = -1;
  std::string buffer_;
  std::string stderr_path_;
};

boulder::v1::TrainerMessage Parse(const std::string& line) {
  boulder::v1::TrainerMessage m;
  const auto status = google::protobuf::util::JsonStringToMessage(line, &m);
  EXPECT_TRUE(status.ok()) << status.ToString() << " in: " << line;
  return m;
}

TEST(TrainerMainTest, WritesOneJsonTrainerMessagePerLine) {
  const std::string spec = WriteFile("ok.yaml", SpecYaml(20));
  Trainer t(
      {"--spec", spec, "--job-id", "7", "--attempt", "2", "--set", "training.log_every_steps=5"});
  std::vector<boulder::v1::TrainerMessage> messages;
  for (std::string line = t.ReadLine(); !line.empty(); line = t.ReadLine()) {
    messages.push_back(Parse(line));
    // Proto field names (what the agent's parser and humans grepping logs expect).
    if (messages.back().has_step()) {
      EXPECT_THAT(line, HasSubstr("\"total_steps\""));
    }
  }
  EXPECT_EQ(t.Wait(), 0) << t.Stderr();
  ASSERT_EQ(messages.size(), 5u);  // steps 5, 10, 15, 20 (the --set override), generation
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(messages[i].has_step());
    EXPECT_EQ(messages[i].step().step(), 5 * (i + 1));
    EXPECT_EQ(messages[i].step().total_steps(), 20);
    EXPECT_EQ(messages[i].step().job_id(), 7);
    EXPECT_EQ(messages[i].step().attempt(), 2);
    EXPECT_GT(messages[i].step().loss(), 0.0);
  }
  ASSERT_TRUE(messages[4].has_generation());
  EXPECT_EQ(messages[4].generation().prompt_size(), 4);
  EXPECT_EQ(messages[4].generation().tokens_size(), 5);
}

TEST(TrainerMainTest, BadSpecExitsTwoNamingFileAndField) {
  const std::string spec = WriteFile("bad.yaml", SpecYaml(20));
  Trainer t({"--spec", spec, "--set", "model.heads=3"});
  const boulder::v1::TrainerMessage m = Parse(t.ReadLine());
  EXPECT_EQ(t.Wait(), 2);
  EXPECT_THAT(t.Stderr(), HasSubstr("boulder-trainer: " + spec + ": model.heads: 3"));
  EXPECT_THAT(m.error(), HasSubstr("model.heads: 3"));
}

TEST(TrainerMainTest, FatalErrorGoesToTheFdAndExitsOne) {
  if (boulder::kernels::NewCudaBackend(0).ok()) GTEST_SKIP() << "a usable GPU is present";
  // A valid spec (auto may mean cuda) that this CPU-only build cannot train.
  const std::string spec = WriteFile("bf16.yaml", SpecYaml(20, "bf16", "auto"));
  Trainer t({"--spec", spec});
  const boulder::v1::TrainerMessage m = Parse(t.ReadLine());
  EXPECT_EQ(t.Wait(), 1);
  EXPECT_THAT(m.error(), HasSubstr("precision: bf16 needs the cuda backend"));
  EXPECT_THAT(t.Stderr(), HasSubstr("boulder-trainer: precision: bf16"));

  Trainer cuda({"--spec", WriteFile("ok2.yaml", SpecYaml(20)), "--backend", "cuda"});
  EXPECT_THAT(Parse(cuda.ReadLine()).error(), HasSubstr("backend cuda: "));
  EXPECT_EQ(cuda.Wait(), 1);
}

TEST(TrainerMainTest, SigtermStopsPromptlyWithExit143) {
  const std::string spec = WriteFile("long.yaml", SpecYaml(1000000));
  Trainer t({"--spec", spec, "--set", "training.log_every_steps=1"});
  const boulder::v1::TrainerMessage first = Parse(t.ReadLine());
  ASSERT_TRUE(first.has_step());
  t.Signal(SIGTERM);
  EXPECT_EQ(t.Wait(), 143);
  EXPECT_THAT(t.Stderr(), HasSubstr("stopped at step"));
}

}  // namespace
