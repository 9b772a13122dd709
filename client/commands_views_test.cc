// The terminal views of the commands against the fake coordinator: the live display of
// `watch` (progress bar, loss chart, per-rank step times), `plot` and `top`.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/commands.h"
#include "client/fake_coordinator_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace boulder::client {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_F(CommandsTest, WatchOnATerminalRedrawsBarChartAndStepTimesInPlace) {
  ScriptRun(3, v1::SUCCEEDED);
  io_.out_is_terminal = true;
  io_.terminal_width = 100;
  io_.terminal_height = 24;  // a 6-row chart: 8 lines with the bar and the step times
  WatchOptions options;
  options.job_id = 7;
  EXPECT_EQ(RunWatch(connect_, options, io_), kExitOk);
  const std::string out = out_.str();
  // The first display starts on a fresh line; the next ones go back up its 7 lines first.
  EXPECT_THAT(out, HasSubstr("\r\033[Kstep 1/3 ["));
  EXPECT_THAT(out, HasSubstr("\r\033[7A\033[Jstep 2/3 ["));
  // Losses 4, 2, 1.333 on 24 dot rows: rows 0, 17 (2.0 is 3/4 of the way down) and 23, the
  // falls joined by vertical runs in the right dot column of cell 0 and the left of cell 1.
  EXPECT_THAT(out, HasSubstr("\r\033[7A\033[Jstep 3/3 [████████████████████████████████████████] "
                             "loss 1.3333  lr 3.0e-04  2,048 tok/s  ETA 0:00\n"
                             "    4 ┤⢱\n"
                             "      │⢸\n"
                             "      │⢸\n"
                             "      │⢸\n"
                             "      │⠘⡄\n"
                             "1.333 ┤ ⡇\n"
                             "rank 0: 250.0 ms\n"
                             "job 7 SUCCEEDED\n"));
  EXPECT_THAT(out, Not(HasSubstr("(100%)")));
}

TEST_F(CommandsTest, WatchOnATerminalShowsEveryRanksStepTime) {
  int64_t seq = 0;
  jobs_.events.push_back(StateEvent(++seq, v1::RUNNING));
  jobs_.events.push_back(StepEvent(++seq, 1, 2));
  v1::JobEvent rank1 = StepEvent(++seq, 1, 2);
  rank1.mutable_step()->set_rank(1);
  rank1.mutable_step()->set_step_time_seconds(0.3);
  jobs_.events.push_back(rank1);
  jobs_.events.push_back(StateEvent(++seq, v1::FAILED, "rank 1 exited"));
  io_.out_is_terminal = true;
  io_.terminal_width = 80;
  io_.terminal_height = 12;  // a 2-row chart
  WatchOptions options;
  options.job_id = 7;
  EXPECT_EQ(RunWatch(connect_, options, io_), kExitError);
  // Rank 1's report redraws the display (4 lines) with its time; the bar stays rank 0's.
  EXPECT_THAT(out_.str(), HasSubstr("\r\033[3A\033[Jstep 1/2 ["));
  EXPECT_THAT(out_.str(), HasSubstr("rank 0: 250.0 ms  rank 1: 300.0 ms\n"
                                    "job 7 FAILED: rank 1 exited\n"));
}

TEST_F(CommandsTest, WatchOnATerminalPrintsStateLinesAboveTheDisplay) {
  int64_t seq = 0;
  jobs_.events.push_back(StateEvent(++seq, v1::RUNNING));
  jobs_.events.push_back(StepEvent(++seq, 1, 2));
  jobs_.events.push_back(StateEvent(++seq, v1::RESTARTING, "worker w-1 lost"));
  jobs_.events.push_back(StepEvent(++seq, 2, 2));
  jobs_.events.push_back(StateEvent(++seq, v1::CANCELLED));
  io_.out_is_terminal = true;
  io_.terminal_width = 80;
  io_.terminal_height = 12;
  WatchOptions options;
  options.job_id = 7;
  EXPECT_EQ(RunWatch(connect_, options, io_), kExitCancelled);
  const std::string out = out_.str();
  // Erased (4 lines), the state line in its place, then drawn again below it.
  EXPECT_THAT(out, HasSubstr("\r\033[3A\033[Jjob 7 RESTARTING on worker w-1: worker w-1 lost\n"
                             "\r\033[Kstep 1/2 ["));
  EXPECT_THAT(out, HasSubstr("\r\033[3A\033[Jstep 2/2 ["));
  EXPECT_THAT(out, EndsWith("rank 0: 250.0 ms\njob 7 CANCELLED\n"));
}

TEST_F(CommandsTest, WatchOnAPipeHasNoChartOrCursorMovement) {
  ScriptRun(3, v1::SUCCEEDED);
  WatchOptions options;
  options.job_id = 7;
  EXPECT_EQ(RunWatch(connect_, options, io_), kExitOk);
  EXPECT_THAT(out_.str(), Not(HasSubstr("\033[")));
  EXPECT_THAT(out_.str(), Not(HasSubstr("┤")));
  EXPECT_THAT(out_.str(), Not(HasSubstr("rank 0:")));
}

// Per process: ctest runs the tests of this binary as parallel processes.
std::string PlotPath() {
  return ::testing::TempDir() + "/client_commands_views_test_" + std::to_string(::getpid()) + ".svg";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// The number of "x,y" pairs of the loss polyline.
size_t LossPoints(const std::string& svg) {
  const size_t at = svg.find("<polyline class=\"loss\"");
  if (at == std::string::npos) return 0;
  const size_t p = svg.find("points=\"", at) + 8;
  const std::vector<std::string> pairs = absl::StrSplit(svg.substr(p, svg.find('"', p) - p), ' ');
  return pairs.size();
}

TEST_F(CommandsTest, PlotWritesTheLossOfEveryStepReport) {
  ScriptRun(5, v1::SUCCEEDED);
  // Another rank's reports are not part of the curve.
  v1::JobEvent rank1 = StepEvent(100, 1, 5);
  rank1.mutable_step()->set_rank(1);
  jobs_.events.insert(jobs_.events.begin() + 3, rank1);
  for (size_t i = 0; i < jobs_.events.size(); ++i) jobs_.events[i].set_seq(i + 1);
  PlotOptions options;
  options.job_id = 7;
  options.output = PlotPath();
  EXPECT_EQ(RunPlot(connect_, options, io_), kExitOk);
  EXPECT_EQ(out_.str(), "wrote " + PlotPath() + " (5 step reports, loss 0.8000 at step 5)\n");
  EXPECT_EQ(err_.str(), "");
  const std::string svg = ReadAll(PlotPath());
  std::remove(PlotPath().c_str());
  EXPECT_THAT(svg, StartsWith("<?xml"));
  EXPECT_THAT(svg, HasSubstr("<title>job 7 · minigpt (SUCCEEDED)</title>"));
  EXPECT_EQ(LossPoints(svg), 5u);
  EXPECT_THAT(svg, EndsWith("</svg>\n"));
}

TEST_F(CommandsTest, PlotOfARunningJobStopsAtItsLatestReport) {
  // The events so far; the fake ends the stream after them as a live one would not.
  int64_t seq = 0;
  jobs_.events.push_back(StateEvent(++seq, v1::RUNNING));
  for (int s = 1; s <= 3; ++s) jobs_.events.push_back(StepEvent(++seq, s, 10));
  jobs_.job.set_state(v1::RUNNING);
  jobs_.job.mutable_latest_report()->set_step(3);
  PlotOptions options;
  options.job_id = 7;
  options.output = "-";
  EXPECT_EQ(RunPlot(connect_, options, io_), kExitOk);
  EXPECT_EQ(LossPoints(out_.str()), 3u);
  EXPECT_THAT(out_.str(), HasSubstr("(RUNNING)</title>"));
}

TEST_F(CommandsTest, PlotOfAJobWithoutReportsIsAnError) {
  jobs_.job.set_state(v1::QUEUED);
  jobs_.job.clear_latest_report();
  PlotOptions options;
  options.job_id = 7;
  options.output = PlotPath() + ".unused";
  EXPECT_EQ(RunPlot(connect_, options, io_), kExitError);
  EXPECT_EQ(err_.str(), "boulder: job 7 has no step reports yet (QUEUED)\n");
  EXPECT_EQ(out_.str(), "");
  EXPECT_FALSE(std::ifstream(options.output).good());
}

TEST_F(CommandsTest, PlotReportsAnUnwritableFile) {
  ScriptRun(2, v1::SUCCEEDED);
  PlotOptions options;
  options.job_id = 7;
  options.output = ::testing::TempDir() + "/no-such-dir/loss.svg";
  EXPECT_EQ(RunPlot(connect_, options, io_), kExitError);
  EXPECT_EQ(err_.str(),
            "boulder: cannot write " + options.output + ": No such file or directory\n");
}

TEST_F(CommandsTest, TopOnAPipePrintsOnce) {
  EXPECT_EQ(RunTop(connect_, TopOptions(), io_), kExitOk);
  const std::string out = out_.str();
  EXPECT_THAT(out, StartsWith("boulder top  " + connect_.address + "  "));
  EXPECT_THAT(out, HasSubstr("workers 1 (1 busy)  jobs 0 running, 0 queued\n"));
  EXPECT_THAT(out, HasSubstr("\nWORKERS\nID    BACKEND   GPU   MEMORY   STATE   JOB   STEP-TIME\n"
                             "w-1   cpu       -     -        BUSY    7     -\n"));
  EXPECT_THAT(out, HasSubstr("\nJOBS\nID   NAME      STATE       STEP      LOSS\n"
                             "7    minigpt   SUCCEEDED   100/100   0.0400\n"));
  EXPECT_THAT(out, Not(HasSubstr("\033[")));
}

TEST_F(CommandsTest, TopOnATerminalRefreshesUntilQuit) {
  io_.out_is_terminal = true;
  io_.terminal_width = 100;
  io_.terminal_height = 30;
  TopOptions options;
  int waits = 0;
  std::vector<absl::Duration> timeouts;
  options.wait_for_quit = [&](absl::Duration timeout) {
    timeouts.push_back(timeout);
    return ++waits == 3;
  };
  EXPECT_EQ(RunTop(connect_, options, io_), kExitOk);
  const std::string out = out_.str();
  EXPECT_THAT(out, StartsWith("\033[?1049h\033[?25l\033[Hboulder top  "));
  EXPECT_THAT(out, EndsWith("\n\033[K\nq or Ctrl-C to quit\033[K\n\033[J\033[?25h\033[?1049l"));
  EXPECT_EQ(Count(out, "\033[H"), 3);
  EXPECT_EQ(Count(out, "w-1   cpu"), 3);
  EXPECT_EQ(timeouts, std::vector<absl::Duration>(3, absl::Seconds(1)));
}

}  // namespace
}  // namespace boulder::client
