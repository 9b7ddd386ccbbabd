/* rsock.h: what a program may ask the librsock preloaded into it, at run
 * time: whether a descriptor is accelerated, over which transport, its
 * byte counters, and the library's version.
 *
 * A program that includes this header still runs without librsock: the
 * rsock_query_*() wrappers below find librsock's functions with
 * dlsym(RTLD_DEFAULT, ...) and answer ENOSYS (or NULL) when it is not
 * loaded. Link with -ldl on a libc older than 2.34.
 *
 * Versioned: RSOCK_API_VERSION grows when something is added, and nothing
 * is ever removed or changed in meaning. struct rsock_fd_info begins with
 * its size, set by the caller: librsock fills what both versions know and
 * leaves the rest as the caller set it. C and C++. See docs/api.md.
 */
#ifndef RSOCK_H
#define RSOCK_H

#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RSOCK_API_VERSION 1

/* What librsock does with a descriptor. */
enum rsock_state {
  RSOCK_STATE_PLAIN = 0,       /* nothing: a kernel descriptor like any other */
  RSOCK_STATE_LISTENER = 1,    /* a listening socket its rules name (a candidate) */
  RSOCK_STATE_PAIRING = 2,     /* a candidate connection whose pairing is not over; its
                                  bytes go on kernel TCP meanwhile */
  RSOCK_STATE_ACCELERATED = 3, /* a connection whose bytes go over the transport below */
};

/* How an accelerated connection's bytes travel. */
enum rsock_transport {
  RSOCK_TRANSPORT_NONE = 0, /* not accelerated */
  RSOCK_TRANSPORT_SHM = 1,  /* shared memory: a peer on the same host */
  RSOCK_TRANSPORT_RDMA = 2, /* an RDMA RC queue pair */
};

struct rsock_fd_info {
  uint32_t size;      /* in: sizeof(struct rsock_fd_info) */
  uint32_t state;     /* enum rsock_state */
  uint32_t transport; /* enum rsock_transport */
  uint32_t reserved;  /* 0 */
  /* The connection's bytes through librsock (its rings), and on its
     kernel socket before it switched to them (RSOCK_TCP_FIRST). */
  uint64_t bytes_sent;
  uint64_t bytes_received;
  uint64_t tcp_bytes_sent;
  uint64_t tcp_bytes_received;
};

/* Exported by librsock.so. rsock_describe_fd: 0, or -1 with errno EBADF (fd is
   not open) or EINVAL (info is NULL, or info->size is below 16). */
int rsock_describe_fd(int fd, struct rsock_fd_info *info);
const char *rsock_version(void);      /* "0.9.0" */
unsigned rsock_api_version(void);     /* RSOCK_API_VERSION of the library */

/* The same, also without librsock: -1 and ENOSYS (NULL, 0) when it is not
   loaded into this process. */
static inline int rsock_query_fd(int fd, struct rsock_fd_info *info) {
  int (*fn)(int, struct rsock_fd_info *);
  *(void **)&fn = dlsym(RTLD_DEFAULT, "rsock_describe_fd");
  if (!fn) {
    errno = ENOSYS;
    return -1;
  }
  return fn(fd, info);
}

static inline const char *rsock_query_version(void) {
  const char *(*fn)(void);
  *(void **)&fn = dlsym(RTLD_DEFAULT, "rsock_version");
  return fn ? fn() : NULL;
}

static inline unsigned rsock_query_api_version(void) {
  unsigned (*fn)(void);
  *(void **)&fn = dlsym(RTLD_DEFAULT, "rsock_api_version");
  return fn ? fn() : 0;
}

#ifdef __cplusplus
}
#endif

#endif /* RSOCK_H */
