// A fresh directory under the system's temporary directory for one test, removed with all it
// holds when the TempDir goes out of scope. Tests only.
#ifndef BOULDER_WORKER_ENGINE_TEST_TEMP_DIR_H_
#define BOULDER_WORKER_ENGINE_TEST_TEMP_DIR_H_

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace boulder::engine {

class TempDir {
 public:
  // `prefix` names the directory ("<prefix>-XXXXXX"), so a leftover shows which test made it.
  explicit TempDir(const std::string& prefix) {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace boulder::engine

#endif  // BOULDER_WORKER_ENGINE_TEST_TEMP_DIR_H_
