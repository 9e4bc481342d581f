// RespReader: Redis replies read from the socket by hand, bulk values straight into the caller's buffer.
#include "storage/resp_reader.h"

#include <hiredis/hiredis.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace cake {
namespace {

// OK for an interrupted call (retry); the error otherwise.
absl::Status Broken(ssize_t r) {
  if (r == 0) return absl::UnavailableError("Server closed the connection");
  if (errno == EINTR) return absl::OkStatus();
  if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::DeadlineExceededError("timed out");
  return absl::UnavailableError(std::strerror(errno));
}

}  // namespace

void RedisReplyDeleter::operator()(redisReply* reply) const { freeReplyObject(reply); }

// Allocated as hiredis allocates its own, so freeReplyObject frees it.
RedisReply NewRedisReply(int type, std::string_view text, long long integer) {
  auto* r = static_cast<redisReply*>(calloc(1, sizeof(redisReply)));
  r->type = type;
  r->integer = integer;
  if (type == REDIS_REPLY_STRING || type == REDIS_REPLY_ERROR || type == REDIS_REPLY_STATUS) {
    r->str = static_cast<char*>(malloc(text.size() + 1));
    std::memcpy(r->str, text.data(), text.size());
    r->str[text.size()] = '\0';
    r->len = text.size();
  }
  return RedisReply(r);
}

absl::StatusOr<RedisReply> RespReader::Next(std::span<std::byte> sink) {
  Allowance allowance;
  return Reply(sink, 0, allowance);
}

absl::StatusOr<RedisReply> RespReader::Reply(std::span<std::byte> sink, int depth, Allowance& allowance) {
  CAKE_ASSIGN_OR_RETURN(const std::string line, Line());
  if (line.empty()) return absl::DataLossError("empty reply line");
  const char kind = line[0];
  const std::string_view rest = std::string_view(line).substr(1);
  switch (kind) {
    case '+':
      return NewRedisReply(REDIS_REPLY_STATUS, rest);
    case '-':
      return NewRedisReply(REDIS_REPLY_ERROR, rest);
    case ':': {
      long long value = 0;
      if (!absl::SimpleAtoi(absl::string_view(rest.data(), rest.size()), &value)) break;
      return NewRedisReply(REDIS_REPLY_INTEGER, {}, value);
    }
    case '$': {
      long long length = 0;
      if (!absl::SimpleAtoi(absl::string_view(rest.data(), rest.size()), &length)) break;
      if (length < 0) return NewRedisReply(REDIS_REPLY_NIL);
      if (static_cast<uint64_t>(length) > kMaxBulkBytes) {
        return absl::DataLossError(absl::StrCat("Redis announced a value of ", length, " bytes; no value this daemon "
                                                "writes exceeds ", kMaxBulkBytes));
      }
      RedisReply reply;
      if (static_cast<uint64_t>(length) == sink.size() && !sink.empty()) {
        CAKE_RETURN_IF_ERROR(Exact(sink.data(), sink.size()));
        reply = NewRedisReply(REDIS_REPLY_NIL);
        reply->type = REDIS_REPLY_STRING;  // landed in the sink: len set, str null
        reply->len = length;
      } else if (static_cast<uint64_t>(length) > std::min(max_kept_, allowance.kept_bytes)) {
        CAKE_RETURN_IF_ERROR(Skip(length));
        reply = NewRedisReply(REDIS_REPLY_ERROR, absl::StrCat("a value of ", length, " bytes where at most ",
                                                              max_kept_, " were expected (not kept)"));
      } else {
        std::string value(length, '\0');
        CAKE_RETURN_IF_ERROR(Exact(reinterpret_cast<std::byte*>(value.data()), value.size()));
        allowance.kept_bytes -= value.size();
        reply = NewRedisReply(REDIS_REPLY_STRING, value);
      }
      char crlf[2];
      CAKE_RETURN_IF_ERROR(Exact(reinterpret_cast<std::byte*>(crlf), 2));
      if (crlf[0] != '\r' || crlf[1] != '\n') return absl::DataLossError("a bulk value not followed by CRLF");
      return reply;
    }
    case '*': {
      long long count = 0;
      if (!absl::SimpleAtoi(absl::string_view(rest.data(), rest.size()), &count)) break;
      if (count < 0) return NewRedisReply(REDIS_REPLY_NIL);
      if (depth + 1 > kMaxReplyDepth) {
        return absl::DataLossError(absl::StrCat("Redis sent arrays nested deeper than ", kMaxReplyDepth));
      }
      if (static_cast<uint64_t>(count) > allowance.elements) {
        return absl::DataLossError(absl::StrCat("Redis announced an array of ", count, " elements; one reply holds at "
                                                "most ", kMaxReplyElements, " in all"));
      }
      allowance.elements -= count;
      RedisReply array = NewRedisReply(REDIS_REPLY_ARRAY);
      if (count > 0) {
        // Filled one by one; an element not read yet is null, which freeReplyObject skips.
        array->element = static_cast<redisReply**>(calloc(count, sizeof(redisReply*)));
        if (array->element == nullptr) return absl::ResourceExhaustedError("no memory for a Redis array reply");
        array->elements = count;
      }
      for (long long i = 0; i < count; ++i) {
        CAKE_ASSIGN_OR_RETURN(RedisReply element, Reply({}, depth + 1, allowance));
        array->element[i] = element.release();
      }
      return array;
    }
    default:
      break;
  }
  return absl::DataLossError(absl::StrCat("unexpected reply from Redis: ", line));
}

absl::StatusOr<std::string> RespReader::Line() {
  std::string line;
  while (true) {
    if (pos_ == end_) {
      CAKE_RETURN_IF_ERROR(Fill());
    }
    const char* start = buf_ + pos_;
    const char* nl = static_cast<const char*>(std::memchr(start, '\n', end_ - pos_));
    if (nl == nullptr) {
      line.append(start, end_ - pos_);
      pos_ = end_;
      if (line.size() > kMaxLineBytes) {
        return absl::DataLossError(absl::StrCat("a reply line longer than ", kMaxLineBytes, " bytes"));
      }
      continue;
    }
    line.append(start, nl - start);
    pos_ += nl - start + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return line;
  }
}

// What is buffered first, then straight from the socket into dst.
absl::Status RespReader::Exact(std::byte* dst, size_t n) {
  const size_t buffered = std::min(n, end_ - pos_);
  std::memcpy(dst, buf_ + pos_, buffered);
  pos_ += buffered;
  size_t got = buffered;
  while (got < n) {
    const ssize_t r = recv(fd_, dst + got, n - got, 0);
    if (r > 0) {
      got += r;
    } else if (absl::Status s = Broken(r); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status RespReader::Skip(uint64_t n) {
  std::byte scratch[16 << 10];
  while (n > 0) {
    const size_t step = std::min<uint64_t>(n, sizeof(scratch));
    CAKE_RETURN_IF_ERROR(Exact(scratch, step));
    n -= step;
  }
  return absl::OkStatus();
}

absl::Status RespReader::Fill() {
  while (true) {
    const ssize_t r = recv(fd_, buf_, sizeof(buf_), 0);
    if (r > 0) {
      pos_ = 0;
      end_ = r;
      return absl::OkStatus();
    }
    CAKE_RETURN_IF_ERROR(Broken(r));
  }
}

}  // namespace cake
