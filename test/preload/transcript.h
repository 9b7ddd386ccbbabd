// Transcript comparison for the preload tests that run one program on plain
// TCP and under librsock (DESIGN.md invariant 10): the program prints one
// canonical line per probe, and the two runs must print the same lines.
// Thread-safety: plain functions.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "harness.h"

namespace rsock_test {

// The lines of `out` that start with `prefix`.
inline std::vector<std::string> transcript(const std::string& out, const std::string& prefix) {
  std::vector<std::string> lines;
  for (const std::string& l : split_lines(out))
    if (l.rfind(prefix, 0) == 0) lines.push_back(l);
  return lines;
}

// Expects the two transcripts to be equal, naming every line that differs.
inline void expect_same_transcript(const std::vector<std::string>& tcp,
                                   const std::vector<std::string>& rsock) {
  EXPECT_EQ(tcp.size(), rsock.size()) << "the two runs printed different numbers of probes";
  const size_t n = std::max(tcp.size(), rsock.size());
  std::ostringstream diff;
  int differing = 0;
  for (size_t i = 0; i < n; ++i) {
    const std::string a = i < tcp.size() ? tcp[i] : "<none>";
    const std::string b = i < rsock.size() ? rsock[i] : "<none>";
    if (a == b) continue;
    ++differing;
    diff << "  kernel:   " << a << "\n  librsock: " << b << "\n";
  }
  EXPECT_EQ(differing, 0) << "librsock differs from the kernel:\n" << diff.str();
}

}  // namespace rsock_test
