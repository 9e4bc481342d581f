// RespReader: reads Redis replies (RESP2) straight from a socket, so a bulk value can land in a caller's buffer
// with the kernel's copy only; hiredis' own reader copies it twice more (into its buffer, then into a reply), and
// trusts the sizes a peer announces. Every reply the daemon reads goes through it: status, error, integer, bulk
// string, nil and arrays (SCAN, CLUSTER SLOTS), each size bounded before anything is allocated. Replies come as
// hiredis redisReply objects, so they are handled and freed like hiredis' own.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

struct redisReply;

namespace cake {

struct RedisReplyDeleter {
  void operator()(redisReply* reply) const;  // freeReplyObject
};
using RedisReply = std::unique_ptr<redisReply, RedisReplyDeleter>;

// A reply made here rather than by hiredis' reader. text is the value of a string, error or status reply.
RedisReply NewRedisReply(int type, std::string_view text = {}, long long integer = 0);

class RespReader {
 public:
  // What a peer may make this reader hold or wait for (Redis is a peer, not a master). A bulk reply longer than
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

  // Reads fd, a connected socket; its receive timeout (SO_RCVTIMEO) bounds every wait. Does not own it. A bulk
  // reply that does not go into a sink is kept up to max_kept_bytes.
  explicit RespReader(int fd, uint64_t max_kept_bytes = kMaxKeptBulkBytes) : fd_(fd), max_kept_(max_kept_bytes) {}

  // The next reply. A bulk reply of exactly sink.size() bytes (sink not empty) is received into sink, and its
  // reply is a string with len set and str null; any other reply is returned in full.
  // UNAVAILABLE: the peer closed the connection or the socket failed; DEADLINE_EXCEEDED: the receive timeout
  // passed; DATA_LOSS: a line that is not a reply of a kind understood here, a line, bulk or array length past the
  // limits above, arrays nested too deep, a bulk value not followed by CRLF.
  absl::StatusOr<RedisReply> Next(std::span<std::byte> sink);

  // False when bytes past the last reply were read: a connection in that state is out of step with its replies.
  bool drained() const { return pos_ == end_; }

 private:
  // What one reply may still take: elements and kept bytes, over all its levels.
  struct Allowance {
    uint64_t elements = kMaxReplyElements;
    uint64_t kept_bytes = kMaxReplyKeptBytes;
  };
  absl::StatusOr<RedisReply> Reply(std::span<std::byte> sink, int depth, Allowance& allowance);
  absl::StatusOr<std::string> Line();
  absl::Status Exact(std::byte* dst, size_t n);
  absl::Status Skip(uint64_t n);  // reads n bytes and keeps none
  absl::Status Fill();

  const int fd_;
  const uint64_t max_kept_;
  char buf_[16 << 10];
  size_t pos_ = 0, end_ = 0;
};

}  // namespace cake
