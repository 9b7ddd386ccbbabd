// The transports' side of the exec hand-off (src/lifecycle/exec_handoff.h;
// the variable's format: docs/protocol.md section 8). Before an exec, each
// end describes itself through an ExecSink (Channel::exec_prepare); in the
// new image, the entry's transport takes the end over (ExecEntryKind::adopt).
// lifecycle/ builds the variable, finds the sockets and attaches the
// connections; it names no transport. handoff.cpp is the one place that
// lists the transports' entries.
// Thread-safety: exec_prepare and exec_undo run in the thread that execs or
// spawns, and may run in a vfork child (no heap memory); adopt runs once,
// from the new image's init.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "stats/stats.h"
#include "transport/channel.h"

namespace rsock {

enum class ExecKind : int {
  kReplace,  // this process execs (execve and friends): same pid, same holders
  kSpawn     // a new child process execs (posix_spawn): it becomes one more holder
};

// What an end's exec_prepare may do to the variable and to its stream.
class ExecSink {
 public:
  // Appends the entry ";<tag>[,<sdev>,<sino>],<fields>" whole, or nothing
  // (false: the variable is full). with_socket: the socket's identity
  // follows the tag (the new image finds the connection's fds by it).
  virtual bool add(char tag, bool with_socket, const char* fields) = 0;
  // A descriptor the new image inherits for an entry: closed once the exec
  // or spawn has happened (or failed).
  virtual void keep(int fd) = 0;
  // Channel::exec_undo(kind, token) runs if the exec or spawn fails.
  virtual void undo_later(uint32_t token) = 0;
  // The stream of the connection: report every byte read so far as
  // consumed (the end's shared state then says exactly where it stands);
  // wait (bounded) until no thread of this process is inside a send or recv.
  virtual void report_consumed() = 0;
  virtual void quiesce() = 0;

 protected:
  ~ExecSink() = default;
};

// Bounds of a hand-off entry's fields, for the transports' snprintf.
inline constexpr size_t kExecFieldsCap = 192;

// What the new image made of an entry.
struct Adoption {
  Path path = Path::kShm;
  std::unique_ptr<Channel> channel;  // the end, taken over (empty: lost, or nothing to attach)
  const char* lost = nullptr;        // why the end cannot be used here: calls on its fds fail
  bool resume = false;               // the stream continues from `at`
  EndPositions at;
  bool counted = false;         // counts in the stats as a connection of this image
  const char* how = "";         // the log line's end, after "fd N: "
};

// One kind of entry: its tag and field count (with the tag), whether the
// socket's identity follows the tag, whether a spawned child reads it, and
// the transport's take-over. adopt gets the entry's fields and the fds of
// its socket in this image (empty when it did not reach this image: the
// transport then only releases what the old image counted).
struct ExecEntryKind {
  char tag;
  int fields;
  bool with_socket;
  bool in_spawn;
  void (*adopt)(char** f, const std::vector<int>& fds, bool spawned, Adoption* out);
};

// The transports' entry for (tag, field count), or nullptr.
const ExecEntryKind* exec_entry_kind(const char* tag, int fields);

// Helpers for the transports' parsers: numbers, and a descriptor the old
// image dup'd for an entry, checked by identity (-1 when the fd is not the
// file that device and inode name: then it is not ours to touch).
bool parse_u64(const char* s, int base, uint64_t* out);
int owned_memfd(const char* fd_s, const char* dev_s, const char* ino_s);
// A non-close-on-exec dup of fd above the application's numbers, for an
// entry, with its device and inode; -1 when there is none.
int exec_dup(int fd, uint64_t* dev, uint64_t* ino);

}  // namespace rsock
