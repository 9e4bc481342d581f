#include "server/connection_gate.h"

#include <sys/stat.h>
#include <unistd.h>

#include "spdlog/spdlog.h"

namespace cake {

namespace {
bool StillOpen(int fd, dev_t device, ino_t inode) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && st.st_dev == device && st.st_ino == inode;
}
}  // namespace

ConnectionGate::Verdict ConnectionGate::Admit(int fd, const std::string& peer, Origin origin) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Verdict::kTotalCapReached;  // cannot happen for a descriptor just accepted
  MutexLock lock(&mu_);
  // A reused number: the connection it named is gone.
  if (auto it = open_.find(fd); it != open_.end()) ForgetLocked(it);
  // Only at a cap is it worth looking for connections gRPC closed since: an fstat per open connection.
  if (CapsLocked(peer, origin) != Verdict::kAdmitted) ForgetClosedLocked();
  if (const Verdict verdict = CapsLocked(peer, origin); verdict != Verdict::kAdmitted) return verdict;
  open_[fd] = Open{peer, st.st_dev, st.st_ino, origin};
  ++per_peer_[peer];
  if (origin == Origin::kNetwork) ++network_open_;
  return Verdict::kAdmitted;
}

bool ConnectionGate::AdmitOrClose(int fd, const std::string& peer, std::string_view listener, Origin origin) {
  const Verdict verdict = Admit(fd, peer, origin);
  if (verdict == Verdict::kAdmitted) {
    admitted_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  ::close(fd);
  refused_.fetch_add(1, std::memory_order_relaxed);
  bool warn = false;
  {
    MutexLock lock(&mu_);
    if (const auto now = std::chrono::steady_clock::now(); now - last_warning_ > std::chrono::seconds(10)) {
      last_warning_ = now;
      warn = true;
    }
  }
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

ConnectionGate::Verdict ConnectionGate::CapsLocked(const std::string& peer, Origin origin) const {
  if (open_.size() >= max_connections_) return Verdict::kTotalCapReached;
  if (origin == Origin::kNetwork && network_open_ >= max_network_connections_) return Verdict::kTotalCapReached;
  if (auto it = per_peer_.find(peer); it != per_peer_.end() && it->second >= max_per_peer_) {
    return Verdict::kPeerCapReached;
  }
  return Verdict::kAdmitted;
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
  if (--per_peer_[it->second.peer] == 0) per_peer_.erase(it->second.peer);
  if (it->second.origin == Origin::kNetwork) --network_open_;
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

}  // namespace cake
