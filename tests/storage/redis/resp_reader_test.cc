// RespReader on a real socket (a socketpair): every kind of reply it understands, values into the caller's
// buffer or not, values larger than its buffer arriving in pieces, and malformed, truncated and stalled replies.
#include "storage/redis/resp_reader.h"

#include <hiredis/hiredis.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/storage/tier_test_util.h"

namespace cake {
namespace {

// reader() is the end a RespReader reads, with a receive timeout so a stalled reply fails instead of hanging;
// tests write the server's side of the conversation into the other end.
class SocketPair {
 public:
  SocketPair() {
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, fds_) == 0);
    timeval timeout{0, 200 * 1000};
    REQUIRE(setsockopt(fds_[0], SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout)) == 0);
  }
  ~SocketPair() {
    close(fds_[0]);
    CloseWriter();
  }
  int reader() const { return fds_[0]; }

  void Send(std::string_view bytes) const {
    while (!bytes.empty()) {
      const ssize_t n = send(fds_[1], bytes.data(), bytes.size(), MSG_NOSIGNAL);
      REQUIRE(n > 0);
      bytes.remove_prefix(n);
    }
  }
  void CloseWriter() {
    if (fds_[1] >= 0) close(fds_[1]);
    fds_[1] = -1;
  }

 private:
  int fds_[2] = {-1, -1};
};

std::string Text(const RedisReply& r) { return std::string(r->str, r->len); }

std::string Bulk(const std::string& value) { return "$" + std::to_string(value.size()) + "\r\n" + value + "\r\n"; }

std::span<std::byte> AsSink(std::vector<std::byte>& v) { return std::span(v); }

}  // namespace

TEST_CASE("RespReader: status, error, integer and nil replies", "[resp]") {
  SocketPair pair;
  pair.Send("+OK\r\n-MOVED 3999 127.0.0.1:6381\r\n:42\r\n:-7\r\n$-1\r\n");
  RespReader reader(pair.reader());

  auto ok = reader.Next({});
  REQUIRE(ok.ok());
  CHECK((*ok)->type == REDIS_REPLY_STATUS);
  CHECK(Text(*ok) == "OK");
  auto error = reader.Next({});
  REQUIRE(error.ok());
  CHECK((*error)->type == REDIS_REPLY_ERROR);
  CHECK(Text(*error) == "MOVED 3999 127.0.0.1:6381");
  auto answer = reader.Next({});
  REQUIRE(answer.ok());
  CHECK((*answer)->type == REDIS_REPLY_INTEGER);
  CHECK((*answer)->integer == 42);
  auto negative = reader.Next({});
  REQUIRE(negative.ok());
  CHECK((*negative)->integer == -7);
  std::vector<std::byte> sink(8);
  auto nil = reader.Next(AsSink(sink));  // a missing key leaves the sink alone
  REQUIRE(nil.ok());
  CHECK((*nil)->type == REDIS_REPLY_NIL);
  CHECK(reader.drained());
}

TEST_CASE("RespReader: a bulk reply of the sink's size lands in the sink, any other is a string reply", "[resp]") {
  SocketPair pair;
  RespReader reader(pair.reader());
  const std::string binary("a\r\nb\0c\n", 7);  // CR, LF and NUL inside a value are data
  pair.Send(Bulk(binary) + Bulk("abc") + Bulk("") + Bulk("xyz"));

  std::vector<std::byte> sink(binary.size());
  auto landed = reader.Next(AsSink(sink));
  REQUIRE(landed.ok());
  CHECK((*landed)->type == REDIS_REPLY_STRING);
  CHECK((*landed)->str == nullptr);
  CHECK((*landed)->len == binary.size());
  CHECK(std::memcmp(sink.data(), binary.data(), binary.size()) == 0);

  auto other_size = reader.Next(AsSink(sink));
  REQUIRE(other_size.ok());
  CHECK((*other_size)->type == REDIS_REPLY_STRING);
  REQUIRE((*other_size)->str != nullptr);
  CHECK(Text(*other_size) == "abc");

  std::vector<std::byte> empty_sink;
  auto empty = reader.Next(AsSink(empty_sink));  // an empty sink takes nothing, not even an empty value
  REQUIRE(empty.ok());
  CHECK((*empty)->type == REDIS_REPLY_STRING);
  REQUIRE((*empty)->str != nullptr);
  CHECK((*empty)->len == 0);

  auto no_sink = reader.Next({});
  REQUIRE(no_sink.ok());
  CHECK(Text(*no_sink) == "xyz");
  CHECK(reader.drained());
}

TEST_CASE("RespReader: values larger than its buffer, arriving in small pieces, come whole", "[resp]") {
  SocketPair pair;
  RespReader reader(pair.reader(), /*max_kept_bytes=*/1 << 20);
  const std::string big = testing::TestText(1, 1 << 20), medium = testing::TestText(2, 100 << 10);
  const std::string stream = "+OK\r\n" + Bulk(big) + Bulk(medium) + ":1\r\n";
  std::thread writer([&] {
    for (size_t at = 0; at < stream.size(); at += 7777) {
      pair.Send(std::string_view(stream).substr(at, 7777));
      if (at % (7777 * 16) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });

  auto ok = reader.Next({});
  std::vector<std::byte> sink(big.size());
  auto into_sink = reader.Next(AsSink(sink));
  auto copied = reader.Next({});
  auto one = reader.Next({});
  writer.join();
  REQUIRE(ok.ok());
  REQUIRE(into_sink.ok());
  CHECK((*into_sink)->str == nullptr);
  CHECK(std::memcmp(sink.data(), big.data(), big.size()) == 0);
  REQUIRE(copied.ok());
  CHECK(Text(*copied) == medium);
  REQUIRE(one.ok());
  CHECK((*one)->integer == 1);
  CHECK(reader.drained());
}

TEST_CASE("RespReader: bytes past the reply it was asked for leave it not drained", "[resp]") {
  SocketPair pair;
  RespReader reader(pair.reader());
  pair.Send("+OK\r\n+EXTRA\r\n");
  REQUIRE(reader.Next({}).ok());
  CHECK_FALSE(reader.drained());
  REQUIRE(reader.Next({}).ok());
  CHECK(reader.drained());
}

TEST_CASE("RespReader: a malformed reply is DATA_LOSS, with the line in the message", "[resp]") {
  const auto [bytes, message] = GENERATE(table<std::string, std::string>({
      {"\r\n", "empty reply line"},
      {"*two\r\n", "unexpected reply from Redis: *two"},
      {":forty-two\r\n", "unexpected reply from Redis: :forty-two"},
      {"$five\r\nhello\r\n", "unexpected reply from Redis: $five"},
      {"hello\r\n", "unexpected reply from Redis: hello"},
  }));
  CAPTURE(bytes);
  SocketPair pair;
  RespReader reader(pair.reader());
  pair.Send(bytes);
  auto reply = reader.Next({});
  REQUIRE_FALSE(reply.ok());
  CHECK(reply.status().code() == absl::StatusCode::kDataLoss);
  CHECK(std::string(reply.status().message()) == message);
}

TEST_CASE("RespReader: a hostile peer cannot make it allocate or wait past its limits", "[resp]") {
  SECTION("an absurd bulk length is DATA_LOSS at once, nothing allocated") {
    SocketPair pair;
    RespReader reader(pair.reader());
    pair.Send("$99999999999999\r\n");
    auto reply = reader.Next({});
    REQUIRE_FALSE(reply.ok());
    CHECK(reply.status().code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(reply.status().message()), Catch::Contains("99999999999999 bytes"));
  }
  SECTION("a line that never ends is DATA_LOSS once it passes the line limit") {
    SocketPair pair;
    RespReader reader(pair.reader());
    pair.Send("+" + std::string(RespReader::kMaxLineBytes + 1024, 'x'));
    auto reply = reader.Next({});
    REQUIRE_FALSE(reply.ok());
    CHECK(reply.status().code() == absl::StatusCode::kDataLoss);
  }
  SECTION("a value larger than what is kept is read past, answered as an error, and the next reply still parses") {
    SocketPair pair;
    RespReader reader(pair.reader());
    const std::string big = testing::TestText(4, RespReader::kMaxKeptBulkBytes + 1);
    std::thread server([&] { pair.Send(Bulk(big) + "+OK\r\n"); });
    auto skipped = reader.Next({});
    auto next = reader.Next({});
    server.join();
    REQUIRE(skipped.ok());
    CHECK((*skipped)->type == REDIS_REPLY_ERROR);
    CHECK_THAT(Text(*skipped), Catch::Contains("not kept"));
    REQUIRE(next.ok());
    CHECK((*next)->type == REDIS_REPLY_STATUS);
    CHECK(reader.drained());
  }
  SECTION("a bulk value not followed by CRLF is DATA_LOSS") {
    SocketPair pair;
    RespReader reader(pair.reader());
    pair.Send("$3\r\nabcXY");
    auto reply = reader.Next({});
    REQUIRE_FALSE(reply.ok());
    CHECK(reply.status().code() == absl::StatusCode::kDataLoss);
  }
}

TEST_CASE("RespReader: a reply cut short is UNAVAILABLE when the server closes, DEADLINE_EXCEEDED when it stalls",
          "[resp]") {
  const std::string value = testing::TestText(3, 40000);
  const std::string full = Bulk(value);
  // Cut inside the first line, inside the value (before and past the reader's 16 KiB buffer), and before the
  // value's CRLF.
  const auto [cut, sink_bytes] = GENERATE_COPY(table<size_t, size_t>({
      {0, 0},
      {3, 0},
      {10, 0},
      {10, value.size()},
      {30000, 0},
      {30000, value.size()},
      {full.size() - 2, 0},
      {full.size() - 1, value.size()},
  }));
  CAPTURE(cut, sink_bytes);
  std::vector<std::byte> sink(sink_bytes);
  SocketPair pair;
  RespReader reader(pair.reader());
  pair.Send(std::string_view(full).substr(0, cut));

  SECTION("the server closes the connection") {
    pair.CloseWriter();
    auto reply = reader.Next(AsSink(sink));
    REQUIRE_FALSE(reply.ok());
    CHECK(reply.status().code() == absl::StatusCode::kUnavailable);
    CHECK(std::string(reply.status().message()) == "Server closed the connection");
  }
  SECTION("the server stops sending") {
    const auto start = std::chrono::steady_clock::now();
    auto reply = reader.Next(AsSink(sink));
    REQUIRE_FALSE(reply.ok());
    CHECK(reply.status().code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(150));
  }
}

TEST_CASE("RespReader: arrays, nested, with every size bounded before anything is allocated", "[resp]") {
  SocketPair pair;
  RespReader reader(pair.reader());
  // A cluster's slot map has this shape: ranges, each [first, last, [host, port, id]].
  pair.Send("*2\r\n*3\r\n:0\r\n:5460\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n*0\r\n*-1\r\n");
  auto slots = reader.Next({});
  REQUIRE(slots.ok());
  REQUIRE((*slots)->type == REDIS_REPLY_ARRAY);
  REQUIRE((*slots)->elements == 2);
  const redisReply* range = (*slots)->element[0];
  REQUIRE(range->elements == 3);
  CHECK(range->element[1]->integer == 5460);
  CHECK(std::string(range->element[2]->element[0]->str, range->element[2]->element[0]->len) == "127.0.0.1");
  CHECK((*slots)->element[1]->type == REDIS_REPLY_ARRAY);
  CHECK((*slots)->element[1]->elements == 0);
  auto nil = reader.Next({});
  REQUIRE(nil.ok());
  CHECK((*nil)->type == REDIS_REPLY_NIL);
  CHECK(reader.drained());

  std::string hostile_reply, message;
  SECTION("an element count past the allowance") {
    hostile_reply = "*99999999999\r\n";
    message = "Redis announced an array of 99999999999 elements; one reply holds at most 1048576 in all";
  }
  SECTION("arrays nested too deep") {
    for (int i = 0; i < 9; ++i) hostile_reply += "*1\r\n";
    hostile_reply += ":1\r\n";
    message = "Redis sent arrays nested deeper than 8";
  }
  SECTION("arrays each within the allowance, together past it: it holds for the whole reply") {
    hostile_reply = "*2\r\n*1000000\r\n";
    for (int i = 0; i < 1000000; ++i) hostile_reply += ":1\r\n";
    hostile_reply += "*100000\r\n";
    message = "Redis announced an array of 100000 elements; one reply holds at most 1048576 in all";
  }
  SocketPair hostile;
  RespReader hostile_reader(hostile.reader());
  std::thread sender([&] { hostile.Send(hostile_reply); });
  auto reply = hostile_reader.Next({});
  sender.join();
  REQUIRE_FALSE(reply.ok());
  CHECK(reply.status().code() == absl::StatusCode::kDataLoss);
  CHECK(std::string(reply.status().message()) == message);
}

TEST_CASE("RespReader: the bulk bytes one reply keeps are bounded in all, not only per value", "[resp]") {
  SocketPair pair;
  RespReader reader(pair.reader());
  // 1100 values of 60 KiB: each under the per-value limit, together past the reply's 64 MiB.
  const std::string value(60 << 10, 'v');
  std::string sent = "*1100\r\n";
  for (int i = 0; i < 1100; ++i) sent += "$" + std::to_string(value.size()) + "\r\n" + value + "\r\n";
  std::thread sender([&] { pair.Send(sent); });
  auto reply = reader.Next({});
  sender.join();
  REQUIRE(reply.ok());  // read to its end, so the connection stays in step
  REQUIRE((*reply)->elements == 1100);
  uint64_t kept = 0;
  size_t refused = 0;
  for (size_t i = 0; i < (*reply)->elements; ++i) {
    const redisReply* e = (*reply)->element[i];
    if (e->type == REDIS_REPLY_STRING) kept += e->len;
    if (e->type == REDIS_REPLY_ERROR) ++refused;
  }
  CHECK(kept <= RespReader::kMaxReplyKeptBytes);
  CHECK(refused > 0);
  CHECK(reader.drained());
}

}  // namespace cake
