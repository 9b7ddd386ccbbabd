// Unit tests for src/transport/shm/possession.h over real loopback TCP
// connections: the peer lookup finds the other end of a connection (and
// nothing for a socket that is not connected), a proof names exactly the
// socket it was made from, and a proof grants nothing (no I/O, no socket
// options, no reopening through /proc).
#include "transport/shm/possession.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace rsock {
namespace {

struct Pair {
  int listener = -1, client = -1, server = -1;
  Pair() {
    listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(listener, 4) != 0 ||
        getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return;
    client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
    server = accept(listener, nullptr, nullptr);
  }
  ~Pair() {
    for (int fd : {listener, client, server})
      if (fd >= 0) close(fd);
  }
};

uint64_t inode_of(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

TEST(Possession, FindsTheOtherEndOfAConnection) {
  Pair p;
  ASSERT_GE(p.server, 0);
  PeerSocket peer;
  ASSERT_EQ(peer_socket_of(p.client, &peer), 0);
  EXPECT_EQ(peer.inode, inode_of(p.server));
  EXPECT_EQ(peer.uid, geteuid());
  ASSERT_EQ(peer_socket_of(p.server, &peer), 0);
  EXPECT_EQ(peer.inode, inode_of(p.client));
}

TEST(Possession, NoPeerForASocketWithoutOne) {
  Pair p;
  ASSERT_GE(p.server, 0);
  PeerSocket peer;
  EXPECT_LT(peer_socket_of(p.listener, &peer), 0);
  int unconnected = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_LT(peer_socket_of(unconnected, &peer), 0);
  close(unconnected);
}

TEST(Possession, AProofNamesItsSocketOnly) {
  Pair p, other;
  ASSERT_GE(p.server, 0);
  ASSERT_GE(other.server, 0);
  int proof = possession_proof(p.client);
  ASSERT_GE(proof, 0);
  EXPECT_TRUE(proof_names(proof, inode_of(p.client), p.server));
  EXPECT_FALSE(proof_names(proof, inode_of(p.server), p.server));
  EXPECT_FALSE(proof_names(proof, inode_of(other.client), p.server));
  EXPECT_FALSE(proof_names(proof, 0, p.server));
  // A regular file with the same inode number is not a socket.
  int file = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  EXPECT_FALSE(proof_names(file, inode_of(file), p.server));
  close(file);
  close(proof);
}

TEST(Possession, AProofGrantsNothing) {
  Pair p;
  ASSERT_GE(p.server, 0);
  int proof = possession_proof(p.client);
  ASSERT_GE(proof, 0);
  char b = 'x';
  EXPECT_LT(write(proof, &b, 1), 0);
  EXPECT_LT(send(proof, &b, 1, MSG_DONTWAIT), 0);
  EXPECT_LT(recv(proof, &b, 1, MSG_DONTWAIT), 0);
  int v = 0;
  socklen_t len = sizeof v;
  EXPECT_LT(getsockopt(proof, SOL_SOCKET, SO_TYPE, &v, &len), 0);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", proof);
  int reopened = open(path, O_RDWR);
  EXPECT_LT(reopened, 0);
  if (reopened >= 0) close(reopened);
  close(proof);
}

}  // namespace
}  // namespace rsock
