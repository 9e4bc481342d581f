#include "server/edge/unix_listener.h"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/server.h"
#include "grpcpp/server_posix.h"
#include "server/edge/accept_loop.h"
#include "spdlog/spdlog.h"

namespace cake {

absl::StatusOr<sockaddr_un> UnixSocketAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path ", path, " is longer than ", sizeof(addr.sun_path) - 1, " bytes"));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Bind(const std::string& path, uint32_t mode) {
  auto address = UnixSocketAddress(path);
  if (!address.ok()) return address.status();
  sockaddr_un addr = *address;
  std::unique_ptr<UnixListener> listener(new UnixListener());
  listener->listen_fd_ = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listener->listen_fd_.valid()) {
    return absl::UnavailableError(absl::StrCat("socket(AF_UNIX): ", std::strerror(errno)));
  }
  // Bound with a umask that admits nobody, then opened to `mode`: no moment exists in which the socket is wider.
  const mode_t old_umask = ::umask(0777);
  const int bound = ::bind(listener->listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  ::umask(old_umask);
  if (bound != 0) return absl::UnavailableError(absl::StrCat("bind ", path, ": ", std::strerror(bind_errno)));
  if (::chmod(path.c_str(), mode) != 0 || ::listen(listener->listen_fd_.get(), SOMAXCONN) != 0) {
    const int e = errno;
    ::unlink(path.c_str());
    return absl::UnavailableError(absl::StrCat("listen on ", path, ": ", std::strerror(e)));
  }
  listener->stop_fd_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!listener->stop_fd_.valid()) return absl::UnavailableError(absl::StrCat("eventfd: ", std::strerror(errno)));
  return listener;
}

UnixListener::~UnixListener() { Stop(); }

void UnixListener::Serve(grpc::Server* server, ConnectionGate* gate, UidAdmission may_connect) {
  thread_ = std::thread(
      [this, server, gate, may_connect = std::move(may_connect)] { AcceptLoop(server, gate, may_connect); });
}

void UnixListener::Stop() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(stop_fd_.get(), &one, sizeof(one));
  thread_.join();
  listen_fd_ = UniqueFd();
}

void UnixListener::AcceptLoop(grpc::Server* server, ConnectionGate* gate, const UidAdmission& may_connect) {
  RunAcceptLoop(listen_fd_.get(), stop_fd_.get(), "unix socket", [&](int fd) {
    ucred cred{};
    socklen_t cred_len = sizeof(cred);
    struct stat st {};
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0 || ::fstat(fd, &st) != 0) {
      ::close(fd);
      return;
    }
    // Before gRPC owns it: once it does, it reads (and buffers) a whole request before any handler can refuse it.
    if (may_connect && !may_connect(cred.uid)) {
      RefuseUnnamed(fd, cred.uid);
      return;
    }
    // Per uid: the kernel's word for who is on the other end, which a peer cannot vary as it can a TCP port.
    if (gate != nullptr && !gate->AdmitOrClose(fd, absl::StrCat("uid ", cred.uid), "unix socket")) return;
    {
      MutexLock lock(&mu_);
      connections_[fd] = Connection{UnixPeer{cred.uid, cred.gid, cred.pid}, st.st_dev, st.st_ino};
      ++accepted_;
    }
    // gRPC owns the descriptor from here on and closes it when the connection ends.
    grpc::AddInsecureChannelFromFd(server, fd);
  });
}

void UnixListener::RefuseUnnamed(int fd, uid_t uid) {
  ::close(fd);
  const uint64_t refused = refused_unnamed_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (const auto now = std::chrono::steady_clock::now(); now - last_refusal_warning_ > std::chrono::seconds(10)) {
    last_refusal_warning_ = now;
    spdlog::warn(
        "a connection on the unix socket from uid {} closed at accept: no [[access.principal]] names that "
        "uid (name it in unix_uids or unix_users, then reload; {} refused in all)",
        uid, refused);
  }
}

std::optional<UnixPeer> UnixListener::PeerOf(std::string_view grpc_peer) const {
  constexpr std::string_view kPrefix = "fd:";
  int fd = -1;
  if (grpc_peer.substr(0, kPrefix.size()) != kPrefix ||
      !absl::SimpleAtoi(std::string(grpc_peer.substr(kPrefix.size())), &fd)) {
    return std::nullopt;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::nullopt;
  MutexLock lock(&mu_);
  auto it = connections_.find(fd);
  if (it == connections_.end() || it->second.device != st.st_dev || it->second.inode != st.st_ino) return std::nullopt;
  return it->second.peer;
}

uint64_t UnixListener::accepted() const {
  MutexLock lock(&mu_);
  return accepted_;
}

}  // namespace cake
