// Helpers shared by the server's tests.
#ifndef BOULDER_SERVER_TEST_UTIL_H_
#define BOULDER_SERVER_TEST_UTIL_H_

#include <string>

#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "google/protobuf/message.h"
#include "google/protobuf/util/message_differencer.h"

namespace boulder::server::testing {

// A fresh directory under the test's temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The body of an HTTP/1.0 GET of `path` from `address` ("HOST:PORT", IPv4); UNAVAILABLE if
// it cannot connect, INTERNAL for a malformed or non-200 reply. Waits at most 10 s.
absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path);

// A small valid job spec (the seed model shrunk) as YAML, on the cpu backend, with
// max_restarts 0 (a failed attempt fails the job; override max_restarts to test restarts).
std::string SmallSpecYaml();

MATCHER_P(EqualsProto, expected, "equals " + expected.ShortDebugString()) {
  std::string diff;
  google::protobuf::util::MessageDifferencer d;
  d.ReportDifferencesToString(&diff);
  if (d.Compare(arg, expected)) return true;
  *result_listener << diff;
  return false;
}

}  // namespace boulder::server::testing

#endif  // BOULDER_SERVER_TEST_UTIL_H_
