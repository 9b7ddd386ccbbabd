// Logging for librsock: levels, a compile-time ceiling, errno preserved,
// written with the real write(2) to stderr or RSOCK_LOG_FILE, never through
// the application's stdio. Thread-safety: each message is one write(2).
#pragma once

#include "config/config.h"

#ifndef RSOCK_LOG_CEILING
#define RSOCK_LOG_CEILING 4  // trace; build with -DRSOCK_LOG_CEILING=1 to compile out info and below
#endif

namespace rsock {

extern int g_log_level;  // set by the runtime from Config::log_level
// Set by the runtime: true when fd carries librsock state (an accelerated
// stream), so that a log line is never written into one.
extern bool (*g_log_fd_is_stream)(int fd);
// Sends the log to `path` (nullptr/empty: stderr), opened with
// open_append_file; a path that cannot be used gives one warning line on
// stderr naming RSOCK_LOG_FILE, the path and the reason, and the log stays
// on stderr.
void log_open(const char* path);
void log_write(int level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace rsock

#define RSOCK_LOG(level, ...)                                                    \
  do {                                                                           \
    if ((level) <= RSOCK_LOG_CEILING && (level) <= ::rsock::g_log_level)         \
      ::rsock::log_write((level), __VA_ARGS__);                                  \
  } while (0)
#define LOG_ERROR(...) RSOCK_LOG(::rsock::kLogError, __VA_ARGS__)
#define LOG_WARN(...) RSOCK_LOG(::rsock::kLogWarn, __VA_ARGS__)
#define LOG_INFO(...) RSOCK_LOG(::rsock::kLogInfo, __VA_ARGS__)
#define LOG_DEBUG(...) RSOCK_LOG(::rsock::kLogDebug, __VA_ARGS__)
