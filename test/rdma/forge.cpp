// forge.cpp - a forged rdma_cm connect request, for the rdma tier's
// forged-request case (test/rdma/run.sh). Run on the client's host, as the
// real client's neighbour: it claims the client's TCP connection (its
// 4-tuple, in librsock's private data format, src/ring/handshake.h) in a
// request to the server's rdma_cm listener, and reports how far it got.
// The server may accept it (it cannot tell it from the real client's), but
// it must never pair with it: only the real client can write the in-band
// proof, and no ring is announced outside that proof.
//
//   forge SERVER_IP SERVER_PORT CLIENT_IP CLIENT_PORT
//
// Prints "SENT" once the request is out, one line per rdma_cm event, and
// "RESULT established=E rejected=R disconnected=D" at the end (after a
// disconnect, a reject, or 60 s). Exit 0 unless it could not send.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ring/handshake.h"
#include "transport/addr.h"

namespace {

bool parse(const char* ip, const char* port, sockaddr_storage* ss, rsock::WireAddr* w) {
  memset(ss, 0, sizeof *ss);
  auto* a = reinterpret_cast<sockaddr_in*>(ss);
  a->sin_family = AF_INET;
  a->sin_port = htons(static_cast<uint16_t>(atoi(port)));
  return inet_pton(AF_INET, ip, &a->sin_addr) == 1 &&
         rsock::to_wire(reinterpret_cast<sockaddr*>(ss), w);
}

rdma_cm_event* next(rdma_event_channel* ch, int ms) {
  pollfd p = {ch->fd, POLLIN, 0};
  if (poll(&p, 1, ms) != 1) return nullptr;
  rdma_cm_event* ev = nullptr;
  return rdma_get_cm_event(ch, &ev) == 0 ? ev : nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc != 5) {
    fprintf(stderr, "usage: forge SERVER_IP SERVER_PORT CLIENT_IP CLIENT_PORT\n");
    return 2;
  }
  sockaddr_storage server, client;
  rsock::ConnectInfo info;
  if (!parse(argv[1], argv[2], &server, &info.server) ||
      !parse(argv[3], argv[4], &client, &info.client)) {
    fprintf(stderr, "forge: bad address\n");
    return 2;
  }
  info.ring_log2 = 20;
  info.flags = rsock::kPrivClientListens;
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  if (!ch || rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0) return 1;
  reinterpret_cast<sockaddr_in*>(&client)->sin_port = 0;  // any rdma_cm port of ours
  if (rdma_resolve_addr(id, reinterpret_cast<sockaddr*>(&client),
                        reinterpret_cast<sockaddr*>(&server), 5000) != 0)
    return 1;
  rdma_cm_event* ev = next(ch, 10000);
  if (!ev || ev->event != RDMA_CM_EVENT_ADDR_RESOLVED) return 1;
  rdma_ack_cm_event(ev);
  if (rdma_resolve_route(id, 5000) != 0) return 1;
  ev = next(ch, 10000);
  if (!ev || ev->event != RDMA_CM_EVENT_ROUTE_RESOLVED) return 1;
  rdma_ack_cm_event(ev);
  ibv_pd* pd = ibv_alloc_pd(id->verbs);
  ibv_cq* cq = ibv_create_cq(id->verbs, 16, nullptr, nullptr, 0);
  ibv_qp_init_attr qa = {};
  qa.send_cq = qa.recv_cq = cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  if (!pd || !cq || rdma_create_qp(id, pd, &qa) != 0) return 1;
  uint8_t priv[rsock::kConnectPrivBytes];
  rsock::encode_connect_priv(info, priv);
  rdma_conn_param cp = {};
  cp.private_data = priv;
  cp.private_data_len = sizeof priv;
  cp.retry_count = 7;
  cp.rnr_retry_count = 7;
  if (rdma_connect(id, &cp) != 0) return 1;
  printf("SENT\n");
  int established = 0, rejected = 0, disconnected = 0;
  const time_t end = time(nullptr) + 60;
  while (time(nullptr) < end && !rejected && !disconnected) {
    ev = next(ch, 1000);
    if (!ev) continue;
    printf("EVENT %s\n", rdma_event_str(ev->event));
    if (ev->event == RDMA_CM_EVENT_ESTABLISHED) {
      ++established;
      rsock::AcceptInfo acc;
      if (rsock::decode_accept_priv(ev->param.conn.private_data, ev->param.conn.private_data_len,
                                    &acc))
        printf("ACCEPTED challenge=%016llx\n", static_cast<unsigned long long>(acc.challenge));
    } else if (ev->event == RDMA_CM_EVENT_REJECTED || ev->event == RDMA_CM_EVENT_UNREACHABLE ||
               ev->event == RDMA_CM_EVENT_CONNECT_ERROR) {
      ++rejected;
    } else if (ev->event == RDMA_CM_EVENT_DISCONNECTED) {
      ++disconnected;
    }
    rdma_ack_cm_event(ev);
  }
  printf("RESULT established=%d rejected=%d disconnected=%d\n", established, rejected,
         disconnected);
  rdma_destroy_qp(id);
  rdma_destroy_id(id);
  return 0;
}
