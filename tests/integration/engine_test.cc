// The CPU transformer engine against a real caked: the KV cache Cake assembles (computed front, loaded back) is
// byte for byte the KV cache of full compute, for every meeting point, and so is the first token; corrupt or
// missing chunks on disk are computed and change nothing.
#include <filesystem>
#include <fstream>

#include "examples/cpu_engine/prefill_engine.h"
#include "tests/integration/fixture.h"

using namespace cake;
using namespace cake::engine;
using namespace cake::testing;
namespace fs = std::filesystem;

namespace {

TransformerConfig SmallModel(Storage storage = Storage::kFp32, uint64_t seed = 3) {
  TransformerConfig c;
  c.layers = 2;
  c.hidden = 64;
  c.heads = 4;
  c.kv_heads = 2;
  c.intermediate = 96;
  c.vocab = 101;
  c.seed = seed;
  c.storage = storage;
  return c;
}

std::vector<uint32_t> Prompt(size_t n, uint32_t seed) {
  std::vector<uint32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint32_t>((i * 2654435761u + seed) % 100);
  return p;
}

// Full compute's KV cache and first token.
struct Truth {
  std::vector<std::byte> kv;
  uint32_t first_token = 0;
};

Truth ComputeTruth(PrefillEngine& engine) {
  auto run = engine.Run(PrefillMode::kComputeOnly);
  REQUIRE(run.ok());
  CHECK(run->computed_chunks == engine.total_chunks());
  return {std::vector<std::byte>(engine.Kv().begin(), engine.Kv().end()), run->first_token};
}

// Index of the first byte that differs, or -1.
long long FirstDifference(std::span<const std::byte> a, const std::vector<std::byte>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<long long>(i);
  }
  return -1;
}

void CheckEveryMeetingPoint(PrefillEngine& engine, const Truth& truth, uint32_t cached) {
  for (uint32_t m = 0; m <= cached; ++m) {
    CAPTURE(m);
    auto run = engine.Run(PrefillMode::kFixedSplit, m);
    REQUIRE(run.ok());
    CHECK(run->meeting_chunk == m);
    CHECK(run->loaded_chunks == cached - m);
    CHECK(run->computed_chunks == engine.total_chunks() - (cached - m));
    CHECK(FirstDifference(engine.Kv(), truth.kv) == -1);
    CHECK(run->first_token == truth.first_token);
  }
  for (PrefillMode mode : {PrefillMode::kIoOnly, PrefillMode::kCake}) {
    CAPTURE(mode == PrefillMode::kCake ? "cake" : "io-only");
    auto run = engine.Run(mode);
    REQUIRE(run.ok());
    CHECK(run->failed_chunks == 0);
    CHECK(FirstDifference(engine.Kv(), truth.kv) == -1);
    CHECK(run->first_token == truth.first_token);
  }
}

}  // namespace

TEST_CASE("Cake's assembled KV cache is full compute's, byte for byte, at every meeting point", "[engine]") {
  auto daemon = StartDaemon();
  auto client = Connect(daemon);
  const uint32_t chunk_tokens = 16;
  struct Case {
    const char* name;
    Storage storage;
    size_t tokens;
    uint32_t stored;  // chunks stored: fewer than the prompt's makes an uncached suffix
  };
  for (const Case& c : {Case{"multiple of the chunk", Storage::kFp32, 6 * 16, 6},
                        Case{"partial tail chunk", Storage::kFp32, 6 * 16 + 5, 6},
                        Case{"cached prefix shorter than the prompt", Storage::kFp32, 7 * 16 + 9, 4},
                        Case{"bf16 storage", Storage::kBf16, 5 * 16 + 3, 5}}) {
    CAPTURE(c.name);
    // A model per case (another seed), so no case finds another's chunks in the daemon.
    Transformer model(SmallModel(c.storage, 100 + c.tokens));
    const auto prompt = Prompt(c.tokens, static_cast<uint32_t>(c.tokens));
    auto region =
        client->RegisterRegion(model.PageBytes(chunk_tokens) * ((c.tokens + chunk_tokens - 1) / chunk_tokens));
    REQUIRE(region.ok());
    PrefillEngine engine(model, chunk_tokens, prompt, client.get(), *region);
    const Truth truth = ComputeTruth(engine);
    auto stored = engine.Store(c.stored);
    REQUIRE(stored.ok());
    REQUIRE(stored->stored_chunks == c.stored);
    auto lookup = client->Lookup(engine.ns(), {prompt, {}});
    REQUIRE(lookup.ok());
    REQUIRE(lookup->cached_chunks == c.stored);
    CheckEveryMeetingPoint(engine, truth, c.stored);
    REQUIRE(client->ReleaseRegion(*region).ok());
  }
}

TEST_CASE("a Cake run races real compute against throttled loads and stays bit-exact", "[engine]") {
  auto daemon = StartDaemon({"--dram-read-gbps", "100"});  // a cap to change once the compute speed is known
  auto client = Connect(daemon);
  const uint32_t chunk_tokens = 32, chunks = 12;
  TransformerConfig config = SmallModel(Storage::kFp32, 11);
  config.hidden = 256;
  config.layers = 4;
  config.intermediate = 512;
  Transformer model(config);
  const auto prompt = Prompt(chunks * chunk_tokens, 5);
  auto region = client->RegisterRegion(model.PageBytes(chunk_tokens) * chunks);
  REQUIRE(region.ok());
  PrefillEngine engine(model, chunk_tokens, prompt, client.get(), *region);
  const Truth truth = ComputeTruth(engine);
  REQUIRE(engine.Store(chunks).ok());
  // Reads capped so loading everything takes about as long as computing everything: the two really race, and
  // chunks land while the engine computes next to them. Where they meet is the bench's business; here every run
  // must assemble exactly what full compute did.
  auto computed = engine.Run(PrefillMode::kComputeOnly);
  REQUIRE(computed.ok());
  const double gbps = model.PageBytes(chunk_tokens) * chunks * 8.0 / computed->ttft_s / 1e9;
  REQUIRE(client->SetReadCap(TierKind::kDram, gbps).ok());
  for (int run_index = 0; run_index < 3; ++run_index) {
    auto run = engine.Run(PrefillMode::kCake);
    REQUIRE(run.ok());
    CHECK(run->meeting_chunk <= chunks);
    CHECK(run->loaded_chunks == chunks - run->meeting_chunk);
    CHECK(run->computed_chunks >= run->meeting_chunk);
    CHECK(FirstDifference(engine.Kv(), truth.kv) == -1);
    CHECK(run->first_token == truth.first_token);
  }
  REQUIRE(client->ReleaseRegion(*region).ok());
}

TEST_CASE("corrupt and missing chunks on disk are computed and the result stays bit-exact", "[engine][disk]") {
  const fs::path root = fs::temp_directory_path() / ("cake-engine-disk-" + std::to_string(getpid()));
  fs::remove_all(root);
  const uint32_t chunk_tokens = 16;
  const uint32_t chunks = 8;
  Transformer model(SmallModel(Storage::kFp32, 21));
  const auto prompt = Prompt(chunks * chunk_tokens + 7, 9);
  Truth truth;
  {
    auto daemon = StartDaemon({"--disk-root", root.string()});
    auto client = Connect(daemon);
    auto region = client->RegisterRegion(model.PageBytes(chunk_tokens) * (chunks + 1));
    REQUIRE(region.ok());
    PrefillEngine engine(model, chunk_tokens, prompt, client.get(), *region);
    truth = ComputeTruth(engine);
    REQUIRE(engine.Store(chunks).ok());
    REQUIRE(Eventually([&] { return Counter(*client, "tier_disk_chunks") == chunks; }));
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.is_regular_file() && e.path().extension() == ".chunk") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() == chunks);
  // Which chunk a file holds is the daemon's business: damage one and, later, delete another.
  {
    std::fstream f(files[2], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096 + 64);
    const char garbage[8] = {'g', 'a', 'r', 'b', 'a', 'g', 'e', '!'};
    f.write(garbage, sizeof(garbage));
  }
  auto run_both = [&](bool expect_failed_read) {
    auto daemon = StartDaemon({"--disk-root", root.string()});
    auto client = Connect(daemon);
    auto region = client->RegisterRegion(model.PageBytes(chunk_tokens) * (chunks + 1));
    REQUIRE(region.ok());
    PrefillEngine engine(model, chunk_tokens, prompt, client.get(), *region);
    for (PrefillMode mode : {PrefillMode::kIoOnly, PrefillMode::kCake}) {
      CAPTURE(mode == PrefillMode::kCake ? "cake" : "io-only");
      auto run = engine.Run(mode);
      REQUIRE(run.ok());
      if (mode == PrefillMode::kIoOnly) {
        // The damage shows: a read failed (and was computed), or the cached prefix ends before a missing chunk.
        CHECK(run->loaded_chunks < chunks);
        if (expect_failed_read) CHECK(run->failed_chunks == 1);
      }
      CHECK(run->computed_chunks + run->loaded_chunks >= engine.total_chunks());
      CHECK(FirstDifference(engine.Kv(), truth.kv) == -1);
      CHECK(run->first_token == truth.first_token);
    }
    REQUIRE(client->ReleaseRegion(*region).ok());
  };
  SECTION("a corrupt chunk") { run_both(true); }
  SECTION("a corrupt chunk and a missing one") {
    fs::remove(files[5]);
    run_both(false);
  }
  fs::remove_all(root);
}
