#include "server/edge/accept_loop.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "spdlog/spdlog.h"

namespace cake {

void RunAcceptLoop(int listen_fd, int stop_fd, std::string_view what, const std::function<void(int fd)>& accepted) {
  pollfd fds[2] = {{listen_fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
  auto last_warning = std::chrono::steady_clock::time_point();
  while (true) {
    if (::poll(fds, 2, -1) < 0) {
      // Only a stop ends the loop: a transient failure (ENOMEM) must not leave the socket unserved.
      if (errno != EINTR) ::poll(nullptr, 0, 50);
      continue;
    }
    if (fds[1].revents != 0) break;
    if ((fds[0].revents & POLLIN) == 0) continue;
    // Non-blocking, as gRPC's own listener hands connections to its transport.
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors (or memory): the connection waits in the backlog; say so now and then, and breathe.
      if (const auto now = std::chrono::steady_clock::now(); now - last_warning > std::chrono::seconds(10)) {
        spdlog::warn("accept on the {} failed: {}; connections wait", what, std::strerror(errno));
        last_warning = now;
      }
      ::poll(nullptr, 0, 50);
      continue;
    }
    accepted(fd);
  }
}

}  // namespace cake
