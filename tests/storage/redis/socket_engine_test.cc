// The socket engine contract, run over both engines (io_uring, poll): RunExchanges on real sockets (socketpairs
// whose other end a test thread plays as Redis) sends requests of many pieces, receives values straight into
// their sinks, keeps every connection in flight at once, and ends each exchange on its own: a peer that closes,
// one that stalls and one that sends garbage fail their exchange only, and nothing is left in flight.
#include "storage/redis/socket_engine.h"

#include <hiredis/hiredis.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/storage/tier_test_util.h"

namespace cake {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<SocketEngine> MakeEngine(const std::string& name) {
  if (name == "poll") return MakePollSocketEngine();
  auto uring = MakeUringSocketEngine(64);
  if (uring.ok()) return std::move(*uring);
  WARN("io_uring is unavailable here (" << uring.status().message() << "): the io_uring run uses poll");
  return MakePollSocketEngine();
}

// A connected pair: the client end for RunExchanges, the server end for a thread that plays Redis.
struct Pair {
  Pair() { REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0); }
  ~Pair() {
    if (fds[0] >= 0) close(fds[0]);
    if (fds[1] >= 0) close(fds[1]);
  }
  int client() const { return fds[0]; }
  int server() const { return fds[1]; }
  void CloseServer() {
    close(fds[1]);
    fds[1] = -1;
  }
  int fds[2] = {-1, -1};
};

// Reads exactly n bytes from fd (the request), or fewer if it closes.
std::string ReadExactly(int fd, size_t n) {
  std::string got(n, '\0');
  size_t at = 0;
  while (at < n) {
    const ssize_t r = recv(fd, got.data() + at, n - at, 0);
    if (r <= 0) break;
    at += r;
  }
  got.resize(at);
  return got;
}

void SendAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    bytes.remove_prefix(n);
  }
}

std::string Bulk(const std::string& value) { return "$" + std::to_string(value.size()) + "\r\n" + value + "\r\n"; }

size_t Total(const std::vector<iovec>& pieces) {
  size_t n = 0;
  for (const iovec& v : pieces) n += v.iov_len;
  return n;
}

const std::string kPing = "*1\r\n$4\r\nPING\r\n";

// An exchange that sends request (which must outlive it) and awaits one reply into parser.
SocketExchange OneReplyExchange(int fd, const std::string& request, RespParser& parser) {
  parser.Expect({});
  SocketExchange exchange;
  exchange.fd = fd;
  exchange.request = {{const_cast<char*>(request.data()), request.size()}};
  exchange.parser = &parser;
  return exchange;
}

// Nothing was left in flight by what ran before: the engine carries a PING on pair and its answer comes.
void CheckServesAPing(SocketEngine& engine, Pair& pair) {
  RespParser parser;
  SocketExchange ping = OneReplyExchange(pair.client(), kPing, parser);
  std::thread answer([&] {
    (void)ReadExactly(pair.server(), kPing.size());
    SendAll(pair.server(), "+PONG\r\n");
  });
  RunExchanges(engine, std::span(&ping, 1), 2000ms);
  answer.join();
  CHECK(ping.status.ok());
  CHECK(parser.has_reply());
  CHECK_FALSE(engine.broken());
}

}  // namespace

TEST_CASE("socket engines: every exchange in flight at once, long requests sent whole, values into their sinks",
          "[socket]") {
  const std::string name = GENERATE("io_uring", "poll");
  auto engine = MakeEngine(name);
  constexpr int kConnections = 4;
  // Each request: 3000 pieces (past IOV_MAX, so several sends) adding up to 6 MiB, more than a socket buffer
  // holds, so sends complete in part; each reply: one 3 MiB value for a sink, then a status.
  std::vector<std::string> pieces;
  for (int i = 0; i < 3000; ++i) pieces.push_back(testing::TestText(i, 2 << 10));
  std::vector<Pair> pairs(kConnections);
  std::vector<RespParser> parsers(kConnections);
  std::vector<std::string> values;
  std::vector<std::vector<std::byte>> sinks;
  std::vector<SocketExchange> exchanges(kConnections);
  for (int c = 0; c < kConnections; ++c) {
    values.push_back(testing::TestText(100 + c, 3 << 20));
    sinks.emplace_back(values.back().size());
    exchanges[c].fd = pairs[c].client();
    for (const std::string& p : pieces) exchanges[c].request.push_back({const_cast<char*>(p.data()), p.size()});
    exchanges[c].parser = &parsers[c];
    parsers[c].Expect(std::span(sinks[c]));
    parsers[c].Expect({});
  }
  const size_t request_bytes = Total(exchanges[0].request);
  std::vector<std::string> received(kConnections);
  std::vector<std::thread> servers;
  for (int c = 0; c < kConnections; ++c) {
    servers.emplace_back([&, c] {
      // Answer only after the whole request: both directions must be in flight together to get here.
      received[c] = ReadExactly(pairs[c].server(), request_bytes);
      SendAll(pairs[c].server(), Bulk(values[c]) + "+OK\r\n");
    });
  }
  RunExchanges(*engine, exchanges, 5000ms);
  for (std::thread& t : servers) t.join();

  std::string expected_request;
  for (const std::string& p : pieces) expected_request += p;
  for (int c = 0; c < kConnections; ++c) {
    INFO(name << " connection " << c);
    CHECK(exchanges[c].status.ok());
    CHECK(received[c] == expected_request);
    REQUIRE(parsers[c].has_reply());
    RedisReply value = parsers[c].PopReply();
    CHECK(value->type == REDIS_REPLY_STRING);
    CHECK(value->str == nullptr);  // landed in the sink
    CHECK(std::memcmp(sinks[c].data(), values[c].data(), values[c].size()) == 0);
    REQUIRE(parsers[c].has_reply());
    CHECK(parsers[c].PopReply()->type == REDIS_REPLY_STATUS);
    CHECK(parsers[c].drained());
  }
}

TEST_CASE("socket engines: a peer that closes, one that stalls and one that sends garbage fail only their own",
          "[socket][hostile]") {
  const std::string name = GENERATE("io_uring", "poll");
  auto engine = MakeEngine(name);
  Pair healthy, closing, stalling, garbage;
  std::vector<RespParser> parsers(4);
  std::vector<SocketExchange> exchanges;
  Pair* pairs[4] = {&healthy, &closing, &stalling, &garbage};
  for (int i = 0; i < 4; ++i) exchanges.push_back(OneReplyExchange(pairs[i]->client(), kPing, parsers[i]));
  std::thread peers([&] {
    for (Pair* p : pairs) (void)ReadExactly(p->server(), kPing.size());
    SendAll(garbage.server(), "?what\r\n");
    SendAll(closing.server(), "+PO");  // half a reply, then gone
    closing.CloseServer();
    std::this_thread::sleep_for(50ms);  // the healthy one answers last: the failures must not hold it up
    SendAll(healthy.server(), "+PONG\r\n");
    // stalling never answers
  });
  const auto start = std::chrono::steady_clock::now();
  RunExchanges(*engine, exchanges, 300ms);
  const auto took = std::chrono::steady_clock::now() - start;
  peers.join();
  INFO(name);
  CHECK(exchanges[0].status.ok());
  REQUIRE(parsers[0].has_reply());
  CHECK(std::string(parsers[0].PopReply()->str) == "PONG");
  CHECK(exchanges[1].status.code() == absl::StatusCode::kUnavailable);
  CHECK(exchanges[2].status.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(exchanges[3].status.code() == absl::StatusCode::kDataLoss);
  CHECK(took < 5s);  // bounded by the idle timeout, not by the stalled peer

  // Nothing was left in flight: the engine serves the next call, on the stalled connection too.
  CheckServesAPing(*engine, stalling);
}

TEST_CASE("socket engines: a peer that never reads a long request times out, its send cancelled", "[socket][hostile]") {
  const std::string name = GENERATE("io_uring", "poll");
  auto engine = MakeEngine(name);
  Pair deaf;
  const std::string request = testing::TestText(5, 16 << 20);  // far more than the socket buffers hold
  RespParser parser;
  SocketExchange exchange = OneReplyExchange(deaf.client(), request, parser);
  const auto start = std::chrono::steady_clock::now();
  RunExchanges(*engine, std::span(&exchange, 1), 200ms);
  INFO(name);
  CHECK(exchange.status.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  CHECK_FALSE(engine->broken());

  // The cancelled send left nothing behind: the engine serves another connection.
  Pair other;
  CheckServesAPing(*engine, other);
}

TEST_CASE("socket engines: an exchange with nothing to send or await is done at once", "[socket]") {
  const std::string name = GENERATE("io_uring", "poll");
  auto engine = MakeEngine(name);
  Pair pair;
  RespParser parser;
  SocketExchange nothing;
  nothing.fd = pair.client();
  nothing.parser = &parser;
  RunExchanges(*engine, std::span(&nothing, 1), 100ms);
  CHECK(nothing.status.ok());
}

TEST_CASE("socket engines: the calling thread's engine is io_uring when asked and the kernel allows, else poll",
          "[socket]") {
  CHECK(ThisThreadSocketEngine(false).name() == "poll");
  const bool uring_here = MakeUringSocketEngine(8).ok();
  CHECK(ThisThreadSocketEngine(true).name() == (uring_here ? "io_uring" : "poll"));
  CHECK(&ThisThreadSocketEngine(true) == &ThisThreadSocketEngine(true));  // kept for the thread
}

}  // namespace cake
