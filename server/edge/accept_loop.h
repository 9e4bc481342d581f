// The loop both of the daemon's own listeners (unix socket, TCP) run on a thread of their own: accept until a stop
// is signalled, hand each connection on, and survive running out of descriptors.
#pragma once

#include <functional>
#include <string_view>

namespace cake {

// Accepts on `listen_fd` (non-blocking) until `stop_fd` (an eventfd) is readable, calling `accepted(fd)` for each
// connection (non-blocking, close-on-exec; `accepted` owns it). `what` names the listener in warnings. When the
// process is out of descriptors the connection waits in the kernel's backlog and the loop retries every 50 ms:
// a full descriptor table is a state to wait out, never a reason to stop.
void RunAcceptLoop(int listen_fd, int stop_fd, std::string_view what, const std::function<void(int fd)>& accepted);

}  // namespace cake
