// The disk tier through a real caked: the cache survives a restart, a corrupt file is a miss the engine computes,
// and a SIGKILL in the middle of heavy stores leaves no partial chunk behind.
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/integration/fixture.h"

using namespace cake;
using namespace cake::testing;
namespace fs = std::filesystem;

namespace {

std::vector<fs::path> Files(const std::string& root, bool chunks_only) {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    if (!chunks_only || e.path().extension() == ".chunk") out.push_back(e.path());
  }
  return out;
}

}  // namespace

TEST_CASE("the disk tier keeps the cache across a restart, from its clean-stop index or after a crash", "[disk]") {
  ScratchFolder root;
  const auto ns = SmallNamespace(64);
  const uint64_t chunk_bytes = 64 * kSmallBytesPerToken;
  const auto tokens = Tokens(64 * 12);
  const fs::path index = fs::path(root.path) / "v1" / "clean-stop.index";
  // Checkpoints every 100 ms first, then off: the same root both ways.
  ScratchFolder config_dir;
  const std::string no_checkpoints =
      WriteFile(config_dir.path, "no-checkpoints.toml", "[disk]\nindex_checkpoint_ms = 0\n");
  const std::string checkpoints = WriteFile(config_dir.path, "checkpoints.toml", "[disk]\nindex_checkpoint_ms = 100\n");
  {
    auto daemon = StartDaemon({"--config", checkpoints, "--disk-root", root.path});
    auto client = Connect(daemon);
    StorePrompt(*client, ns, tokens, 31, 12, chunk_bytes);
    REQUIRE(Eventually([&] { return Counter(*client, "tier_disk_chunks") == 12; }));
    // The checkpoint thread writes the index once chunks arrive: a crash (SIGKILL) after it loses no header read.
    REQUIRE(Eventually([&] { return fs::exists(index); }));
    daemon.Kill();
  }
  {
    // The checkpoint may predate the last chunks: those are read by their headers.
    auto daemon = StartDaemon({"--config", no_checkpoints, "--disk-root", root.path});
    CHECK(daemon.log().find("recovered 12 chunks") != std::string::npos);
    CHECK(daemon.log().find("from the clean-stop index") != std::string::npos);
    CHECK(daemon.Stop() == 0);
    CHECK(fs::exists(index));
  }
  {
    // A clean stop's index is read, and gone before the daemon serves: without checkpoints a crash from here
    // leaves none.
    auto daemon = StartDaemon({"--config", no_checkpoints, "--disk-root", root.path});
    CHECK(daemon.log().find("recovered 12 chunks") != std::string::npos);
    CHECK(daemon.log().find("12 from the clean-stop index") != std::string::npos);
    CHECK_FALSE(fs::exists(index));
    daemon.Kill();
  }
  auto daemon = StartDaemon({"--disk-root", root.path});
  CHECK(daemon.log().find("recovered 12 chunks") != std::string::npos);
  CHECK(daemon.log().find("no clean-stop index: every header read") != std::string::npos);
  auto client = Connect(daemon);
  auto lookup = client->Lookup(ns, {tokens, {}});
  REQUIRE(lookup.ok());
  REQUIRE(lookup->cached_chunks == 12);
  for (TierKind t : lookup->tiers) CHECK(t == TierKind::kDisk);
  auto done = LoadAndVerify(*client, ns, tokens, 31);
  CHECK(done.meeting_chunk == 0);
  CHECK(done.loaded_chunks == 12);
  // What was read from disk is now in DRAM too.
  lookup = client->Lookup(ns, {tokens, {}});
  REQUIRE(lookup.ok());
  for (TierKind t : lookup->tiers) CHECK(t == TierKind::kDram);
}

TEST_CASE("a corrupt chunk file is a miss the engine computes, never a failed load", "[disk]") {
  ScratchFolder root;
  const auto ns = SmallNamespace(64);
  const uint64_t chunk_bytes = 64 * kSmallBytesPerToken;
  const auto tokens = Tokens(64 * 8);
  {
    auto daemon = StartDaemon({"--disk-root", root.path});
    auto client = Connect(daemon);
    StorePrompt(*client, ns, tokens, 17, 8, chunk_bytes);
    REQUIRE(Eventually([&] { return Counter(*client, "tier_disk_chunks") == 8; }));
  }
  // Flip one payload byte of one chunk file (which chunk it holds is the daemon's business).
  auto files = Files(root.path, true);
  REQUIRE(files.size() == 8);
  {
    std::fstream f(files[3], std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(4096 + 100);
    char c;
    f.read(&c, 1);
    c ^= 0x5a;
    f.seekp(4096 + 100);
    f.write(&c, 1);
  }
  auto daemon = StartDaemon({"--disk-root", root.path});
  auto client = Connect(daemon);
  auto done = LoadAndVerify(*client, ns, tokens, 17);
  CHECK(done.failed_chunks == 1);
  CHECK(done.meeting_chunk >= 1);  // the engine computes the corrupt chunk and everything below it
  CHECK(done.loaded_chunks == 8 - done.meeting_chunk);
  // The corrupt file is gone, and the cached prefix now ends just before it.
  CHECK(Files(root.path, true).size() == 7);
  auto lookup = client->Lookup(ns, {tokens, {}});
  REQUIRE(lookup.ok());
  CHECK(lookup->cached_chunks == done.meeting_chunk - 1);
  CHECK(Counter(*client, "load_chunk_read_failures") == 1);
  CHECK(Counter(*client, "load_chunk_read_failures_data_loss") == 1);  // by its status code: a corrupt chunk
  CHECK(Counter(*client, "tier_disk_corrupt_removed") == 1);
}

TEST_CASE("SIGKILL during heavy stores leaves no partial chunk", "[disk]") {
  ScratchFolder root;
  const auto ns = SmallNamespace(1024);
  const uint64_t chunk_bytes = 1024 * kSmallBytesPerToken;  // 1 MiB
  const uint32_t chunks = 48;
  const auto tokens = Tokens(1024 * chunks);
  {
    auto daemon = StartDaemon({"--disk-root", root.path});
    std::thread writer([&] {
      auto client = Client::Connect({daemon.socket_path(), "writer"});
      if (!client.ok()) return;
      auto region = (*client)->RegisterRegion(chunk_bytes);
      if (!region.ok()) return;
      for (uint32_t i = 0; i < chunks; ++i) {
        FillChunk(region->data(), chunk_bytes, 23, i);
        if (!(*client)->Store(ns, {tokens, {}}, i, 1, *region, 0).ok()) return;  // the daemon died
      }
    });
    // Kill once some chunks are on disk and more are on their way.
    Eventually([&] { return Files(root.path, true).size() >= 8; });
    daemon.Kill();
    writer.join();
  }
  auto daemon = StartDaemon({"--disk-root", root.path});
  for (const auto& f : Files(root.path, false)) {
    INFO(f.string());
    // Every temporary leftover was removed at start-up; the index is the checkpoint the new daemon writes.
    CHECK((f.extension() == ".chunk" || f.filename() == "clean-stop.index"));
  }
  auto client = Connect(daemon);
  auto lookup = client->Lookup(ns, {tokens, {}});
  REQUIRE(lookup.ok());
  CHECK(lookup->cached_chunks >= 1);
  // Every chunk the restarted daemon serves is byte-identical to what was stored.
  auto done = LoadAndVerify(*client, ns, tokens, 23);
  CHECK(done.failed_chunks == 0);
  CHECK(done.loaded_chunks == lookup->cached_chunks);
}

TEST_CASE("evicting DRAM leaves the disk copy, and loads come from disk", "[disk][evict]") {
  ScratchFolder root;
  auto daemon = StartDaemon({"--disk-root", root.path});
  auto client = Connect(daemon);
  const auto ns = SmallNamespace(64);
  const uint64_t chunk_bytes = 64 * kSmallBytesPerToken;
  const auto tokens = Tokens(64 * 6);
  StorePrompt(*client, ns, tokens, 41, 6, chunk_bytes);
  REQUIRE(Eventually([&] { return Counter(*client, "tier_disk_chunks") == 6; }));
  auto evicted = client->Evict(TierKind::kDram);
  REQUIRE(evicted.ok());
  CHECK(*evicted == 6);
  CHECK(Counter(*client, "tier_dram_chunks") == 0);
  auto lookup = client->Lookup(ns, {tokens, {}});
  REQUIRE(lookup.ok());
  REQUIRE(lookup->cached_chunks == 6);
  for (TierKind t : lookup->tiers) CHECK(t == TierKind::kDisk);
  CHECK(LoadAndVerify(*client, ns, tokens, 41).loaded_chunks == 6);

  CHECK(client->Evict(TierKind::kNone).status().code() == absl::StatusCode::kInvalidArgument);
  auto dram_only = StartDaemon();
  CHECK(Connect(dram_only)->Evict(TierKind::kDisk).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("a full disk tier evicts the oldest chunks and never corrupts", "[disk]") {
  ScratchFolder root;
  const auto ns = SmallNamespace(64);
  const uint64_t chunk_bytes = 64 * kSmallBytesPerToken;
  // The budget counts whole files: a 64 KiB chunk's file is 68 KiB (its 4 KiB header), so 15 fit in 1 MiB.
  constexpr uint64_t kFit = (1u << 20) / (64 * 1024 + 4096);
  const auto old_prompt = Tokens(64 * 40, 5);
  const auto new_prompt = Tokens(64 * 8, 6);
  {
    auto daemon = StartDaemon({"--disk-root", root.path, "--disk-capacity-mib", "1"});
    auto client = Connect(daemon);
    StorePrompt(*client, ns, old_prompt, 5, 40, chunk_bytes);  // more than the disk holds: Store still succeeds
    StorePrompt(*client, ns, new_prompt, 6, 8, chunk_bytes);
    REQUIRE(client->Ping().ok());
    // 48 chunks went to a disk that holds 15: the write-back evicted the rest, and Stats says so.
    REQUIRE(Eventually([&] { return Counter(*client, "write_back_written") == 48; }));
    CHECK(Counter(*client, "tier_disk_evictions") == 48 - kFit);
    CHECK(Counter(*client, "tier_dram_evictions") == 0);
    CHECK(daemon.Stop() == 0);  // the stop flushes the write-back
  }
  auto daemon = StartDaemon({"--disk-root", root.path, "--disk-capacity-mib", "1"});
  CHECK(daemon.log().find("removed 0 temporary and 0 corrupt files") != std::string::npos);
  auto client = Connect(daemon);
  CHECK(Counter(*client, "tier_disk_used_bytes") <= (1u << 20));
  CHECK(Counter(*client, "tier_disk_chunks") == kFit);
  CHECK(Counter(*client, "tier_disk_used_bytes") == kFit * (64 * 1024 + 4096));
  // The newest prompt survived whole and loads byte for byte; the oldest lost its first chunks: a clean miss.
  auto done = LoadAndVerify(*client, ns, new_prompt, 6);
  CHECK(done.loaded_chunks == 8);
  auto old_lookup = client->Lookup(ns, {old_prompt, {}});
  REQUIRE(old_lookup.ok());
  CHECK(old_lookup->cached_chunks == 0);
}

TEST_CASE("loads from disk are promoted into DRAM unless they would churn it", "[disk][promotion]") {
  // A 1 MiB DRAM tier and 64 KiB chunks: loads of up to 8 chunks (half the tier) from disk are promoted.
  ScratchFolder root;
  auto daemon = StartDaemon({"--disk-root", root.path, "--dram-capacity-mib", "1"});
  auto client = Connect(daemon);
  const auto ns = SmallNamespace(64);
  const uint64_t chunk_bytes = 64 * kSmallBytesPerToken;
  const auto tokens = Tokens(64 * 12);
  StorePrompt(*client, ns, tokens, 43, 12, chunk_bytes);
  REQUIRE(Eventually([&] { return Counter(*client, "tier_disk_chunks") == 12; }));
  REQUIRE(client->Evict(TierKind::kDram).ok());
  auto region = client->RegisterRegion(12 * chunk_bytes);
  REQUIRE(region.ok());
  auto tiers_of = [&](size_t chunks) {
    auto lookup = client->Lookup(ns, {std::vector<uint32_t>(tokens.begin(), tokens.begin() + chunks * 64), {}});
    REQUIRE(lookup.ok());
    return lookup->tiers;
  };

  // 12 chunks, 768 KiB: more than half the tier. Loaded, verified, and left on disk.
  LoadOptions all{ns, {tokens, {}}, &*region};
  all.io_only = true;
  auto result = RunCakeLoad(*client, all, 43, [](uint32_t) {});
  CHECK(result.done.loaded_chunks == 12);
  for (uint32_t c = 0; c < 12; ++c) CHECK(ChunkMatches(region->data() + c * chunk_bytes, chunk_bytes, 43, c));
  CHECK(Counter(*client, "loads_not_promoted") == 1);
  CHECK(Counter(*client, "write_back_promoted") == 0);
  for (TierKind t : tiers_of(12)) CHECK(t == TierKind::kDisk);

  // The first 6 chunks, 384 KiB: promoted by the promotion thread once the reads are reported.
  const std::vector<uint32_t> first_six(tokens.begin(), tokens.begin() + 6 * 64);  // the options only point at it
  LoadOptions some{ns, {first_six, {}}, &*region};
  some.io_only = true;
  std::memset(region->data(), 0, region->size());
  result = RunCakeLoad(*client, some, 43, [](uint32_t) {});
  CHECK(result.done.loaded_chunks == 6);
  for (uint32_t c = 0; c < 6; ++c) CHECK(ChunkMatches(region->data() + c * chunk_bytes, chunk_bytes, 43, c));
  CHECK(Eventually([&] { return Counter(*client, "write_back_promoted") == 6; }));
  for (TierKind t : tiers_of(6)) CHECK(t == TierKind::kDram);
  CHECK(Counter(*client, "write_back_promotion_dropped") == 0);

  // Now 6 chunks in DRAM below 6 on disk: read at once, a window per tier, and every byte lands right.
  std::memset(region->data(), 0, region->size());
  result = RunCakeLoad(*client, all, 43, [](uint32_t) {});
  CHECK(result.done.loaded_chunks == 12);
  for (uint32_t c = 0; c < 12; ++c) CHECK(ChunkMatches(region->data() + c * chunk_bytes, chunk_bytes, 43, c));
}
