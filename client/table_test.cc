#include "client/table.h"

#include "gtest/gtest.h"

namespace boulder::client {
namespace {

TEST(DisplayWidthTest, CountsCodePointsNotBytes) {
  EXPECT_EQ(DisplayWidth(""), 0u);
  EXPECT_EQ(DisplayWidth("abc"), 3u);
  EXPECT_EQ(DisplayWidth("[██░]"), 5u);  // each block is 3 bytes in UTF-8
}

TEST(TableTest, AlignsColumnsToTheWidestCell) {
  Table table({"ID", "NAME", "STATE"});
  table.AddRow({"7", "minigpt", "RUNNING"});
  table.AddRow({"12", "a", "QUEUED"});
  EXPECT_EQ(table.rows(), 2u);
  EXPECT_EQ(table.Render(),
            "ID   NAME      STATE\n"
            "7    minigpt   RUNNING\n"
            "12   a         QUEUED\n");
}

TEST(TableTest, MeasuresMultiByteCellsByDisplayWidth) {
  Table table({"A", "B"});
  table.AddRow({"█", "x"});
  table.AddRow({"abc", "y"});
  EXPECT_EQ(table.Render(),
            "A     B\n"
            "█     x\n"
            "abc   y\n");
}

TEST(TableTest, HeaderOnlyWithoutRows) {
  Table table({"ID", "NAME"});
  EXPECT_EQ(table.Render(), "ID   NAME\n");
}

}  // namespace
}  // namespace boulder::client
