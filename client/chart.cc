#include "client/chart.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"

namespace boulder::client {
namespace {

constexpr int kMinCells = 4;
constexpr int kDotRowsPerCell = 4;
constexpr int kDotColumnsPerCell = 2;
// Braille dot bits by dot row (0 = top), for the left and the right dot column of a cell
// (Unicode numbers the dots 1-2-3-7 down the left and 4-5-6-8 down the right).
constexpr uint8_t kLeftDots[] = {0x01, 0x02, 0x04, 0x40};
constexpr uint8_t kRightDots[] = {0x08, 0x10, 0x20, 0x80};

// U+2800 + bits as UTF-8.
std::string Braille(uint8_t bits) {
  const int code = 0x2800 + bits;
  std::string out;
  out += static_cast<char>(0xE0 | (code >> 12));
  out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
  out += static_cast<char>(0x80 | (code & 0x3F));
  return out;
}

// The value of each dot column: the values themselves while they fit, else bucket means.
std::vector<double> ColumnValues(const std::vector<double>& values, size_t dot_columns) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  const size_t n = values.size();
  std::vector<double> out;
  if (n <= dot_columns) {
    for (double v : values) out.push_back(std::isfinite(v) ? v : kNaN);
    return out;
  }
  out.reserve(dot_columns);
  for (size_t c = 0; c < dot_columns; ++c) {
    const size_t lo = c * n / dot_columns;
    const size_t hi = (c + 1) * n / dot_columns;
    double sum = 0;
    int finite = 0;
    for (size_t i = lo; i < hi; ++i) {
      if (std::isfinite(values[i])) {
        sum += values[i];
        ++finite;
      }
    }
    out.push_back(finite > 0 ? sum / finite : kNaN);
  }
  return out;
}

}  // namespace

std::vector<std::string> RenderLineChart(const std::vector<double>& values, int width, int rows) {
  if (rows < 1) return {};
  double lo = std::numeric_limits<double>::infinity();
  double hi = -lo;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  if (lo > hi) return {};
  // The axis spans the values' own range; bucket means lie within it.
  const double ymin = lo;
  const double ymax = hi;
  const std::string top = absl::StrFormat("%.4g", ymax);
  const std::string bottom = absl::StrFormat("%.4g", ymin);
  const int label_w = static_cast<int>(std::max(top.size(), bottom.size()));
  const int cells = width - 1 - label_w - 2;
  if (cells < kMinCells) return {};
  const std::vector<double> columns =
      ColumnValues(values, static_cast<size_t>(cells) * kDotColumnsPerCell);
  const int dot_rows = rows * kDotRowsPerCell;
  auto dot_row = [&](double y) {
    if (ymax == ymin) return (dot_rows - 1) / 2;
    return static_cast<int>(std::lround((ymax - y) / (ymax - ymin) * (dot_rows - 1)));
  };

  std::vector<std::vector<uint8_t>> grid(rows, std::vector<uint8_t>(cells, 0));
  auto set_dot = [&](size_t column, int row) {
    const uint8_t* dots = column % kDotColumnsPerCell == 0 ? kLeftDots : kRightDots;
    grid[row / kDotRowsPerCell][column / kDotColumnsPerCell] |= dots[row % kDotRowsPerCell];
  };
  int prev = -1;  // dot row of the previous column; -1 when it had no value
  for (size_t c = 0; c < columns.size(); ++c) {
    if (std::isnan(columns[c])) {
      prev = -1;
      continue;
    }
    const int r = dot_row(columns[c]);
    // Joins from just after the previous column's dot to this one's.
    int from = r;
    int to = r;
    if (prev >= 0 && r > prev) from = prev + 1;
    if (prev >= 0 && r < prev) to = prev - 1;
    for (int y = from; y <= to; ++y) set_dot(c, y);
    prev = r;
  }

  std::vector<std::string> lines;
  for (int i = 0; i < rows; ++i) {
    std::string label;
    if (i == 0) {
      label = top;
    } else if (i == rows - 1) {
      label = bottom;
    }
    std::string line = absl::StrFormat("%*s %s", label_w, label, label.empty() ? "│" : "┤");
    for (uint8_t bits : grid[i]) line += bits == 0 ? std::string(" ") : Braille(bits);
    line.erase(line.find_last_not_of(' ') + 1);
    lines.push_back(std::move(line));
  }
  return lines;
}

DownsampledSeries::DownsampledSeries(size_t capacity) : capacity_(capacity) {
  assert(capacity >= 2 && capacity % 2 == 0);
}

void DownsampledSeries::Add(double value) {
  if (buckets_.empty() || buckets_.back().count == span_) {
    if (buckets_.size() == capacity_) {
      for (size_t i = 0; i < capacity_ / 2; ++i) {
        const Bucket& a = buckets_[2 * i];
        const Bucket& b = buckets_[2 * i + 1];
        buckets_[i] = Bucket{a.sum + b.sum, a.finite + b.finite, a.count + b.count};
      }
      buckets_.resize(capacity_ / 2);
      span_ *= 2;
    }
    buckets_.emplace_back();
  }
  Bucket& last = buckets_.back();
  ++last.count;
  if (std::isfinite(value)) {
    last.sum += value;
    ++last.finite;
  }
}

std::vector<double> DownsampledSeries::Points() const {
  std::vector<double> out;
  out.reserve(buckets_.size());
  for (const Bucket& b : buckets_) {
    out.push_back(b.finite > 0 ? b.sum / static_cast<double>(b.finite)
                               : std::numeric_limits<double>::quiet_NaN());
  }
  return out;
}

}  // namespace boulder::client
