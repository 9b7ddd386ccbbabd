// Log sink (see log.h).
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include <string>

#include "common/append_file.h"
#include "common/real.h"

namespace rsock {

int g_log_level = kDefaultLogLevel;
bool (*g_log_fd_is_stream)(int fd) = nullptr;
static int g_log_fd = 2;

void log_open(const char* path) {
  if (path == nullptr || *path == '\0') return;
  const char* why = nullptr;
  const int fd = open_append_file(path, &why);
  if (fd >= 0) {
    g_log_fd = fd;
    return;
  }
  // Called once per process (at init): one line, and the log stays on stderr.
  const std::string msg = "librsock: RSOCK_LOG_FILE: cannot append to \"" + message_text(path) +
                          "\": " + why + "; logging to stderr\n";
  real().write(2, msg.data(), msg.size());
}

void log_write(int level, const char* fmt, ...) {
  const int saved_errno = errno;
  static const char* const kNames[] = {"error", "warn", "info", "debug", "trace"};
  char buf[512];
  int n = snprintf(buf, sizeof buf, "librsock[%d] %s: ", static_cast<int>(getpid()),
                   kNames[level < 0 ? 0 : level > 4 ? 4 : level]);
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(buf + n, sizeof buf - n - 1, fmt, ap);
  va_end(ap);
  size_t len = static_cast<size_t>(n) + (m < 0 ? 0 : static_cast<size_t>(m));
  if (len > sizeof buf - 2) len = sizeof buf - 2;
  buf[len++] = '\n';
  // An inetd-style service has its connection on 0, 1 and 2: a line
  // written to an accelerated socket's kernel side would break the stream
  // (its peer never reads it there). Such a line is dropped.
  const bool into_stream = g_log_fd_is_stream && g_log_fd_is_stream(g_log_fd);
  if (real().write && !into_stream) real().write(g_log_fd, buf, len);
  errno = saved_errno;
}

}  // namespace rsock
