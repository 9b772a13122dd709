// Aligned text tables for `boulder jobs` and `boulder workers`, in the style of kubectl:
// upper-case headers, columns left-aligned and separated by (at least) three spaces, no
// borders, no trailing spaces.
//
// Not thread-safe; a Table is built and printed by one thread.
#ifndef BOULDER_CLIENT_TABLE_H_
#define BOULDER_CLIENT_TABLE_H_

#include <string>
#include <vector>

namespace boulder::client {

// Number of terminal columns `text` occupies: UTF-8 code points, not bytes (the progress bar
// uses block characters). Assumes no wide (CJK) characters or control sequences.
size_t DisplayWidth(const std::string& text);

class Table {
 public:
  explicit Table(std::vector<std::string> headers);

  // REQUIRES: row.size() == number of headers.
  void AddRow(std::vector<std::string> row);

  size_t rows() const { return rows_.size(); }

  // The table, header first, one '\n'-terminated line per row.
  std::string Render() const;

 private:
  std::vector<std::string> headers_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace boulder::client

#endif  // BOULDER_CLIENT_TABLE_H_
