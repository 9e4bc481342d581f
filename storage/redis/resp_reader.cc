// RespReader: Redis replies read from the socket by hand, bulk values straight into the caller's buffer.
#include "storage/redis/resp_reader.h"

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

RespParser::RespParser(uint64_t max_kept_bytes) : max_kept_(max_kept_bytes), buf_(new char[kBufferBytes]) {}
RespParser::~RespParser() = default;

void RespParser::Expect(std::span<std::byte> sink, const SinkProgress* progress) {
  awaited_.push_back({sink, progress});
  if (failed_.ok()) failed_ = Parse();  // what is buffered already may hold it
}

RedisReply RespParser::PopReply() {
  RedisReply reply = std::move(done_.front());
  done_.pop_front();
  return reply;
}

std::span<std::byte> RespParser::ReadTarget() {
  // A value's bytes go straight to where they belong once nothing older is buffered.
  target_is_body_ = state_ == State::kBody && body_dst_ != nullptr && body_left_ > 0 && pos_ == end_;
  if (target_is_body_) return std::span(body_dst_, body_left_);
  if (pos_ == end_) {
    pos_ = end_ = 0;
  } else if (kBufferBytes - end_ < (16 << 10)) {
    // A partial line at the end: move it to the front. Parse() has failed any line past kMaxLineBytes, so at
    // least 16 KiB are free afterwards.
    std::memmove(buf_.get(), buf_.get() + pos_, end_ - pos_);
    end_ -= pos_;
    pos_ = 0;
  }
  return std::span(reinterpret_cast<std::byte*>(buf_.get()) + end_, kBufferBytes - end_);
}

absl::Status RespParser::Received(size_t n) {
  if (!failed_.ok()) return failed_;
  if (target_is_body_) {
    if (body_progress_ != nullptr && n > 0) (*body_progress_)(std::span<const std::byte>(body_dst_, n));
    body_dst_ += n;
    body_left_ -= n;
  } else {
    end_ += n;
  }
  target_is_body_ = false;
  failed_ = Parse();
  return failed_;
}

absl::Status RespParser::Parse() {
  while (!awaited_.empty()) {
    switch (state_) {
      case State::kLine: {
        const char* start = buf_.get() + pos_;
        const char* nl = static_cast<const char*>(std::memchr(start, '\n', end_ - pos_));
        if (nl == nullptr) {
          if (end_ - pos_ > kMaxLineBytes) {
            return absl::DataLossError(absl::StrCat("a reply line longer than ", kMaxLineBytes, " bytes"));
          }
          return absl::OkStatus();  // more to come
        }
        std::string_view line(start, nl - start);
        pos_ += nl - start + 1;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        CAKE_RETURN_IF_ERROR(OnLine(line));
        break;
      }
      case State::kBody: {
        const size_t take = std::min<uint64_t>(body_left_, end_ - pos_);
        if (body_dst_ != nullptr) {
          std::memcpy(body_dst_, buf_.get() + pos_, take);
          if (body_progress_ != nullptr && take > 0) (*body_progress_)(std::span<const std::byte>(body_dst_, take));
          body_dst_ += take;
        }
        pos_ += take;
        body_left_ -= take;
        if (body_left_ > 0) return absl::OkStatus();
        state_ = State::kCrlf;
        break;
      }
      case State::kCrlf: {
        if (end_ - pos_ < 2) return absl::OkStatus();
        if (buf_[pos_] != '\r' || buf_[pos_ + 1] != '\n') {
          return absl::DataLossError("a bulk value not followed by CRLF");
        }
        pos_ += 2;
        state_ = State::kLine;
        Complete(std::move(body_reply_));
        break;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status RespParser::OnLine(std::string_view line) {
  if (line.empty()) return absl::DataLossError("empty reply line");
  const char kind = line[0];
  const absl::string_view rest(line.data() + 1, line.size() - 1);
  const size_t depth = stack_.size();
  switch (kind) {
    case '+':
      Complete(NewRedisReply(REDIS_REPLY_STATUS, std::string_view(rest.data(), rest.size())));
      return absl::OkStatus();
    case '-':
      Complete(NewRedisReply(REDIS_REPLY_ERROR, std::string_view(rest.data(), rest.size())));
      return absl::OkStatus();
    case ':': {
      long long value = 0;
      if (!absl::SimpleAtoi(rest, &value)) break;
      Complete(NewRedisReply(REDIS_REPLY_INTEGER, {}, value));
      return absl::OkStatus();
    }
    case '$': {
      long long length = 0;
      if (!absl::SimpleAtoi(rest, &length)) break;
      if (length < 0) {
        Complete(NewRedisReply(REDIS_REPLY_NIL));
        return absl::OkStatus();
      }
      if (static_cast<uint64_t>(length) > kMaxBulkBytes) {
        return absl::DataLossError(absl::StrCat("Redis announced a value of ", length,
                                                " bytes; no value this daemon "
                                                "writes exceeds ",
                                                kMaxBulkBytes));
      }
      const std::span<std::byte> sink = depth == 0 ? awaited_.front().sink : std::span<std::byte>();
      body_progress_ = nullptr;
      if (static_cast<uint64_t>(length) == sink.size() && !sink.empty()) {
        body_reply_ = NewRedisReply(REDIS_REPLY_NIL);
        body_reply_->type = REDIS_REPLY_STRING;  // lands in the sink: len set, str null
        body_reply_->len = length;
        body_dst_ = sink.data();
        body_progress_ = awaited_.front().progress;
      } else if (static_cast<uint64_t>(length) > std::min(max_kept_, allowance_.kept_bytes)) {
        body_reply_ = NewRedisReply(REDIS_REPLY_ERROR, absl::StrCat("a value of ", length, " bytes where at most ",
                                                                    max_kept_, " were expected (not kept)"));
        body_dst_ = nullptr;
      } else {
        body_reply_ = NewRedisReply(REDIS_REPLY_STRING, std::string(length, '\0'));
        body_dst_ = reinterpret_cast<std::byte*>(body_reply_->str);
        allowance_.kept_bytes -= length;
      }
      body_left_ = length;
      state_ = State::kBody;
      return absl::OkStatus();
    }
    case '*': {
      long long count = 0;
      if (!absl::SimpleAtoi(rest, &count)) break;
      if (count < 0) {
        Complete(NewRedisReply(REDIS_REPLY_NIL));
        return absl::OkStatus();
      }
      if (depth + 1 > kMaxReplyDepth) {
        return absl::DataLossError(absl::StrCat("Redis sent arrays nested deeper than ", kMaxReplyDepth));
      }
      if (static_cast<uint64_t>(count) > allowance_.elements) {
        return absl::DataLossError(absl::StrCat("Redis announced an array of ", count,
                                                " elements; one reply holds at "
                                                "most ",
                                                kMaxReplyElements, " in all"));
      }
      allowance_.elements -= count;
      RedisReply array = NewRedisReply(REDIS_REPLY_ARRAY);
      if (count == 0) {
        Complete(std::move(array));
        return absl::OkStatus();
      }
      // Filled one by one; an element not received yet is null, which freeReplyObject skips.
      array->element = static_cast<redisReply**>(calloc(count, sizeof(redisReply*)));
      if (array->element == nullptr) return absl::ResourceExhaustedError("no memory for a Redis array reply");
      array->elements = count;
      stack_.push_back(Frame{std::move(array), 0});
      return absl::OkStatus();
    }
    default:
      break;
  }
  return absl::DataLossError(
      absl::StrCat("unexpected reply from Redis: ", absl::string_view(line.data(), line.size())));
}

// A reply is complete: an element of the array being filled (which may complete it in turn), or an awaited one.
void RespParser::Complete(RedisReply reply) {
  while (!stack_.empty()) {
    Frame& frame = stack_.back();
    frame.array->element[frame.filled++] = reply.release();
    if (frame.filled < frame.array->elements) return;
    reply = std::move(frame.array);
    stack_.pop_back();
  }
  done_.push_back(std::move(reply));
  awaited_.pop_front();
  allowance_ = Allowance{};
}

absl::StatusOr<RedisReply> RespReader::Next(std::span<std::byte> sink) {
  parser_.Expect(sink);
  CAKE_RETURN_IF_ERROR(parser_.failure());
  while (!parser_.has_reply()) {
    const std::span<std::byte> target = parser_.ReadTarget();
    const ssize_t r = recv(fd_, target.data(), target.size(), 0);
    if (r > 0) {
      CAKE_RETURN_IF_ERROR(parser_.Received(static_cast<size_t>(r)));
    } else if (absl::Status s = Broken(r); !s.ok()) {
      return s;
    }
  }
  return parser_.PopReply();
}

}  // namespace cake
