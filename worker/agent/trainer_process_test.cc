#include "worker/agent/trainer_process.h"

#include <signal.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace boulder::agent {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

constexpr absl::Duration kDeadline = absl::Seconds(20);

// Collects what a TrainerProcess delivers, and lets the test wait for it.
class Recorder {
 public:
  TrainerCallbacks Callbacks() {
    TrainerCallbacks callbacks;
    callbacks.on_message = [this](v1::TrainerMessage message) {
      std::lock_guard<std::mutex> lock(mu_);
      messages_.push_back(std::move(message));
      cv_.notify_all();
    };
    callbacks.on_output = [this](std::string line, bool) {
      std::lock_guard<std::mutex> lock(mu_);
      output_.push_back(std::move(line));
      cv_.notify_all();
    };
    callbacks.on_bad_report = [this](absl::string_view line, const absl::Status& why) {
      std::lock_guard<std::mutex> lock(mu_);
      bad_.push_back(absl::StrCat(line, " | ", why.message()));
    };
    callbacks.on_exit = [this](const TrainerExit& exit) {
      std::lock_guard<std::mutex> lock(mu_);
      exit_ = exit;
      ++exits_;
      cv_.notify_all();
    };
    return callbacks;
  }

  bool WaitForSteps(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, absl::ToChronoTime(absl::Now() + kDeadline),
                          [&] { return CountSteps() >= n; });
  }
  bool WaitForOutput(const std::string& prefix, std::string* line) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, absl::ToChronoTime(absl::Now() + kDeadline), [&] {
      for (const std::string& l : output_) {
        if (absl::StartsWith(l, prefix)) {
          *line = l;
          return true;
        }
      }
      return false;
    });
  }

  std::vector<v1::TrainerMessage> messages() {
    std::lock_guard<std::mutex> lock(mu_);
    return messages_;
  }
  std::vector<std::string> output() {
    std::lock_guard<std::mutex> lock(mu_);
    return output_;
  }
  std::vector<std::string> bad() {
    std::lock_guard<std::mutex> lock(mu_);
    return bad_;
  }
  TrainerExit exit() {
    std::lock_guard<std::mutex> lock(mu_);
    return exit_;
  }
  int exits() {
    std::lock_guard<std::mutex> lock(mu_);
    return exits_;
  }

 private:
  size_t CountSteps() const {
    size_t n = 0;
    for (const auto& m : messages_) n += m.kind_case() == v1::TrainerMessage::kStep;
    return n;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::TrainerMessage> messages_;
  std::vector<std::string> output_;
  std::vector<std::string> bad_;
  TrainerExit exit_;
  int exits_ = 0;
};

TrainerSpawnOptions Fake(const std::string& mode, int steps = 3) {
  TrainerSpawnOptions options;
  options.path = BOULDER_FAKE_TRAINER;
  options.args = {"--report-fd", absl::StrCat(kReportFd), "--job-id", "5", "--mode", mode,
                  "--steps",     absl::StrCat(steps)};
  return options;
}

// True once `pid` is gone or a zombie (reparented away from us, it is not ours to reap).
bool ProcessGone(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  return paren == std::string::npos || line.substr(paren + 2, 1) == "Z";
}

TEST(TrainerProcessTest, ParsesReportsAndReportsTheExitCode) {
  Recorder recorder;
  auto process = TrainerProcess::Start(Fake("exit:3", 4), recorder.Callbacks());
  ASSERT_TRUE(process.ok()) << process.status();
  ASSERT_TRUE((*process)->WaitForExit(kDeadline));

  const std::vector<v1::TrainerMessage> messages = recorder.messages();
  ASSERT_EQ(messages.size(), 5u);
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(messages[i].kind_case(), v1::TrainerMessage::kStep);
    EXPECT_EQ(messages[i].step().step(), i + 1);
    EXPECT_EQ(messages[i].step().job_id(), 5);
    EXPECT_NEAR(messages[i].step().loss(), 4.0 / (i + 1), 1e-12);
  }
  EXPECT_EQ(messages[4].error(), "fake failure 3");
  ASSERT_EQ(recorder.bad().size(), 1u);
  EXPECT_THAT(recorder.bad()[0], HasSubstr("this line is not json | report line: not a"));

  const TrainerExit exit = recorder.exit();
  EXPECT_EQ(recorder.exits(), 1);
  EXPECT_EQ(exit.exit_code, 3);
  EXPECT_EQ(exit.signal, 0);
  EXPECT_FALSE(exit.terminated);
  EXPECT_EQ(exit.error, "fake failure 3");
  EXPECT_EQ(exit.last_output, "fake trainer: exiting with 3");
  // Only stdin, stdout, stderr and the report fd reach the trainer, in a group of its own.
  EXPECT_THAT(recorder.output(), Contains("fake trainer: fds 0 1 2 3"));
  EXPECT_THAT(recorder.output(), Contains("fake trainer: own process group yes"));
  EXPECT_THAT(recorder.output(), Contains("fake trainer: step 4"));
}

TEST(TrainerProcessTest, ASuccessfulExitDeliversTheGeneration) {
  Recorder recorder;
  auto process = TrainerProcess::Start(Fake("exit:0", 1), recorder.Callbacks());
  ASSERT_TRUE(process.ok()) << process.status();
  ASSERT_TRUE((*process)->WaitForExit(kDeadline));
  const std::vector<v1::TrainerMessage> messages = recorder.messages();
  ASSERT_EQ(messages.size(), 2u);
  ASSERT_EQ(messages[1].kind_case(), v1::TrainerMessage::kGeneration);
  EXPECT_THAT(messages[1].generation().tokens(), ::testing::ElementsAre(7, 9, 11));
  EXPECT_EQ(recorder.exit().exit_code, 0);
  EXPECT_EQ(recorder.exit().error, "");
}

TEST(TrainerProcessTest, ReportsTheSignalThatKilledIt) {
  Recorder recorder;
  auto process =
      TrainerProcess::Start(Fake(absl::StrCat("signal:", SIGABRT)), recorder.Callbacks());
  ASSERT_TRUE(process.ok()) << process.status();
  ASSERT_TRUE((*process)->WaitForExit(kDeadline));
  EXPECT_EQ(recorder.exit().exit_code, -1);
  EXPECT_EQ(recorder.exit().signal, SIGABRT);
  EXPECT_FALSE(recorder.exit().terminated);
}

TEST(TrainerProcessTest, TerminateSendsSigtermFirst) {
  Recorder recorder;
  auto process = TrainerProcess::Start(Fake("sleep"), recorder.Callbacks());
  ASSERT_TRUE(process.ok()) << process.status();
  ASSERT_TRUE(recorder.WaitForSteps(3));
  (*process)->Terminate(absl::Seconds(30));
  ASSERT_TRUE((*process)->WaitForExit(kDeadline));
  EXPECT_EQ(recorder.exit().exit_code, 143);
  EXPECT_EQ(recorder.exit().signal, 0);
  EXPECT_TRUE(recorder.exit().terminated);
  EXPECT_EQ(recorder.exit().last_output, "fake trainer: got SIGTERM");
}

TEST(TrainerProcessTest, TerminateKillsATrainerThatIgnoresSigtermAfterTheGrace) {
  Recorder recorder;
  auto process = TrainerProcess::Start(Fake("ignore-term"), recorder.Callbacks());
  ASSERT_TRUE(process.ok()) << process.status();
  ASSERT_TRUE(recorder.WaitForSteps(3));
  const absl::Duration grace = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  (*process)->Terminate(grace);
  ASSERT_TRUE((*process)->WaitForExit(kDeadline));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(recorder.exit().exit_code, -1);
  EXPECT_EQ(recorder.exit().signal, SIGKILL);
  EXPECT_TRUE(recorder.exit().terminated);
  EXPECT_GE(took, grace);
  EXPECT_LT(took, grace + absl::Seconds(5));
}

TEST(TrainerProcessTest, KillsWhatTheTrainerLeftBehind) {
  Recorder recorder;
  auto process = TrainerProcess::Start(Fake("grandchild"), recorder.Callbacks());
  ASSERT_TRUE(process.ok()) << process.status();
  // The grandchild holds the pipes open: the exit must not wait for their EOF.
  ASSERT_TRUE((*process)->WaitForExit(kDeadline));
  EXPECT_EQ(recorder.exit().exit_code, 0);
  std::string line;
  ASSERT_TRUE(recorder.WaitForOutput("fake trainer: grandchild ", &line));
  int grandchild = 0;
  ASSERT_TRUE(absl::SimpleAtoi(line.substr(line.rfind(' ') + 1), &grandchild)) << line;
  const absl::Time deadline = absl::Now() + kDeadline;
  while (!ProcessGone(grandchild) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(ProcessGone(grandchild)) << "grandchild " << grandchild << " still running";
  if (!ProcessGone(grandchild)) kill(grandchild, SIGKILL);
}

TEST(TrainerProcessTest, DestroyingItKillsARunningTrainer) {
  Recorder recorder;
  auto process = TrainerProcess::Start(Fake("ignore-term"), recorder.Callbacks());
  ASSERT_TRUE(process.ok()) << process.status();
  ASSERT_TRUE(recorder.WaitForSteps(3));
  const pid_t pid = (*process)->pid();
  process->reset();
  EXPECT_EQ(recorder.exits(), 1);
  EXPECT_EQ(recorder.exit().signal, SIGKILL);
  EXPECT_TRUE(ProcessGone(pid));
}

TEST(TrainerProcessTest, RunsInItsWorkingDirectoryAndFailsClearlyWithoutOne) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/trainer_process_test_", getpid());
  std::filesystem::create_directories(dir);
  // A relative path keeps working after the chdir.
  TrainerSpawnOptions options = Fake("exit:0", 0);
  const std::filesystem::path cwd = std::filesystem::current_path();
  options.path = std::filesystem::relative(BOULDER_FAKE_TRAINER, cwd).string();
  options.working_dir = dir;
  Recorder recorder;
  auto process = TrainerProcess::Start(options, recorder.Callbacks());
  ASSERT_TRUE(process.ok()) << process.status();
  ASSERT_TRUE((*process)->WaitForExit(kDeadline));
  EXPECT_EQ(recorder.exit().exit_code, 0);
  EXPECT_THAT(recorder.output(), Contains(absl::StrCat("fake trainer: cwd ",
                                                       std::filesystem::canonical(dir).string())));

  options.working_dir = dir + "/missing";
  auto missing = TrainerProcess::Start(options, TrainerCallbacks());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(),
            absl::StrCat("chdir ", dir, "/missing: No such file or directory"));
  std::filesystem::remove_all(dir);
}

TEST(TrainerProcessTest, AMissingExecutableIsNotFound) {
  TrainerSpawnOptions options;
  options.path = "/nonexistent/boulder-trainer";
  auto process = TrainerProcess::Start(options, TrainerCallbacks());
  EXPECT_EQ(process.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(process.status().message(),
            "exec /nonexistent/boulder-trainer: No such file or directory");
}

}  // namespace
}  // namespace boulder::agent
