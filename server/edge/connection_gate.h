// How many connections the daemon serves at once, in all and per peer. Every connection the daemon accepts (unix
// and TCP) passes the gate before gRPC gets it; one past a cap is closed at once, so a peer that opens connections
// and sends nothing can neither use up the daemon's descriptors nor crowd out the other peers.
//
// A unix connection is identified at accept (its uid). A network connection is a stranger until a call on it names
// a principal (TcpCallGate refuses every other call on its headers): strangers make room for whoever comes next
// (the oldest stranger of the peer that holds the most is closed, so a caller with credentials always gets in
// unless identified connections fill the caps), and one that has named nobody within tcp.identify_timeout_ms is
// closed (CloseStrangers), whatever it sent meanwhile.
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
  using Clock = std::chrono::steady_clock;

  ConnectionGate(uint32_t max_connections, uint32_t max_connections_per_peer)
      : max_connections_(max_connections),
        max_network_connections_(max_connections - max_connections / 4),
        max_per_peer_(max_connections_per_peer) {}

  // A connection just accepted on `fd` from `peer` ("uid 1000", "127.0.0.0/8"); a network one also names its
  // `address` ("10.1.2.3:40000", "[2001:db8::1]:40000": the remote end, as ConnectionAddress gives it), by which
  // Identified finds it. Admitted: it counts against the caps until its descriptor is closed (gRPC closes it when
  // the connection ends; the gate notices lazily), making room first by closing strangers where a cap is reached.
  // Otherwise the caller closes it.
  Verdict Admit(int fd, const std::string& peer, Origin origin = Origin::kUnixSocket, const std::string& address = "");
  // Admit, and when refused: close `fd`, count it, and warn (at most every 10 s) naming `listener` and the cap.
  bool AdmitOrClose(int fd, const std::string& peer, std::string_view listener, Origin origin = Origin::kUnixSocket,
                    const std::string& address = "");

  // A call on the network connection `grpc_peer` (gRPC's name for it: "ipv4:10.1.2.3:40000") named a principal:
  // it is no longer a stranger. Cheap for the unix socket's peers ("unix:..."), which are identified at accept.
  void Identified(std::string_view grpc_peer);
  // Closes every stranger accepted before `accepted_before` (shuts its socket down: gRPC then ends the
  // connection and closes its descriptor); returns how many.
  size_t CloseStrangers(Clock::time_point accepted_before);

  uint64_t admitted() const { return admitted_.load(std::memory_order_relaxed); }
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  // Strangers closed: to make room for a newer connection, and for naming nobody in time.
  uint64_t strangers_evicted() const { return strangers_evicted_.load(std::memory_order_relaxed); }
  uint64_t strangers_timed_out() const { return strangers_timed_out_.load(std::memory_order_relaxed); }

  // Connections open now (closed ones found and forgotten first).
  uint32_t open();
  uint32_t open_for(const std::string& peer);
  // Network connections that have not named a principal yet.
  uint32_t strangers();
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
    std::string address;  // network only
    Clock::time_point accepted;
    bool stranger;  // a network connection on which no call has named a principal yet
  };
  void ForgetLocked(absl::flat_hash_map<int, Open>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The stranger to close to make room past `verdict`: the oldest of `peer` at its cap, else the oldest of the
  // peer that holds the most; open_.end() when there is none.
  absl::flat_hash_map<int, Open>::iterator VictimLocked(Verdict verdict, const std::string& peer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Shuts the stranger's socket down (after checking its number still names it) and forgets it.
  void CloseStrangerLocked(absl::flat_hash_map<int, Open>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const uint32_t max_connections_;
  const uint32_t max_network_connections_;
  const uint32_t max_per_peer_;
  Mutex mu_;
  absl::flat_hash_map<int, Open> open_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> per_peer_ ABSL_GUARDED_BY(mu_);
  uint32_t network_open_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, int> by_address_ ABSL_GUARDED_BY(mu_);  // network address -> fd
  absl::flat_hash_map<std::string, uint32_t> strangers_per_peer_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_warning_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> admitted_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> strangers_evicted_{0};
  std::atomic<uint64_t> strangers_timed_out_{0};
};

// A network connection's remote end as the gate names it, "10.1.2.3:40000" or "[2001:db8::1]:40000" (an
// IPv4-mapped address as IPv4), from its descriptor ("" when it has none), and from gRPC's peer string for a call
// ("ipv4:10.1.2.3:40000", "ipv6:[2001:db8::1]:40000", either percent-encoded; "" for any other scheme).
std::string ConnectionAddress(int fd);
std::string ConnectionAddressOfGrpcPeer(std::string_view grpc_peer);

}  // namespace cake
