// The remote tier through real caked daemons and real Redis servers: two daemons share one Redis Cluster (what
// the first stores, the second loads, byte for byte), a Redis master killed in the middle of a load (the load
// completes, the engine computes what did not arrive), a remote that is down when the daemon starts, and an
// engine with no shared region (bytes inline on the stream) storing and loading through the remote tier, and a
// frozen Redis that holds up only the calls that need it.
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "testing/redis_process.h"
#include "tests/integration/fixture.h"

using namespace cake;
using namespace cake::testing;

namespace {

// A daemon whose remote tier is `redis`, with a command timeout far beyond any test: while Redis is stopped,
// nothing that asks it can finish until it continues.
SpawnedDaemon DaemonWithPatientRedis(const RedisServer& redis, std::vector<std::string> extra_args = {}) {
  char dir[] = "/tmp/cake-patient-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  // More calls at once on one connection than the default allows: the frozen-Redis tests queue 1100.
  const std::string config = WriteFile(
      dir, "caked.toml", "[server]\nmax_streams_per_connection = 2048\n[remote]\ncommand_timeout_ms = 60000\n");
  std::vector<std::string> args = {"--config", config, "--remote", redis.address()};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  auto daemon = StartDaemon(args);
  std::filesystem::remove_all(dir);
  return daemon;
}

std::string Seeds(const RedisCluster& cluster) {
  std::string out;
  for (const std::string& a : cluster.addresses()) out += (out.empty() ? "" : ",") + a;
  return out;
}

// Stores chunks [0, count) through a short-lived daemon and waits until every one of them has reached Redis.
void StoreIntoRedis(const std::string& endpoints, const NamespaceSpec& ns, const std::vector<uint32_t>& tokens,
                    uint32_t seed, uint32_t count, uint64_t chunk_bytes) {
  auto writer = StartDaemon({"--remote", endpoints});
  auto client = Connect(writer);
  StorePrompt(*client, ns, tokens, seed, count, chunk_bytes);
  REQUIRE(Eventually([&] { return Counter(*client, "write_back_written") == count; }));
}

}  // namespace

TEST_CASE("two daemons share one Redis Cluster: what one stores, the other loads", "[remote][cluster]") {
  auto cluster = RedisCluster::Start(3);
  REQUIRE(cluster.ok());
  const auto ns = SmallNamespace(64);
  const uint64_t chunk_bytes = 64 * kSmallBytesPerToken;
  const auto tokens = Tokens(64 * 16);
  auto writer = StartDaemon({"--remote", Seeds(*cluster)});
  // Unset, remote.read_threads follows the masters the daemon found: one each.
  CHECK(writer.log().find("chunks read on 3 threads (one per master") != std::string::npos);
  auto writer_client = Connect(writer);
  StorePrompt(*writer_client, ns, tokens, 41, 16, chunk_bytes);
  REQUIRE(Eventually([&] { return Counter(*writer_client, "write_back_written") == 16; }));
  CHECK(Counter(*writer_client, "tier_remote_errors") == 0);

  // The reader is seeded with one node only, cuts values into parts of another size than the writer's, and reads
  // Redis with one thread (remote.read_threads) under a window of 8: the reads wait their turn, none is refused.
  const std::string config =
      WriteFile(writer.run_dir(), "reader.toml", "[remote]\npart_bytes = 16384\nread_threads = 1\n");
  auto reader = StartDaemon({"--config", config, "--remote", cluster->addresses()[1], "--window", "8"});
  CHECK(reader.log().find("chunks read on 1 threads (remote.read_threads)") != std::string::npos);
  auto reader_client = Connect(reader, "engine-b");
  auto lookup = reader_client->Lookup(ns, {tokens, {}});
  REQUIRE(lookup.ok());
  REQUIRE(lookup->cached_chunks == 16);
  for (TierKind t : lookup->tiers) CHECK(t == TierKind::kRemote);

  auto region = reader_client->RegisterRegion(16 * chunk_bytes);
  REQUIRE(region.ok());
  auto done = LoadAndVerify(*reader_client, ns, tokens, 41, &*region);
  CHECK(done.meeting_chunk == 0);
  CHECK(done.loaded_chunks == 16);
  CHECK(done.failed_chunks == 0);
  // Promoted into the reader's DRAM: the next lookup finds it there.
  REQUIRE(Eventually([&] {
    auto again = reader_client->Lookup(ns, {tokens, {}});
    return again.ok() && again->cached_chunks == 16 && again->tiers.back() == TierKind::kDram;
  }));
}

TEST_CASE("a Redis master killed mid-load: the load completes and the engine computes what did not arrive",
          "[remote][cluster]") {
  auto cluster = RedisCluster::Start(3);
  REQUIRE(cluster.ok());
  const auto ns = SmallNamespace(64);
  const uint64_t chunk_bytes = 64 * kSmallBytesPerToken;
  constexpr uint32_t kChunks = 48;
  const auto tokens = Tokens(64 * kChunks);
  StoreIntoRedis(Seeds(*cluster), ns, tokens, 43, kChunks, chunk_bytes);
  // Remote reads capped so the load takes about a second: 48 x 64 KiB at 0.025 Gbit/s.
  auto daemon = StartDaemon({"--remote", Seeds(*cluster), "--remote-read-gbps", "0.025", "--window", "2"});
  auto client = Connect(daemon);
  LoadOptions options{ns, {tokens, {}}, nullptr};
  options.io_only = true;
  auto session = client->StartLoad(options);
  REQUIRE(session.ok());
  auto plan = session.value()->WaitPlan();
  REQUIRE(plan.ok());
  REQUIRE(plan->cached_chunks == kChunks);
  // Once the tail has arrived, a master dies.
  REQUIRE(Eventually([&] { return session.value()->IsResident(kChunks - 4); }));
  cluster->node(0).Kill();
  auto done = session.value()->WaitDone();
  REQUIRE(done.ok());
  CHECK(done->failed_chunks >= 1);  // node 0 owns a third of the slots: some chunk below the tail was there
  CHECK(done->meeting_chunk >= 1);
  CHECK(done->meeting_chunk < kChunks - 3);
  CHECK(done->loaded_chunks == kChunks - done->meeting_chunk);
  for (uint32_t c = done->meeting_chunk; c < kChunks; ++c) {
    INFO("chunk " << c);
    REQUIRE(
        ChunkMatches(reinterpret_cast<const std::byte*>(session.value()->InlineChunk(c).data()), chunk_bytes, 43, c));
  }
  REQUIRE(session.value()->Release().ok());
  CHECK(Counter(*client, "tier_remote_errors") >= 1);
  // The daemon goes on serving: a lookup answers (the dead node's chunks are simply not found).
  auto lookup = client->Lookup(ns, {tokens, {}});
  REQUIRE(lookup.ok());
}

TEST_CASE("a remote that is down at start-up: the daemon serves from its own tiers", "[remote]") {
  // Nothing listens on port 1.
  auto daemon = StartDaemon({"--remote", "127.0.0.1:1"});
  CHECK(daemon.log().find("does not answer yet") != std::string::npos);
  // How many masters is not known: as many read threads as loader.io_threads (4).
  CHECK(daemon.log().find("chunks read on 4 threads (Redis did not answer") != std::string::npos);
  auto client = Connect(daemon);
  const auto ns = SmallNamespace(64);
  const uint64_t chunk_bytes = 64 * kSmallBytesPerToken;
  const auto tokens = Tokens(64 * 4);
  StorePrompt(*client, ns, tokens, 47, 4, chunk_bytes);
  auto done = LoadAndVerify(*client, ns, tokens, 47);
  CHECK(done.loaded_chunks == 4);
  CHECK(Eventually([&] { return Counter(*client, "write_back_failed") == 4; }));
}

TEST_CASE("an engine with no shared region stores and loads inline through the remote tier", "[remote][inline]") {
  auto redis = RedisServer::Start();
  REQUIRE(redis.ok());
  const auto ns = SmallNamespace(64);
  const uint64_t chunk_bytes = 64 * kSmallBytesPerToken;
  const auto tokens = Tokens(64 * 6);
  {
    auto daemon = StartDaemon({"--remote", redis->address()});
    // One server: two read threads, so it never waits a round trip between one chunk and the next.
    CHECK(daemon.log().find("chunks read on 2 threads (one per master, at least 2") != std::string::npos);
    auto client = Connect(daemon);
    std::vector<std::string> chunks(6, std::string(chunk_bytes, '\0'));
    for (uint32_t i = 0; i < 6; ++i) FillChunk(reinterpret_cast<std::byte*>(chunks[i].data()), chunk_bytes, 53, i);
    std::vector<std::string_view> views(chunks.begin(), chunks.end());
    auto stored = client->StoreInline(ns, {tokens, {}}, 0, views);
    REQUIRE(stored.ok());
    CHECK(stored->stored_chunks == 6);
    REQUIRE(Eventually([&] { return Counter(*client, "write_back_written") == 6; }));
  }
  // A fresh daemon: nothing in its DRAM, everything in Redis.
  auto daemon = StartDaemon({"--remote", redis->address()});
  auto client = Connect(daemon);
  auto done = LoadAndVerify(*client, ns, tokens, 53);
  CHECK(done.meeting_chunk == 0);
  CHECK(done.loaded_chunks == 6);
}

TEST_CASE("remote.promote_to_disk keeps a remote hit on the local disk as well", "[remote][disk]") {
  auto redis = RedisServer::Start();
  REQUIRE(redis.ok());
  const auto ns = SmallNamespace(64);
  const uint64_t chunk_bytes = 64 * kSmallBytesPerToken;
  const auto tokens = Tokens(64 * 8);
  StoreIntoRedis(redis->address(), ns, tokens, 59, 8, chunk_bytes);
  char dir[] = "/tmp/cake-promote-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string root = std::string(dir) + "/disk";
  const std::string config = WriteFile(dir, "promote.toml", "[remote]\npromote_to_disk = true\n");
  auto daemon = StartDaemon({"--config", config, "--remote", redis->address(), "--disk-root", root});
  auto client = Connect(daemon);
  auto done = LoadAndVerify(*client, ns, tokens, 59);
  CHECK(done.loaded_chunks == 8);
  REQUIRE(Eventually([&] { return Counter(*client, "write_back_promoted_to_disk") == 8; }));
  CHECK(Counter(*client, "tier_disk_chunks") == 8);
  REQUIRE(client->Evict(TierKind::kDram).ok());
  auto lookup = client->Lookup(ns, {tokens, {}});
  REQUIRE(lookup.ok());
  REQUIRE(lookup->cached_chunks == 8);
  for (TierKind t : lookup->tiers) CHECK(t == TierKind::kDisk);
  done = LoadAndVerify(*client, ns, tokens, 59);
  CHECK(done.loaded_chunks == 8);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a frozen Redis delays only the calls that need it: Ping and a DRAM load go on", "[remote][frozen]") {
  auto redis = RedisServer::Start();
  REQUIRE(redis.ok());
  const auto ns = SmallNamespace(64);
  const uint64_t chunk_bytes = 64 * kSmallBytesPerToken;
  const auto in_dram = Tokens(64 * 8, 1);
  const auto nowhere = Tokens(64 * 8, 2);
  auto daemon = DaemonWithPatientRedis(*redis);
  auto client = Connect(daemon);
  StorePrompt(*client, ns, in_dram, 61, 8, chunk_bytes);
  REQUIRE(Eventually([&] { return Counter(*client, "write_back_written") == 8; }));

  REQUIRE(kill(redis->pid(), SIGSTOP) == 0);
  // More calls waiting on Redis than gRPC keeps threads for by default: Lookups and Loads of a prompt DRAM lacks
  // (so Redis must be asked), and Status (Redis's memory figures, unless the last ones are under a second old).
  constexpr int kWaiting = 24;
  std::atomic<int> answered{0}, failed{0}, statuses{0};
  std::vector<std::thread> waiting;
  for (int i = 0; i < kWaiting; ++i) {
    waiting.emplace_back([&, i] {
      auto c = Client::Connect({daemon.socket_path(), absl::StrCat("waiter-", i)});
      if (!c.ok()) return (void)++failed;
      bool ok = false;
      if (i % 3 == 0) {
        auto session = (*c)->StartLoad(LoadOptions{ns, {nowhere, {}}, nullptr});
        ok = session.ok() && (*session)->WaitPlan().ok() && (*session)->Release().ok();
      } else if (i % 3 == 1) {
        ok = (*c)->Lookup(ns, {nowhere, {}}).ok();
      } else {
        if ((*c)->Status().ok()) ++statuses;
        return;
      }
      ++(ok ? answered : failed);
    });
  }
  // Give them time to reach the daemon and block there.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));

  // Meanwhile the daemon serves everyone else: Ping, and a load that DRAM holds whole, byte for byte.
  for (int i = 0; i < 20; ++i) REQUIRE(client->Ping().ok());
  auto done = LoadAndVerify(*client, ns, in_dram, 61);
  CHECK(done.loaded_chunks == 8);
  auto lookup = client->Lookup(ns, {in_dram, {}});
  REQUIRE(lookup.ok());
  CHECK(lookup->cached_chunks == 8);
  // An engine that gives up on a load stuck behind Redis gets its stream back at once (its Start's lookup
  // holds no thread the stream needs).
  auto stuck = client->StartLoad(LoadOptions{ns, {nowhere, {}}, nullptr});
  REQUIRE(stuck.ok());
  CHECK((*stuck)->Release().ok());
  CHECK(answered.load() == 0);  // every lookup and load that needs Redis is still waiting for it
  CHECK(failed.load() == 0);

  // Redis comes back: each waiting call gets its answer.
  REQUIRE(kill(redis->pid(), SIGCONT) == 0);
  for (auto& t : waiting) t.join();
  CHECK(answered.load() == kWaiting * 2 / 3);
  CHECK(failed.load() == 0);
  CHECK(statuses.load() == kWaiting / 3);
}

TEST_CASE("with more calls waiting on a frozen Redis than the daemon queues, Lookups answer from memory at once",
          "[remote][frozen]") {
  auto redis = RedisServer::Start();
  REQUIRE(redis.ok());
  const auto ns = SmallNamespace(64);
  const uint64_t chunk_bytes = 64 * kSmallBytesPerToken;
  const auto tokens = Tokens(64 * 4, 3);
  auto daemon = DaemonWithPatientRedis(*redis);
  auto client = Connect(daemon);
  RawStubs raw(daemon);
  StorePrompt(*client, ns, tokens, 62, 4, chunk_bytes);
  REQUIRE(Eventually([&] { return Counter(*client, "write_back_written") == 4; }));
  REQUIRE(client->Evict(TierKind::kDram).ok());  // Redis alone holds the prompt now: every Lookup of it must ask Redis

  REQUIRE(kill(redis->pid(), SIGSTOP) == 0);
  // The network-call threads (4) and their queue (1024) fill up; the calls past them are answered at once, with
  // the prefix DRAM and disk hold (none of it), instead of waiting too.
  constexpr int kCalls = 1100;
  constexpr int kQueued = 4 + 1024;  // DaemonState::kNetworkCallThreads + kNetworkCallQueue
  v1::LookupRequest request;
  ToProto(ns, request.mutable_namespace_());
  for (uint32_t t : tokens) request.mutable_prompt()->add_tokens(t);
  grpc::CompletionQueue cq;
  struct Call {
    grpc::ClientContext context;
    v1::LookupResponse response;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::LookupResponse>> reader;
  };
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < kCalls; ++i) {
    calls.push_back(std::make_unique<Call>());
    Call& call = *calls.back();
    call.reader = raw.kv->AsyncLookup(&call.context, request, &cq);
    call.reader->Finish(&call.response, &call.status, &call);
  }
  int early = 0;
  const auto frozen_until = std::chrono::system_clock::now() + std::chrono::seconds(5);
  while (early < kCalls - kQueued) {
    void* tag = nullptr;
    bool ok = false;
    if (cq.AsyncNext(&tag, &ok, frozen_until) != grpc::CompletionQueue::GOT_EVENT) break;
    const Call& call = *static_cast<Call*>(tag);
    REQUIRE(call.status.ok());
    CHECK(call.response.total_chunks() == 4);
    CHECK(call.response.cached_chunks() == 0);  // what memory holds; Redis, frozen, answered nothing
    ++early;
  }
  CHECK(early == kCalls - kQueued);
  // Status and Stats, which ask Redis for its memory figures, are refused rather than queued behind them.
  grpc::ClientContext status_context;
  v1::StatusResponse status;
  CHECK(raw.admin->Status(&status_context, v1::StatusRequest(), &status).error_code() ==
        grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(client->Ping().ok());

  // Redis comes back: every queued Lookup gets its full answer.
  REQUIRE(kill(redis->pid(), SIGCONT) == 0);
  int late = 0, full = 0;
  for (; early + late < kCalls; ++late) {
    void* tag = nullptr;
    bool ok = false;
    REQUIRE(cq.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + std::chrono::seconds(60)) ==
            grpc::CompletionQueue::GOT_EVENT);
    const Call& call = *static_cast<Call*>(tag);
    REQUIRE(call.status.ok());
    full += call.response.cached_chunks() == 4;
  }
  CHECK(full == kQueued);
  CHECK(Counter(*client, "lookups_network_skipped") == static_cast<uint64_t>(kCalls - kQueued));
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
}

TEST_CASE("a Redis that freezes mid-load holds none of the threads a DRAM load reads on", "[remote][frozen]") {
  auto redis = RedisServer::Start();
  REQUIRE(redis.ok());
  const auto ns = SmallNamespace(64);
  const uint64_t chunk_bytes = 64 * kSmallBytesPerToken;
  const auto remote_only = Tokens(64 * 8, 4);
  const auto in_dram = Tokens(64 * 8, 5);
  // One I/O thread: shared with the remote tier's reads, a frozen Redis would hold it for the command timeout.
  // The remote reads are capped (64 KiB in ~50 ms), so most of them are still to come when Redis freezes.
  auto daemon = DaemonWithPatientRedis(*redis, {"--io-threads", "1", "--remote-read-gbps", "0.01"});
  auto client = Connect(daemon);
  StorePrompt(*client, ns, remote_only, 63, 8, chunk_bytes);
  REQUIRE(Eventually([&] { return Counter(*client, "write_back_written") == 8; }));
  REQUIRE(client->Evict(TierKind::kDram).ok());
  StorePrompt(*client, ns, in_dram, 64, 8, chunk_bytes);

  LoadOptions from_redis{ns, {remote_only, {}}, nullptr};
  from_redis.io_only = true;
  auto stuck = client->StartLoad(from_redis);
  REQUIRE(stuck.ok());
  auto plan = (*stuck)->WaitPlan();
  REQUIRE(plan.ok());
  REQUIRE(plan->cached_chunks == 8);
  REQUIRE(kill(redis->pid(), SIGSTOP) == 0);

  // Redis holds the remote reads (for up to a minute); the DRAM load goes through on its own thread, byte for byte,
  // long before the command timeout would have freed a shared one (no Stats here: it would ask the frozen Redis).
  const auto dram_start = std::chrono::steady_clock::now();
  auto done = LoadAndVerify(*client, ns, in_dram, 64);
  CHECK(done.loaded_chunks == 8);
  CHECK(std::chrono::steady_clock::now() - dram_start < std::chrono::seconds(30));

  REQUIRE(kill(redis->pid(), SIGCONT) == 0);
  auto finished = (*stuck)->WaitDone();
  REQUIRE(finished.ok());
  CHECK(finished->loaded_chunks + finished->failed_chunks == 8);
  CHECK((*stuck)->Release().ok());
}
