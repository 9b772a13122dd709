#include "common/spec_path.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace boulder::common {
namespace {

using ::testing::HasSubstr;

TEST(SpecPathTest, AcceptsRelativePathsBelowTheRoot) {
  EXPECT_TRUE(ValidateSpecPath("data.token_files[0]", "train.bin").ok());
  EXPECT_TRUE(ValidateSpecPath("data.token_files[0]", "shards/a/./b..c/train.bin").ok());
  EXPECT_TRUE(ValidateSpecPath("checkpoint.dir", "ckpt/").ok());
}

TEST(SpecPathTest, RefusesTraversalWithTheFieldPath) {
  absl::Status s = ValidateSpecPath("data.token_files[2]", "data/../../etc/passwd");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "data.token_files[2]: 'data/../../etc/passwd' leaves the job's directory ('..' is "
            "not allowed)");
  EXPECT_EQ(ValidateSpecPath("f", "..").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateSpecPath("f", "a/..").code(), absl::StatusCode::kInvalidArgument);
}

TEST(SpecPathTest, RefusesAbsoluteHomeControlAndBackslash) {
  EXPECT_THAT(ValidateSpecPath("model.init_from", "/etc/shadow").message(),
              HasSubstr("is absolute"));
  SpecPathPolicy absolute_ok;
  absolute_ok.allow_absolute = true;
  EXPECT_TRUE(ValidateSpecPath("model.init_from", "/mnt/weights.bin", absolute_ok).ok());
  EXPECT_EQ(ValidateSpecPath("model.init_from", "/mnt/../etc", absolute_ok).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ValidateSpecPath("f", "~/x").message(), HasSubstr("'~'"));
  EXPECT_THAT(ValidateSpecPath("f", "~root/x").message(), HasSubstr("'~'"));
  EXPECT_EQ(ValidateSpecPath("f", std::string("a\0b", 3)).message(),
            "f: 'a\\x00b' contains a control character");
  EXPECT_THAT(ValidateSpecPath("f", "a\\..\\b").message(), HasSubstr("backslash"));
  EXPECT_EQ(ValidateSpecPath("f", "").message(), "f: empty path");
  EXPECT_THAT(ValidateSpecPath("f", std::string(kMaxSpecPathBytes + 1, 'a')).message(),
              HasSubstr("longer than"));
}

TEST(SpecPathTest, ResolveJoinsAndCatchesLinksOutOfTheRoot) {
  namespace fs = std::filesystem;
  std::string tmpl = (fs::temp_directory_path() / "spec-path-XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const fs::path root = tmpl;
  std::ofstream(root / "ok.bin") << "x";
  fs::create_symlink("/etc", root / "escape");

  auto joined = ResolveSpecPath("f", "ok.bin", root.string());
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(*joined, (root / "ok.bin").string());

  auto real = ResolveSpecPath("f", "ok.bin", root.string(), {}, /*resolve_links=*/true);
  ASSERT_TRUE(real.ok()) << real.status();
  EXPECT_EQ(*real, fs::canonical(root / "ok.bin").string());

  auto escaped = ResolveSpecPath("f", "escape/passwd", root.string(), {}, true);
  EXPECT_EQ(escaped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(escaped.status().message(), HasSubstr("through a symbolic link"));

  EXPECT_EQ(ResolveSpecPath("f", "missing.bin", root.string(), {}, true).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ResolveSpecPath("f", "../x", root.string()).status().code(),
            absl::StatusCode::kInvalidArgument);
  fs::remove_all(root);
}

}  // namespace
}  // namespace boulder::common
