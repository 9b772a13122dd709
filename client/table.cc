#include "client/table.h"

#include <algorithm>
#include <cassert>
#include <utility>

namespace boulder::client {
namespace {

constexpr size_t kGap = 3;

}  // namespace

size_t DisplayWidth(const std::string& text) {
  size_t width = 0;
  for (unsigned char c : text) {
    // Count every byte that is not a UTF-8 continuation byte (10xxxxxx).
    if ((c & 0xC0) != 0x80) ++width;
  }
  return width;
}

Table::Table(std::vector<std::string> headers) : headers_(std::move(headers)) {}

void Table::AddRow(std::vector<std::string> row) {
  assert(row.size() == headers_.size());
  rows_.push_back(std::move(row));
}

std::string Table::Render() const {
  std::vector<size_t> widths(headers_.size());
  for (size_t c = 0; c < headers_.size(); ++c) widths[c] = DisplayWidth(headers_[c]);
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], DisplayWidth(row[c]));
  }
  std::string out;
  auto append_line = [&](const std::vector<std::string>& cells) {
    for (size_t c = 0; c < cells.size(); ++c) {
      out += cells[c];
      if (c + 1 < cells.size()) out.append(widths[c] - DisplayWidth(cells[c]) + kGap, ' ');
    }
    out.push_back('\n');
  };
  append_line(headers_);
  for (const auto& row : rows_) append_line(row);
  return out;
}

}  // namespace boulder::client
