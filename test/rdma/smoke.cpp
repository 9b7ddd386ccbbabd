// smoke.cpp - proves that test/rdma/vm.sh gives two hosts real RDMA and TCP.
//
//   smoke rdma-server PORT        (host A) accept one rdma_cm RC connection,
//                                 expect an RDMA WRITE_WITH_IMM into its buffer,
//                                 check data + immediate, SEND back a checksum
//   smoke rdma-client HOST PORT   (host B) connect (retrying the REJECTED that a
//                                 fresh listener can cause), RDMA WRITE_WITH_IMM,
//                                 wait for the checksum and compare
//   smoke tcp-server PORT         kernel TCP: receive the pattern, reply checksum
//   smoke tcp-client HOST PORT
//
// Every wait is bounded (no hangs in an emulated guest); exit 0 = OK, 1 = fail.
// Built by test/rdma/smoke.sh: g++ -std=c++20 ... -libverbs -lrdmacm
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr size_t kRdmaBytes = 16 * 1024;  // several RoCE MTUs: exercises segmentation
constexpr size_t kTcpBytes = 256 * 1024;
constexpr uint32_t kImm = 0x52534f4b;  // "RSOK"
constexpr int kEventTimeoutMs = 20000;  // generous: guests are emulated
constexpr int kConnectTries = 10;

const char* g_role = "smoke";

[[noreturn]] void fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::fprintf(stderr, "%s: FAIL: ", g_role);
  std::vfprintf(stderr, fmt, ap);
  std::fprintf(stderr, "\n");
  va_end(ap);
  std::exit(1);
}

void say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::printf("%s: ", g_role);
  std::vprintf(fmt, ap);
  std::printf("\n");
  std::fflush(stdout);
  va_end(ap);
}

// Deterministic payload both sides can recompute.
void fill_pattern(uint8_t* p, size_t n) {
  uint32_t x = 0x12345678;
  for (size_t i = 0; i < n; i++) {
    x = x * 1103515245 + 12345;
    p[i] = static_cast<uint8_t>(x >> 16);
  }
}

uint64_t fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

int parse_port(const char* s) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (!*s || *end || v <= 0 || v > 65535) fail("bad port '%s'", s);
  return static_cast<int>(v);
}

sockaddr_in make_addr(const char* host, int port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) fail("bad IPv4 address '%s'", host);
  return sa;
}

// ------------------------------------------------------------------ rdma_cm --

// What the server tells the client in the accept's private data.
struct BufferInfo {
  uint64_t addr;
  uint32_t rkey;
  uint32_t len;
};

// Next rdma_cm event within the timeout, or nullptr.
rdma_cm_event* next_event(rdma_event_channel* ch, int timeout_ms) {
  pollfd pfd{ch->fd, POLLIN, 0};
  int r = poll(&pfd, 1, timeout_ms);
  if (r < 0) fail("poll(cm channel): %s", std::strerror(errno));
  if (r == 0) return nullptr;
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(ch, &ev)) fail("rdma_get_cm_event: %s", std::strerror(errno));
  return ev;
}

// Verbs resources of one connection. Completions are waited for through a
// completion channel (blocking with a timeout) rather than by spinning: a
// spinning poller would steal the guest's only emulated CPU.
struct Conn {
  ibv_pd* pd = nullptr;
  ibv_comp_channel* cc = nullptr;
  ibv_cq* cq = nullptr;
  ibv_mr* mr = nullptr;
  std::vector<uint8_t> buf;

  void create(rdma_cm_id* id, size_t bytes) {
    pd = ibv_alloc_pd(id->verbs);
    if (!pd) fail("ibv_alloc_pd: %s", std::strerror(errno));
    cc = ibv_create_comp_channel(id->verbs);
    if (!cc) fail("ibv_create_comp_channel: %s", std::strerror(errno));
    cq = ibv_create_cq(id->verbs, 16, nullptr, cc, 0);
    if (!cq) fail("ibv_create_cq: %s", std::strerror(errno));
    if (ibv_req_notify_cq(cq, 0)) fail("ibv_req_notify_cq");
    buf.assign(bytes, 0);
    mr = ibv_reg_mr(pd, buf.data(), buf.size(),
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!mr) fail("ibv_reg_mr: %s", std::strerror(errno));
    ibv_qp_init_attr qa{};
    qa.send_cq = cq;
    qa.recv_cq = cq;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = 4;
    qa.cap.max_recv_wr = 4;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    if (rdma_create_qp(id, pd, &qa)) fail("rdma_create_qp: %s", std::strerror(errno));
  }

  void destroy(rdma_cm_id* id) {
    if (id && id->qp) rdma_destroy_qp(id);
    if (mr) ibv_dereg_mr(mr);
    if (cq) ibv_destroy_cq(cq);
    if (cc) ibv_destroy_comp_channel(cc);
    if (pd) ibv_dealloc_pd(pd);
    *this = Conn{};
  }

  // One work completion, within timeout_ms; it must have succeeded.
  ibv_wc wait_completion(int timeout_ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      ibv_wc wc{};
      int n = ibv_poll_cq(cq, 1, &wc);
      if (n < 0) fail("ibv_poll_cq");
      if (n == 1) {
        if (wc.status != IBV_WC_SUCCESS)
          fail("completion wr_id %llu: %s", (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
        return wc;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) fail("no completion within %d ms", timeout_ms);
      pollfd pfd{cc->fd, POLLIN, 0};
      if (poll(&pfd, 1, static_cast<int>(left)) > 0) {
        ibv_cq* ev_cq = nullptr;
        void* ctx = nullptr;
        if (ibv_get_cq_event(cc, &ev_cq, &ctx)) fail("ibv_get_cq_event");
        ibv_ack_cq_events(ev_cq, 1);
        if (ibv_req_notify_cq(cq, 0)) fail("ibv_req_notify_cq");
      }
    }
  }

  void post_recv(rdma_cm_id* id, uint64_t wr_id, void* addr, uint32_t len) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(addr), len, mr->lkey};
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = wr_id;
    wr.sg_list = len ? &sge : nullptr;
    wr.num_sge = len ? 1 : 0;
    if (ibv_post_recv(id->qp, &wr, &bad)) fail("ibv_post_recv: %s", std::strerror(errno));
  }
};

int rdma_server(int port) {
  g_role = "rdma-server";
  rdma_event_channel* ch = rdma_create_event_channel();
  if (!ch) fail("rdma_create_event_channel: %s", std::strerror(errno));
  rdma_cm_id* listener = nullptr;
  if (rdma_create_id(ch, &listener, nullptr, RDMA_PS_TCP)) fail("rdma_create_id: %s", std::strerror(errno));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (rdma_bind_addr(listener, reinterpret_cast<sockaddr*>(&sa)))
    fail("rdma_bind_addr(:%d): %s", port, std::strerror(errno));
  if (rdma_listen(listener, 4)) fail("rdma_listen: %s", std::strerror(errno));
  say("listening on port %d", port);

  // Accept until one connection completes the exchange. A client whose earlier
  // attempt failed half-way may leave events for a dead id: skip those.
  Conn c;
  rdma_cm_id* id = nullptr;
  for (;;) {
    rdma_cm_event* ev = next_event(ch, 4 * kEventTimeoutMs);
    if (!ev) fail("no connection within %d ms", 4 * kEventTimeoutMs);
    rdma_cm_event_type type = ev->event;
    rdma_cm_id* ev_id = ev->id;
    if (type == RDMA_CM_EVENT_CONNECT_REQUEST) {
      if (id) {  // already serving one: refuse extras
        rdma_reject(ev_id, nullptr, 0);
        rdma_ack_cm_event(ev);
        continue;
      }
      id = ev_id;
      c.create(id, kRdmaBytes + sizeof(uint64_t));
      // The WRITE_WITH_IMM consumes a receive (zero-length: data goes via RDMA).
      c.post_recv(id, 1, nullptr, 0);
      BufferInfo info{reinterpret_cast<uintptr_t>(c.buf.data()), c.mr->rkey, static_cast<uint32_t>(kRdmaBytes)};
      rdma_conn_param cp{};
      cp.private_data = &info;
      cp.private_data_len = sizeof info;
      cp.responder_resources = 1;
      cp.initiator_depth = 1;
      rdma_ack_cm_event(ev);
      if (rdma_accept(id, &cp)) fail("rdma_accept: %s", std::strerror(errno));
      continue;
    }
    rdma_ack_cm_event(ev);
    if (ev_id != id) continue;
    if (type == RDMA_CM_EVENT_ESTABLISHED) break;
    // The pending connection died (e.g. the client gave up and retries).
    say("connection attempt ended with %s; waiting for another", rdma_event_str(type));
    c.destroy(id);
    rdma_destroy_id(id);
    id = nullptr;
  }
  say("connection established");

  ibv_wc wc = c.wait_completion(kEventTimeoutMs);
  if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM) fail("expected RECV_RDMA_WITH_IMM, got opcode %d", wc.opcode);
  if (!(wc.wc_flags & IBV_WC_WITH_IMM) || ntohl(wc.imm_data) != kImm)
    fail("immediate 0x%x, expected 0x%x", ntohl(wc.imm_data), kImm);
  std::vector<uint8_t> want(kRdmaBytes);
  fill_pattern(want.data(), want.size());
  if (std::memcmp(want.data(), c.buf.data(), kRdmaBytes) != 0) fail("RDMA-written data differs from the pattern");
  uint64_t sum = fnv1a(c.buf.data(), kRdmaBytes);
  say("RDMA WRITE_WITH_IMM received: %zu bytes, imm 0x%x, data OK", kRdmaBytes, ntohl(wc.imm_data));

  // Answer with a SEND of the checksum (from the registered buffer's tail).
  std::memcpy(c.buf.data() + kRdmaBytes, &sum, sizeof sum);
  ibv_sge sge{reinterpret_cast<uintptr_t>(c.buf.data() + kRdmaBytes), sizeof sum, c.mr->lkey};
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = 2;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (ibv_post_send(id->qp, &wr, &bad)) fail("ibv_post_send(SEND): %s", std::strerror(errno));
  c.wait_completion(kEventTimeoutMs);

  // Orderly close: the client disconnects after reading the checksum.
  rdma_cm_event* ev = next_event(ch, kEventTimeoutMs);
  if (ev) {
    say("peer closed (%s)", rdma_event_str(ev->event));
    rdma_ack_cm_event(ev);
  }
  c.destroy(id);
  rdma_destroy_id(id);
  rdma_destroy_id(listener);
  rdma_destroy_event_channel(ch);
  say("OK");
  return 0;
}

// Waits for `want` on id's channel; any other event is returned as a failure.
bool expect_event(rdma_event_channel* ch, rdma_cm_event_type want, const char* what,
                  BufferInfo* info_out = nullptr) {
  rdma_cm_event* ev = next_event(ch, kEventTimeoutMs);
  if (!ev) {
    say("%s: no event within %d ms", what, kEventTimeoutMs);
    return false;
  }
  bool ok = ev->event == want && ev->status == 0;
  if (!ok) {
    say("%s: got %s (status %d)", what, rdma_event_str(ev->event), ev->status);
  } else if (info_out) {
    if (ev->param.conn.private_data_len < sizeof *info_out) {
      say("%s: private data too short (%u)", what, ev->param.conn.private_data_len);
      ok = false;
    } else {
      std::memcpy(info_out, ev->param.conn.private_data, sizeof *info_out);
    }
  }
  rdma_ack_cm_event(ev);
  return ok;
}

int rdma_client(const char* host, int port) {
  g_role = "rdma-client";
  sockaddr_in dst = make_addr(host, port);
  rdma_event_channel* ch = rdma_create_event_channel();
  if (!ch) fail("rdma_create_event_channel: %s", std::strerror(errno));

  // The first connect to a freshly started listener on the other host can be
  // REJECTED (IB CM "no matching listener") although the listener exists; a
  // later attempt succeeds. So: a fresh id per attempt, bounded retries.
  Conn c;
  rdma_cm_id* id = nullptr;
  BufferInfo remote{};
  int attempt = 1;
  for (;; attempt++) {
    if (rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP)) fail("rdma_create_id: %s", std::strerror(errno));
    bool ok = false;
    if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 5000)) {
      say("rdma_resolve_addr: %s", std::strerror(errno));
    } else if (expect_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED, "resolve address")) {
      if (rdma_resolve_route(id, 5000)) {
        say("rdma_resolve_route: %s", std::strerror(errno));
      } else if (expect_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, "resolve route")) {
        c.create(id, kRdmaBytes + sizeof(uint64_t));
        c.post_recv(id, 3, c.buf.data() + kRdmaBytes, sizeof(uint64_t));  // for the checksum
        rdma_conn_param cp{};
        cp.responder_resources = 1;
        cp.initiator_depth = 1;
        cp.retry_count = 7;
        cp.rnr_retry_count = 7;
        if (rdma_connect(id, &cp)) {
          say("rdma_connect: %s", std::strerror(errno));
        } else {
          ok = expect_event(ch, RDMA_CM_EVENT_ESTABLISHED, "connect", &remote);
        }
      }
    }
    if (ok) break;
    c.destroy(id);
    rdma_destroy_id(id);
    id = nullptr;
    if (attempt == kConnectTries) fail("no connection to %s:%d after %d attempts", host, port, attempt);
    say("attempt %d failed, retrying", attempt);
    usleep(200000 * attempt);
  }
  say("connected to %s:%d (attempt %d); remote buffer %u bytes, rkey 0x%x", host, port, attempt,
      remote.len, remote.rkey);
  if (remote.len < kRdmaBytes) fail("remote buffer too small");

  fill_pattern(c.buf.data(), kRdmaBytes);
  uint64_t want = fnv1a(c.buf.data(), kRdmaBytes);
  ibv_sge sge{reinterpret_cast<uintptr_t>(c.buf.data()), static_cast<uint32_t>(kRdmaBytes), c.mr->lkey};
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = 4;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(kImm);
  wr.wr.rdma.remote_addr = remote.addr;
  wr.wr.rdma.rkey = remote.rkey;
  if (ibv_post_send(id->qp, &wr, &bad)) fail("ibv_post_send(WRITE_WITH_IMM): %s", std::strerror(errno));

  // Two completions in either order: our write acked, the server's checksum.
  bool wrote = false, answered = false;
  while (!wrote || !answered) {
    ibv_wc wc = c.wait_completion(kEventTimeoutMs);
    if (wc.opcode == IBV_WC_RDMA_WRITE) wrote = true;
    else if (wc.opcode == IBV_WC_RECV) answered = true;
    else fail("unexpected completion opcode %d", wc.opcode);
  }
  uint64_t got;
  std::memcpy(&got, c.buf.data() + kRdmaBytes, sizeof got);
  if (got != want) fail("server checksum %016llx, expected %016llx", (unsigned long long)got, (unsigned long long)want);
  say("RDMA WRITE_WITH_IMM of %zu bytes acknowledged, server checksum matches", kRdmaBytes);

  rdma_disconnect(id);
  expect_event(ch, RDMA_CM_EVENT_DISCONNECTED, "disconnect");
  c.destroy(id);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
  say("OK");
  return 0;
}

// -------------------------------------------------------------- kernel TCP --

void io_all(int fd, uint8_t* p, size_t n, bool writing) {
  while (n) {
    pollfd pfd{fd, static_cast<short>(writing ? POLLOUT : POLLIN), 0};
    if (poll(&pfd, 1, kEventTimeoutMs) != 1) fail("TCP %s timed out", writing ? "send" : "receive");
    ssize_t r = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("TCP %s: %s", writing ? "send" : "recv", std::strerror(errno));
    if (r == 0) fail("TCP peer closed early");
    p += r;
    n -= static_cast<size_t>(r);
  }
}

int tcp_server(int port) {
  g_role = "tcp-server";
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(ls, reinterpret_cast<sockaddr*>(&sa), sizeof sa)) fail("bind(:%d): %s", port, std::strerror(errno));
  if (listen(ls, 4)) fail("listen: %s", std::strerror(errno));
  say("listening on port %d", port);
  pollfd pfd{ls, POLLIN, 0};
  if (poll(&pfd, 1, 4 * kEventTimeoutMs) != 1) fail("no connection within %d ms", 4 * kEventTimeoutMs);
  int fd = accept(ls, nullptr, nullptr);
  if (fd < 0) fail("accept: %s", std::strerror(errno));
  std::vector<uint8_t> got(kTcpBytes), want(kTcpBytes);
  io_all(fd, got.data(), got.size(), false);
  fill_pattern(want.data(), want.size());
  if (got != want) fail("received data differs from the pattern");
  uint64_t sum = fnv1a(got.data(), got.size());
  io_all(fd, reinterpret_cast<uint8_t*>(&sum), sizeof sum, true);
  say("received %zu bytes, data OK", kTcpBytes);
  close(fd);
  close(ls);
  say("OK");
  return 0;
}

int tcp_client(const char* host, int port) {
  g_role = "tcp-client";
  sockaddr_in dst = make_addr(host, port);
  int fd = -1;
  for (int attempt = 1;; attempt++) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof dst) == 0) break;
    int err = errno;
    close(fd);
    if (attempt == kConnectTries) fail("connect %s:%d: %s", host, port, std::strerror(err));
    usleep(200000 * attempt);
  }
  std::vector<uint8_t> data(kTcpBytes);
  fill_pattern(data.data(), data.size());
  auto t0 = std::chrono::steady_clock::now();
  io_all(fd, data.data(), data.size(), true);
  uint64_t got = 0;
  io_all(fd, reinterpret_cast<uint8_t*>(&got), sizeof got, false);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (got != fnv1a(data.data(), data.size())) fail("server checksum mismatch");
  say("sent %zu bytes to %s:%d in %.1f ms, server checksum matches", kTcpBytes, host, port, ms);
  close(fd);
  say("OK");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "rdma-server" && argc == 3) return rdma_server(parse_port(argv[2]));
  if (mode == "rdma-client" && argc == 4) return rdma_client(argv[2], parse_port(argv[3]));
  if (mode == "tcp-server" && argc == 3) return tcp_server(parse_port(argv[2]));
  if (mode == "tcp-client" && argc == 4) return tcp_client(argv[2], parse_port(argv[3]));
  std::fprintf(stderr,
               "usage: smoke rdma-server PORT | rdma-client HOST PORT |\n"
               "             tcp-server PORT  | tcp-client HOST PORT\n");
  return 2;
}
