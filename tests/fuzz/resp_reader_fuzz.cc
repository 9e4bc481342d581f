// libFuzzer target: whatever bytes a Redis peer sends, RespReader (RespParser over a socket) answers with replies
// or a status, within its limits, and never crashes, hangs or allocates what a length claims. The input goes into
// a socketpair whose writing end is then closed; the first byte picks the sink size the reader is offered. The
// same bytes then go to a RespParser directly in pieces of 1 to 16 bytes (the first byte again), as io_uring may
// deliver them: a line, a length or a value split anywhere.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "storage/redis/resp_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > (60 << 10)) return 0;  // the socket buffer holds it whole: no writer thread needed
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 0;
  int sndbuf = 1 << 20;
  setsockopt(fds[1], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
  timeval timeout{0, 20 * 1000};
  setsockopt(fds[0], SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const size_t sink_size = data[0] % 16 == 0 ? 0 : data[0];
  size_t sent = 0;
  while (sent < size - 1) {
    const ssize_t n = send(fds[1], data + 1 + sent, size - 1 - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  close(fds[1]);
  {
    cake::RespReader reader(fds[0]);
    std::vector<std::byte> sink(sink_size);
    for (int i = 0; i < 1000; ++i) {
      auto reply = reader.Next(sink);
      if (!reply.ok()) break;
    }
  }
  close(fds[0]);

  cake::RespParser parser;
  std::vector<std::byte> parser_sink(sink_size);
  for (int i = 0; i < 64; ++i) parser.Expect(parser_sink);
  const size_t piece = 1 + data[0] / 16;
  size_t at = 1;
  while (at < size && parser.failure().ok() && parser.awaited() > 0) {
    const std::span<std::byte> target = parser.ReadTarget();
    const size_t n = std::min({piece, target.size(), size - at});
    std::memcpy(target.data(), data + at, n);
    at += n;
    if (!parser.Received(n).ok()) break;
    while (parser.has_reply()) parser.PopReply();
  }
  return 0;
}
