// The live loss chart of `boulder watch` on a terminal: a line chart drawn with Unicode
// braille characters (2x4 dots per cell), and the bounded series it draws from.
//
// Pure functions and a value type; thread-compatible.
#ifndef BOULDER_CLIENT_CHART_H_
#define BOULDER_CLIENT_CHART_H_

#include <cstdint>
#include <string>
#include <vector>

namespace boulder::client {

// Draws `values` as a line chart of `rows` lines, each strictly narrower than `width`
// columns (as the progress bar, so that terminals that wrap at the last column do not
// scroll). Each line is a right-aligned y-axis label column (the finite values' maximum on
// the first line, their minimum on the last, "%.4g"; the plot spans that range), a space,
// an axis character ('┤' beside a label, '│' elsewhere) and the plot cells, with trailing
// spaces trimmed:
//   4.56 ┤⠑⠢⢄
//        │   ⠈⠑⠒⠤⣀⣀
//   0.12 ┤         ⠉⠉⠉⠒⠒
// Each cell is two dot columns wide: value i takes dot column i while the values fit, and
// otherwise dot column c shows the mean of values [c*n/D, (c+1)*n/D) of the n values over the
// D dot columns. Consecutive dot columns are joined by a vertical run of dots so that steep
// falls read as a line. Non-finite values (NaN, inf) are skipped: they leave their dot
// column empty and the line is not joined across it. A flat series is drawn on the middle
// dot row. Returns no lines when there is no finite value, or when `rows` < 1 or the width
// leaves fewer than 4 plot cells.
std::vector<std::string> RenderLineChart(const std::vector<double>& values, int width, int rows);

// A series of any length kept in at most `capacity` points: while it fits, every value is a
// point; then adjacent points are merged pairwise (their means, weighted by how many values
// each holds), so that each point is the mean of 2^k consecutive values (the last one of
// fewer). Non-finite values count towards the point's span but not its mean; a point of
// only non-finite values is NaN. Memory and Add() time stay bounded over a million steps.
class DownsampledSeries {
 public:
  // REQUIRES: capacity >= 2 and even.
  explicit DownsampledSeries(size_t capacity = 1024);

  void Add(double value);
  // The points, oldest first.
  std::vector<double> Points() const;
  // How many values each full point holds (1, 2, 4, ...).
  int64_t values_per_point() const { return span_; }

 private:
  struct Bucket {
    double sum = 0;
    int64_t finite = 0;  // values in `sum`
    int64_t count = 0;   // values, finite or not
  };
  size_t capacity_;
  int64_t span_ = 1;
  std::vector<Bucket> buckets_;
};

}  // namespace boulder::client

#endif  // BOULDER_CLIENT_CHART_H_
