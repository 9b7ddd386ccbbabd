// Pairing under load (issue 8): server workers (listen-then-fork sharing one
// listener, or SO_REUSEPORT siblings) x concurrent client processes x many
// connections, blocking and event-loop (nonblocking connect and accept,
// edge-triggered epoll), short- and long-lived, at the default pairing
// timeout and at 1-5 ms (timeouts at every step of the handshake). Every
// connection must end with both ends on the same path and every byte
// correct: rs_pairstress checks each byte and exchanges, in band, the path
// each end saw its own bytes take (from the kernel's byte counts, not from
// librsock), and both ends print both views. The stats of all processes
// must tell the same story: the paths add up to the per-connection views on
// each side, each side's fallbacks add up to its TCP connections with a
// reason that fits (a timeout, or a peer that gave up), nobody counts an
// intruder that was not there, and the accelerated bytes sent by one side
// are the bytes received by the other.
//
// PAIRSTRESS_SCALE=N multiplies the connection counts (a long soak).
#include <set>

#include "harness.h"

namespace rsock_test {
namespace {

struct StressCase {
  const char* name;
  const char* share;      // fork | reuseport
  const char* server_io;  // block | epoll | mixed
  int workers;
  int clients;            // client processes
  int waves;              // ... started this many at a time
  int conns;              // connections per client process
  int parallel;           // ... this many at a time
  const char* client_io;  // block | epoll | mixed (even clients block, odd ones epoll)
  int rounds;
  int hold_ms;
  int bytes;
  // Pairing timeouts (ms), cycled over the server and the clients; empty:
  // the default.
  std::vector<int> timeouts;
  // RSOCK_TEST_HANDOVER_PAUSE_US of every process: each hand-over pauses
  // after the outcome is out and before the fds change hands, so that
  // programs use, finish and close connections inside that window.
  int handover_pause_us = 0;
};

void PrintTo(const StressCase& c, std::ostream* os) { *os << c.name; }

int scale() {
  const char* s = getenv("PAIRSTRESS_SCALE");
  int n = s ? atoi(s) : 1;
  return n > 0 ? n : 1;
}

// One connection as both ends reported it.
struct View {
  std::string me, peer;
  int pid = 0;
};

// Parses the "CONN id=... me=... peer=... pid=..." lines of `text` into
// views (keyed by id); FAIL lines go to fails. A repeated id is a failure.
void parse_conns(const std::string& text, std::map<std::string, View>* views,
                 std::vector<std::string>* fails, const std::string& who) {
  for (const std::string& line : split_lines(text)) {
    if (line.rfind("FAIL ", 0) == 0) {
      fails->push_back(who + ": " + line);
      continue;
    }
    if (line.rfind("CONN ", 0) != 0) continue;
    auto kv = parse_result(line, "CONN");
    View v{kv["me"], kv["peer"], atoi(kv["pid"].c_str())};
    EXPECT_TRUE(views->emplace(kv["id"], v).second)
        << who << ": connection " << kv["id"] << " reported twice";
  }
}

class PairingStress : public PreloadTest, public ::testing::WithParamInterface<StressCase> {};

TEST_P(PairingStress, BothEndsAgreeOnEveryConnection) {
  const StressCase& c = GetParam();
  const int conns = c.conns * scale();
  const int port = free_port();
  ASSERT_GT(port, 0);
  const std::string stop = dir() + "/stop";
  const std::string rule = "127.0.0.1:" + std::to_string(port);
  size_t next_timeout = 0;
  auto env = [&] {
    Env e = {{"RSOCK_PEERS", rule}};
    if (!c.timeouts.empty())
      e["RSOCK_CONNECT_TIMEOUT_MS"] =
          std::to_string(c.timeouts[next_timeout++ % c.timeouts.size()]);
    if (c.handover_pause_us)
      e["RSOCK_TEST_HANDOVER_PAUSE_US"] = std::to_string(c.handover_pause_us);
    return preloaded(e);
  };

  bool ready = false;
  Proc& server = start_server(
      "server", "rs_pairstress",
      {"--role", "server", "--port", std::to_string(port), "--workers", std::to_string(c.workers),
       "--share", c.share, "--io", c.server_io, "--stop", stop},
      env(), &ready);
  ASSERT_TRUE(ready) << server.describe();

  // Client processes, `waves` at a time; each is bounded generously (its
  // connections are bounded one by one by rs_pairstress itself).
  std::vector<Proc*> clients;
  for (int i = 0; i < c.clients; i += c.waves) {
    std::vector<Proc*> wave;
    for (int j = i; j < std::min(c.clients, i + c.waves); ++j) {
      const char* io = c.client_io;
      if (std::string(io) == "mixed") io = j % 2 ? "epoll" : "block";
      wave.push_back(
          &spawn("client" + std::to_string(j), "rs_pairstress",
                 {"--role", "client", "--port", std::to_string(port), "--id", std::to_string(j + 1),
                  "--conns", std::to_string(conns), "--parallel", std::to_string(c.parallel),
                  "--io", io, "--rounds", std::to_string(c.rounds), "--hold-ms",
                  std::to_string(c.hold_ms), "--bytes", std::to_string(c.bytes)},
                 env()));
    }
    for (Proc* p : wave) ASSERT_TRUE(wait_exit(*p, 300000)) << p->name << " hung";
    clients.insert(clients.end(), wave.begin(), wave.end());
  }
  { std::ofstream(stop.c_str()) << "stop\n"; }
  ASSERT_TRUE(wait_exit(server, 120000)) << "server hung";

  // Per connection: both ends reported it, once, with the same two views.
  std::map<std::string, View> at_client, at_server;
  std::vector<std::string> fails;
  std::set<int> client_pids;
  for (Proc* p : clients) {
    EXPECT_TRUE(p->exited_ok()) << p->name << ": " << p->describe();
    parse_conns(p->out(), &at_client, &fails, p->name);
    client_pids.insert(p->pid);
  }
  EXPECT_TRUE(server.exited_ok()) << server.describe();
  parse_conns(server.out(), &at_server, &fails, "server");
  for (const std::string& f : fails) ADD_FAILURE() << f;
  EXPECT_EQ(at_client.size(), static_cast<size_t>(c.clients) * conns);
  uint64_t accel = 0, tcp = 0;
  int disagreements = 0;
  for (auto& [id, cv] : at_client) {
    auto it = at_server.find(id);
    if (it == at_server.end()) {
      ADD_FAILURE() << "connection " << id << " finished at the client, not at the server";
      continue;
    }
    const View& sv = it->second;
    if (cv.me != cv.peer || sv.me != sv.peer || cv.me != sv.me || cv.me == "unknown") {
      if (++disagreements <= 10)
        ADD_FAILURE() << "connection " << id << ": client saw itself on " << cv.me
                      << " and the server on " << cv.peer << "; the server saw itself on " << sv.me
                      << " and the client on " << sv.peer;
    }
    (cv.me == "accel" ? accel : tcp)++;
  }
  EXPECT_EQ(disagreements, 0);
  for (auto& [id, sv] : at_server)
    EXPECT_TRUE(at_client.count(id)) << "connection " << id << " unknown to its client";

  // The stats of every process, by side.
  Stats cs, ss;  // sums
  int server_lines = 0;
  auto add = [](Stats* sum, const Stats& s) {
    for (auto& [k, v] : s.connections) sum->connections[k] += v;
    for (auto& [k, v] : s.fallbacks) sum->fallbacks[k] += v;
    for (auto& [k, v] : s.rejected) sum->rejected[k] += v;
    for (auto& [k, v] : s.resets) sum->resets[k] += v;
    sum->bytes_sent += s.bytes_sent;
    sum->bytes_received += s.bytes_received;
  };
  for (const Stats& s : stats()) {
    if (client_pids.count(s.pid)) {
      add(&cs, s);
    } else {
      add(&ss, s);
      ++server_lines;
    }
  }
  // Each worker writes one line, and so does the parent when it made the
  // listener (fork); with SO_REUSEPORT each worker makes its own, and the
  // parent, which made no TCP socket, writes none.
  const bool parent_listens = std::string(c.share) == "fork";
  EXPECT_EQ(server_lines, c.workers + (parent_listens ? 1 : 0))
      << "one line from each worker, and from the parent when it made the listener";
  for (auto [who, st] : {std::pair<const char*, Stats*>{"clients", &cs}, {"server", &ss}}) {
    EXPECT_EQ(st->conn("shm"), accel) << who << ": connections.shm";
    EXPECT_EQ(st->conn("tcp"), tcp) << who << ": connections.tcp";
    EXPECT_EQ(st->conn("rdma"), 0u) << who;
    EXPECT_EQ(st->total_fallbacks(), tcp) << who << ": each TCP connection has one reason";
    EXPECT_TRUE(st->rejected.empty())
        << who << ": rejected " << st->rejects("unproven") << " intruder(s), but there were none";
    EXPECT_TRUE(st->resets.empty()) << who;
  }
  // Honest reasons: with both ends preloaded and no intruder, a stream
  // stays on TCP only because a pairing ran out of time (this side's or
  // the peer's), or, after that, through the client's negative cache (the
  // server then finds no rendezvous).
  for (auto& [reason, n] : cs.fallbacks)
    EXPECT_TRUE(reason == "pair_timeout" || reason == "negative_cache")
        << "clients: " << n << " x " << reason;
  for (auto& [reason, n] : ss.fallbacks)
    EXPECT_TRUE(reason == "pair_timeout" || reason == "peer_not_accelerated")
        << "server: " << n << " x " << reason;
  EXPECT_EQ(cs.bytes_sent, ss.bytes_received) << "accelerated bytes, client to server";
  EXPECT_EQ(ss.bytes_sent, cs.bytes_received) << "accelerated bytes, server to client";
  if (c.timeouts.empty()) {
    EXPECT_GT(accel, 0u) << "nothing paired at the default timeout: the test tested nothing";
  }
  std::cerr << "[ stress   ] " << c.name << ": " << at_client.size() << " connections, " << accel
            << " shm, " << tcp << " tcp; client fallbacks:";
  for (auto& [k, v] : cs.fallbacks) std::cerr << " " << k << "=" << v;
  std::cerr << "; server fallbacks:";
  for (auto& [k, v] : ss.fallbacks) std::cerr << " " << k << "=" << v;
  std::cerr << "\n";
}

const std::vector<int> kTiny = {1, 2, 3, 5, 4, 1};

INSTANTIATE_TEST_SUITE_P(
    Shm, PairingStress,
    ::testing::Values(
        // name, share, server io, workers, clients, waves, conns, parallel, client io,
        // rounds, hold ms, bytes, timeouts
        StressCase{
            "ForkWorkersBlocking", "fork", "block", 2, 8, 8, 250, 4, "block", 1, 0, 4096, {}},
        StressCase{
            "ForkWorkersEventLoop", "fork", "epoll", 2, 8, 8, 250, 8, "epoll", 1, 0, 4096, {}},
        // The hand-over's window held open (3 ms each): an event loop that
        // reads, answers and closes before its fd changes hands must
        // still end the connection (its stats count its bytes) and drop
        // its epoll member (the number's next connection is added afresh).
        StressCase{"ForkWorkersEventLoopSlowHandOver",
                   "fork",
                   "epoll",
                   2,
                   8,
                   8,
                   250,
                   8,
                   "epoll",
                   1,
                   0,
                   4096,
                   {},
                   3000},
        StressCase{
            "ReuseportMixed", "reuseport", "mixed", 3, 8, 8, 250, 6, "mixed", 1, 0, 4096, {}},
        StressCase{"LongLivedMixed", "fork", "mixed", 2, 8, 8, 24, 12, "mixed", 6, 40, 16384, {}},
        StressCase{"TinyTimeoutsForkMixed", "fork", "mixed", 2, 48, 8, 12, 6, "mixed", 1, 0, 2048,
                   kTiny},
        StressCase{"TinyTimeoutsReuseportLongLived", "reuseport", "mixed", 2, 24, 8, 8, 8, "mixed",
                   3, 20, 2048, kTiny},
        // Each client process stops pairing after its first timeout (the
        // negative cache), so many processes with few connections each
        // make the most pairings run into a deadline.
        StressCase{"TinyTimeoutsManyProcesses", "fork", "mixed", 3, 160, 16, 4, 4, "mixed", 1, 0,
                   1024, kTiny}),
    [](const ::testing::TestParamInfo<StressCase>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace rsock_test
