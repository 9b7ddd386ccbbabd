// Opening the files librsock appends to (RSOCK_LOG_FILE, RSOCK_STATS) in a
// process that may run as root among other users' files. The path comes from
// the environment and may point into a world-writable directory where another
// user has planted something: the open must never follow a symbolic link at
// the last component, never write to anything but a regular file (a FIFO
// could block the program, a device could be anything), never append to a
// file with a second hard link (a planted link to a file the user could not
// write), and never reuse, in a sticky world-writable directory such as
// /tmp, a name that another user owns. Nothing here prints: the callers say
// once per process why a path was refused. Thread-safety: reentrant, no
// state; uses only system calls.
#pragma once

namespace rsock {

// Opens `path` for appending (O_WRONLY | O_APPEND | O_CLOEXEC), creating it
// with mode 0644 (less the umask) when it does not exist. Returns the fd, or
// a negative errno with *reason (may be nullptr) set to a short static text
// that completes "cannot append to <path>: ...":
//   -ELOOP   "is a symbolic link (not followed)"
//   -EINVAL  "is not a regular file" (FIFO, socket, device, directory)
//   -EMLINK  "has more than one hard link"
//   -EPERM   "belongs to another user in a sticky world-writable directory"
//   other    the errno's description ("Permission denied", ...)
// Directories on the way are followed as usual; only the last component is
// held to these rules.
int open_append_file(const char* path, const char** reason);

}  // namespace rsock
