// Prefetch through a real caked (LookupRequest.prefetch): a prompt on disk only is copied into DRAM while the
// engine's request waits, the load that follows reads every chunk from DRAM, bit-exact; a prefetch for another
// tenant is refused like a Lookup; one nobody loads is counted wasted.
#include <unistd.h>

#include "tests/integration/fixture.h"

using namespace cake;
using namespace cake::testing;

namespace {

constexpr uint64_t kChunkBytes = 64 * kSmallBytesPerToken;

// A prompt of `chunks` chunks stored, written back to disk, then dropped from DRAM: on disk only.
void OnDiskOnly(Client& client, const NamespaceSpec& ns, const std::vector<uint32_t>& tokens, uint32_t seed,
                uint32_t chunks) {
  const uint64_t before = Counter(client, "tier_disk_chunks");
  StorePrompt(client, ns, tokens, seed, chunks, kChunkBytes);
  REQUIRE(Eventually([&] { return Counter(client, "tier_disk_chunks") == before + chunks; }));
  REQUIRE(client.Evict(TierKind::kDram).ok());
}

}  // namespace

TEST_CASE("a prefetched prompt is in DRAM when its load comes, and the load is bit-exact", "[prefetch]") {
  ScratchFolder root;
  auto daemon = StartDaemon({"--disk-root", root.path});
  auto client = Connect(daemon);
  const auto ns = SmallNamespace(64);
  const auto tokens = Tokens(64 * 8, 7);
  OnDiskOnly(*client, ns, tokens, 51, 8);

  auto lookup = client->Lookup(ns, {tokens, {}}, {.prefetch = true});
  REQUIRE(lookup.ok());
  CHECK(lookup->cached_chunks == 8);
  for (TierKind t : lookup->tiers) CHECK(t == TierKind::kDisk);  // where they were when asked
  CHECK(lookup->prefetch_chunks == 8);
  REQUIRE(Eventually([&] { return Counter(*client, "prefetch_chunks_copied") == 8; }));
  auto again = client->Lookup(ns, {tokens, {}});
  REQUIRE(again.ok());
  for (TierKind t : again->tiers) CHECK(t == TierKind::kDram);

  const uint64_t disk_reads = Counter(*client, "tier_disk_reads_hit");
  auto done = LoadAndVerify(*client, ns, tokens, 51);
  CHECK(done.loaded_chunks == 8);
  CHECK(Counter(*client, "tier_disk_reads_hit") == disk_reads);  // every chunk came from DRAM
  CHECK(Counter(*client, "prefetch_chunks_used") == 8);
  CHECK(Counter(*client, "prefetch_held_bytes") == 0);
  // Nothing left to copy: the prompt is in DRAM.
  auto third = client->Lookup(ns, {tokens, {}}, {.prefetch = true});
  REQUIRE(third.ok());
  CHECK(third->prefetch_chunks == 0);
}

TEST_CASE("prefetch: the budget leaves out the head, a prefetch nobody loads is wasted, and the switch turns it off",
          "[prefetch]") {
  ScratchFolder root, config_dir;
  // One tenant may hold three quarters of the budget: 5 of these 7 chunks.
  const std::string config = WriteFile(
      config_dir.path, "caked.toml", "[prefetch]\nmax_bytes = " + std::to_string(7 * kChunkBytes) + "\nttl_ms = 300\n");
  auto daemon = StartDaemon({"--config", config, "--disk-root", root.path});
  auto client = Connect(daemon);
  const auto ns = SmallNamespace(64);
  const auto tokens = Tokens(64 * 8, 8);
  OnDiskOnly(*client, ns, tokens, 52, 8);
  auto lookup = client->Lookup(ns, {tokens, {}}, {.prefetch = true});
  REQUIRE(lookup.ok());
  CHECK(lookup->prefetch_chunks == 5);
  CHECK(Counter(*client, "prefetch_chunks_over_budget") == 3);
  REQUIRE(Eventually([&] { return Counter(*client, "prefetch_chunks_copied") == 5; }));
  // The tail came in: chunks 3 to 7 in DRAM, 0 to 2 still on disk only.
  auto after = client->Lookup(ns, {tokens, {}});
  REQUIRE(after.ok());
  for (uint32_t c = 0; c < 8; ++c) CHECK(after->tiers[c] == (c >= 3 ? TierKind::kDram : TierKind::kDisk));
  // Nobody loads it: after the ttl the housekeeping forgets it, counted wasted, and the budget is free again.
  REQUIRE(Eventually([&] { return Counter(*client, "prefetch_chunks_wasted") == 5; }));
  CHECK(Counter(*client, "prefetch_held_bytes") == 0);

  const std::string off_config = WriteFile(config_dir.path, "off.toml", "[prefetch]\nenabled = false\n");
  auto disabled = StartDaemon({"--config", off_config, "--disk-root", root.path + "/disabled"});
  auto disabled_client = Connect(disabled);
  OnDiskOnly(*disabled_client, ns, tokens, 52, 8);
  auto plain = disabled_client->Lookup(ns, {tokens, {}}, {.prefetch = true});
  REQUIRE(plain.ok());
  CHECK(plain->cached_chunks == 8);
  CHECK(plain->prefetch_chunks == 0);
  CHECK(Counter(*disabled_client, "prefetches") == 0);
}

TEST_CASE("a prefetch for another tenant is refused like a Lookup", "[prefetch][access]") {
  ScratchFolder root, config_dir;
  const std::string config =
      WriteFile(config_dir.path, "caked.toml",
                "[[access.principal]]\nname = \"self\"\nunix_uids = [" + std::to_string(::geteuid()) +
                    "]\ntenants = [\"tenant-a\"]\nroles = [\"engine\", \"admin\"]\n");
  auto daemon = StartDaemon({"--config", config, "--disk-root", root.path});
  auto client = Connect(daemon);
  const auto tokens = Tokens(64 * 4, 9);
  OnDiskOnly(*client, SmallNamespace(64, "tenant-a"), tokens, 53, 4);
  auto other = client->Lookup(SmallNamespace(64, "tenant-b"), {tokens, {}}, {.prefetch = true});
  CHECK(other.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(Counter(*client, "prefetches") == 0);
  CHECK(Counter(*client, "prefetch_chunks_queued") == 0);
}
