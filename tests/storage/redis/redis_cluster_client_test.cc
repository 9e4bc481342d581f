// RedisClusterClient against real redis-server processes: commands on one server and on a 3-master cluster
// seeded with one node, values received into the caller's buffer, AUTH, a node that is down (back-off) or frozen
// (timeouts), a slot migrated under the client (ASK, then MOVED), a master killed, and masters with replicas that
// fail over (killed, and by hand).
#include "storage/redis/redis_cluster_client.h"

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "testing/redis_process.h"
#include "tests/storage/tier_test_util.h"

namespace cake {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

RedisCommand Cmd(std::string verb, std::string key, std::vector<std::string> tail = {}) {
  RedisCommand c;
  c.verb = std::move(verb);
  c.key = std::move(key);
  c.tail = std::move(tail);
  return c;
}

// value must outlive the command: it is sent from where it is.
RedisCommand Set(std::string key, const std::string& value, std::vector<std::string> tail = {}) {
  RedisCommand c = Cmd("SET", std::move(key), std::move(tail));
  c.value = std::as_bytes(std::span(value));
  c.has_value = true;
  return c;
}

RedisCommand GetInto(std::string key, std::vector<std::byte>& sink) {
  RedisCommand c = Cmd("GET", std::move(key));
  c.sink = sink;
  return c;
}

std::unique_ptr<RedisClusterClient> OpenClient(RedisClusterClient::Options options) {
  auto client = RedisClusterClient::Open(options);
  REQUIRE(client.ok());
  return std::move(client).value();
}

RedisClusterClient::Options OptionsFor(std::vector<std::string> endpoints) {
  RedisClusterClient::Options options;
  options.endpoints = std::move(endpoints);
  options.log_name = "client test";
  return options;
}

std::string Text(const RedisReply& r) { return r->str == nullptr ? "" : std::string(r->str, r->len); }

bool SinkHolds(const std::vector<std::byte>& sink, const std::string& value) {
  return sink.size() == value.size() && std::memcmp(sink.data(), value.data(), value.size()) == 0;
}

}  // namespace

TEST_CASE("RedisClusterClient: bad options are refused, a Redis that is not up is not needed to open", "[redis]") {
  auto refused = [](RedisClusterClient::Options options, std::string_view why) {
    auto client = RedisClusterClient::Open(options);
    REQUIRE_FALSE(client.ok());
    CHECK(client.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(client.status().message()) == why);
  };
  refused(OptionsFor({}), "no Redis endpoint configured");
  refused(OptionsFor({"localhost"}), "endpoint 'localhost' is not host:port");
  refused(OptionsFor({"127.0.0.1:1", ":6379"}), "endpoint ':6379' is not host:port");
  refused(OptionsFor({"localhost:0"}), "endpoint 'localhost:0' is not host:port");
  refused(OptionsFor({"localhost:65536"}), "endpoint 'localhost:65536' is not host:port");
  RedisClusterClient::Options options = OptionsFor({"127.0.0.1:1"});
  options.connections = 0;
  refused(options, "connections must be above 0");
  options.connections = 1;
  options.command_timeout = milliseconds(0);
  refused(options, "timeouts must be above 0");

  auto down = OpenClient(OptionsFor({"127.0.0.1:1"}));
  CHECK_FALSE(down->is_cluster());
  CHECK(down->counters().errors == 1);  // the slot map could not be asked for
  CHECK(down->Masters().size() == 1);
}

TEST_CASE("RedisClusterClient: SET, GET and DEL on a single node, over one pooled connection", "[redis]") {
  auto redis = RedisServer::Start();
  REQUIRE(redis.ok());
  auto client = OpenClient(OptionsFor({redis->address()}));
  CHECK_FALSE(client->is_cluster());
  REQUIRE(client->Masters().size() == 1);

  // v2 under RespReader::kMaxKeptBulkBytes: a value read without a sink is kept up to that.
  const std::string v1 = std::string("one\0\r\n", 6), v2 = testing::TestText(2, 60000);
  auto replies = client->Execute({Set("k1", v1), Set("k2", v2, {"EX", "100"}), Cmd("GET", "k1"), Cmd("GET", "k2"),
                                  Cmd("GET", "missing"), Cmd("DEL", "k1"), Cmd("GET", "k1"), Cmd("INCR", "k2")});
  REQUIRE(replies.ok());
  REQUIRE(replies->size() == 8);
  const std::vector<RedisReply>& r = *replies;
  CHECK(r[0]->type == REDIS_REPLY_STATUS);
  CHECK(Text(r[0]) == "OK");
  CHECK(r[1]->type == REDIS_REPLY_STATUS);
  CHECK(Text(r[2]) == v1);
  CHECK(Text(r[3]) == v2);
  CHECK(r[4]->type == REDIS_REPLY_NIL);
  CHECK(r[5]->type == REDIS_REPLY_INTEGER);
  CHECK(r[5]->integer == 1);
  CHECK(r[6]->type == REDIS_REPLY_NIL);
  // An error reply is a reply: the command ran and Redis refused it.
  CHECK(r[7]->type == REDIS_REPLY_ERROR);
  CHECK(Text(r[7]).rfind("ERR", 0) == 0);

  const int ttl = std::stoi(redis->Command({"TTL", "k2"}).value_or("-1"));
  CHECK(ttl > 90);
  CHECK(ttl <= 100);
  CHECK(redis->Command({"EXISTS", "k1"}).value_or("") == "0");

  auto info = client->RunOn(*client->Masters()[0], Cmd("INFO", "memory"));
  REQUIRE(info.ok());
  CHECK(Text(*info).find("used_memory:") != std::string::npos);

  for (int i = 0; i < 20; ++i) REQUIRE(client->Execute({Cmd("EXISTS", "k2")}).ok());
  const RedisClusterClient::Counters c = client->counters();
  CHECK(c.connects == 1);  // the slot-map query's connection, reused by every call since
  CHECK(c.errors == 0);
  CHECK(c.moved == 0);
  CHECK(c.ask == 0);
}

TEST_CASE("RedisClusterClient: a GET's value can land in the caller's buffer", "[redis]") {
  // Through io_uring and through poll(2): the same driver, so the same answers.
  const bool use_io_uring = GENERATE(true, false);
  auto redis = RedisServer::Start();
  REQUIRE(redis.ok());
  RedisClusterClient::Options options = OptionsFor({redis->address()});
  options.use_io_uring = use_io_uring;
  auto client = OpenClient(options);
  const std::string big = testing::TestText(1, 300000), small = "small";
  REQUIRE(client->Execute({Set("big", big), Set("small", small)}).ok());

  std::vector<std::byte> exact(big.size()), wrong(big.size() - 1), spare(10);
  // The caller is told of the value's bytes as they land, in order.
  RedisCommand tracked = GetInto("big", exact);
  size_t landed = 0;
  bool in_order = true;
  tracked.on_landed = [&](std::span<const std::byte> piece) {
    in_order = in_order && piece.data() == exact.data() + landed;
    landed += piece.size();
  };
  auto replies = client->Execute({tracked, Cmd("EXISTS", "big"), GetInto("big", wrong), GetInto("missing", spare),
                                  GetInto("small", spare), Cmd("GET", "small")});
  REQUIRE(replies.ok());
  CHECK(landed == big.size());
  CHECK(in_order);
  const std::vector<RedisReply>& r = *replies;
  CHECK(r[0]->type == REDIS_REPLY_STRING);
  CHECK(r[0]->str == nullptr);  // it landed in the sink
  CHECK(r[0]->len == big.size());
  CHECK(SinkHolds(exact, big));
  CHECK(r[1]->integer == 1);
  // Neither the sink's size nor small enough to keep (a pipeline keeps headers, not stray values): read past, and
  // answered as an error reply of its own.
  CHECK(r[2]->type == REDIS_REPLY_ERROR);
  CHECK(Text(r[2]).find("not kept") != std::string::npos);
  CHECK(r[3]->type == REDIS_REPLY_NIL);
  CHECK(Text(r[4]) == small);
  CHECK(Text(r[5]) == small);

  // The connection came back in step: it serves the next call.
  REQUIRE(client->Execute({Cmd("GET", "small")}).ok());
  CHECK(client->counters().connects == 1);
  CHECK(client->counters().errors == 0);
}

TEST_CASE("RedisClusterClient: AUTH with a password, or an ACL user and its password, a wrong one is refused",
          "[redis]") {
  RedisServer::Options server_options;
  server_options.password = "s3cret";
  auto redis = RedisServer::Start(server_options);
  REQUIRE(redis.ok());
  REQUIRE(redis->Command({"ACL", "SETUSER", "cake", "on", ">pa55", "~*", "+@all"}).ok());
  const std::string value = "v";

  RedisClusterClient::Options options = OptionsFor({redis->address()});
  options.password = "s3cret";
  auto client = OpenClient(options);
  REQUIRE(client->Execute({Set("k", value)}).ok());

  options.user = "cake";
  options.password = "pa55";
  auto as_user = OpenClient(options);
  auto got = as_user->Execute({Cmd("GET", "k")});
  REQUIRE(got.ok());
  CHECK(Text((*got)[0]) == "v");

  options.password = "wrong";
  auto refused = OpenClient(options);
  auto status = refused->Execute({Cmd("GET", "k")}).status();
  CHECK(status.code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(status.message()).find("AUTH refused") != std::string::npos);
  CHECK(refused->counters().connects == 0);
}

TEST_CASE("RedisClusterClient: a node that is down fails fast during its back-off, which doubles", "[redis]") {
  auto redis = RedisServer::Start();
  REQUIRE(redis.ok());
  auto client = OpenClient(OptionsFor({redis->address()}));
  REQUIRE(client->Execute({Cmd("EXISTS", "k")}).ok());
  redis->Stop();

  // The next call finds the pooled connection closed, and marks the node down.
  auto first = client->Execute({Cmd("EXISTS", "k")});
  CHECK(first.status().code() == absl::StatusCode::kUnavailable);
  const auto down_at = SteadyClock::now();
  CHECK(client->counters().errors == 1);

  // During the back-off, calls fail without trying.
  auto fast = client->Execute({Cmd("EXISTS", "k")});
  CHECK(fast.status().code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(fast.status().message()).find("probing it in the background") != std::string::npos);
  CHECK(std::string(fast.status().message()).find(redis->address()) != std::string::npos);
  CHECK(client->counters().fast_failures == 1);
  CHECK(client->counters().errors == 1);

  // Tried again (by the prober) once the back-off is over (50 ms, then 100 ms): count the fast failures until it
  // is. The attempts are seen by polling every 5 ms, so a gap between two of them can look up to a poll shorter.
  auto next_attempt = [&] {
    const uint64_t errors = client->counters().errors;
    while (client->counters().errors == errors) {
      CHECK(client->Execute({Cmd("EXISTS", "k")}).status().code() == absl::StatusCode::kUnavailable);
      std::this_thread::sleep_for(milliseconds(5));
    }
    return SteadyClock::now();
  };
  const auto second_at = next_attempt();
  CHECK(second_at - down_at >= milliseconds(50 - 10));  // down_at is taken after the failure the back-off runs from
  const auto third_at = next_attempt();
  CHECK(third_at - second_at >= milliseconds(100 - 10));
  CHECK(client->counters().fast_failures > 2);
  CHECK(client->counters().connects == 1);  // refused connections are not counted
}

TEST_CASE("RedisClusterClient: a frozen server times out once, then fails fast until a probe sees it answer",
          "[redis]") {
  auto redis = RedisServer::Start();
  REQUIRE(redis.ok());
  RedisClusterClient::Options options = OptionsFor({redis->address()});
  options.command_timeout = milliseconds(200);
  options.max_backoff = milliseconds(200);
  auto client = OpenClient(options);
  auto other = OpenClient(options);  // a connection of its own, for hiredis' way of reading
  const std::string value = testing::TestText(5, 20000);
  REQUIRE(client->Execute({Set("k", value)}).ok());
  REQUIRE(other->Execute({Cmd("GET", "k")}).ok());
  std::vector<std::byte> sink(value.size());

  REQUIRE(kill(redis->pid(), SIGSTOP) == 0);
  // Both ways of reading replies time out: ours (into a sink) and hiredis'.
  auto start = SteadyClock::now();
  auto direct = client->Execute({GetInto("k", sink)});
  CHECK(direct.status().code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(direct.status().message()).find("no answer within 200 ms") != std::string::npos);
  CHECK(SteadyClock::now() - start < std::chrono::seconds(2));  // the timeout, not a hang
  start = SteadyClock::now();
  auto through_hiredis = other->Execute({Cmd("GET", "k")});
  CHECK(through_hiredis.status().code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(through_hiredis.status().message()).find("no answer within 200 ms") != std::string::npos);
  CHECK(SteadyClock::now() - start < std::chrono::seconds(2));

  // From then on no caller waits: the probes (a PING each back-off, on the client's own thread) do the waiting.
  const uint64_t errors = client->counters().errors;
  const auto frozen_until = SteadyClock::now() + milliseconds(1000);
  while (SteadyClock::now() < frozen_until) {
    start = SteadyClock::now();
    CHECK(client->Execute({GetInto("k", sink)}).status().code() == absl::StatusCode::kUnavailable);
    CHECK(SteadyClock::now() - start < milliseconds(100));
    std::this_thread::sleep_for(milliseconds(20));
  }
  CHECK(client->counters().errors > errors);  // probes that timed out
  REQUIRE(kill(redis->pid(), SIGCONT) == 0);

  bool back = false;
  for (int i = 0; i < 100 && !back; ++i) {
    auto got = client->Execute({GetInto("k", sink)});
    back = got.ok();
    if (!back) std::this_thread::sleep_for(milliseconds(20));
  }
  CHECK(back);
  CHECK(SinkHolds(sink, value));
}

TEST_CASE("RedisClusterClient: SET, GET and DEL on a Redis Cluster seeded with one node", "[redis][cluster]") {
  auto cluster = RedisCluster::Start(3);
  REQUIRE(cluster.ok());
  auto client = OpenClient(OptionsFor({cluster->addresses()[2]}));
  CHECK(client->is_cluster());
  CHECK(client->Masters().size() == 3);

  constexpr int kKeys = 30;
  std::vector<std::string> keys, values;
  for (int i = 0; i < kKeys; ++i) {
    keys.push_back(absl::StrCat("key-", i));
    values.push_back(testing::TestText(i, 1000 + i));
  }
  std::vector<RedisCommand> sets, gets, dels;
  for (int i = 0; i < kKeys; ++i) {
    sets.push_back(Set(keys[i], values[i]));
    gets.push_back(Cmd("GET", keys[i]));
    dels.push_back(Cmd("DEL", keys[i]));
  }
  REQUIRE(client->Execute(sets).ok());
  std::vector<int> per_node(3, 0);
  for (int i = 0; i < kKeys; ++i) {
    CAPTURE(keys[i]);
    // The one slot function agrees with Redis, and the key is where the slot map says.
    CHECK(absl::StrCat(RedisKeySlot(keys[i])) ==
          cluster->node(0).Command({"CLUSTER", "KEYSLOT", keys[i]}).value_or(""));
    auto owner = cluster->NodeForSlot(RedisKeySlot(keys[i]));
    REQUIRE(owner.ok());
    per_node[*owner]++;
    CHECK(cluster->node(*owner).Command({"GET", keys[i]}).value_or("") == values[i]);
  }
  for (int n : per_node) CHECK(n > 0);

  auto got = client->Execute(gets);
  REQUIRE(got.ok());
  for (int i = 0; i < kKeys; ++i) CHECK(Text((*got)[i]) == values[i]);
  auto deleted = client->Execute(dels);
  REQUIRE(deleted.ok());
  for (int i = 0; i < kKeys; ++i) CHECK((*deleted)[i]->integer == 1);
  got = client->Execute(gets);
  REQUIRE(got.ok());
  for (int i = 0; i < kKeys; ++i) CHECK((*got)[i]->type == REDIS_REPLY_NIL);
  CHECK(client->counters().moved == 0);  // the slot map was right from the start
  CHECK(client->counters().ask == 0);

  // Any seed that answers will do.
  auto second = OpenClient(OptionsFor({"127.0.0.1:1", cluster->addresses()[0]}));
  CHECK(second->is_cluster());
  CHECK(second->Masters().size() == 3);
}

TEST_CASE("RedisClusterClient: follows ASK while a slot migrates and MOVED once it has moved", "[redis][cluster]") {
  auto cluster = RedisCluster::Start(3);
  REQUIRE(cluster.ok());
  auto client = OpenClient(OptionsFor({cluster->addresses()[0]}));
  const std::string gone = "{mig}gone", stays = "{mig}stays", fresh = "{mig}fresh";
  const std::string gone_value = testing::TestText(1, 50000), stays_value = testing::TestText(2, 30000),
                    fresh_value = "new";
  REQUIRE(client->Execute({Set(gone, gone_value), Set(stays, stays_value)}).ok());
  const int slot = RedisKeySlot(gone);
  const int from = cluster->NodeForSlot(slot).value();
  const int to = (from + 1) % 3;

  REQUIRE(cluster->BeginSlotMigration(slot, from, to).ok());
  REQUIRE(cluster->MigrateKeys(slot, from, to, {gone}).ok());
  // The source answers ASK for what went ahead (and for a key it does not have); the rest it still serves.
  std::vector<std::byte> gone_sink(gone_value.size()), stays_sink(stays_value.size());
  auto replies = client->Execute(
      {GetInto(gone, gone_sink), GetInto(stays, stays_sink), Cmd("GET", gone), Set(fresh, fresh_value)});
  REQUIRE(replies.ok());
  CHECK(SinkHolds(gone_sink, gone_value));
  CHECK(SinkHolds(stays_sink, stays_value));
  CHECK(Text((*replies)[2]) == gone_value);
  CHECK((*replies)[3]->type == REDIS_REPLY_STATUS);  // written on the target, after ASKING
  CHECK(client->counters().ask == 3);
  CHECK(client->counters().moved == 0);  // the slot is still the source's

  REQUIRE(cluster->MigrateAllKeys(slot, from, to).ok());
  REQUIRE(cluster->FinishSlotMigration(slot, from, to).ok());
  std::fill(gone_sink.begin(), gone_sink.end(), std::byte{0});
  replies = client->Execute({GetInto(gone, gone_sink), Cmd("GET", stays), Cmd("GET", fresh)});
  REQUIRE(replies.ok());
  CHECK(SinkHolds(gone_sink, gone_value));
  CHECK(Text((*replies)[1]) == stays_value);
  CHECK(Text((*replies)[2]) == fresh_value);
  const uint64_t moved = client->counters().moved;
  CHECK(moved >= 1);  // the old owner redirected
  // The map was updated: the new owner is asked directly from now on.
  replies = client->Execute({Cmd("GET", gone), Cmd("GET", stays)});
  REQUIRE(replies.ok());
  CHECK(Text((*replies)[0]) == gone_value);
  CHECK(client->counters().moved == moved);
}

TEST_CASE("RedisClusterClient: a dead master fails its own slots only, allow_partial still answers the others",
          "[redis][cluster]") {
  auto cluster = RedisCluster::Start(3);
  REQUIRE(cluster.ok());
  RedisClusterClient::Options options = OptionsFor({cluster->addresses()[0]});
  options.command_timeout = milliseconds(500);
  auto client = OpenClient(options);
  constexpr int kKeys = 30;
  std::vector<std::string> keys, values;
  std::vector<RedisCommand> sets, gets, live_gets;
  for (int i = 0; i < kKeys; ++i) {
    keys.push_back(absl::StrCat("key-", i));
    values.push_back(absl::StrCat("value-", i));
  }
  std::vector<bool> on_dead(kKeys);
  for (int i = 0; i < kKeys; ++i) {
    sets.push_back(Set(keys[i], values[i]));
    gets.push_back(Cmd("GET", keys[i]));
    on_dead[i] = cluster->NodeForSlot(RedisKeySlot(keys[i])).value() == 1;
    if (!on_dead[i]) live_gets.push_back(Cmd("GET", keys[i]));
  }
  REQUIRE(client->Execute(sets).ok());
  REQUIRE(live_gets.size() < static_cast<size_t>(kKeys));
  REQUIRE(!live_gets.empty());

  cluster->node(1).Kill();
  auto all = client->Execute(gets);
  REQUIRE_FALSE(all.ok());
  CHECK(all.status().code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(all.status().message()).find(cluster->node(1).address()) != std::string::npos);

  auto partial = client->Execute(gets, /*allow_partial=*/true);
  REQUIRE(partial.ok());
  for (int i = 0; i < kKeys; ++i) {
    CAPTURE(i);
    if (on_dead[i]) {
      CHECK((*partial)[i] == nullptr);
    } else {
      REQUIRE((*partial)[i] != nullptr);
      CHECK(Text((*partial)[i]) == values[i]);
    }
  }

  auto live = client->Execute(live_gets);
  REQUIRE(live.ok());
  CHECK(client->Masters().size() == 3);  // the slot map still names it: no failover without replicas
}

TEST_CASE("RedisClusterClient: a master killed or failed over hands its slots to its replica and no reply is wrong",
          "[redis][cluster][failover]") {
  auto cluster = RedisCluster::Start(3, 1);
  REQUIRE(cluster.ok());
  REQUIRE(cluster->size() == 6);
  // Seeded with one master only: the replicas it must go to after a failover are learned from the slot map.
  RedisClusterClient::Options options = OptionsFor({cluster->addresses()[0]});
  options.command_timeout = milliseconds(500);
  auto client = OpenClient(options);
  REQUIRE(client->Masters().size() == 3);

  constexpr int kKeys = 60;
  std::vector<std::string> keys, values;
  std::vector<RedisCommand> sets, gets;
  std::vector<int> owner(kKeys);
  for (int i = 0; i < kKeys; ++i) {
    keys.push_back(absl::StrCat("failover-", i));
    values.push_back(testing::TestText(i, 200 + i));
  }
  for (int i = 0; i < kKeys; ++i) {
    sets.push_back(Set(keys[i], values[i]));
    gets.push_back(Cmd("GET", keys[i]));
    owner[i] = cluster->NodeForSlot(RedisKeySlot(keys[i])).value();
  }
  REQUIRE(client->Execute(sets).ok());
  for (int m = 0; m < 3; ++m) REQUIRE(cluster->WaitForReplicas(m).ok());
  REQUIRE(std::count(owner.begin(), owner.end(), 1) > 0);
  REQUIRE(std::count(owner.begin(), owner.end(), 2) > 0);

  // Every reply that comes is the value stored; a key on a node that cannot answer gets no reply (a miss).
  // Returns how many keys were answered.
  auto read_all = [&] {
    auto got = client->Execute(gets, /*allow_partial=*/true);
    REQUIRE(got.ok());
    int answered = 0, wrong = 0;
    for (int i = 0; i < kKeys; ++i) {
      if ((*got)[i] == nullptr) continue;
      wrong += Text((*got)[i]) != values[i];
      answered++;
    }
    CHECK(wrong == 0);
    return answered;
  };
  REQUIRE(read_all() == kKeys);

  {
    INFO("master 1 killed: its keys are misses until its replica is promoted, then the replica serves them");
    const size_t replica = cluster->ReplicasOf(1).at(0);
    cluster->node(1).Kill();
    const int while_down = read_all();
    CHECK(while_down == kKeys - std::count(owner.begin(), owner.end(), 1));
    // Reads go on meanwhile, each answered or a miss at once: the dead node is backing off.
    const auto promoted_by = SteadyClock::now() + std::chrono::seconds(15);
    while (SteadyClock::now() < promoted_by && cluster->Role(replica).value_or("") != "master") {
      const auto start = SteadyClock::now();
      read_all();
      CHECK(SteadyClock::now() - start < milliseconds(400));
      std::this_thread::sleep_for(milliseconds(50));
    }
    REQUIRE(cluster->WaitUntilMaster(replica).ok());
    // The client learns the new owner without a MOVED (the dead node sends none) from the map another node gives.
    const auto learned_by = SteadyClock::now() + std::chrono::seconds(3);
    while (read_all() != kKeys && SteadyClock::now() < learned_by) std::this_thread::sleep_for(milliseconds(10));
    CHECK(read_all() == kKeys);
    CHECK(client->Masters().size() == 3);
    // Writes to those slots land on the new master.
    const int moved_key = static_cast<int>(std::find(owner.begin(), owner.end(), 1) - owner.begin());
    const std::string fresh = "written after the failover";
    REQUIRE(client->Execute({Set(keys[moved_key], fresh)}).ok());
    CHECK(cluster->node(replica).Command({"GET", keys[moved_key]}).value_or("") == fresh);
    values[moved_key] = fresh;
  }

  {
    INFO("master 2 failed over by hand, then killed: no call fails, the old master's MOVED leads to the new one");
    const size_t replica = cluster->ReplicasOf(2).at(0);
    REQUIRE(cluster->Failover(replica).ok());
    auto got = client->Execute(gets);
    REQUIRE(got.ok());
    for (int i = 0; i < kKeys; ++i) CHECK(Text((*got)[i]) == values[i]);
    cluster->node(2).Kill();
    got = client->Execute(gets);
    REQUIRE(got.ok());
    for (int i = 0; i < kKeys; ++i) CHECK(Text((*got)[i]) == values[i]);
    CHECK(client->Masters().size() == 3);
  }
}

}  // namespace cake

namespace cake {
namespace {

// A hostile "Redis": a TCP listener on loopback that accepts AUTH and answers every other command with `reply`,
// and counts the connections it took and the bytes it was sent (to see whether a client ever came, and with what).
class HostilePeer {
 public:
  explicit HostilePeer(std::string reply) : reply_(std::move(reply)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    socklen_t len = sizeof(addr);
    REQUIRE(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port_ = ntohs(addr.sin_port);
    REQUIRE(listen(fd_, 16) == 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~HostilePeer() {
    stopping_ = true;
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int port() const { return port_; }
  int connections() const { return connections_.load(); }
  std::string received() {
    std::lock_guard lock(mu_);
    return received_;
  }

 private:
  void Serve() {
    while (!stopping_) {
      const int c = accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      ++connections_;
      char buf[4096];
      for (;;) {
        pollfd p{c, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) {
          if (stopping_) break;
          continue;
        }
        const ssize_t n = recv(c, buf, sizeof(buf), 0);
        if (n <= 0) break;
        {
          std::lock_guard lock(mu_);
          received_.append(buf, n);
        }
        // One answer per command: each command of a pipeline starts with '*' at the start of a line.
        int commands = 0;
        for (ssize_t i = 0; i < n; ++i) commands += buf[i] == '*' && (i == 0 || buf[i - 1] == '\n');
        const bool auth = std::string_view(buf, n).find("AUTH") != std::string_view::npos;
        std::string out;
        for (int i = 0; i < std::max(commands, 1); ++i) out += auth ? "+OK\r\n" : reply_;
        if (send(c, out.data(), out.size(), MSG_NOSIGNAL) < 0) break;
      }
      close(c);
    }
  }

  const std::string reply_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> connections_{0};
  std::mutex mu_;
  std::string received_;
  std::thread thread_;
};

}  // namespace

TEST_CASE("RedisClusterClient: a redirect to a node no seed or slot map named is not followed", "[redis][hostile]") {
  // The node a hostile server would send our password to, and the hostile server itself.
  HostilePeer elsewhere("+OK\r\n");
  const std::string redirect = GENERATE(std::string("MOVED"), std::string("ASK"));
  CAPTURE(redirect);
  HostilePeer seed(absl::StrCat("-", redirect, " 1 127.0.0.1:", elsewhere.port(), "\r\n"));
  RedisClusterClient::Options options = OptionsFor({seed.address()});
  options.password = "secret-password";
  options.command_timeout = milliseconds(500);
  auto client = OpenClient(options);

  auto got = client->Execute({Cmd("GET", "some-key")});
  CHECK_FALSE(got.ok());  // the redirects never end, and none is followed
  CHECK(client->counters().redirects_refused >= 1);
  CHECK(client->counters().moved == 0);
  CHECK(client->counters().ask == 0);
  CHECK(elsewhere.connections() == 0);  // never connected, so never sent AUTH there
  CHECK(elsewhere.received().find("secret-password") == std::string::npos);
  CHECK(client->Masters().size() == 1);  // the node list did not grow
}

}  // namespace cake
