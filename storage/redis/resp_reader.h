// Redis replies (RESP2) read by hand, bounded, a bulk value straight into a caller's buffer: RespParser, which
// any socket driver feeds, and RespReader, the blocking one. Every reply the daemon reads goes through it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

struct redisReply;

namespace cake {

struct RedisReplyDeleter {
  void operator()(redisReply* reply) const;  // freeReplyObject
};
using RedisReply = std::unique_ptr<redisReply, RedisReplyDeleter>;

// A reply made here rather than by hiredis' reader. text is the value of a string, error or status reply.
RedisReply NewRedisReply(int type, std::string_view text = {}, long long integer = 0);

// Told of a sink's bytes as they land in it, in order: a reader can checksum them while the rest is on its way.
using SinkProgress = std::function<void(std::span<const std::byte> landed)>;

// RespParser: the one RESP2 reply parser, push mode: whoever owns the socket asks where the next bytes should go
// (ReadTarget), receives into it by any means (recv, io_uring) and reports how many landed (Received). While a
// value is arriving for a caller's buffer and nothing else is buffered, the target is that buffer itself, so a
// bulk value costs the kernel's copy only; hiredis' own reader copies it twice more and trusts the sizes a peer
// announces. Status, error, integer, bulk string, nil and arrays (SCAN, CLUSTER SLOTS), each size bounded before
// anything is allocated. Replies come as hiredis redisReply objects, handled and freed like hiredis' own.
class RespParser {
 public:
  // What a peer may make this parser hold or wait for (Redis is a peer, not a master). A bulk reply longer than
  // the largest value the remote tier's codec writes (a 512 MiB part) is a protocol violation, as is a line
  // longer than any reply line Redis sends; a bulk reply that is not received into a sink is kept only up to
  // kMaxKeptBulkBytes (the replies a pipeline keeps are headers, 64 bytes) and beyond that read past and
  // answered as an error reply, so the connection stays in step and memory stays bounded (a caller may keep more).
  static constexpr uint64_t kMaxBulkBytes = uint64_t{512} << 20;
  static constexpr uint64_t kMaxKeptBulkBytes = 64 << 10;
  static constexpr size_t kMaxLineBytes = 64 << 10;
  // Arrays: elements in one reply, all levels together (a SCAN page or a cluster's slot map has far fewer), how
  // deep they nest (CLUSTER SLOTS: 3), and the bulk bytes one reply may keep in all.
  static constexpr uint64_t kMaxReplyElements = uint64_t{1} << 20;
  static constexpr int kMaxReplyDepth = 8;
  static constexpr uint64_t kMaxReplyKeptBytes = uint64_t{64} << 20;

  explicit RespParser(uint64_t max_kept_bytes = kMaxKeptBulkBytes);
  ~RespParser();
  RespParser(const RespParser&) = delete;
  RespParser& operator=(const RespParser&) = delete;

  // Queues one reply to wait for, after those already queued, and parses what is buffered. A bulk reply of
  // exactly sink.size() bytes (sink not empty) is received into sink, and its reply is a string with len set and
  // str null; any other reply is returned in full. progress (when not null, alive until the reply is complete)
  // is told of each piece of the value as it lands in sink.
  void Expect(std::span<std::byte> sink, const SinkProgress* progress = nullptr);
  // Replies queued and not yet complete.
  size_t awaited() const { return awaited_.size(); }

  // Where the next received bytes should go: never empty while a reply is awaited and nothing failed. Valid until
  // the next call to any method.
  std::span<std::byte> ReadTarget();
  // n bytes (at most the target's size) were written at the start of the last ReadTarget(); parses what it can.
  // DATA_LOSS: a line that is not a reply of a kind understood here, a line, bulk or array length past the
  // limits above, arrays nested too deep, a bulk value not followed by CRLF. Once it fails it stays failed.
  absl::Status Received(size_t n);
  // OK, or what made Received (or Expect) fail.
  const absl::Status& failure() const { return failed_; }

  // Complete replies, oldest first.
  bool has_reply() const { return !done_.empty(); }
  RedisReply PopReply();

  // False when bytes past the last awaited reply were received: a connection in that state is out of step.
  bool drained() const { return pos_ == end_ && state_ == State::kLine && stack_.empty(); }

 private:
  enum class State { kLine, kBody, kCrlf };
  // What one reply may still take: elements and kept bytes, over all its levels.
  struct Allowance {
    uint64_t elements = kMaxReplyElements;
    uint64_t kept_bytes = kMaxReplyKeptBytes;
  };
  struct Frame {
    RedisReply array;
    size_t filled = 0;
  };
  absl::Status Parse();
  absl::Status OnLine(std::string_view line);
  void Complete(RedisReply reply);

  const uint64_t max_kept_;
  // Room for the longest line allowed plus what follows it in the same receive.
  static constexpr size_t kBufferBytes = kMaxLineBytes + (16 << 10);
  std::unique_ptr<char[]> buf_;
  size_t pos_ = 0, end_ = 0;
  bool target_is_body_ = false;  // the last ReadTarget() was the value's destination, not buf_

  State state_ = State::kLine;
  uint64_t body_left_ = 0;
  std::byte* body_dst_ = nullptr;                // null: the value is read past, not kept
  const SinkProgress* body_progress_ = nullptr;  // set while a value lands in a sink whose caller wants to know
  RedisReply body_reply_;
  std::vector<Frame> stack_;  // arrays being filled, outermost first
  Allowance allowance_;
  absl::Status failed_;
  struct Awaited {
    std::span<std::byte> sink;
    const SinkProgress* progress;
  };
  std::deque<Awaited> awaited_;  // replies not yet complete
  std::deque<RedisReply> done_;
};

// RespReader: RespParser over a blocking socket whose receive timeout (SO_RCVTIMEO) bounds every wait, for
// callers that wait for one reply at a time.
class RespReader {
 public:
  static constexpr uint64_t kMaxBulkBytes = RespParser::kMaxBulkBytes;
  static constexpr uint64_t kMaxKeptBulkBytes = RespParser::kMaxKeptBulkBytes;
  static constexpr size_t kMaxLineBytes = RespParser::kMaxLineBytes;
  static constexpr uint64_t kMaxReplyElements = RespParser::kMaxReplyElements;
  static constexpr int kMaxReplyDepth = RespParser::kMaxReplyDepth;
  static constexpr uint64_t kMaxReplyKeptBytes = RespParser::kMaxReplyKeptBytes;

  // Reads fd, a connected socket. Does not own it. A bulk reply that does not go into a sink is kept up to
  // max_kept_bytes.
  explicit RespReader(int fd, uint64_t max_kept_bytes = kMaxKeptBulkBytes) : fd_(fd), parser_(max_kept_bytes) {}

  // The next reply (see RespParser::Expect for the sink). UNAVAILABLE: the peer closed the connection or the
  // socket failed; DEADLINE_EXCEEDED: the receive timeout passed; DATA_LOSS: as RespParser::Received.
  absl::StatusOr<RedisReply> Next(std::span<std::byte> sink);

  // False when bytes past the last reply were read: a connection in that state is out of step with its replies.
  bool drained() const { return parser_.drained(); }

 private:
  const int fd_;
  RespParser parser_;
};

}  // namespace cake
