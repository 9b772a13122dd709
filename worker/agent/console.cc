#include "worker/agent/console.h"

#include <iostream>
#include <mutex>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace boulder::agent {
namespace {

std::mutex& ConsoleMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}

}  // namespace

void PrintToStdout(absl::string_view line) {
  std::lock_guard<std::mutex> lock(ConsoleMutex());
  std::cout << line << std::endl;
}

void LogToStderr(absl::string_view line) {
  const std::string stamp =
      absl::FormatTime("%Y-%m-%d %H:%M:%E3S", absl::Now(), absl::LocalTimeZone());
  std::lock_guard<std::mutex> lock(ConsoleMutex());
  std::cerr << stamp << " boulder-worker: " << line << std::endl;
}

}  // namespace boulder::agent
