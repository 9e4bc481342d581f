// The redis-server harness the remote-tier tests and cake-bench remote rely on: a standalone server starts,
// answers and stops; a password keeps strangers out; a 3-master cluster starts converged, computes slots as Redis
// does, and moves a slot with its keys (stepwise, with the ASK redirect in the middle, and in one call).
#include "testing/redis_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace cake {
namespace {

bool ProcessGone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

// Sends one inline command on a raw, unauthenticated connection and returns the first reply line: the harness
// itself always authenticates, so it cannot show what a stranger gets.
std::string RawCommand(int port, const std::string& command) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  const std::string request = command + "\r\n";
  REQUIRE(write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size()));
  std::string reply;
  char c;
  while (read(fd, &c, 1) == 1 && c != '\n') reply.push_back(c);
  close(fd);
  if (!reply.empty() && reply.back() == '\r') reply.pop_back();
  return reply;
}

TEST_CASE("RedisServer: starts, answers commands and stops", "[redis]") {
  auto server = RedisServer::Start();
  REQUIRE(server.ok());
  CHECK(server->host() == "127.0.0.1");
  CHECK(server->address() == absl::StrCat("127.0.0.1:", server->port()));
  const pid_t pid = server->pid();
  REQUIRE(pid > 0);
  const std::string dir = server->dir();
  CHECK(std::filesystem::is_directory(dir));

  CHECK(server->Command({"PING"}).value_or("") == "PONG");
  CHECK(server->Command({"SET", "greeting", std::string("hel\0lo", 6)}).value_or("") == "OK");
  CHECK(server->Command({"GET", "greeting"}).value_or("") == std::string("hel\0lo", 6));
  CHECK(server->Command({"INCRBY", "counter", "41"}).value_or("") == "41");
  CHECK(server->Command({"RPUSH", "list", "a", "b"}).value_or("") == "2");
  CHECK(server->Command({"LRANGE", "list", "0", "-1"}).value_or("") == "a\nb");
  CHECK(absl::IsNotFound(server->Command({"GET", "missing"}).status()));
  auto wrong = server->Command({"NOSUCHCOMMAND"});
  REQUIRE(!wrong.ok());
  CHECK(absl::StrContains(wrong.status().message(), "unknown command"));
  // No persistence: nothing would survive a restart, and nothing slows the test down.
  CHECK(server->Command({"CONFIG", "GET", "save"}).value_or("") == "save\n");
  CHECK(absl::StrContains(server->log(), "Ready to accept connections"));

  CHECK(server->Stop() == 0);
  CHECK(server->pid() == -1);
  CHECK(ProcessGone(pid));
  CHECK(server->Stop() == 0);  // idempotent
  CHECK(!server->Command({"PING"}).ok());

  { RedisServer gone = std::move(*server); }
  CHECK(!std::filesystem::exists(dir));
}

TEST_CASE("RedisServer: a password refuses unauthenticated commands", "[redis]") {
  RedisServer::Options options;
  options.password = "s3cret";
  options.extra_args = {"--maxmemory", "64mb"};
  auto server = RedisServer::Start(options);
  REQUIRE(server.ok());
  CHECK(absl::StartsWith(RawCommand(server->port(), "SET k v"), "-NOAUTH"));
  CHECK(server->Command({"SET", "k", "v"}).value_or("") == "OK");  // Command authenticates
  CHECK(server->Command({"CONFIG", "GET", "maxmemory"}).value_or("") == "maxmemory\n67108864");
}

TEST_CASE("RedisServer: a server that cannot start reports its output", "[redis]") {
  RedisServer::Options options;
  options.extra_args = {"--no-such-option", "1"};
  auto server = RedisServer::Start(options);
  REQUIRE(!server.ok());
  CHECK(absl::IsUnavailable(server.status()));
  CHECK(absl::StrContains(server.status().message(), "no-such-option"));
}

TEST_CASE("RedisCluster: starts, routes keys and moves slots", "[redis]") {
  auto started = RedisCluster::Start(3);
  REQUIRE(started.ok());
  RedisCluster& cluster = *started;
  REQUIRE(cluster.size() == 3);
  // One cluster for all the steps below (no SECTIONs, which would start one per section): a fresh master
  // takes 2 s to report cluster_state:ok (Redis's CLUSTER_WRITABLE_DELAY). Kill goes last.
  const std::vector<std::string> addresses = cluster.addresses();
  CHECK(std::set<std::string>(addresses.begin(), addresses.end()).size() == 3);
  for (size_t i = 0; i < cluster.size(); ++i) {
    CHECK(cluster.NodeId(i).size() == 40);
    CHECK(absl::StrContains(cluster.node(i).Command({"CLUSTER", "INFO"}).value_or(""), "cluster_state:ok"));
    CHECK(cluster.node(i).Command({"CLUSTER", "INFO"}).value_or("").find("cluster_known_nodes:3") != std::string::npos);
  }

  {
    INFO("KeySlot agrees with CLUSTER KEYSLOT");
    const std::vector<std::string> keys = {
        "foo",           "bar", "{user1000}.following",     "{user1000}.followers", "foo{}{bar}", "foo{{bar}}zap",
        "foo{bar}{zap}", "",    std::string("bin\0\xff", 5)};
    for (const auto& key : keys) {
      CAPTURE(key);
      CHECK(absl::StrCat(RedisCluster::KeySlot(key)) ==
            cluster.node(0).Command({"CLUSTER", "KEYSLOT", key}).value_or("?"));
    }
    CHECK(RedisCluster::KeySlot("foo") == 12182);
    CHECK(RedisCluster::KeySlot("{user1000}.following") == RedisCluster::KeySlot("{user1000}.followers"));
  }

  {
    INFO("NodeForSlot names where a key lands; other nodes redirect");
    const int slot = RedisCluster::KeySlot("foo");
    auto owner = cluster.NodeForSlot(slot);
    REQUIRE(owner.ok());
    CHECK(cluster.node(*owner).Command({"SET", "foo", "bar"}).value_or("") == "OK");
    const size_t other = (*owner + 1) % cluster.size();
    auto moved = cluster.node(other).Command({"SET", "foo", "baz"});
    REQUIRE(!moved.ok());
    CHECK(moved.status().message() == absl::StrCat("MOVED ", slot, " ", cluster.node(*owner).address()));
    CHECK(!cluster.NodeForSlot(RedisCluster::kSlots).ok());
  }

  {
    INFO("a slot migration in steps redirects with ASK in the middle");
    const std::string key = "{cake}chunk";
    const int slot = RedisCluster::KeySlot(key);
    const size_t from = *cluster.NodeForSlot(slot);
    const size_t to = (from + 1) % cluster.size();
    REQUIRE(cluster.node(from).Command({"SET", key, "kv"}).ok());
    REQUIRE(cluster.node(from).Command({"SET", "{cake}other", "kv2"}).ok());

    REQUIRE(cluster.BeginSlotMigration(slot, from, to).ok());
    CHECK(cluster.node(from).Command({"GET", key}).value_or("") == "kv");  // still on the source
    REQUIRE(cluster.MigrateKeys(slot, from, to, {key}).ok());
    auto ask = cluster.node(from).Command({"GET", key});
    REQUIRE(!ask.ok());
    CHECK(ask.status().message() == absl::StrCat("ASK ", slot, " ", cluster.node(to).address()));
    // Without ASKING the target still sends clients to the owner.
    CHECK(absl::StartsWith(cluster.node(to).Command({"GET", key}).status().message(), "MOVED"));
    CHECK(cluster.NodeForSlot(slot).value_or(-1) == static_cast<int>(from));  // the owner until Finish

    REQUIRE(cluster.MigrateAllKeys(slot, from, to).ok());
    CHECK(cluster.node(from).Command({"CLUSTER", "COUNTKEYSINSLOT", absl::StrCat(slot)}).value_or("") == "0");
    REQUIRE(cluster.FinishSlotMigration(slot, from, to).ok());
    CHECK(cluster.NodeForSlot(slot).value_or(-1) == static_cast<int>(to));
    CHECK(cluster.node(to).Command({"GET", key}).value_or("") == "kv");
    CHECK(cluster.node(to).Command({"GET", "{cake}other"}).value_or("") == "kv2");
    CHECK(cluster.node(from).Command({"GET", key}).status().message() ==
          absl::StrCat("MOVED ", slot, " ", cluster.node(to).address()));
  }

  {
    INFO("MoveSlot moves a slot with its keys");
    const int slot = RedisCluster::KeySlot("{move}");
    const size_t from = *cluster.NodeForSlot(slot);
    const size_t to = (from + 2) % cluster.size();
    for (int i = 0; i < 5; ++i) REQUIRE(cluster.node(from).Command({"SET", absl::StrCat("{move}", i), "v"}).ok());
    REQUIRE(cluster.MoveSlot(slot, from, to).ok());
    CHECK(cluster.NodeForSlot(slot).value_or(-1) == static_cast<int>(to));
    for (int i = 0; i < 5; ++i) CHECK(cluster.node(to).Command({"GET", absl::StrCat("{move}", i)}).value_or("") == "v");
    CHECK(absl::IsInvalidArgument(cluster.MoveSlot(slot, to, to)));
    CHECK(absl::IsInvalidArgument(cluster.MigrateKeys(slot, to, from, {"not-in-the-slot"})));
  }

  {
    INFO("Kill stops a node the hard way");
    const pid_t pid = cluster.node(2).pid();
    cluster.node(2).Kill();
    CHECK(cluster.node(2).pid() == -1);
    CHECK(ProcessGone(pid));
    CHECK(!cluster.node(2).Command({"PING"}).ok());
    CHECK(cluster.node(0).Command({"PING"}).value_or("") == "PONG");
    CHECK(cluster.node(1).Command({"PING"}).value_or("") == "PONG");
  }
}

}  // namespace
}  // namespace cake
