#include "client/keyboard.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>

#include "absl/time/clock.h"

namespace boulder::client {
namespace {

volatile std::sig_atomic_t g_quit_signal = 0;

void OnQuitSignal(int) { g_quit_signal = 1; }

}  // namespace

QuitKeys::QuitKeys() {
  g_quit_signal = 0;
  struct sigaction action {};
  action.sa_handler = OnQuitSignal;
  sigemptyset(&action.sa_mask);
  // No SA_RESTART: poll() returns EINTR at once rather than after its timeout.
  action.sa_flags = 0;
  sigaction(SIGINT, &action, &saved_int_);
  sigaction(SIGTERM, &action, &saved_term_);
  if (isatty(STDIN_FILENO) == 1 && tcgetattr(STDIN_FILENO, &saved_mode_) == 0) {
    termios raw = saved_mode_;
    // ISIG stays on: Ctrl-C still sends SIGINT.
    raw.c_lflag &= ~(ICANON | ECHO);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    stdin_is_terminal_ = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
  }
}

QuitKeys::~QuitKeys() {
  if (stdin_is_terminal_) tcsetattr(STDIN_FILENO, TCSANOW, &saved_mode_);
  sigaction(SIGINT, &saved_int_, nullptr);
  sigaction(SIGTERM, &saved_term_, nullptr);
}

bool QuitKeys::WaitForQuit(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    if (g_quit_signal != 0) return true;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(left)) + 1;
    pollfd fd{STDIN_FILENO, POLLIN, 0};
    const int ready = poll(&fd, stdin_open_ ? 1 : 0, ms);
    if (ready <= 0) continue;  // timeout, or EINTR from a signal: both checked above
    char keys[64];
    const ssize_t n = read(STDIN_FILENO, keys, sizeof(keys));
    if (n <= 0) {
      if (n == 0 || errno != EINTR) stdin_open_ = false;  // at its end: stop polling it
      continue;
    }
    for (ssize_t i = 0; i < n; ++i) {
      if (keys[i] == 'q' || keys[i] == 'Q') return true;
    }
  }
}

}  // namespace boulder::client
