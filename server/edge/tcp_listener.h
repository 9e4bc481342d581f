// The daemon's TCP port, accepted by the daemon itself and handed to gRPC (TLS and all) through an external
// connection acceptor: gRPC's own TCP listener (1.51) has no cap on connections, so a peer could open connections
// until the daemon runs out of descriptors. Here each connection passes the ConnectionGate first, counted by the
// peer's address.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"
#include "base/unique_fd.h"
#include "server/edge/connection_gate.h"

namespace grpc::experimental {
class ExternalConnectionAcceptor;
}

namespace cake {

// A TCP socket listening on `address` ("host:port", "[v6]:port"; port 0: any free one), non-blocking, and the port
// it got. `key` names the config key in errors ("tcp.listen").
struct ListeningTcpSocket {
  UniqueFd fd;
  int port = 0;
};
absl::StatusOr<ListeningTcpSocket> ListenOnTcp(const std::string& address, const char* key);

// What the per-peer cap counts a TCP peer as, from its address without the port: the address itself, except where
// one host holds many: every loopback address (127.0.0.0/8, ::1) is the local host, "loopback"; an IPv6 address
// counts by its /64 ("2001:db8:1:2::/64"), which one host may fill; an IPv4-mapped one as the IPv4 address.
std::string NetworkPeerKey(std::string_view address);

class TcpListener {
 public:
  // Binds and listens on `address` ("host:port", "[v6]:port"; port 0: any free one). Accepting starts with Serve.
  static absl::StatusOr<std::unique_ptr<TcpListener>> Bind(const std::string& address);
  ~TcpListener();

  int port() const { return port_; }
  // Accepts on a thread of its own, handing every connection `gate` admits to `acceptor`, which runs the
  // handshake (TLS when the server's credentials say so) under the server's handshake timeout.
  void Serve(grpc::experimental::ExternalConnectionAcceptor* acceptor, ConnectionGate* gate);
  // Stops accepting and joins the thread; connections already handed over stay gRPC's. Idempotent.
  void Stop();

 private:
  TcpListener() = default;

  UniqueFd listen_fd_;
  UniqueFd stop_fd_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace cake
