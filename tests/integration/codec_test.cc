// The chunk codec through real daemons: a disk tier and a remote tier with codec = "planes-zstd" store chunks
// encoded and load them back byte for byte (after a restart, and from another daemon sharing the Redis), and a
// daemon without the codec never takes the encoded chunks for raw bytes: they are misses it computes.
#include <filesystem>

#include "testing/redis_process.h"
#include "tests/integration/fixture.h"

using namespace cake;
using namespace cake::testing;

TEST_CASE("a disk tier with the planes-zstd codec loads bit-exact across restarts and is a miss to one without it",
          "[codec][disk]") {
  ScratchFolder root;
  const auto ns = SmallNamespace(64);
  const uint64_t chunk_bytes = 64 * kSmallBytesPerToken;
  const auto tokens = Tokens(64 * 10);
  {
    auto daemon = StartDaemon({"--disk-root", root.path, "--disk-codec", "planes-zstd"});
    auto client = Connect(daemon);
    StorePrompt(*client, ns, tokens, 23, 10, chunk_bytes);
    REQUIRE(Eventually([&] { return Counter(*client, "tier_disk_codec_chunks_encoded") == 10; }));
    CHECK(Counter(*client, "tier_disk_codec_raw_bytes_encoded") == 10 * chunk_bytes);
    CHECK(Counter(*client, "tier_disk_codec_stored_bytes_encoded") > 0);
    CHECK(daemon.Stop() == 0);
  }
  {
    auto daemon = StartDaemon({"--disk-root", root.path, "--disk-codec", "planes-zstd"});
    auto client = Connect(daemon);
    auto lookup = client->Lookup(ns, {tokens, {}});
    REQUIRE(lookup.ok());
    REQUIRE(lookup->cached_chunks == 10);
    for (TierKind t : lookup->tiers) CHECK(t == TierKind::kDisk);
    const auto done = LoadAndVerify(*client, ns, tokens, 23);
    CHECK(done.failed_chunks == 0);
    CHECK(done.loaded_chunks == 10 - done.meeting_chunk);
    CHECK(Counter(*client, "tier_disk_codec_chunks_decoded") == done.loaded_chunks);
    // Verify decodes every chunk too: all good, and the raw bytes counted.
    const auto verified = Run(std::string(CAKE_CAKECTL_PATH) + " --socket " + daemon.socket_path() + " verify");
    CHECK(verified.exit_code == 0);
    CHECK_THAT(verified.output, Catch::Contains("10 chunks (640.0 KiB) checked"));
    CHECK(daemon.Stop() == 0);
  }
  // The same folder without the codec: the encoded chunks live under keys it never asks for.
  auto daemon = StartDaemon({"--disk-root", root.path});
  CHECK(daemon.log().find("recovered 10 chunks") != std::string::npos);
  auto client = Connect(daemon);
  auto lookup = client->Lookup(ns, {tokens, {}});
  REQUIRE(lookup.ok());
  CHECK(lookup->cached_chunks == 0);
}

TEST_CASE("a remote tier with the planes-zstd codec: what one daemon stores another loads bit-exact",
          "[codec][remote]") {
  auto redis = RedisServer::Start();
  REQUIRE(redis.ok());
  const auto ns = SmallNamespace(64);
  const uint64_t chunk_bytes = 64 * kSmallBytesPerToken;
  const auto tokens = Tokens(64 * 8);
  {
    auto writer = StartDaemon({"--remote", redis->address(), "--remote-codec", "planes-zstd"});
    auto client = Connect(writer);
    StorePrompt(*client, ns, tokens, 29, 8, chunk_bytes);
    REQUIRE(Eventually([&] { return Counter(*client, "tier_remote_codec_chunks_encoded") == 8; }));
  }
  {
    auto without = StartDaemon({"--remote", redis->address()});
    auto client = Connect(without);
    auto lookup = client->Lookup(ns, {tokens, {}});
    REQUIRE(lookup.ok());
    CHECK(lookup->cached_chunks == 0);
  }
  auto reader = StartDaemon({"--remote", redis->address(), "--remote-codec", "planes-zstd"});
  auto client = Connect(reader);
  auto lookup = client->Lookup(ns, {tokens, {}});
  REQUIRE(lookup.ok());
  REQUIRE(lookup->cached_chunks == 8);
  const auto done = LoadAndVerify(*client, ns, tokens, 29);
  CHECK(done.failed_chunks == 0);
  CHECK(Counter(*client, "tier_remote_codec_chunks_decoded") >= done.loaded_chunks);
}
