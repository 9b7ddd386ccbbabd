// RC queue pairs without rdma_cm (see verbs_qp.h).
#include "transport/verbs/verbs_qp.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "common/own_fd.h"
#include "transport/verbs/verbs_channel.h"

namespace rsock {
namespace {

// The GID a RoCE port has for an IP address: IPv6 as it is, IPv4 as
// v4-mapped IPv6 (which is WireAddr's form already).
bool gid_of(const WireAddr& addr, uint8_t gid[16]) {
  memcpy(gid, addr.addr, 16);
  return true;
}

// Searches ctx's port for the GID, RoCE v2 before v1. Returns the index.
int search_port(ibv_context* ctx, uint8_t port, const uint8_t want[16], ibv_port_attr* pa) {
  if (ibv_query_port(ctx, port, pa) != 0 || pa->state != IBV_PORT_ACTIVE) return -1;
  int v1 = -1;
  for (int i = 0; i < pa->gid_tbl_len; ++i) {
    ibv_gid_entry e;
    if (ibv_query_gid_ex(ctx, port, static_cast<uint32_t>(i), &e, 0) != 0) continue;
    if (memcmp(e.gid.raw, want, 16) != 0) continue;
    if (e.gid_type == IBV_GID_TYPE_ROCE_V2) return i;
    if (e.gid_type == IBV_GID_TYPE_ROCE_V1 && v1 < 0) v1 = i;
  }
  return v1;
}

}  // namespace

int verbs_find_gid(ibv_context* ctx, uint8_t port, const WireAddr& addr, VerbsPort* out) {
  uint8_t want[16];
  if (!ctx || !gid_of(addr, want)) return -ENODEV;
  ibv_port_attr pa;
  const int idx = search_port(ctx, port, want, &pa);
  if (idx < 0) return -ENODEV;
  out->ctx = ctx;
  out->port = port;
  out->gid_index = idx;
  memcpy(out->gid, want, 16);
  out->mtu = static_cast<uint8_t>(pa.active_mtu);
  return 0;
}

int verbs_open_port_for(const WireAddr& addr, VerbsPort* out) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) return -ENODEV;
  int rc = -ENODEV;
  for (int i = 0; i < n && rc != 0; ++i) {
    ibv_context* ctx = ibv_open_device(list[i]);
    if (!ctx) continue;
    ibv_device_attr da;
    if (ibv_query_device(ctx, &da) == 0) {
      for (int p = 1; p <= da.phys_port_cnt && rc != 0; ++p)
        rc = verbs_find_gid(ctx, static_cast<uint8_t>(p), addr, out);
    }
    if (rc != 0) ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  return rc;
}

ibv_qp_init_attr verbs_qp_init_attr(ibv_cq* cq) {
  ibv_qp_init_attr qa = {};
  qa.send_cq = cq;
  qa.recv_cq = cq;
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 0;
  qa.cap.max_send_wr = kVerbsSendDepth;
  qa.cap.max_recv_wr = kVerbsRecvDepth;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  qa.cap.max_inline_data = kVerbsMaxInline;
  return qa;
}

ibv_qp* verbs_create_qp(ibv_pd* pd, ibv_cq* cq, const VerbsPort& port, uint32_t* max_inline) {
  ibv_qp_init_attr qa = verbs_qp_init_attr(cq);
  ibv_qp* qp = ibv_create_qp(pd, &qa);
  if (!qp) {
    qa.cap.max_inline_data = 0;  // as at setup: some devices refuse large inline sizes
    qp = ibv_create_qp(pd, &qa);
    if (!qp) return nullptr;
  }
  *max_inline = qa.cap.max_inline_data;
  ibv_qp_attr at = {};
  at.qp_state = IBV_QPS_INIT;
  at.pkey_index = 0;
  at.port_num = port.port;
  at.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;  // never remote read
  if (ibv_modify_qp(qp, &at,
                    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
    const int e = errno;
    ibv_destroy_qp(qp);
    errno = e;
    return nullptr;
  }
  return qp;
}

int verbs_connect_qp(ibv_qp* qp, const VerbsPort& port, const QpAddress& peer, uint32_t psn) {
  ibv_qp_attr at = {};
  at.qp_state = IBV_QPS_RTR;
  at.path_mtu = static_cast<ibv_mtu>(peer.mtu < port.mtu ? peer.mtu : port.mtu);
  at.dest_qp_num = peer.qpn;
  at.rq_psn = peer.psn;
  at.max_dest_rd_atomic = 1;
  // An RNR only happens when the peer stopped polling; retry soon after it
  // re-posts: 0.64 ms (as the channel sets it on rdma_cm's queue pairs).
  at.min_rnr_timer = 12;
  at.ah_attr.is_global = 1;
  memcpy(at.ah_attr.grh.dgid.raw, peer.gid, 16);
  at.ah_attr.grh.sgid_index = static_cast<uint8_t>(port.gid_index);
  at.ah_attr.grh.hop_limit = 64;
  at.ah_attr.port_num = port.port;
  if (ibv_modify_qp(qp, &at,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0)
    return errno ? -errno : -EINVAL;
  at = {};
  at.qp_state = IBV_QPS_RTS;
  // 268 ms per try, 7 retries: a peer that is slow to bring its own queue
  // pair up (both ends of a move do it at once) is waited for about 2 s;
  // one that vanished is noticed as fast.
  at.timeout = kVerbsAckTimeout;
  at.retry_cnt = kVerbsRetryCount;
  at.rnr_retry = 7;  // infinite: see verbs_channel.cpp, message credits
  at.sq_psn = psn;
  at.max_rd_atomic = 1;
  if (ibv_modify_qp(qp, &at,
                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) != 0)
    return errno ? -errno : -EINVAL;
  return 0;
}

ibv_comp_channel* verbs_comp_channel(ibv_context* ctx) {
  ibv_comp_channel* ch = ibv_create_comp_channel(ctx);
  if (ch) ch->fd = lift_fd(ch->fd);  // libibverbs reads the number from here on each use
  return ch;
}

rdma_event_channel* verbs_event_channel() {
  rdma_event_channel* ch = rdma_create_event_channel();
  if (ch) ch->fd = lift_fd(ch->fd);  // librdmacm reads the number from here on each use
  return ch;
}

uint32_t verbs_random_psn() {
  uint32_t v = 0;
  if (getrandom(&v, sizeof v, 0) != sizeof v) v = 0x5a5a5a;
  return v & 0xffffff;
}

}  // namespace rsock
