#include "server/edge/tcp_listener.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "grpcpp/server_builder.h"
#include "server/edge/accept_loop.h"

namespace cake {
namespace {

// The peer as the per-peer cap counts it (a client picks its ports freely, and a host may hold many addresses),
// from the connection's remote end as ConnectionAddress names it ("10.1.2.3:40000", "[2001:db8::1]:40000").
std::string PeerAddress(const std::string& connection) {
  if (connection.empty()) return "unknown";
  std::string host = connection.substr(0, connection.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return NetworkPeerKey(host);
}

std::string IPv4PeerKey(const in_addr& v4) {
  if ((ntohl(v4.s_addr) >> 24) == 127) return "loopback";
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &v4, text, sizeof(text));
  return text;
}

}  // namespace

std::string NetworkPeerKey(std::string_view address) {
  const std::string text(address);
  in_addr v4{};
  if (::inet_pton(AF_INET, text.c_str(), &v4) == 1) return IPv4PeerKey(v4);
  in6_addr v6{};
  if (::inet_pton(AF_INET6, text.c_str(), &v6) != 1) return text;
  if (IN6_IS_ADDR_V4MAPPED(&v6)) {
    std::memcpy(&v4.s_addr, &v6.s6_addr[12], sizeof(v4.s_addr));
    return IPv4PeerKey(v4);
  }
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return "loopback";
  std::memset(&v6.s6_addr[8], 0, 8);
  char prefix[INET6_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET6, &v6, prefix, sizeof(prefix));
  return std::string(prefix) + "/64";
}

absl::StatusOr<ListeningTcpSocket> ListenOnTcp(const std::string& address, const char* key) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(absl::StrCat(key, " \"", address, "\" is not host:port"));
  }
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, " \"", address, "\": cannot resolve it (", ::gai_strerror(rc), ")"));
  }
  ListeningTcpSocket listening;
  std::string last_error = "no address";
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
    if (!fd.valid()) {
      last_error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.get(), SOMAXCONN) != 0) {
      last_error = std::strerror(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len);
    listening.port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                       : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    listening.fd = std::move(fd);
    break;
  }
  ::freeaddrinfo(found);
  if (!listening.fd.valid()) {
    return absl::UnavailableError(absl::StrCat(key, " \"", address, "\": cannot listen (", last_error, ")"));
  }
  return listening;
}

absl::StatusOr<std::unique_ptr<TcpListener>> TcpListener::Bind(const std::string& address) {
  auto listening = ListenOnTcp(address, "tcp.listen");
  if (!listening.ok()) return listening.status();
  std::unique_ptr<TcpListener> listener(new TcpListener());
  listener->listen_fd_ = std::move(listening->fd);
  listener->port_ = listening->port;
  listener->stop_fd_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!listener->stop_fd_.valid()) return absl::UnavailableError(absl::StrCat("eventfd: ", std::strerror(errno)));
  return listener;
}

TcpListener::~TcpListener() { Stop(); }

void TcpListener::Serve(grpc::experimental::ExternalConnectionAcceptor* acceptor, ConnectionGate* gate) {
  thread_ = std::thread([this, acceptor, gate] {
    RunAcceptLoop(listen_fd_.get(), stop_fd_.get(), "TCP port", [&](int fd) {
      const std::string address = ConnectionAddress(fd);
      if (!gate->AdmitOrClose(fd, PeerAddress(address), "TCP port", ConnectionGate::Origin::kNetwork, address)) return;
      grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters connection;
      connection.listener_fd = listen_fd_.get();
      connection.fd = fd;  // gRPC's from here on: it closes it when the connection ends
      acceptor->HandleNewConnection(&connection);
    });
  });
}

void TcpListener::Stop() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(stop_fd_.get(), &one, sizeof(one));
  thread_.join();
  listen_fd_ = UniqueFd();
}

}  // namespace cake
