#include "client/chart.h"

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "client/table.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace boulder::client {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Width 8 with one-character labels leaves 8 - 1 - (1 + 2) = 4 cells, 8 dot columns.
constexpr int kFourCells = 8;

TEST(RenderLineChartTest, OneDotColumnPerValueWhileTheyFit) {
  // Rows 0..3 of one cell row: 4 -> 0, 3 -> 1, 2 -> 2, 1 -> 3. Braille bits: left column
  // 0x01 0x02 0x04 0x40, right column 0x08 0x10 0x20 0x80 (top to bottom).
  // Cell 0: 0x01 | 0x10 = U+2811; cell 1: 0x04 | 0x80 = U+2884; cells 2-3 empty (trimmed).
  EXPECT_THAT(RenderLineChart({4, 3, 2, 1}, kFourCells, 1), ElementsAre("4 ┤⠑⢄"));
}

TEST(RenderLineChartTest, StepsAreJoinedByAVerticalRunAndLabelsMarkMaxAndMin) {
  // Two cell rows = 8 dot rows: 4 -> row 0, 1 -> row 7; the second column runs rows 1-7.
  // Cell (0,0): 0x01 | 0x10 | 0x20 | 0x80 = U+28B1; cell (1,0): right column full = U+28B8.
  EXPECT_THAT(RenderLineChart({4, 1}, kFourCells, 2), ElementsAre("4 ┤⢱", "1 ┤⢸"));
}

TEST(RenderLineChartTest, FlatSeriesIsDrawnOnTheMiddleDotRow) {
  // 8 dot rows: the middle is row (8 - 1) / 2 = 3, the bottom dots of the first cell row.
  EXPECT_THAT(RenderLineChart({2, 2, 2}, kFourCells, 2), ElementsAre("2 ┤⣀⡀", "2 ┤"));
}

TEST(RenderLineChartTest, NonFiniteValuesAreSkippedAndNotJoinedAcross) {
  // 4 -> row 0 (left dot 0x01 of cell 0), the NaN leaves column 1 empty, 1 -> row 3 in
  // column 2 (left dot 0x40 of cell 1) with no run from row 0.
  EXPECT_THAT(RenderLineChart({4, kNaN, 1}, kFourCells, 1), ElementsAre("4 ┤⠁⡀"));
  EXPECT_THAT(RenderLineChart({4, std::numeric_limits<double>::infinity(), 1}, kFourCells, 1),
              ElementsAre("4 ┤⠁⡀"));
}

TEST(RenderLineChartTest, MoreValuesThanDotColumnsAreAveragedPerColumn) {
  // 16 values over 8 dot columns: pairs. Means 0 0 1 1 2 2 3 1.5 -> rows 3 3 2 2 1 1 0 2
  // (the last pair (0, 3) averages to 1.5, row round(1.5) = 2, joined from row 0).
  std::vector<double> values = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 0, 3};
  EXPECT_THAT(RenderLineChart(values, kFourCells, 1), ElementsAre("3 ┤⣀⠤⠒⠱"));
}

TEST(RenderLineChartTest, LinesStayNarrowerThanTheTerminal) {
  std::mt19937 rng(42);
  std::normal_distribution<double> noise(0, 0.05);
  std::vector<double> loss;
  for (int i = 0; i < 1000; ++i) loss.push_back(4.5 * std::exp(-i / 200.0) + noise(rng));
  for (int width : {20, 50, 101}) {
    std::vector<std::string> lines = RenderLineChart(loss, width, 5);
    ASSERT_EQ(lines.size(), 5u) << width;
    for (const std::string& line : lines) EXPECT_LT(DisplayWidth(line), size_t(width)) << line;
  }
}

TEST(RenderLineChartTest, NothingToDraw) {
  EXPECT_THAT(RenderLineChart({}, 80, 4), IsEmpty());
  EXPECT_THAT(RenderLineChart({kNaN, kNaN}, 80, 4), IsEmpty());
  EXPECT_THAT(RenderLineChart({1, 2}, 80, 0), IsEmpty());
  EXPECT_THAT(RenderLineChart({1, 2}, kFourCells - 1, 1), IsEmpty());  // 3 cells
}

TEST(DownsampledSeriesTest, MergesPairsWhenFull) {
  DownsampledSeries s(4);
  for (int v = 1; v <= 4; ++v) s.Add(v);
  EXPECT_THAT(s.Points(), ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(s.values_per_point(), 1);
  s.Add(5);
  EXPECT_THAT(s.Points(), ElementsAre(1.5, 3.5, 5));
  EXPECT_EQ(s.values_per_point(), 2);
  for (int v = 6; v <= 8; ++v) s.Add(v);
  EXPECT_THAT(s.Points(), ElementsAre(1.5, 3.5, 5.5, 7.5));
  s.Add(9);
  EXPECT_THAT(s.Points(), ElementsAre(2.5, 6.5, 9));
  EXPECT_EQ(s.values_per_point(), 4);
}

TEST(DownsampledSeriesTest, NonFiniteValuesCountButDoNotAverage) {
  DownsampledSeries s(4);
  s.Add(kNaN);
  s.Add(2);
  std::vector<double> points = s.Points();
  ASSERT_EQ(points.size(), 2u);
  EXPECT_TRUE(std::isnan(points[0]));
  EXPECT_EQ(points[1], 2);
  for (int v = 3; v <= 5; ++v) s.Add(v);
  // (NaN, 2) -> 2, (3, 4) -> 3.5, then 5 alone.
  EXPECT_THAT(s.Points(), ElementsAre(2, 3.5, 5));
}

TEST(DownsampledSeriesTest, StaysBoundedOverAMillionValues) {
  DownsampledSeries s(1024);
  for (int i = 0; i < 1000000; ++i) s.Add(i);
  std::vector<double> points = s.Points();
  EXPECT_LE(points.size(), 1024u);
  EXPECT_EQ(s.values_per_point(), 1024);  // 2^10 * 1024 >= 1e6 > 2^9 * 1024
  // The first point is the mean of 0..1023.
  EXPECT_DOUBLE_EQ(points[0], 511.5);
}

}  // namespace
}  // namespace boulder::client
