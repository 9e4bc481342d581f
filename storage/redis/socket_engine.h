// Socket I/O for the Redis client: one narrow engine interface (io_uring, or poll(2) where the kernel refuses a
// ring) and the one driver, RunExchanges, that keeps every connection of a call sending and receiving at once
// from the calling thread, hands received bytes to each connection's RespParser (a value straight into its
// caller's buffer), and owns every outcome: short sends, EINTR, a peer that closes, one that stalls. As with the
// disk's IoEngine, the outcome handling lives in the driver, above the engines, so both engines share it and a
// contract test holds them to the same behaviour.
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/redis/resp_reader.h"

namespace cake {

struct SocketOp {
  enum class Kind { kSend, kRecv };
  Kind kind = Kind::kRecv;
  int fd = -1;
  // kSend: sendmsg(2) of these (the engine keeps no copy; they stay valid until the completion).
  const iovec* iov = nullptr;
  size_t iov_count = 0;
  // kRecv: recv(2) into this buffer.
  std::byte* buffer = nullptr;
  size_t length = 0;
  uint64_t tag = 0;  // handed back in the completion
};

struct SocketCompletion {
  uint64_t tag = 0;
  // What the system call would say: bytes moved (0 from a recv: the peer closed) or -errno (-ECANCELED after
  // Cancel).
  int64_t result = 0;
};

// Owned by one thread at a time; not thread-safe.
class SocketEngine {
 public:
  virtual ~SocketEngine() = default;
  virtual std::string_view name() const = 0;
  // Starts an operation (an engine may hold it until the next Wait). An error means the engine failed.
  virtual absl::Status Submit(const SocketOp& op) = 0;
  // The next completion, or nullopt once deadline passes with none.
  virtual absl::StatusOr<std::optional<SocketCompletion>> Wait(std::chrono::steady_clock::time_point deadline) = 0;
  // Asks the operation with this tag to end now; its completion still comes (-ECANCELED, or what it did first).
  virtual void Cancel(uint64_t tag) = 0;
  // True once Submit or Wait failed: operations may be left in flight, so the engine must not be reused.
  virtual bool broken() const { return false; }
};

// An io_uring engine (IORING_OP_SENDMSG, IORING_OP_RECV, IORING_OP_ASYNC_CANCEL): UNAVAILABLE with the reason
// when the kernel refuses a ring or lacks those operations.
absl::StatusOr<std::unique_ptr<SocketEngine>> MakeUringSocketEngine(uint32_t entries);
// poll(2), then the non-blocking system call, for kernels without a usable io_uring.
std::unique_ptr<SocketEngine> MakePollSocketEngine();
// The engine of the calling thread, made on first use: io_uring unless use_uring is false or the kernel refuses
// a ring (then poll, said once in the log). Replaced when it breaks.
SocketEngine& ThisThreadSocketEngine(bool use_uring);

// One connection's share of a call: its request bytes and the parser that awaits its replies.
struct SocketExchange {
  int fd = -1;
  std::vector<iovec> request;    // sent in order; the driver advances through it
  RespParser* parser = nullptr;  // Expect()ed once per reply before RunExchanges
  // Set by RunExchanges: OK once every awaited reply is complete. UNAVAILABLE: the peer closed or the socket
  // failed; DEADLINE_EXCEEDED: no byte moved either way for idle_timeout; DATA_LOSS: the parser's verdict.
  absl::Status status;
};

// Sends every exchange's request and receives its replies, all at once on engine. An exchange ends when its
// replies are complete, it fails, or it makes no progress for idle_timeout; the others go on. Returns only when
// nothing is in flight on any exchange's buffers. An engine failure fails every unfinished exchange (UNAVAILABLE).
void RunExchanges(SocketEngine& engine, std::span<SocketExchange> exchanges, std::chrono::milliseconds idle_timeout);

}  // namespace cake
