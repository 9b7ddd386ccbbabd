// The transports' side of the exec hand-off (see handoff.h): the one place
// that lists their entries.
#include "transport/handoff.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/own_fd.h"
#include "common/real.h"
#include "fdtable/fdtable.h"
#include "transport/shm/shm_channel.h"
#include "transport/verbs/verbs_channel.h"

namespace rsock {

void Channel::exec_prepare(ExecKind, bool inherited, ExecSink& sink) {
  if (inherited) (void)sink.add('L', true, "resources");
}

const ExecEntryKind* exec_entry_kind(const char* tag, int fields) {
  // S: a shared-memory end the new image holds; C: one whose last holder
  // closed it by exec (the new image tells the peer; not in a spawned
  // child); R: an RDMA end, taken over on first use.
  static const ExecEntryKind kKinds[] = {
      {'S', 11, true, true, shm_exec_adopt},
      {'C', 7, false, false, shm_exec_goodbye},
      {'R', 7, true, true, verbs_exec_adopt},
  };
  if (!tag || !tag[0] || tag[1]) return nullptr;
  for (const ExecEntryKind& k : kKinds)
    if (k.tag == tag[0] && k.fields == fields) return &k;
  return nullptr;
}

bool parse_u64(const char* s, int base, uint64_t* out) {
  if (!s || !*s) return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(s, &end, base);
  if (errno != 0 || *end != '\0' || *s == '-') return false;
  *out = v;
  return true;
}

int owned_memfd(const char* fd_s, const char* dev_s, const char* ino_s) {
  uint64_t fd, dev, ino;
  struct stat st;
  if (!parse_u64(fd_s, 10, &fd) || fd >= static_cast<uint64_t>(FdTable::kMaxFd) ||
      !parse_u64(dev_s, 10, &dev) || !parse_u64(ino_s, 10, &ino) ||
      fstat(static_cast<int>(fd), &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != dev ||
      st.st_ino != ino)
    return -1;
  return static_cast<int>(fd);
}

int exec_dup(int fd, uint64_t* dev, uint64_t* ino) {
  const int dup = fd >= 0 ? dup_high(fd, false) : -1;
  struct stat st;
  if (dup < 0 || fstat(dup, &st) != 0) {
    if (dup >= 0) real().close(dup);
    return -1;
  }
  *dev = st.st_dev;
  *ino = st.st_ino;
  return dup;
}

}  // namespace rsock
