// Policy: decides, from the Config, the program name, the role and the
// addresses of one socket, whether librsock should try to accelerate it and
// with which transport. Pure and thread-safe (reads an immutable Config).
#pragma once

#include <sys/socket.h>

#include <string_view>

#include "config/config.h"

namespace rsock {

struct Decision {
  bool candidate = false;           // a rule matched and its transport is not tcp
  TransportKind transport = TransportKind::kTcp;
  int rule_index = -1;              // index into Config::rules, -1 if none matched
};

// Client side: `peer` is the address passed to connect().
// Server side: `local` is the address passed to bind()/seen by getsockname()
// of a listening socket; a wildcard address matches by port alone (0.0.0.0:
// IPv4 rules only; the dual-stack ::, IPv4 and IPv6 rules). IPv4-mapped IPv6
// addresses match IPv4 rules. The first matching rule wins; rules scoped to
// another program or another role are skipped. Non-inet families, truncated
// addresses and a disabled Config never match.
Decision decide(const Config& config, std::string_view program, Role role,
                const sockaddr* addr, socklen_t len);

}  // namespace rsock
