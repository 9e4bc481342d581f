// How many connections the daemon serves at once, in all and per peer. Every connection the daemon accepts (unix
// and TCP) passes the gate before gRPC gets it; one past a cap is closed at once, so a peer that opens connections
// and sends nothing can neither use up the daemon's descriptors nor crowd out the other peers.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "base/mutex.h"

namespace cake {

class ConnectionGate {
 public:
  enum class Verdict { kAdmitted, kTotalCapReached, kPeerCapReached };
  // Where a connection comes from: a local user on the unix socket (counted by uid: one account each), or the
  // network (counted by address, which a peer can vary: every 127.x.y.z is the local host's, an IPv6 host holds a
  // /64). Network connections may hold only the total cap less a quarter kept for the socket, so peers posing as
  // many addresses can never shut the local engines out.
  enum class Origin { kUnixSocket, kNetwork };

  ConnectionGate(uint32_t max_connections, uint32_t max_connections_per_peer)
      : max_connections_(max_connections),
        max_network_connections_(max_connections - max_connections / 4),
        max_per_peer_(max_connections_per_peer) {}

  // A connection just accepted on `fd` from `peer` ("uid 1000", "127.0.0.0/8"). Admitted: it counts against the
  // caps until its descriptor is closed (gRPC closes it when the connection ends; the gate notices lazily).
  // Otherwise the caller closes it.
  Verdict Admit(int fd, const std::string& peer, Origin origin = Origin::kUnixSocket);
  // Admit, and when refused: close `fd`, count it, and warn (at most every 10 s) naming `listener` and the cap.
  bool AdmitOrClose(int fd, const std::string& peer, std::string_view listener, Origin origin = Origin::kUnixSocket);

  uint64_t admitted() const { return admitted_.load(std::memory_order_relaxed); }
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

  // Connections open now (closed ones found and forgotten first).
  uint32_t open();
  uint32_t open_for(const std::string& peer);
  uint32_t max_connections() const { return max_connections_; }
  uint32_t max_network_connections() const { return max_network_connections_; }
  uint32_t max_connections_per_peer() const { return max_per_peer_; }

 private:
  // Forgets connections whose descriptor is closed, or now names another file. gRPC gives no word when it closes a
  // connection; a socket's inode is unique while it is open, so (device, inode) tells a live connection from a
  // reused number.
  void ForgetClosedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether one more connection from `peer` fits under the caps, as counted now.
  Verdict CapsLocked(const std::string& peer, Origin origin) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Open {
    std::string peer;
    dev_t device;
    ino_t inode;
    Origin origin;
  };
  void ForgetLocked(absl::flat_hash_map<int, Open>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const uint32_t max_connections_;
  const uint32_t max_network_connections_;
  const uint32_t max_per_peer_;
  Mutex mu_;
  absl::flat_hash_map<int, Open> open_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> per_peer_ ABSL_GUARDED_BY(mu_);
  uint32_t network_open_ ABSL_GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point last_warning_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> admitted_{0};
  std::atomic<uint64_t> refused_{0};
};

}  // namespace cake
