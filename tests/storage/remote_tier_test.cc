// The remote tier against real redis-server processes: the value layout in Redis, corrupt and partial values,
// part sizes and prefixes, TTL, the password passed on, a remote that is down, and a Redis Cluster with chunks
// spread over three masters and a master killed. How the client talks to Redis (AUTH, back-off, timeouts,
// redirects) is tested in redis_cluster_client_test.cc, the value format in remote_codec_test.cc.
#include "storage/remote_tier.h"

#include <catch2/catch.hpp>
#include <chrono>

#include "storage/redis/redis_cluster_client.h"
#include "testing/redis_process.h"
#include "tests/storage/tier_test_util.h"

namespace cake {
namespace {

using testing::TestKey;
using testing::TestValue;

RedisServer& SharedServer() {
  static absl::StatusOr<RedisServer> server = RedisServer::Start();
  if (!server.ok()) FAIL(server.status().ToString());
  return *server;
}

std::unique_ptr<RemoteTier> OpenTier(RemoteTier::Options options) {
  auto tier = RemoteTier::Open(options);
  REQUIRE(tier.ok());
  return std::move(tier).value();
}

RemoteTier::Options OptionsFor(const std::string& endpoint, const std::string& prefix, uint64_t part_bytes = 4096) {
  RemoteTier::Options options;
  options.endpoints = {endpoint};
  options.key_prefix = prefix;
  options.part_bytes = part_bytes;
  return options;
}

std::string KeyName(const std::string& prefix, const ChunkKey& key, const std::string& suffix) {
  return prefix + "{" + key.Hex() + "}:" + suffix;
}

}  // namespace

TEST_CASE("remote: bad options are refused with a reason", "[remote]") {
  RemoteTier::Options options;
  CHECK(RemoteTier::Open(options).status().code() == absl::StatusCode::kInvalidArgument);
  options.endpoints = {"localhost"};
  CHECK(RemoteTier::Open(options).status().code() == absl::StatusCode::kInvalidArgument);
  options.endpoints = {"127.0.0.1:1"};
  options.key_prefix = "a{b}:";
  auto status = RemoteTier::Open(options).status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()).find("hash tags") != std::string::npos);
  options.key_prefix = "ok:";
  options.part_bytes = 0;
  CHECK(RemoteTier::Open(options).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("remote: a value is split into parts under one hash tag, header last", "[remote]") {
  RedisServer& redis = SharedServer();
  auto tier = OpenTier(OptionsFor(redis.address(), "layout:", 4096));
  const ChunkKey key = TestKey(7);
  const auto value = TestValue(7, 10 * 4096 + 123);  // 10 whole parts and a short one
  REQUIRE(tier->Write(key, value).ok());
  for (int i = 0; i < 11; ++i) {
    auto len = redis.Command({"STRLEN", KeyName("layout:", key, std::to_string(i))});
    REQUIRE(len.ok());
    CHECK(*len == (i < 10 ? "4096" : "123"));
  }
  CHECK(redis.Command({"EXISTS", KeyName("layout:", key, "11")}).value() == "0");
  CHECK(redis.Command({"STRLEN", KeyName("layout:", key, "h")}).value() == "64");
  CHECK(RedisKeySlot(KeyName("layout:", key, "h")) == RedisKeySlot(KeyName("layout:", key, "3")));
  CHECK(RedisKeySlot(KeyName("layout:", key, "h")) == RedisCluster::KeySlot(KeyName("layout:", key, "h")));

  std::vector<std::byte> out(value.size());
  REQUIRE(tier->Read(key, out).ok());
  CHECK(out == value);

  // A daemon configured with another part size reads it too (the header says how it was cut).
  auto other = OpenTier(OptionsFor(redis.address(), "layout:", 1 << 20));
  std::fill(out.begin(), out.end(), std::byte{0});
  REQUIRE(other->Read(key, out).ok());
  CHECK(out == value);

  REQUIRE(tier->Remove(key).ok());
  CHECK(redis.Command({"EXISTS", KeyName("layout:", key, "0")}).value() == "0");
  CHECK(redis.Command({"EXISTS", KeyName("layout:", key, "h")}).value() == "0");
}

TEST_CASE("remote: a corrupt, partial or foreign value is a miss and is removed", "[remote]") {
  RedisServer& redis = SharedServer();
  const std::string prefix = "corrupt:";
  auto tier = OpenTier(OptionsFor(redis.address(), prefix, 4096));
  const ChunkKey key = TestKey(11);
  const auto value = TestValue(11, 5 * 4096);
  std::vector<std::byte> out(value.size());

  SECTION("a part overwritten with other bytes of the same length") {
    REQUIRE(tier->Write(key, value).ok());
    REQUIRE(redis.Command({"SET", KeyName(prefix, key, "3"), std::string(4096, 'x')}).ok());
  }
  SECTION("a part evicted") {
    REQUIRE(tier->Write(key, value).ok());
    REQUIRE(redis.Command({"DEL", KeyName(prefix, key, "1")}).ok());
  }
  SECTION("a part cut short") {
    REQUIRE(tier->Write(key, value).ok());
    REQUIRE(redis.Command({"SET", KeyName(prefix, key, "4"), std::string(100, 'x')}).ok());
  }
  SECTION("a header that is not ours") {
    REQUIRE(tier->Write(key, value).ok());
    REQUIRE(redis.Command({"SET", KeyName(prefix, key, "h"), "hello"}).ok());
  }
  SECTION("a header with one flipped bit") {
    REQUIRE(tier->Write(key, value).ok());
    std::string header = redis.Command({"GET", KeyName(prefix, key, "h")}).value();
    header[33] ^= 1;
    REQUIRE(redis.Command({"SET", KeyName(prefix, key, "h"), header}).ok());
  }
  CHECK(tier->Read(key, out).code() == absl::StatusCode::kDataLoss);
  CHECK_FALSE(tier->Contains(key));
  CHECK(redis.Command({"EXISTS", KeyName(prefix, key, "h")}).value() == "0");
  CHECK(tier->counters().corrupt_removed == 1);
  // Stored again, it reads back.
  REQUIRE(tier->Write(key, value).ok());
  REQUIRE(tier->Read(key, out).ok());
  CHECK(out == value);
}

TEST_CASE("remote: prefixes keep caches apart, ContainsEach answers many keys", "[remote]") {
  RedisServer& redis = SharedServer();
  auto a = OpenTier(OptionsFor(redis.address(), "tenant-a:"));
  auto b = OpenTier(OptionsFor(redis.address(), "tenant-b:"));
  REQUIRE(a->Write(TestKey(1), TestValue(1, 1000)).ok());
  REQUIRE(a->Write(TestKey(3), TestValue(3, 1000)).ok());
  CHECK_FALSE(b->Contains(TestKey(1)));
  const std::vector<ChunkKey> keys = {TestKey(1), TestKey(2), TestKey(3)};
  CHECK(a->ContainsEach(keys) == std::vector<bool>{true, false, true});
  CHECK(b->ContainsEach(keys) == std::vector<bool>{false, false, false});
  int seen = 0;
  b->ForEach([&](const ChunkKey&, uint64_t) { ++seen; });
  CHECK(seen == 0);
}

TEST_CASE("remote: a TTL makes every key of a chunk expire", "[remote]") {
  RedisServer& redis = SharedServer();
  RemoteTier::Options options = OptionsFor(redis.address(), "ttl:", 4096);
  options.ttl = std::chrono::seconds(100);
  auto tier = OpenTier(options);
  const ChunkKey key = TestKey(5);
  REQUIRE(tier->Write(key, TestValue(5, 3 * 4096)).ok());
  for (const char* suffix : {"h", "0", "2"}) {
    auto ttl = redis.Command({"TTL", KeyName("ttl:", key, suffix)});
    REQUIRE(ttl.ok());
    const int seconds = std::stoi(*ttl);
    CHECK(seconds > 90);
    CHECK(seconds <= 100);
  }
}

TEST_CASE("remote: the password in the options reaches Redis", "[remote]") {
  RedisServer::Options server_options;
  server_options.password = "s3cret";
  auto redis = RedisServer::Start(server_options);
  REQUIRE(redis.ok());
  RemoteTier::Options options = OptionsFor(redis->address(), "auth:");
  options.password = "s3cret";
  auto tier = OpenTier(options);
  REQUIRE(tier->Write(TestKey(1), TestValue(1, 5000)).ok());
  std::vector<std::byte> out(5000);
  REQUIRE(tier->Read(TestKey(1), out).ok());

  options.password = "wrong";
  auto refused = OpenTier(options);
  absl::Status status = refused->Read(TestKey(1), out);
  CHECK(status.code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(status.message()).find("AUTH") != std::string::npos);
  CHECK_FALSE(refused->Contains(TestKey(1)));
}

TEST_CASE("remote: a down remote is a fast miss", "[remote]") {
  RemoteTier::Options options = OptionsFor("127.0.0.1:1", "down:");
  auto tier = OpenTier(options);  // opening does not need Redis
  std::vector<std::byte> out(100);
  CHECK(tier->Read(TestKey(1), out).code() == absl::StatusCode::kUnavailable);
  CHECK_FALSE(tier->Contains(TestKey(1)));
  CHECK(tier->Write(TestKey(1), TestValue(1, 100)).code() == absl::StatusCode::kUnavailable);
  CHECK(tier->counters().errors >= 1);
  CHECK(tier->counters().fast_failures >= 1);  // backing off: later calls did not even try to connect
  // The client's counters, as Stats names them.
  const RemoteTier::Counters c = tier->counters();
  const TierStats stats = tier->Stats();
  using Own = std::vector<std::pair<std::string_view, uint64_t>>;
  CHECK(stats.own == Own{{"errors", c.errors},
                         {"connects", 0},
                         {"fast_failures", c.fast_failures},
                         {"moved", 0},
                         {"ask", 0},
                         {"redirects_refused", 0},
                         {"headers_skipped", 0},
                         {"scans_cut_short", 0}});
  CHECK(stats.corrupt_removed == 0);
}

TEST_CASE("remote: a Redis Cluster spreads chunks, and a dead master's chunks are misses", "[remote][cluster]") {
  auto cluster = RedisCluster::Start(3);
  REQUIRE(cluster.ok());
  const std::string prefix = "cl:";
  // Seeded with one node only: the rest of the map comes from CLUSTER SLOTS.
  RemoteTier::Options options = OptionsFor(cluster->addresses()[2], prefix, 4096);
  options.command_timeout = std::chrono::milliseconds(500);
  auto tier = OpenTier(options);
  CHECK(tier->is_cluster());

  constexpr uint32_t kChunks = 30;
  for (uint32_t i = 0; i < kChunks; ++i) REQUIRE(tier->Write(TestKey(i), TestValue(i, 3 * 4096 + i)).ok());
  std::vector<int> per_node(3, 0);
  for (uint32_t i = 0; i < kChunks; ++i) {
    auto owner = cluster->NodeForSlot(RedisKeySlot(KeyName(prefix, TestKey(i), "h")));
    REQUIRE(owner.ok());
    per_node[*owner]++;
  }
  for (int n : per_node) CHECK(n > 0);
  auto read_back = [&](uint32_t i) {
    std::vector<std::byte> out(3 * 4096 + i);
    absl::Status s = tier->Read(TestKey(i), out);
    return s.ok() && out == TestValue(i, out.size());
  };

  for (uint32_t i = 0; i < kChunks; ++i) CHECK(read_back(i));

  // A master killed: its chunks are lost, the others still read.
  cluster->node(1).Kill();
  uint32_t lost = 0, kept = 0;
  for (uint32_t i = 0; i < kChunks; ++i) {
    const bool on_dead_node = cluster->NodeForSlot(RedisKeySlot(KeyName(prefix, TestKey(i), "h"))).value_or(1) == 1;
    const bool ok = read_back(i);
    if (on_dead_node) {
      CHECK_FALSE(ok);
      ++lost;
    } else {
      CHECK(ok);
      ++kept;
    }
  }
  CHECK(lost == static_cast<uint32_t>(per_node[1]));
  CHECK(kept == kChunks - static_cast<uint32_t>(per_node[1]));
  // Lookups answer for the live nodes and say "absent" for the dead one's keys.
  std::vector<ChunkKey> keys;
  for (uint32_t i = 0; i < kChunks; ++i) keys.push_back(TestKey(i));
  const std::vector<bool> found = tier->ContainsEach(keys);
  for (uint32_t i = 0; i < kChunks; ++i) {
    const bool on_dead_node = cluster->NodeForSlot(RedisKeySlot(KeyName(prefix, TestKey(i), "h"))).value_or(1) == 1;
    CHECK(found[i] == !on_dead_node);
  }
}

}  // namespace cake
