// RC queue pairs brought up by hand, without rdma_cm: what moving a
// connection to another process needs (docs/protocol.md section 7, "Moving
// a connection"). A fork's child cannot use rdma_cm (librdmacm keeps the
// parent's device descriptors, which the kernel refuses in another process),
// but it can open the device itself with libibverbs: the port and GID come
// from the connection's own TCP address (RoCE: the GID is the IP address),
// and the other side's queue pair number, PSN, GID and MTU arrive in band.
// Thread-safety: stateless functions over caller-owned objects.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstdint>

#include "ring/wire.h"

namespace rsock {

// A device port and the GID of one of its addresses.
struct VerbsPort {
  ibv_context* ctx = nullptr;
  uint8_t port = 0;
  int gid_index = -1;
  uint8_t gid[16] = {};
  uint8_t mtu = 0;  // enum ibv_mtu of the port's active MTU
};

// The local ACK timeout of every queue pair we bring up: a packet not
// acknowledged within 4.096 us * 2^16 = 268 ms is sent again, up to
// kVerbsRetryCount times, before the queue pair fails (2.1 s in all). One
// value for both kinds: rdma_cm's own default on RoCE (packet lifetime + 1,
// 19 on Debian 12's kernel: 2.1 s per try) would stall a stream for two
// seconds on every lost packet.
inline constexpr uint8_t kVerbsAckTimeout = 16;
inline constexpr uint8_t kVerbsRetryCount = 7;

// How long a queue pair with these settings can take to succeed or fail a
// posted work request whose packets keep being lost: every try's timeout.
inline constexpr int64_t verbs_retry_bound_ms(uint8_t timeout, uint8_t retry_cnt) {
  return ((int64_t{4096} << timeout) / 1000000 + 1) * (retry_cnt + 1);
}

// How the other side reaches a queue pair.
struct QpAddress {
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint8_t gid[16] = {};
  uint8_t mtu = 0;
};

// Opens (ibv_open_device) the device that has `addr` as a RoCE GID (v2
// preferred) on an active port. *out->ctx is then ours to close. Returns 0,
// or -ENODEV when no device has it (InfiniBand and iWARP devices, whose
// GIDs are not IP addresses, have none).
int verbs_open_port_for(const WireAddr& addr, VerbsPort* out);
// The same lookup on a context already open (rdma_cm's), on one port.
int verbs_find_gid(ibv_context* ctx, uint8_t port, const WireAddr& addr, VerbsPort* out);

// An RC queue pair on pd and cq with our queue sizes (verbs_channel.h), in
// INIT with remote write allowed. *max_inline: what the device granted.
// nullptr with errno set on failure.
ibv_qp* verbs_create_qp(ibv_pd* pd, ibv_cq* cq, const VerbsPort& port, uint32_t* max_inline);
// The attributes of every queue pair of a connection (rdma_cm's at setup,
// ours after a move): RC, one CQ for both queues, our depths and inline
// size (a caller retries with max_inline_data 0 when a device refuses it).
ibv_qp_init_attr verbs_qp_init_attr(ibv_cq* cq);
// INIT -> RTR -> RTS towards `peer`, our first PSN `psn`. Returns 0 or a
// negative errno.
int verbs_connect_qp(ibv_qp* qp, const VerbsPort& port, const QpAddress& peer, uint32_t psn);

// rdma-core's completion and rdma_cm event channels, their descriptors
// moved above the application's (common/own_fd.h). nullptr with errno set
// on failure; freed with ibv_destroy_comp_channel / rdma_destroy_event_channel.
ibv_comp_channel* verbs_comp_channel(ibv_context* ctx);
rdma_event_channel* verbs_event_channel();

// A random 24-bit PSN.
uint32_t verbs_random_psn();

}  // namespace rsock
