// rsockstat: the accelerated and pairing connections of running processes
// under librsock, and each process's connections and fallbacks by reason
// code. It reads the files the processes publish (src/stats/publish.h):
// <dir>/rsock-<uid>/<pid>, only the caller's own unless run as root. Those
// files are written by the processes they describe, so every field is
// checked before use, and nothing read from them is trusted as a length,
// an index or a string end. A file whose process is gone (killed) is
// removed. See docs/man/rsockstat.1.
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "stats/publish.h"

#ifndef RSOCK_VERSION
#error "RSOCK_VERSION comes from the Makefile"
#endif

namespace {

using rsock::pub::Header;
using rsock::pub::Slot;

struct Conn {
  int fd;
  std::string local, remote, transport, state;
  uint64_t sent, received, tcp_sent, tcp_received, stalls, wakeups;
  int64_t since;
};

struct Code {
  std::string name;
  uint64_t count;
};

struct Process {
  int pid;
  unsigned uid;
  std::string program;
  uint64_t connections[3];
  uint64_t unlisted;
  std::vector<Code> codes[4];  // by CodeKind
  std::vector<Conn> conns;
};

template <class T>
T load(const T* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
uint64_t load64(const std::atomic<uint64_t>& a) {
  return load(reinterpret_cast<const uint64_t*>(&a));
}
uint32_t load32(const std::atomic<uint32_t>& a) {
  return load(reinterpret_cast<const uint32_t*>(&a));
}

// Only what a program name or a code may hold is kept; the rest becomes '?'.
std::string clean(const char* s, size_t cap) {
  std::string out;
  for (size_t i = 0; i < cap && s[i]; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    out += (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') ? static_cast<char>(c) : '?';
  }
  return out;
}

std::string address(uint8_t family, const uint8_t* addr, uint16_t port) {
  char text[INET6_ADDRSTRLEN + 16];
  if (family == AF_INET) {
    inet_ntop(AF_INET, addr, text, sizeof text);
    return std::string(text) + ":" + std::to_string(port);
  }
  if (family == AF_INET6) {
    inet_ntop(AF_INET6, addr, text, sizeof text);
    return "[" + std::string(text) + "]:" + std::to_string(port);
  }
  return "?";
}

uint64_t proc_start_ticks(int pid) {
  char path[64], text[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  if (n <= 0) return 0;
  text[n] = '\0';
  uint64_t v = 0;
  return rsock::pub::parse_start_ticks(text, &v) ? v : 0;
}

// Reads one file; false when it is not a live process's. *stale: the
// process it describes is gone (or the pid belongs to another now).
bool read_file(int dfd, const char* name, unsigned dir_uid, Process* out, bool* stale) {
  *stale = false;
  char* end = nullptr;
  const long pid = strtol(name, &end, 10);
  if (*name < '1' || *name > '9' || *end || pid <= 0 || pid > 0x3fffffff) return false;
  const int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return false;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != dir_uid ||
      static_cast<size_t>(st.st_size) < rsock::pub::kFileBytes) {
    close(fd);
    return false;
  }
  void* m = mmap(nullptr, rsock::pub::kFileBytes, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return false;
  const auto* h = static_cast<const Header*>(m);
  bool ok = memcmp(h->magic, rsock::pub::kMagic, sizeof h->magic) == 0 &&
            h->version == rsock::pub::kVersion && h->header_bytes == sizeof(Header) &&
            h->slot_bytes == sizeof(Slot) && h->slot_count == rsock::pub::kSlots && h->pid == pid;
  if (ok) {
    // The process must be the file's user's: a user cannot speak for
    // another's processes. (Only root writes in root's directory, also for
    // a process that has dropped its privileges since.)
    char proc[32];
    snprintf(proc, sizeof proc, "/proc/%ld", pid);
    struct stat ps;
    const bool gone = kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
    if (!gone && dir_uid != 0 && (stat(proc, &ps) != 0 || ps.st_uid != dir_uid)) ok = false;
    const uint64_t ticks = proc_start_ticks(static_cast<int>(pid));
    if (gone || (ticks != 0 && ticks != h->start_ticks)) {
      *stale = true;
      ok = false;
    }
  }
  if (ok && !*stale) {
    out->pid = static_cast<int>(pid);
    out->uid = dir_uid;
    out->program = clean(h->program, sizeof h->program);
    for (int i = 0; i < 3; ++i) out->connections[i] = load64(h->connections[i]);
    out->unlisted = load64(h->unlisted);
    for (const rsock::pub::Code& c : h->codes) {
      const uint64_t n = load64(c.count);
      if (c.kind >= 1 && c.kind <= 3 && n > 0)
        out->codes[c.kind].push_back({clean(c.name, sizeof c.name), n});
    }
    const auto* slots =
        reinterpret_cast<const Slot*>(static_cast<const char*>(m) + rsock::pub::kSlotsOffset);
    const uint32_t high = std::min(load32(h->high), rsock::pub::kSlots);
    for (uint32_t i = 0; i < high; ++i) {
      const Slot& s = slots[i];
      const uint32_t gen = load32(s.gen);
      const uint32_t state = load32(s.state);
      if (state != rsock::pub::kPairing && state != rsock::pub::kAccelerated) continue;
      Conn c;
      c.fd = s.fd;
      c.local = address(s.family, s.local_addr, s.local_port);
      c.remote = address(s.family, s.remote_addr, s.remote_port);
      c.transport = s.transport == rsock::pub::kTransportRdma ? "rdma" : "shm";
      c.state = state == rsock::pub::kPairing ? "pairing" : "accelerated";
      if (state == rsock::pub::kPairing) c.transport = "tcp";
      c.sent = load64(s.c.sent);
      c.received = load64(s.c.received);
      c.tcp_sent = load64(s.c.tcp_sent);
      c.tcp_received = load64(s.c.tcp_received);
      c.stalls = load64(s.c.stalls);
      c.wakeups = load64(s.c.wakeups);
      c.since = s.since;
      // Claimed again while we read: another connection's fields are mixed in.
      if (load32(s.gen) != gen || load32(s.state) != state) continue;
      out->conns.push_back(std::move(c));
    }
  }
  munmap(m, rsock::pub::kFileBytes);
  return ok;
}

// The processes of one user's directory (pid_filter: only that one).
void read_dir(const std::string& dir, unsigned uid, int pid_filter, std::vector<Process>* out) {
  const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) return;
  struct stat st;
  // A directory that is not its user's alone is not one librsock uses.
  if (fstat(dfd, &st) != 0 || (st.st_mode & 077) != 0 || st.st_uid != uid) {
    close(dfd);
    return;
  }
  DIR* d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return;
  }
  while (const dirent* e = readdir(d)) {
    if (pid_filter > 0 && atoi(e->d_name) != pid_filter) continue;
    Process p = {};
    bool stale = false;
    if (read_file(dirfd(d), e->d_name, static_cast<unsigned>(st.st_uid), &p, &stale))
      out->push_back(std::move(p));
    else if (stale)
      unlinkat(dirfd(d), e->d_name, 0);
  }
  closedir(d);
}

std::vector<Process> collect(const std::string& base, int pid_filter) {
  std::vector<Process> procs;
  if (geteuid() != 0) {
    read_dir(base + "/rsock-" + std::to_string(geteuid()), geteuid(), pid_filter, &procs);
  } else if (DIR* d = opendir(base.c_str())) {
    while (const dirent* e = readdir(d)) {
      char* end = nullptr;
      if (strncmp(e->d_name, "rsock-", 6) != 0) continue;
      const unsigned long uid = strtoul(e->d_name + 6, &end, 10);
      if (e->d_name[6] == '\0' || *end || uid > 0xffffffffu) continue;
      read_dir(base + "/" + e->d_name, static_cast<unsigned>(uid), pid_filter, &procs);
    }
    closedir(d);
  }
  std::sort(procs.begin(), procs.end(),
            [](const Process& a, const Process& b) { return a.pid < b.pid; });
  return procs;
}

const char* const kKinds[] = {"", "fallbacks", "resets", "rejected"};

void print_json(const std::vector<Process>& procs) {
  printf("{\"processes\": [");
  for (size_t i = 0; i < procs.size(); ++i) {
    const Process& p = procs[i];
    printf("%s{\"pid\": %d, \"uid\": %u, \"program\": \"%s\", ", i ? ", " : "", p.pid, p.uid,
           p.program.c_str());
    printf("\"connections\": {\"shm\": %llu, \"rdma\": %llu, \"tcp\": %llu}, \"unlisted\": %llu",
           static_cast<unsigned long long>(p.connections[0]),
           static_cast<unsigned long long>(p.connections[1]),
           static_cast<unsigned long long>(p.connections[2]),
           static_cast<unsigned long long>(p.unlisted));
    for (int k = 1; k <= 3; ++k) {
      printf(", \"%s\": {", kKinds[k]);
      for (size_t j = 0; j < p.codes[k].size(); ++j)
        printf("%s\"%s\": %llu", j ? ", " : "", p.codes[k][j].name.c_str(),
               static_cast<unsigned long long>(p.codes[k][j].count));
      printf("}");
    }
    printf(", \"open\": [");
    for (size_t j = 0; j < p.conns.size(); ++j) {
      const Conn& c = p.conns[j];
      printf(
          "%s{\"fd\": %d, \"local\": \"%s\", \"remote\": \"%s\", \"transport\": \"%s\", "
          "\"state\": \"%s\", \"bytes_sent\": %llu, \"bytes_received\": %llu, "
          "\"tcp_bytes_sent\": %llu, \"tcp_bytes_received\": %llu, \"stalls\": %llu, "
          "\"wakeups\": %llu, \"since\": %lld}",
          j ? ", " : "", c.fd, c.local.c_str(), c.remote.c_str(), c.transport.c_str(),
          c.state.c_str(), static_cast<unsigned long long>(c.sent),
          static_cast<unsigned long long>(c.received), static_cast<unsigned long long>(c.tcp_sent),
          static_cast<unsigned long long>(c.tcp_received),
          static_cast<unsigned long long>(c.stalls), static_cast<unsigned long long>(c.wakeups),
          static_cast<long long>(c.since));
    }
    printf("]}");
  }
  printf("]}\n");
}

void print_table(const std::vector<Process>& procs) {
  printf("%-7s %-15s %4s %-22s %-22s %-5s %-11s %12s %12s %8s %8s\n", "PID", "PROGRAM", "FD",
         "LOCAL", "REMOTE", "VIA", "STATE", "SENT", "RECEIVED", "STALLS", "WAKEUPS");
  for (const Process& p : procs)
    for (const Conn& c : p.conns)
      printf("%-7d %-15.15s %4d %-22s %-22s %-5s %-11s %12llu %12llu %8llu %8llu\n", p.pid,
             p.program.c_str(), c.fd, c.local.c_str(), c.remote.c_str(), c.transport.c_str(),
             c.state.c_str(), static_cast<unsigned long long>(c.tcp_sent + c.sent),
             static_cast<unsigned long long>(c.tcp_received + c.received),
             static_cast<unsigned long long>(c.stalls), static_cast<unsigned long long>(c.wakeups));
  printf("\n%-7s %-15s %-20s %s\n", "PID", "PROGRAM", "MADE shm/rdma/tcp",
         "FALLBACKS, RESETS, REJECTED (by reason code)");
  for (const Process& p : procs) {
    std::string made = std::to_string(p.connections[0]) + "/" + std::to_string(p.connections[1]) +
                       "/" + std::to_string(p.connections[2]);
    std::string why;
    for (int k = 1; k <= 3; ++k)
      for (const Code& c : p.codes[k]) {
        if (!why.empty()) why += ", ";
        why += std::string(k == 1   ? ""
                           : k == 2 ? "reset "
                                    : "rejected ") +
               c.name + " " + std::to_string(c.count);
      }
    if (p.unlisted) why += (why.empty() ? "" : ", ") + std::to_string(p.unlisted) + " not listed";
    printf("%-7d %-15.15s %-20s %s\n", p.pid, p.program.c_str(), made.c_str(),
           why.empty() ? "-" : why.c_str());
  }
}

void usage(FILE* f) {
  fprintf(f,
          "usage: rsockstat [-j] [-p PID] [-i SECONDS [-c COUNT]] [--dir DIR]\n"
          "Shows the connections librsock accelerates in running processes (yours, or\n"
          "everyone's as root): addresses, transport (shm, rdma; tcp while pairing),\n"
          "state, bytes each way, credit stalls, wakeups; then each process's\n"
          "connections by path and its fallbacks, resets and rejections by reason code.\n"
          "\n"
          "  -j, --json          one JSON object instead of the tables\n"
          "  -p, --pid PID       only that process (exit status 1 if it is not shown)\n"
          "  -i, --interval S    repeat every S seconds (until interrupted, or -c times)\n"
          "  -c, --count N       with -i: N views, then exit\n"
          "      --dir DIR       where processes publish (RSOCK_PUBLISH_DIR; /dev/shm)\n"
          "  -h, --help          this text\n"
          "      --version       the version\n");
}

bool parse_int(const char* s, long min, long max, long* out) {
  char* end = nullptr;
  errno = 0;
  const long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < min || v > max) return false;
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  long pid = 0, interval = 0, count = 0;
  const char* env_dir = getenv("RSOCK_PUBLISH_DIR");
  std::string dir = env_dir && *env_dir ? env_dir : "/dev/shm";
  static const option kLong[] = {
      {"json", no_argument, nullptr, 'j'},           {"pid", required_argument, nullptr, 'p'},
      {"interval", required_argument, nullptr, 'i'}, {"count", required_argument, nullptr, 'c'},
      {"dir", required_argument, nullptr, 'd'},      {"help", no_argument, nullptr, 'h'},
      {"version", no_argument, nullptr, 'V'},        {nullptr, 0, nullptr, 0}};
  for (int o; (o = getopt_long(argc, argv, "jp:i:c:h", kLong, nullptr)) != -1;) {
    switch (o) {
      case 'j':
        json = true;
        break;
      case 'p':
        if (!parse_int(optarg, 1, 0x3fffffff, &pid)) {
          fprintf(stderr, "rsockstat: -p: \"%s\" is not a process id\n", optarg);
          return 2;
        }
        break;
      case 'i':
        if (!parse_int(optarg, 1, 86400, &interval)) {
          fprintf(stderr, "rsockstat: -i: \"%s\" is not a number of seconds (1..86400)\n", optarg);
          return 2;
        }
        break;
      case 'c':
        if (!parse_int(optarg, 1, 1000000000, &count)) {
          fprintf(stderr, "rsockstat: -c: \"%s\" is not a count (1 or more)\n", optarg);
          return 2;
        }
        break;
      case 'd':
        dir = optarg;
        break;
      case 'h':
        usage(stdout);
        return 0;
      case 'V':
        printf("rsockstat %s\n", RSOCK_VERSION);
        return 0;
      default:
        usage(stderr);
        return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "rsockstat: unexpected argument \"%s\"\n", argv[optind]);
    usage(stderr);
    return 2;
  }
  if (count && !interval) {
    fprintf(stderr, "rsockstat: -c needs -i\n");
    return 2;
  }
  bool shown = false;
  for (long n = 0;; ++n) {
    const std::vector<Process> procs = collect(dir, static_cast<int>(pid));
    shown = !procs.empty();
    if (interval && !json) {
      const time_t now = time(nullptr);
      char when[32];
      strftime(when, sizeof when, "%F %T", localtime(&now));
      printf("%s%s\n", n ? "\n" : "", when);
    }
    if (json)
      print_json(procs);
    else
      print_table(procs);
    fflush(stdout);
    if (!interval || (count && n + 1 >= count)) break;
    sleep(static_cast<unsigned>(interval));
  }
  return pid && !shown ? 1 : 0;
}
