// ConnectionGate and the TCP peer key: what a peer that varies its address, or floods the network side, can hold.
#include "server/edge/connection_gate.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <vector>

#include "server/edge/tcp_listener.h"

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
  // The far end of the connection Next() returned last: what a client would hold.
  int FarEndOfLast() const { return fds.back(); }
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
    const std::string host = "10.0.0." + std::to_string(i);
    CHECK(gate.Admit(sockets.Next(), host, ConnectionGate::Origin::kNetwork, host + ":4000") ==
          ConnectionGate::Verdict::kAdmitted);
    gate.Identified("ipv4:" + host + ":4000");  // strangers would make room (below)
  }
  CHECK(gate.Admit(sockets.Next(), "10.0.0.99", ConnectionGate::Origin::kNetwork) ==
        ConnectionGate::Verdict::kTotalCapReached);
  // A local engine still gets in, up to the whole cap.
  CHECK(gate.Admit(sockets.Next(), "uid 1000") == ConnectionGate::Verdict::kAdmitted);
  CHECK(gate.Admit(sockets.Next(), "uid 1001") == ConnectionGate::Verdict::kAdmitted);
  CHECK(gate.Admit(sockets.Next(), "uid 1002") == ConnectionGate::Verdict::kTotalCapReached);
  CHECK(gate.open() == 8);
}

// Whether the daemon's side of a socketpair was shut down: the far end reads the end of the stream.
bool ShutDown(int far_end) {
  pollfd p{far_end, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  char byte;
  return ::recv(far_end, &byte, 1, MSG_DONTWAIT) == 0;
}

TEST_CASE("connection gate: strangers cannot lock an identified caller out of the TCP port", "[connection-gate]") {
  Sockets sockets;
  ConnectionGate gate(64, 4);  // 48 for the network, 4 per peer
  // A stranger holds its host's whole share ("loopback": every 127.x.y.z), calling nothing that names anyone.
  std::vector<int> stranger_ends;
  for (int i = 0; i < 4; ++i) {
    REQUIRE(gate.Admit(sockets.Next(), "loopback", ConnectionGate::Origin::kNetwork,
                       "127.0.0.2:" + std::to_string(5000 + i)) == ConnectionGate::Verdict::kAdmitted);
    stranger_ends.push_back(sockets.FarEndOfLast());
  }
  CHECK(gate.strangers() == 4);
  // At 4054af8 the next connection from that host was closed at accept for as long as the stranger's stayed. Now
  // it takes the place of the oldest stranger, whose socket is shut down (gRPC then ends it).
  REQUIRE(gate.Admit(sockets.Next(), "loopback", ConnectionGate::Origin::kNetwork, "127.0.0.1:6000") ==
          ConnectionGate::Verdict::kAdmitted);
  const int engine_end = sockets.FarEndOfLast();
  CHECK(ShutDown(stranger_ends[0]));
  for (int i = 1; i < 4; ++i) CHECK_FALSE(ShutDown(stranger_ends[i]));
  CHECK(gate.strangers_evicted() == 1);
  // Its first call names a principal: from then on it is never the one to make room.
  gate.Identified("ipv4:127.0.0.1:6000");
  CHECK(gate.strangers() == 3);
  for (int i = 0; i < 10; ++i) {
    REQUIRE(gate.Admit(sockets.Next(), "loopback", ConnectionGate::Origin::kNetwork,
                       "127.0.0.2:" + std::to_string(7000 + i)) == ConnectionGate::Verdict::kAdmitted);
  }
  CHECK_FALSE(ShutDown(engine_end));
  CHECK(gate.open_for("loopback") == 4);
  // Identified connections alone at the cap: the next is refused, none is closed.
  for (int i = 0; i < 3; ++i) gate.Identified("ipv4:127.0.0.2:" + std::to_string(7007 + i));
  CHECK(gate.Admit(sockets.Next(), "loopback", ConnectionGate::Origin::kNetwork, "127.0.0.2:8000") ==
        ConnectionGate::Verdict::kPeerCapReached);
  CHECK_FALSE(ShutDown(engine_end));
}

TEST_CASE("connection gate: at the network's share a stranger of the host holding the most makes room",
          "[connection-gate]") {
  Sockets sockets;
  ConnectionGate gate(8, 8);  // 6 for the network
  std::vector<int> ends;
  for (int i = 0; i < 6; ++i) {
    const std::string host = i < 4 ? "10.0.0.1" : "10.0.0.2";
    REQUIRE(gate.Admit(sockets.Next(), host, ConnectionGate::Origin::kNetwork, host + ":" + std::to_string(100 + i)) ==
            ConnectionGate::Verdict::kAdmitted);
    ends.push_back(sockets.FarEndOfLast());
  }
  // Another host's engine gets in; 10.0.0.1's oldest stranger goes, 10.0.0.2's stay.
  REQUIRE(gate.Admit(sockets.Next(), "10.0.0.9", ConnectionGate::Origin::kNetwork, "10.0.0.9:1") ==
          ConnectionGate::Verdict::kAdmitted);
  CHECK(ShutDown(ends[0]));
  for (int i = 1; i < 6; ++i) CHECK_FALSE(ShutDown(ends[i]));
  // A local engine on the socket, at the whole cap, also makes room.
  for (int i = 0; i < 3; ++i) {
    CHECK(gate.Admit(sockets.Next(), "uid " + std::to_string(1000 + i)) == ConnectionGate::Verdict::kAdmitted);
  }
  CHECK(gate.open() == 8);
  CHECK(gate.strangers_evicted() == 2);
}

TEST_CASE("connection gate: a stranger is closed after the identify timeout, an identified connection is not",
          "[connection-gate]") {
  Sockets sockets;
  ConnectionGate gate(64, 64);
  REQUIRE(gate.Admit(sockets.Next(), "10.0.0.1", ConnectionGate::Origin::kNetwork, "10.0.0.1:1") ==
          ConnectionGate::Verdict::kAdmitted);
  const int stranger_end = sockets.FarEndOfLast();
  REQUIRE(gate.Admit(sockets.Next(), "10.0.0.1", ConnectionGate::Origin::kNetwork, "10.0.0.1:2") ==
          ConnectionGate::Verdict::kAdmitted);
  const int engine_end = sockets.FarEndOfLast();
  REQUIRE(gate.Admit(sockets.Next(), "uid 1000") == ConnectionGate::Verdict::kAdmitted);
  const int local_end = sockets.FarEndOfLast();
  gate.Identified("ipv4:10.0.0.1:2");
  // Not yet: accepted after the cut.
  CHECK(gate.CloseStrangers(ConnectionGate::Clock::now() - std::chrono::seconds(10)) == 0);
  CHECK(gate.CloseStrangers(ConnectionGate::Clock::now() + std::chrono::seconds(1)) == 1);
  CHECK(ShutDown(stranger_end));
  CHECK_FALSE(ShutDown(engine_end));
  CHECK_FALSE(ShutDown(local_end));
  CHECK(gate.strangers_timed_out() == 1);
  CHECK(gate.open() == 2);  // the stranger's descriptor is gRPC's to close; the gate counts it no more
  CHECK(gate.open_for("10.0.0.1") == 1);
}

TEST_CASE("connection gate: a call's gRPC peer names the TCP connection it came on", "[connection-gate]") {
  CHECK(ConnectionAddressOfGrpcPeer("ipv4:10.1.2.3:40000") == "10.1.2.3:40000");
  CHECK(ConnectionAddressOfGrpcPeer("ipv6:[2001:db8::1]:40000") == "[2001:db8::1]:40000");
  CHECK(ConnectionAddressOfGrpcPeer("ipv6:%5B2001:db8::1%5D:40000") == "[2001:db8::1]:40000");
  CHECK(ConnectionAddressOfGrpcPeer("ipv6:[fe80::1%25eth0]:40000") == "[fe80::1]:40000");
  CHECK(ConnectionAddressOfGrpcPeer("unix:/run/cake/caked.sock").empty());
  // A real loopback connection, named from the daemon's side.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(listener, 1) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  const int accepted = ::accept(listener, nullptr, nullptr);
  REQUIRE(accepted >= 0);
  sockaddr_in local{};
  len = sizeof(local);
  REQUIRE(::getsockname(client, reinterpret_cast<sockaddr*>(&local), &len) == 0);
  CHECK(ConnectionAddress(accepted) == "127.0.0.1:" + std::to_string(ntohs(local.sin_port)));
  CHECK(ConnectionAddress(accepted) ==
        ConnectionAddressOfGrpcPeer("ipv4:127.0.0.1:" + std::to_string(ntohs(local.sin_port))));
  for (int fd : {accepted, client, listener}) ::close(fd);
}

TEST_CASE("connection gate: a closed network connection frees its share", "[connection-gate]") {
  ConnectionGate gate(4, 4);
  int pair[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair) == 0);
  Sockets sockets;
  // Identified connections: strangers would make room for the next anyway.
  for (int i = 0; i < 2; ++i) {
    REQUIRE(gate.Admit(sockets.Next(), "a", ConnectionGate::Origin::kNetwork, "10.0.0.1:" + std::to_string(i)) ==
            ConnectionGate::Verdict::kAdmitted);
    gate.Identified("ipv4:10.0.0.1:" + std::to_string(i));
  }
  REQUIRE(gate.Admit(pair[0], "b", ConnectionGate::Origin::kNetwork, "10.0.0.2:1") ==
          ConnectionGate::Verdict::kAdmitted);
  gate.Identified("ipv4:10.0.0.2:1");
  CHECK(gate.Admit(sockets.Next(), "c", ConnectionGate::Origin::kNetwork) == ConnectionGate::Verdict::kTotalCapReached);
  ::close(pair[0]);
  ::close(pair[1]);
  CHECK(gate.Admit(sockets.Next(), "c", ConnectionGate::Origin::kNetwork) == ConnectionGate::Verdict::kAdmitted);
}

}  // namespace cake
