// Safe open of the files librsock appends to (see append_file.h).
#include "common/append_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "common/real.h"

namespace rsock {
namespace {

int refuse(int err, const char* why, const char** reason) {
  if (reason) *reason = why;
  return -err;
}

int fail_errno(int err, const char** reason) {
  const char* desc = strerrordesc_np(err);
  return refuse(err, desc ? desc : "error", reason);
}

void close_fd(int fd) { real().close(fd); }

// What is wrong with an existing entry `st` in a directory `dir`, or nullptr.
const char* problem(const struct stat& st, const struct stat& dir, int* err) {
  if (S_ISLNK(st.st_mode)) {
    *err = ELOOP;
    return "is a symbolic link (not followed)";
  }
  if (!S_ISREG(st.st_mode)) {
    *err = EINVAL;
    return "is not a regular file";
  }
  if (st.st_nlink > 1) {
    *err = EMLINK;
    return "has more than one hard link";
  }
  // The rule of the kernel's fs.protected_regular, kept here whatever that
  // sysctl says: in a sticky world-writable directory only our own files,
  // and the directory owner's, are ours to write.
  const bool shared_dir = (dir.st_mode & S_ISVTX) && (dir.st_mode & S_IWOTH);
  if (shared_dir && st.st_uid != geteuid() && st.st_uid != dir.st_uid) {
    *err = EPERM;
    return "belongs to another user in a sticky world-writable directory";
  }
  return nullptr;
}

}  // namespace

int open_append_file(const char* path, const char** reason) {
  if (path == nullptr || *path == '\0') return fail_errno(ENOENT, reason);
  const std::string p(path);
  const size_t slash = p.rfind('/');
  const std::string dir_path = slash == std::string::npos ? "."
                               : slash == 0               ? "/"
                                                          : p.substr(0, slash);
  const std::string name = slash == std::string::npos ? p : p.substr(slash + 1);
  if (name.empty() || name == "." || name == "..")
    return refuse(EINVAL, "is not a regular file", reason);

  // The entry is opened relative to the directory we checked, so the
  // directory cannot be swapped between the checks and the open.
  const int dir_fd = ::open(dir_path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return fail_errno(errno, reason);
  struct stat dir;
  if (fstat(dir_fd, &dir) != 0) {
    const int err = errno;
    close_fd(dir_fd);
    return fail_errno(err, reason);
  }

  // A look before the open, so that a FIFO or a device is never opened at
  // all; the check after the open is the one that counts (no race).
  struct stat st;
  int err = 0;
  if (fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (const char* why = problem(st, dir, &err)) {
      close_fd(dir_fd);
      return refuse(err, why, reason);
    }
  }
  const int fd =
      openat(dir_fd, name.c_str(),
             O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0644);
  if (fd < 0) {
    err = errno;
    // Say what is in the way when something is (planted meanwhile, or a
    // kernel protection refused it), else the error itself.
    const char* why = nullptr;
    int why_err = 0;
    if (fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0)
      why = problem(st, dir, &why_err);
    close_fd(dir_fd);
    if (why) return refuse(why_err, why, reason);
    return fail_errno(err, reason);
  }
  close_fd(dir_fd);
  const char* why = nullptr;
  if (fstat(fd, &st) != 0) {
    err = errno;
    close_fd(fd);
    return fail_errno(err, reason);
  }
  if ((why = problem(st, dir, &err)) != nullptr) {
    close_fd(fd);
    return refuse(err, why, reason);
  }
  // Appends to a regular file never block; clear the flag all the same so
  // the descriptor is an ordinary one.
  fcntl(fd, F_SETFL, O_APPEND);
  return fd;
}

}  // namespace rsock
