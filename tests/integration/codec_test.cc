// The chunk codec through real daemons: a disk tier and a remote tier with codec = "planes-zstd" store chunks
// encoded and load them back byte for byte (after a restart, and from another daemon sharing the Redis), and a
// daemon without the codec never takes the encoded chunks for raw bytes: they are misses it computes.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "storage/codec_tier.h"
#include "storage/lossy_codec.h"
#include "storage/remote_codec.h"
#include "storage/remote_tier.h"
#include "testing/redis_process.h"
#include "tests/integration/fixture.h"
#include "tests/storage/codec_test_util.h"
#include "tests/storage/tier_test_util.h"

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

namespace {

// bf16 values shaped like KV (a magnitude per group), so quantizing them means something.
std::vector<std::byte> Bf16Chunks(uint64_t bytes, uint32_t seed) {
  std::vector<std::byte> out(bytes);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 5;
  for (uint64_t i = 0; i < bytes / 2; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const double uniform = (static_cast<double>(x >> 11) + 0.5) / 9007199254740992.0;
    const float value = static_cast<float>((uniform - 0.5) * (1 + (i / 64) % 13));
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    out[2 * i] = static_cast<std::byte>(bits >> 16);
    out[2 * i + 1] = static_cast<std::byte>(bits >> 24);
  }
  return out;
}

// One I/O-only load of the whole cached prefix into a fresh region; its bytes.
std::vector<std::byte> LoadBytes(Client& client, const NamespaceSpec& ns, const std::vector<uint32_t>& tokens,
                                 uint64_t bytes) {
  auto region = client.RegisterRegion(bytes);
  REQUIRE(region.ok());
  LoadOptions options{ns, {tokens, {}}, &*region};
  options.io_only = true;
  auto session = client.StartLoad(options);
  REQUIRE(session.ok());
  auto done = (*session)->WaitDone();
  REQUIRE(done.ok());
  REQUIRE(done->failed_chunks == 0);
  std::vector<std::byte> out(bytes);
  for (uint32_t c = 0; c < bytes / (64 * kSmallBytesPerToken); ++c) {
    std::memcpy(out.data() + c * 64 * kSmallBytesPerToken, region->data() + (*session)->RegionOffset(c),
                64 * kSmallBytesPerToken);
  }
  REQUIRE((*session)->Release().ok());
  REQUIRE(client.ReleaseRegion(*region).ok());
  return out;
}

}  // namespace

TEST_CASE("a namespace stored as INT8 loads exact from DRAM and quantized from disk, under keys of its own",
          "[codec][lossy]") {
  ScratchFolder root;
  for (StoredPrecision precision : {StoredPrecision::kInt8, StoredPrecision::kInt4}) {
    INFO("precision " << static_cast<int>(precision));
    NamespaceSpec ns = SmallNamespace(64);
    ns.stored_precision = precision;
    const uint64_t chunk_bytes = 64 * kSmallBytesPerToken;
    const uint32_t chunks = 6;
    const auto tokens = Tokens(64 * chunks, static_cast<uint32_t>(precision));
    const auto kv = Bf16Chunks(chunks * chunk_bytes, 7);
    auto daemon = StartDaemon({"--disk-root", root.path + "/" + std::to_string(static_cast<int>(precision))});
    auto client = Connect(daemon);
    auto region = client->RegisterRegion(kv.size());
    REQUIRE(region.ok());
    std::memcpy(region->data(), kv.data(), kv.size());
    auto stored = client->Store(ns, PromptRef{tokens, {}}, 0, chunks, *region, 0);
    REQUIRE(stored.ok());
    REQUIRE(client->ReleaseRegion(*region).ok());
    REQUIRE(Eventually([&] { return Counter(*client, "write_back_written") == chunks; }));

    // What the disk holds is the quantized encoding: int8 about 1.9x, int4 about 3.6x smaller.
    const LossyFormat format = LossyFormat::Of(ns);
    CHECK(Counter(*client, "tier_disk_written_bytes") == chunks * format.encoded_bytes());
    // The exact namespace's keys are others: nothing of this prompt is cached for it.
    NamespaceSpec exact = ns;
    exact.stored_precision = StoredPrecision::kExact;
    auto other = client->Lookup(exact, {tokens, {}});
    REQUIRE(other.ok());
    CHECK(other->cached_chunks == 0);

    // From DRAM: the engine's bytes exactly.
    CHECK(LoadBytes(*client, ns, tokens, kv.size()) == kv);
    // From disk: each chunk decoded from its quantized form, as the codec decodes it.
    REQUIRE(client->Evict(TierKind::kDram).ok());
    auto lookup = client->Lookup(ns, {tokens, {}});
    REQUIRE(lookup.ok());
    REQUIRE(lookup->cached_chunks == chunks);
    for (TierKind t : lookup->tiers) CHECK(t == TierKind::kDisk);
    const auto from_disk = LoadBytes(*client, ns, tokens, kv.size());
    std::vector<std::byte> expected(kv.size());
    for (uint32_t c = 0; c < chunks; ++c) {
      const auto chunk = std::span(kv).subspan(c * chunk_bytes, chunk_bytes);
      REQUIRE(DecodeLossy(EncodeLossy(format, chunk), std::span(expected).subspan(c * chunk_bytes, chunk_bytes)).ok());
    }
    CHECK(from_disk == expected);
    CHECK(from_disk != kv);
  }
}

TEST_CASE("a lossy precision for an integer dtype is INVALID_ARGUMENT naming the field", "[codec][lossy]") {
  auto daemon = StartDaemon();
  auto client = Connect(daemon);
  NamespaceSpec ns = SmallNamespace(64);
  ns.dtype = DType::kInt8;
  ns.head_dim = 128;
  ns.stored_precision = StoredPrecision::kInt8;
  auto lookup = client->Lookup(ns, {Tokens(128), {}});
  REQUIRE_FALSE(lookup.ok());
  CHECK(lookup.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(lookup.status().message()), Catch::Contains("stored_precision"));
}

TEST_CASE(
    "five Verifies of a hostile Redis's 1 GiB claims (a header without parts, valid 33 KB encodings of zeros) leave "
    "the daemon's memory where it was",
    "[codec][remote][hostile]") {
  auto redis = RedisServer::Start();
  REQUIRE(redis.ok());
  // What a hostile Redis holds under the daemon's key prefix: three valid encodings of 1 GiB of zeros (33 KB each,
  // sealed with valid remote checksums) and a header claiming a 1 GiB payload with no parts behind it.
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  {
    RemoteTier::Options options;
    options.endpoints = {redis->address()};
    options.key_prefix = "cake:";
    options.max_chunk_bytes = kGiB;
    auto planter = RemoteTier::Open(options);
    REQUIRE(planter.ok());
    const std::vector<std::byte> zeros = EncodedZeros(kGiB);
    for (uint32_t i = 0; i < 3; ++i) {
      REQUIRE((*planter)->Write(CodecTier::StoredKey(TestKey(i), ChunkCodec::kPlanesZstd), zeros).ok());
    }
    RemoteHeader header;
    header.key = CodecTier::StoredKey(TestKey(9), ChunkCodec::kPlanesZstd);
    header.payload_length = kGiB;
    header.part_bytes = options.part_bytes;
    header.parts = static_cast<uint32_t>(RemotePartCount(kGiB, options.part_bytes));
    REQUIRE(redis->Command({"SET", "cake:{" + header.key.Hex() + "}:h", EncodeRemoteHeader(header)}).ok());
  }
  auto daemon = StartDaemon({"--remote", redis->address(), "--remote-codec", "planes-zstd"});
  RawStubs raw(daemon);
  auto rss_mib = [&](const char* field) -> uint64_t {
    std::ifstream status("/proc/" + std::to_string(daemon.pid()) + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind(field, 0) == 0) return std::stoull(line.substr(std::strlen(field))) / 1024;
    }
    return uint64_t{0};
  };
  std::ofstream("/proc/" + std::to_string(daemon.pid()) + "/clear_refs") << "5";
  const uint64_t baseline = rss_mib("VmRSS:");
  std::string figures;
  for (int round = 0; round < 5; ++round) {
    grpc::ClientContext context;
    v1::VerifyRequest request;
    request.set_tier(v1::TIER_REMOTE);
    v1::VerifyResponse response;
    const grpc::Status status = raw.admin->Verify(&context, request, &response);
    REQUIRE(status.ok());
    CHECK(response.chunks_checked() == (round == 0 ? 4u : 3u));
    CHECK(response.bytes_checked() == 3 * kGiB);
    CHECK(response.corrupt_removed() == (round == 0 ? 1u : 0u));
    std::this_thread::sleep_for(std::chrono::seconds(1));
    figures += " " + std::to_string(rss_mib("VmRSS:"));
    // At 4054af8 each Verify left about a GiB more (4.1 GB after four with the forged header; 3.09 GB for the three
    // encodings).
#if !defined(__SANITIZE_ADDRESS__)  // the daemon is built with it too: its quarantine keeps freed blocks
    CHECK(rss_mib("VmRSS:") < baseline + 32);
#endif
  }
  const uint64_t peak = rss_mib("VmHWM:");
  std::cout << "5 Verifies of the remote tier (three 1 GiB zero encodings, a forged 1 GiB header): daemon RSS "
            << baseline << " MiB before, 1 s after each:" << figures << " MiB; peak " << peak << " MiB\n";
#if !defined(__SANITIZE_ADDRESS__)
  CHECK(peak < baseline + 64);
#endif
}
