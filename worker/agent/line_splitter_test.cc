#include "worker/agent/line_splitter.h"

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace boulder::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

class LineSplitterTest : public ::testing::Test {
 protected:
  LineSplitter::Emit Collect() {
    return [this](absl::string_view line, bool truncated) {
      lines_.emplace_back(std::string(line), truncated);
    };
  }
  std::vector<std::pair<std::string, bool>> lines_;
};

TEST_F(LineSplitterTest, JoinsPiecesAndSplitsAtNewlines) {
  LineSplitter splitter(100);
  splitter.Append("al", Collect());
  splitter.Append("pha\nbeta\r\n\ngam", Collect());
  EXPECT_THAT(lines_, ElementsAre(Pair("alpha", false), Pair("beta", false), Pair("", false)));
  splitter.Append("ma", Collect());
  splitter.Finish(Collect());
  EXPECT_THAT(lines_.back(), Pair("gamma", false));
  EXPECT_EQ(lines_.size(), 4u);
}

TEST_F(LineSplitterTest, CutsOverlongLinesAndResumesAtTheNextLine) {
  LineSplitter splitter(4);
  splitter.Append("abcdefgh", Collect());
  splitter.Append("ij\nok\n", Collect());
  EXPECT_THAT(lines_, ElementsAre(Pair("abcd", true), Pair("ok", false)));
}

TEST_F(LineSplitterTest, FinishWithoutPendingBytesEmitsNothing) {
  LineSplitter splitter(8);
  splitter.Append("done\n", Collect());
  splitter.Finish(Collect());
  EXPECT_THAT(lines_, ElementsAre(Pair("done", false)));
}

}  // namespace
}  // namespace boulder::agent
