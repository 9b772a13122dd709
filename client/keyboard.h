// Quitting an interactive view (`boulder top`) with q or Ctrl-C: for its lifetime a
// QuitKeys puts the terminal on stdin in non-canonical, no-echo mode (so that one key press is
// read at once and not shown) and catches SIGINT and SIGTERM (so that the view can restore the
// screen before exiting). The destructor restores the terminal mode and the signal handlers.
//
// Not thread-safe; at most one QuitKeys per process at a time (the signal handlers set one
// process-wide flag).
#ifndef BOULDER_CLIENT_KEYBOARD_H_
#define BOULDER_CLIENT_KEYBOARD_H_

#include <signal.h>
#include <termios.h>

#include "absl/time/time.h"

namespace boulder::client {

class QuitKeys {
 public:
  QuitKeys();
  ~QuitKeys();
  QuitKeys(const QuitKeys&) = delete;
  QuitKeys& operator=(const QuitKeys&) = delete;

  // Waits up to `timeout` and returns true as soon as 'q' or 'Q' is typed or SIGINT/SIGTERM
  // arrives (then and on every later call); false when the time passes. Other keys are
  // discarded. Where stdin is not a terminal (or is at its end) it only waits for the signals.
  bool WaitForQuit(absl::Duration timeout);

 private:
  bool stdin_is_terminal_ = false;
  bool stdin_open_ = true;
  termios saved_mode_{};
  struct sigaction saved_int_ {};
  struct sigaction saved_term_ {};
};

}  // namespace boulder::client

#endif  // BOULDER_CLIENT_KEYBOARD_H_
