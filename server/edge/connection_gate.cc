#include "server/edge/connection_gate.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace cake {

namespace {
bool StillOpen(int fd, dev_t device, ino_t inode) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && st.st_dev == device && st.st_ino == inode;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

std::string ConnectionAddress(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
    return absl::StrCat(text, ":", ntohs(v4->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    if (IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr)) {
      in_addr v4{};
      std::memcpy(&v4.s_addr, &v6->sin6_addr.s6_addr[12], sizeof(v4.s_addr));
      ::inet_ntop(AF_INET, &v4, text, sizeof(text));
      return absl::StrCat(text, ":", ntohs(v6->sin6_port));
    }
    ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
    return absl::StrCat("[", text, "]:", ntohs(v6->sin6_port));
  }
  return "";
}

std::string ConnectionAddressOfGrpcPeer(std::string_view grpc_peer) {
  bool v6 = false;
  if (grpc_peer.substr(0, 5) == "ipv4:") {
    grpc_peer.remove_prefix(5);
  } else if (grpc_peer.substr(0, 5) == "ipv6:") {
    grpc_peer.remove_prefix(5);
    v6 = true;
  } else {
    return "";
  }
  std::string decoded;
  for (size_t i = 0; i < grpc_peer.size(); ++i) {
    if (grpc_peer[i] == '%' && i + 2 < grpc_peer.size() && HexDigit(grpc_peer[i + 1]) >= 0 &&
        HexDigit(grpc_peer[i + 2]) >= 0) {
      decoded.push_back(static_cast<char>(HexDigit(grpc_peer[i + 1]) * 16 + HexDigit(grpc_peer[i + 2])));
      i += 2;
    } else {
      decoded.push_back(grpc_peer[i]);
    }
  }
  // An IPv6 scope ("[fe80::1%eth0]:port") is not part of what getpeername's text gives.
  if (v6) {
    if (const size_t scope = decoded.find('%'), close = decoded.find(']');
        scope != std::string::npos && close != std::string::npos && scope < close) {
      decoded.erase(scope, close - scope);
    }
  }
  return decoded;
}

ConnectionGate::Verdict ConnectionGate::Admit(int fd, const std::string& peer, Origin origin,
                                              const std::string& address) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Verdict::kTotalCapReached;  // cannot happen for a descriptor just accepted
  MutexLock lock(&mu_);
  // A reused number: the connection it named is gone.
  if (auto it = open_.find(fd); it != open_.end()) ForgetLocked(it);
  // Only at a cap is it worth looking for connections gRPC closed since: an fstat per open connection.
  if (CapsLocked(peer, origin) != Verdict::kAdmitted) ForgetClosedLocked();
  for (Verdict verdict; (verdict = CapsLocked(peer, origin)) != Verdict::kAdmitted;) {
    auto victim = VictimLocked(verdict, peer);
    if (victim == open_.end()) return verdict;
    CloseStrangerLocked(victim);
    strangers_evicted_.fetch_add(1, std::memory_order_relaxed);
  }
  const bool network = origin == Origin::kNetwork;
  open_[fd] = Open{peer, st.st_dev, st.st_ino, origin, network ? address : "", Clock::now(), network};
  ++per_peer_[peer];
  if (network) {
    ++network_open_;
    ++strangers_per_peer_[peer];
    if (!address.empty()) by_address_[address] = fd;
  }
  return Verdict::kAdmitted;
}

bool ConnectionGate::AdmitOrClose(int fd, const std::string& peer, std::string_view listener, Origin origin,
                                  const std::string& address) {
  const uint64_t evicted_before = strangers_evicted();
  const Verdict verdict = Admit(fd, peer, origin, address);
  bool warn = false;
  {
    MutexLock lock(&mu_);
    if (const auto now = Clock::now(); (verdict != Verdict::kAdmitted || strangers_evicted() != evicted_before) &&
                                       now - last_warning_ > std::chrono::seconds(10)) {
      last_warning_ = now;
      warn = true;
    }
  }
  if (verdict == Verdict::kAdmitted) {
    admitted_.fetch_add(1, std::memory_order_relaxed);
    if (warn) {
      spdlog::warn(
          "a connection on the {} from {} took the place of a network connection that had named no principal "
          "({} such closed in all): the caps (server.max_connections_per_peer {}, server.max_connections {}) "
          "were reached",
          listener, peer, strangers_evicted(), max_per_peer_, max_connections_);
    }
    return true;
  }
  ::close(fd);
  refused_.fetch_add(1, std::memory_order_relaxed);
  if (warn) {
    if (verdict == Verdict::kPeerCapReached) {
      spdlog::warn(
          "a connection on the {} from {} closed at accept: that peer holds server.max_connections_per_peer "
          "({}) already ({} refused in all)",
          listener, peer, max_per_peer_, refused());
    } else if (origin == Origin::kNetwork) {
      spdlog::warn(
          "a connection on the {} from {} closed at accept: the network holds its share of "
          "server.max_connections ({} of {}: a quarter stays for the unix socket) already ({} refused in all)",
          listener, peer, max_network_connections_, max_connections_, refused());
    } else {
      spdlog::warn(
          "a connection on the {} from {} closed at accept: the daemon serves server.max_connections ({}) "
          "already ({} refused in all)",
          listener, peer, max_connections_, refused());
    }
  }
  return false;
}

void ConnectionGate::Identified(std::string_view grpc_peer) {
  if (grpc_peer.substr(0, 5) == "unix:") return;
  const std::string address = ConnectionAddressOfGrpcPeer(grpc_peer);
  if (address.empty()) return;
  MutexLock lock(&mu_);
  auto at = by_address_.find(address);
  if (at == by_address_.end()) return;
  auto it = open_.find(at->second);
  if (it == open_.end() || !it->second.stranger) return;
  it->second.stranger = false;
  if (--strangers_per_peer_[it->second.peer] == 0) strangers_per_peer_.erase(it->second.peer);
}

size_t ConnectionGate::CloseStrangers(Clock::time_point accepted_before) {
  MutexLock lock(&mu_);
  size_t closed = 0;
  for (auto it = open_.begin(); it != open_.end();) {
    auto next = std::next(it);
    if (it->second.stranger && it->second.accepted < accepted_before) {
      CloseStrangerLocked(it);
      ++closed;
    }
    it = next;
  }
  strangers_timed_out_.fetch_add(closed, std::memory_order_relaxed);
  return closed;
}

ConnectionGate::Verdict ConnectionGate::CapsLocked(const std::string& peer, Origin origin) const {
  if (open_.size() >= max_connections_) return Verdict::kTotalCapReached;
  if (origin == Origin::kNetwork && network_open_ >= max_network_connections_) return Verdict::kTotalCapReached;
  if (auto it = per_peer_.find(peer); it != per_peer_.end() && it->second >= max_per_peer_) {
    return Verdict::kPeerCapReached;
  }
  return Verdict::kAdmitted;
}

absl::flat_hash_map<int, ConnectionGate::Open>::iterator ConnectionGate::VictimLocked(Verdict verdict,
                                                                                      const std::string& peer) {
  std::string from = peer;
  if (verdict != Verdict::kPeerCapReached) {
    uint32_t most = 0;
    for (const auto& [stranger_peer, count] : strangers_per_peer_) {
      if (count > most) {
        most = count;
        from = stranger_peer;
      }
    }
    if (most == 0) return open_.end();
  }
  auto victim = open_.end();
  for (auto it = open_.begin(); it != open_.end(); ++it) {
    if (it->second.stranger && it->second.peer == from &&
        (victim == open_.end() || it->second.accepted < victim->second.accepted)) {
      victim = it;
    }
  }
  return victim;
}

void ConnectionGate::CloseStrangerLocked(absl::flat_hash_map<int, Open>::iterator it) {
  // gRPC owns the descriptor: only its socket is shut down (gRPC sees the end of the stream, ends the connection
  // and closes the descriptor), and only while its number still names the connection admitted.
  if (StillOpen(it->first, it->second.device, it->second.inode)) ::shutdown(it->first, SHUT_RDWR);
  ForgetLocked(it);
}

void ConnectionGate::ForgetClosedLocked() {
  for (auto it = open_.begin(); it != open_.end();) {
    if (StillOpen(it->first, it->second.device, it->second.inode)) {
      ++it;
      continue;
    }
    ForgetLocked(it++);
  }
}

void ConnectionGate::ForgetLocked(absl::flat_hash_map<int, Open>::iterator it) {
  const Open& gone = it->second;
  if (--per_peer_[gone.peer] == 0) per_peer_.erase(gone.peer);
  if (gone.origin == Origin::kNetwork) --network_open_;
  if (gone.stranger && --strangers_per_peer_[gone.peer] == 0) strangers_per_peer_.erase(gone.peer);
  if (auto at = by_address_.find(gone.address); at != by_address_.end() && at->second == it->first) {
    by_address_.erase(at);
  }
  open_.erase(it);
}

uint32_t ConnectionGate::open() {
  MutexLock lock(&mu_);
  ForgetClosedLocked();
  return static_cast<uint32_t>(open_.size());
}

uint32_t ConnectionGate::open_for(const std::string& peer) {
  MutexLock lock(&mu_);
  ForgetClosedLocked();
  auto it = per_peer_.find(peer);
  return it == per_peer_.end() ? 0 : it->second;
}

uint32_t ConnectionGate::strangers() {
  MutexLock lock(&mu_);
  ForgetClosedLocked();
  uint32_t count = 0;
  for (const auto& [peer, n] : strangers_per_peer_) count += n;
  return count;
}

}  // namespace cake
