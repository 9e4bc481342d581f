// ConnectionGate and the TCP peer key: what a peer that varies its address, or floods the network side, can hold.
#include "server/connection_gate.h"

#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <vector>

#include "server/tcp_listener.h"

namespace cake {
namespace {

// Real descriptors (the gate tells a live connection from a reused number by fstat), closed at the end.
struct Sockets {
  std::vector<int> fds;
  int Next() {
    int pair[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair) == 0);
    fds.push_back(pair[0]);
    fds.push_back(pair[1]);
    return pair[0];
  }
  ~Sockets() {
    for (int fd : fds) ::close(fd);
  }
};

}  // namespace

TEST_CASE("connection gate: one host is one TCP peer whatever loopback or IPv6 address it uses", "[connection-gate]") {
  CHECK(NetworkPeerKey("127.0.0.1") == "loopback");
  CHECK(NetworkPeerKey("127.8.9.10") == "loopback");
  CHECK(NetworkPeerKey("::1") == "loopback");
  CHECK(NetworkPeerKey("::ffff:127.0.0.2") == "loopback");
  CHECK(NetworkPeerKey("::ffff:10.1.2.3") == "10.1.2.3");
  CHECK(NetworkPeerKey("10.1.2.3") == "10.1.2.3");
  CHECK(NetworkPeerKey("2001:db8:1:2:aaaa:bbbb:cccc:dddd") == "2001:db8:1:2::/64");
  CHECK(NetworkPeerKey("2001:db8:1:2::7") == NetworkPeerKey("2001:db8:1:2:ffff::1"));
  CHECK(NetworkPeerKey("not an address") == "not an address");
}

TEST_CASE("connection gate: network peers cannot take the quarter kept for the unix socket", "[connection-gate]") {
  Sockets sockets;
  ConnectionGate gate(8, 8);  // 6 for the network, 2 only the socket may use
  CHECK(gate.max_network_connections() == 6);
  for (int i = 0; i < 6; ++i) {
    CHECK(gate.Admit(sockets.Next(), "10.0.0." + std::to_string(i), ConnectionGate::Origin::kNetwork) ==
          ConnectionGate::Verdict::kAdmitted);
  }
  CHECK(gate.Admit(sockets.Next(), "10.0.0.99", ConnectionGate::Origin::kNetwork) ==
        ConnectionGate::Verdict::kTotalCapReached);
  // A local engine still gets in, up to the whole cap.
  CHECK(gate.Admit(sockets.Next(), "uid 1000") == ConnectionGate::Verdict::kAdmitted);
  CHECK(gate.Admit(sockets.Next(), "uid 1001") == ConnectionGate::Verdict::kAdmitted);
  CHECK(gate.Admit(sockets.Next(), "uid 1002") == ConnectionGate::Verdict::kTotalCapReached);
  CHECK(gate.open() == 8);
}

TEST_CASE("connection gate: a closed network connection frees its share", "[connection-gate]") {
  ConnectionGate gate(4, 4);
  int pair[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair) == 0);
  Sockets sockets;
  for (int i = 0; i < 2; ++i)
    REQUIRE(gate.Admit(sockets.Next(), "a", ConnectionGate::Origin::kNetwork) == ConnectionGate::Verdict::kAdmitted);
  REQUIRE(gate.Admit(pair[0], "b", ConnectionGate::Origin::kNetwork) == ConnectionGate::Verdict::kAdmitted);
  CHECK(gate.Admit(sockets.Next(), "c", ConnectionGate::Origin::kNetwork) == ConnectionGate::Verdict::kTotalCapReached);
  ::close(pair[0]);
  ::close(pair[1]);
  CHECK(gate.Admit(sockets.Next(), "c", ConnectionGate::Origin::kNetwork) == ConnectionGate::Verdict::kAdmitted);
}

}  // namespace cake
