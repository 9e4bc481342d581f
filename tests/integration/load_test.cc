// The Cake load stream end to end against a real caked: stored bytes come back intact, and the meeting point
// follows the engine's speed against the I/O speed.
#include <thread>

#include "tests/integration/fixture.h"

using namespace cake;
using namespace cake::testing;
using namespace std::chrono_literals;

namespace {

// A daemon whose DRAM tier reads 1 MiB chunks at 0.8 Gbit/s (about 10 ms each), `chunks` of them stored from a
// prompt with `seed`'s pattern, and a region for them: the set-up of the planner's tests.
struct MeasuredTier {
  MeasuredTier(uint32_t chunks, uint32_t seed)
      : h(chunks), daemon(StartDaemon({"--dram-read-gbps", "0.8"})), client(Connect(daemon)), tokens(Tokens(1024 * h)) {
    StorePrompt(*client, ns, tokens, seed, h, chunk_bytes);
    auto registered = client->RegisterRegion(h * chunk_bytes);
    REQUIRE(registered.ok());
    region.emplace(std::move(*registered));
  }
  LoadOptions Options() const { return LoadOptions{ns, {tokens, {}}, &*region}; }
  // One I/O-only load, which teaches the daemon the tier's speed; returns Cake options with a hint of
  // `chunk_compute_s` per chunk, so the plan predicts a meeting.
  LoadOptions TeachSpeed(uint32_t seed, double chunk_compute_s) {
    LoadOptions options = Options();
    options.io_only = true;
    RunCakeLoad(*client, options, seed, [](uint32_t) {});
    options.io_only = false;
    options.compute_first_chunk_s = chunk_compute_s;
    return options;
  }

  const uint32_t h;
  const NamespaceSpec ns = SmallNamespace(1024);
  const uint64_t chunk_bytes = 1024 * kSmallBytesPerToken;
  SpawnedDaemon daemon;
  std::unique_ptr<Client> client;
  const std::vector<uint32_t> tokens;
  std::optional<MappedRegion> region;
};

}  // namespace

TEST_CASE("stored chunks load back byte for byte, I/O only", "[load]") {
  auto daemon = StartDaemon();
  auto client = Connect(daemon);
  const auto ns = SmallNamespace();
  const uint64_t chunk_bytes = 16 * kSmallBytesPerToken;
  const auto tokens = Tokens(16 * 12);
  StorePrompt(*client, ns, tokens, 7, 12, chunk_bytes);

  auto lookup = client->Lookup(ns, {tokens, {}});
  REQUIRE(lookup.ok());
  CHECK(lookup->total_chunks == 12);
  CHECK(lookup->cached_chunks == 12);
  CHECK(lookup->chunk_bytes == chunk_bytes);
  for (TierKind t : lookup->tiers) CHECK(t == TierKind::kDram);

  auto region = client->RegisterRegion(12 * chunk_bytes);
  REQUIRE(region.ok());
  std::memset(region->data(), 0, region->size());
  LoadOptions options{ns, {tokens, {}}, &*region};
  options.io_only = true;
  auto result = RunCakeLoad(*client, options, 7, [](uint32_t) {});
  CHECK(result.plan.cached_chunks == 12);
  CHECK(result.done.meeting_chunk == 0);
  CHECK(result.done.loaded_chunks == 12);
  CHECK(result.done.failed_chunks == 0);
  // I/O-only ignores progress: the engine's instant "compute" above must not have cut the load short.
  for (uint32_t c = 0; c < 12; ++c) CHECK(ChunkMatches(region->data() + c * chunk_bytes, chunk_bytes, 7, c));
}

TEST_CASE("a prompt with an uncached suffix loads only its cached prefix", "[load]") {
  auto daemon = StartDaemon();
  auto client = Connect(daemon);
  const auto ns = SmallNamespace();
  const uint64_t chunk_bytes = 16 * kSmallBytesPerToken;
  const auto tokens = Tokens(16 * 10 + 5);  // 10 full chunks and a partial one
  StorePrompt(*client, ns, tokens, 3, 6, chunk_bytes);
  auto lookup = client->Lookup(ns, {tokens, {}});
  REQUIRE(lookup.ok());
  CHECK(lookup->total_chunks == 10);
  CHECK(lookup->cached_chunks == 6);

  auto region = client->RegisterRegion(10 * chunk_bytes);
  REQUIRE(region.ok());
  LoadOptions options{ns, {tokens, {}}, &*region};
  options.io_only = true;
  auto result = RunCakeLoad(*client, options, 3, [](uint32_t) {});
  CHECK(result.plan.total_chunks == 10);
  CHECK(result.plan.cached_chunks == 6);
  CHECK(result.done.meeting_chunk == 0);
  CHECK(result.done.loaded_chunks == 6);
}

TEST_CASE("chunks the engine holds are never loaded: a fixed split", "[load]") {
  auto daemon = StartDaemon();
  auto client = Connect(daemon);
  const auto ns = SmallNamespace();
  const uint64_t chunk_bytes = 16 * kSmallBytesPerToken;
  const auto tokens = Tokens(16 * 12);
  StorePrompt(*client, ns, tokens, 5, 12, chunk_bytes);
  auto region = client->RegisterRegion(12 * chunk_bytes);
  REQUIRE(region.ok());
  for (bool io_only : {true, false}) {
    CAPTURE(io_only);
    std::memset(region->data(), 0, region->size());
    LoadOptions options{ns, {tokens, {}}, &*region};
    options.io_only = io_only;
    options.computed_through = 5;
    // Under Cake this engine "computes" instantly and may overtake the loads above chunk 5.
    auto result = RunCakeLoad(*client, options, 5, [](uint32_t) {});
    CHECK(result.plan.lowest_loadable == 0);  // the window fits everything; the engine said what it holds
    const uint32_t meeting = result.done.meeting_chunk;
    if (io_only) CHECK(meeting == 5);
    CHECK(meeting >= 5);
    CHECK(result.done.loaded_chunks == 12 - meeting);
    // Offsets are still counted from the region's start: chunk c lands where a full load would put it.
    for (uint32_t c = meeting; c < 12; ++c) CHECK(ChunkMatches(region->data() + c * chunk_bytes, chunk_bytes, 5, c));
    for (uint32_t c = 0; c < 5; ++c) CHECK(std::to_integer<int>(region->data()[c * chunk_bytes]) == 0);
  }
}

TEST_CASE("the meeting point follows the engine's speed", "[load][meeting]") {
  // 1 MiB chunks read at 0.8 Gbit/s: about 10 ms each, whatever the number of reads in flight.
  auto daemon = StartDaemon({"--dram-read-gbps", "0.8"});
  auto client = Connect(daemon);
  const auto ns = SmallNamespace(1024);
  const uint64_t chunk_bytes = 1024 * kSmallBytesPerToken;
  const uint32_t h = 20;
  const auto tokens = Tokens(1024 * h);
  StorePrompt(*client, ns, tokens, 11, h, chunk_bytes);
  auto region = client->RegisterRegion(h * chunk_bytes);
  REQUIRE(region.ok());
  LoadOptions options{ns, {tokens, {}}, &*region};

  SECTION("a fast engine computes nearly everything") {
    auto result = RunCakeLoad(*client, options, 11, [](uint32_t) {});
    // An instant engine reaches the tail before more than a few 10 ms reads land (half, on a loaded machine).
    CHECK(result.done.meeting_chunk >= h / 2);
  }
  SECTION("a slow engine lets the daemon load everything") {
    auto result = RunCakeLoad(*client, options, 11,
                              [](uint32_t) { std::this_thread::sleep_for(std::chrono::milliseconds(600)); });
    CHECK(result.done.meeting_chunk == 0);
    CHECK(result.done.loaded_chunks == h);
  }
  SECTION("a balanced engine meets the loader in the middle") {
    auto result =
        RunCakeLoad(*client, options, 11, [](uint32_t) { std::this_thread::sleep_for(std::chrono::milliseconds(10)); });
    // Even speeds meet near h/2; the margin absorbs a loaded machine's jitter.
    CHECK(result.done.meeting_chunk >= 3);
    CHECK(result.done.meeting_chunk <= h - 3);
  }
}

TEST_CASE("the plan predicts the meeting point once the load speed is known", "[load][meeting]") {
  MeasuredTier t(16, 5);
  const uint32_t h = t.h;
  auto& client = t.client;
  LoadOptions options = t.TeachSpeed(5, 0.010);
  auto session = client->StartLoad(options);
  REQUIRE(session.ok());
  auto plan = (*session)->WaitPlan();
  REQUIRE(plan.ok());
  REQUIRE(plan->predicted_meeting_chunk.has_value());
  CHECK(*plan->predicted_meeting_chunk > 0);
  CHECK(*plan->predicted_meeting_chunk < h);
  CHECK((*session)->Release().ok());

  // A new read cap makes what was measured stale: no prediction until a load has measured the tier again.
  REQUIRE(client->SetReadCap(TierKind::kDram, 0.4).ok());
  auto unmeasured = client->StartLoad(options);
  REQUIRE(unmeasured.ok());
  auto cold_plan = (*unmeasured)->WaitPlan();
  REQUIRE(cold_plan.ok());
  CHECK_FALSE(cold_plan->predicted_meeting_chunk.has_value());
  CHECK((*unmeasured)->Release().ok());
  options.io_only = true;
  RunCakeLoad(*client, options, 5, [](uint32_t) {});
  options.io_only = false;
  auto remeasured = client->StartLoad(options);
  REQUIRE(remeasured.ok());
  auto warm_plan = (*remeasured)->WaitPlan();
  REQUIRE(warm_plan.ok());
  REQUIRE(warm_plan->predicted_meeting_chunk.has_value());
  // Slower loads: the engine computes further than before.
  CHECK(*warm_plan->predicted_meeting_chunk >= *plan->predicted_meeting_chunk);
  CHECK((*remeasured)->Release().ok());
}

TEST_CASE("inline loads carry the bytes on the stream", "[load][inline]") {
  auto daemon = StartDaemon();
  auto client = Connect(daemon);
  const auto ns = SmallNamespace();
  const uint64_t chunk_bytes = 16 * kSmallBytesPerToken;
  const auto tokens = Tokens(16 * 8);
  StorePrompt(*client, ns, tokens, 9, 8, chunk_bytes);
  LoadOptions options{ns, {tokens, {}}, nullptr};
  options.io_only = true;
  auto result = RunCakeLoad(*client, options, 9, [](uint32_t) {});
  CHECK(result.done.loaded_chunks == 8);

  SECTION("and Store takes inline chunks") {
    const auto other = Tokens(16 * 2, 99);
    std::vector<std::string> chunks(2, std::string(chunk_bytes, '\0'));
    for (uint32_t i = 0; i < 2; ++i) FillChunk(reinterpret_cast<std::byte*>(chunks[i].data()), chunk_bytes, 99, i);
    std::vector<std::string_view> views(chunks.begin(), chunks.end());
    auto stored = client->StoreInline(ns, {other, {}}, 0, views);
    REQUIRE(stored.ok());
    CHECK(stored->stored_chunks == 2);
    LoadOptions again{ns, {other, {}}, nullptr};
    again.io_only = true;
    CHECK(RunCakeLoad(*client, again, 99, [](uint32_t) {}).done.loaded_chunks == 2);
  }
}

TEST_CASE("engine-supplied chunk keys work like tokens", "[load]") {
  auto daemon = StartDaemon();
  auto client = Connect(daemon);
  const auto ns = SmallNamespace();
  const uint64_t chunk_bytes = 16 * kSmallBytesPerToken;
  std::vector<std::string> keys;
  for (int i = 0; i < 4; ++i) keys.push_back(std::string(16, static_cast<char>('a' + i)));
  std::vector<std::string> chunks(4, std::string(chunk_bytes, '\0'));
  for (uint32_t i = 0; i < 4; ++i) FillChunk(reinterpret_cast<std::byte*>(chunks[i].data()), chunk_bytes, 4, i);
  std::vector<std::string_view> views(chunks.begin(), chunks.end());
  REQUIRE(client->StoreInline(ns, {{}, keys}, 0, views).ok());
  auto lookup = client->Lookup(ns, {{}, keys});
  REQUIRE(lookup.ok());
  CHECK(lookup->cached_chunks == 4);
  // Another tenant sending the same engine keys sees nothing: keys are salted by the namespace.
  auto other = client->Lookup(SmallNamespace(16, "tenant-b"), {{}, keys});
  REQUIRE(other.ok());
  CHECK(other->cached_chunks == 0);
}

TEST_CASE("a region window too small loads the tail that fits", "[load]") {
  auto daemon = StartDaemon();
  auto client = Connect(daemon);
  const auto ns = SmallNamespace();
  const uint64_t chunk_bytes = 16 * kSmallBytesPerToken;
  const auto tokens = Tokens(16 * 10);
  StorePrompt(*client, ns, tokens, 2, 10, chunk_bytes);
  auto region = client->RegisterRegion(4 * chunk_bytes + 100);
  REQUIRE(region.ok());
  LoadOptions options{ns, {tokens, {}}, &*region};
  options.io_only = true;
  auto result = RunCakeLoad(*client, options, 2, [](uint32_t) {});
  CHECK(result.plan.lowest_loadable == 6);
  CHECK(result.done.meeting_chunk == 6);
  CHECK(result.done.loaded_chunks == 4);
}

TEST_CASE("prompts shorter than a chunk and unknown namespaces load nothing, gracefully", "[load]") {
  auto daemon = StartDaemon();
  auto client = Connect(daemon);
  auto region = client->RegisterRegion(1 << 20);
  REQUIRE(region.ok());
  for (const auto& [ns, tokens] :
       {std::pair{SmallNamespace(), Tokens(7)}, std::pair{SmallNamespace(16, "never-stored-tenant"), Tokens(64)}}) {
    auto lookup = client->Lookup(ns, {tokens, {}});
    REQUIRE(lookup.ok());
    CHECK(lookup->cached_chunks == 0);
    LoadOptions options{ns, {tokens, {}}, &*region};
    auto result = RunCakeLoad(*client, options, 1, [](uint32_t) {});
    CHECK(result.plan.cached_chunks == 0);
    CHECK(result.done.meeting_chunk == 0);
    CHECK(result.done.loaded_chunks == 0);
  }
}

TEST_CASE("concurrent loads of the same prompt each get every byte", "[load][concurrency]") {
  auto daemon = StartDaemon();
  const auto ns = SmallNamespace();
  const uint64_t chunk_bytes = 16 * kSmallBytesPerToken;
  const auto tokens = Tokens(16 * 16);
  {
    auto client = Connect(daemon);
    StorePrompt(*client, ns, tokens, 21, 16, chunk_bytes);
  }
  auto shared_client = Connect(daemon, "engine-shared");
  auto region = shared_client->RegisterRegion(4 * 16 * chunk_bytes);
  REQUIRE(region.ok());
  std::vector<std::thread> engines;
  std::atomic<int> ok{0};
  for (int e = 0; e < 4; ++e) {
    engines.emplace_back([&, e] {
      for (int round = 0; round < 5; ++round) {
        LoadOptions options{ns, {tokens, {}}, &*region, uint64_t(e) * 16 * chunk_bytes, 16 * chunk_bytes};
        options.io_only = round % 2 == 0;
        auto session = shared_client->StartLoad(options);
        if (!session.ok()) return;
        auto done = (*session)->WaitDone();
        if (!done.ok()) return;
        bool intact = true;
        for (uint32_t c = done->meeting_chunk; c < 16; ++c) {
          intact &= ChunkMatches(region->data() + (*session)->RegionOffset(c), chunk_bytes, 21, c);
        }
        if (intact && (*session)->Release().ok()) ++ok;
      }
    });
  }
  for (auto& t : engines) t.join();
  CHECK(ok == 20);
}

TEST_CASE("two loads may not share a region window", "[load][concurrency]") {
  auto daemon = StartDaemon({"--dram-read-gbps", "0.1"});
  auto client = Connect(daemon);
  const auto ns = SmallNamespace(256);
  const uint64_t chunk_bytes = 256 * kSmallBytesPerToken;
  const auto tokens = Tokens(256 * 8);
  StorePrompt(*client, ns, tokens, 1, 8, chunk_bytes);
  auto region = client->RegisterRegion(16 * chunk_bytes);
  REQUIRE(region.ok());
  LoadOptions first{ns, {tokens, {}}, &*region, 0, 8 * chunk_bytes};
  first.io_only = true;
  auto a = client->StartLoad(first);
  REQUIRE(a.ok());
  REQUIRE((*a)->WaitPlan().ok());

  LoadOptions overlapping{ns, {tokens, {}}, &*region, 4 * chunk_bytes, 8 * chunk_bytes};
  auto b = client->StartLoad(overlapping);
  REQUIRE(b.ok());
  CHECK(!(*b)->WaitPlan().ok());
  absl::Status refused = (*b)->Release();
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(refused.message()).find("overlap") != std::string::npos);

  LoadOptions separate{ns, {tokens, {}}, &*region, 8 * chunk_bytes, 8 * chunk_bytes};
  separate.io_only = true;
  auto c = client->StartLoad(separate);
  REQUIRE(c.ok());
  REQUIRE((*c)->WaitDone().ok());
  CHECK((*c)->Release().ok());
  REQUIRE((*a)->WaitDone().ok());
  CHECK((*a)->Release().ok());
}

TEST_CASE("a cancelled load frees everything it held", "[load][cancel]") {
  // Slow reads (10 Mbit/s: 256 KiB chunks take about 0.2 s each) keep the load in flight when it is cancelled.
  auto daemon = StartDaemon({"--dram-read-gbps", "0.01"});
  auto client = Connect(daemon);
  RawStubs raw(daemon);
  const auto ns = SmallNamespace(256);
  const uint64_t chunk_bytes = 256 * kSmallBytesPerToken;
  const auto tokens = Tokens(256 * 8);
  StorePrompt(*client, ns, tokens, 1, 8, chunk_bytes);
  auto region = client->RegisterRegion(8 * chunk_bytes);
  REQUIRE(region.ok());
  LoadOptions options{ns, {tokens, {}}, &*region};
  options.io_only = true;
  {
    auto session = client->StartLoad(options);
    REQUIRE(session.ok());
    REQUIRE((*session)->WaitPlan().ok());
    CHECK(raw.Status().active_loads() == 1);
  }  // dropped without Release: the client cancels the stream
  CHECK(Eventually([&] { return raw.Status().active_loads() == 0; }));
  // The window is free again once the cancelled load's reads have drained.
  options.io_only = false;
  bool reused = Eventually([&] {
    auto again = client->StartLoad(options);
    if (!again.ok() || !(*again)->WaitPlan().ok()) return false;
    (void)(*again)->ReportProgress(8);
    return (*again)->WaitDone().ok() && (*again)->Release().ok();
  });
  CHECK(reused);
  auto stats = client->Stats();
  REQUIRE(stats.ok());
  CHECK(stats->at("loads_cancelled") >= 1);
}

TEST_CASE("a client that vanishes mid-load loses nothing for others", "[load][cancel]") {
  auto daemon = StartDaemon({"--dram-read-gbps", "0.01"});
  RawStubs raw(daemon);
  const auto ns = SmallNamespace(256);
  const uint64_t chunk_bytes = 256 * kSmallBytesPerToken;
  const auto tokens = Tokens(256 * 4, 1);  // the vanishing engine generates the same prompt
  {
    auto client = Connect(daemon);
    StorePrompt(*client, ns, tokens, 8, 4, chunk_bytes);
  }
  // The vanishing engine is a real process that dies with its stream open.
  const std::string command = std::string(CAKE_VANISHING_ENGINE_PATH) + " " + daemon.socket_path() + " 256 4";
  REQUIRE(std::system(command.c_str()) == 0);
  CHECK(Eventually([&] { return raw.Status().active_loads() == 0; }));
  auto client = Connect(daemon, "engine-survivor");
  auto lookup = client->Lookup(ns, {tokens, {}});
  REQUIRE(lookup.ok());
  CHECK(lookup->cached_chunks == 4);
}

TEST_CASE("an engine that stalls below the planned meeting still gets every chunk loaded", "[load][meeting]") {
  MeasuredTier t(16, 8);  // about 10 ms per chunk
  auto& client = t.client;
  // The engine says it computes a chunk in 10 ms, so the plan meets near the middle and the loader holds back
  // reads below it that the engine would beat; then the engine stalls after two chunks. The loader must notice
  // and load everything down to the engine's progress.
  LoadOptions options = t.TeachSpeed(8, 0.010);
  auto session = client->StartLoad(options);
  REQUIRE(session.ok());
  auto plan = (*session)->WaitPlan();
  REQUIRE(plan.ok());
  REQUIRE(plan->strategy == Strategy::kCake);
  REQUIRE(plan->predicted_meeting_chunk.has_value());
  CHECK(*plan->predicted_meeting_chunk > 2);
  std::this_thread::sleep_for(20ms);
  REQUIRE((*session)->ReportProgress(2).ok());
  const auto stalled_at = std::chrono::steady_clock::now();
  auto done = (*session)->WaitDone();
  REQUIRE(done.ok());
  CHECK(done->meeting_chunk == 2);
  CHECK(done->loaded_chunks == 14);
  // 16 reads of 10 ms with window 4: well under a second even on a loaded machine.
  CHECK(std::chrono::steady_clock::now() - stalled_at < 3s);
  for (uint32_t c = 2; c < 16; ++c) {
    CHECK(ChunkMatches(t.region->data() + (*session)->RegionOffset(c), t.chunk_bytes, 8, c));
  }
  CHECK((*session)->Release().ok());
}

TEST_CASE("the planner falls back to compute-only or I/O-only when sharing cannot win", "[load][planner]") {
  // 1 MiB chunks read at 0.8 Gbit/s: about 10 ms each once the daemon has measured it.
  MeasuredTier t(8, 6);
  const uint32_t h = t.h;
  auto& client = t.client;
  LoadOptions options = t.Options();
  options.io_only = true;
  auto first = RunCakeLoad(*client, options, 6, [](uint32_t) {});
  CHECK(first.plan.strategy == Strategy::kIoOnly);  // asked for
  options.io_only = false;

  SECTION("an engine 100x faster than the loads: compute-only, Done at once") {
    options.compute_first_chunk_s = 0.0001;
    auto session = client->StartLoad(options);
    REQUIRE(session.ok());
    auto plan = (*session)->WaitPlan();
    REQUIRE(plan.ok());
    CHECK(plan->strategy == Strategy::kComputeOnly);
    CHECK(plan->predicted_meeting_chunk == h);
    REQUIRE(plan->predicted_compute_only_s);
    REQUIRE(plan->predicted_io_only_s);
    CHECK(*plan->predicted_compute_only_s < *plan->predicted_io_only_s);
    auto done = (*session)->WaitDone();
    REQUIRE(done.ok());
    CHECK(done->meeting_chunk == h);
    CHECK(done->loaded_chunks == 0);
    CHECK((*session)->Release().ok());
    auto stats = client->Stats();
    REQUIRE(stats.ok());
    CHECK(stats->at("loads_compute_only") == 1);
  }
  SECTION("an engine 100x slower than the loads: I/O-only, every chunk loaded") {
    options.compute_first_chunk_s = 1.0;
    auto result = RunCakeLoad(*client, options, 6, [](uint32_t) {});
    CHECK(result.plan.strategy == Strategy::kIoOnly);
    CHECK(result.plan.predicted_meeting_chunk == 0u);
    CHECK(result.done.meeting_chunk == 0);
    CHECK(result.done.loaded_chunks == h);
    auto stats = client->Stats();
    REQUIRE(stats.ok());
    CHECK(stats->at("loads_io_only") == 2);
  }
}

TEST_CASE("the daemon learns the engine's speed from Progress and plans later loads without hints", "[load][planner]") {
  MeasuredTier t(16, 8);
  const uint32_t h = t.h;
  auto& client = t.client;
  LoadOptions options = t.Options();
  options.io_only = true;
  RunCakeLoad(*client, options, 8, [](uint32_t) {});  // the tier's speed
  options.io_only = false;

  // No hints: nothing to predict from yet. The engine computes 10 ms per chunk and reports each.
  auto unplanned = RunCakeLoad(*client, options, 8, [](uint32_t) { std::this_thread::sleep_for(10ms); });
  CHECK(unplanned.plan.strategy == Strategy::kCake);
  CHECK(!unplanned.plan.predicted_cake_s);
  CHECK(unplanned.done.meeting_chunk > 0);

  // Still no hints, but the daemon has seen the engine's chunks take about 10 ms: the plan predicts the split.
  auto planned = RunCakeLoad(*client, options, 8, [](uint32_t) { std::this_thread::sleep_for(10ms); });
  CHECK(planned.plan.strategy == Strategy::kCake);
  REQUIRE(planned.plan.predicted_cake_s);
  REQUIRE(planned.plan.predicted_meeting_chunk);
  CHECK(*planned.plan.predicted_meeting_chunk > 0);
  CHECK(*planned.plan.predicted_meeting_chunk < h);
  CHECK(*planned.plan.predicted_cake_s < *planned.plan.predicted_compute_only_s);
}

TEST_CASE(
    "the client's stepper: compute, wait at the predicted meeting until the predicted Cake time and a fifth, "
    "stop at the loaded suffix or the limit",
    "[client]") {
  using Action = FrontStep::Action;
  const auto started = std::chrono::steady_clock::now();
  const auto seconds = [&](double s) {
    return started + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
  };
  LoadPlan plan;
  plan.strategy = Strategy::kCake;
  plan.cached_chunks = 12;
  plan.lowest_loadable = 2;
  const uint32_t nothing_loaded = plan.cached_chunks;
  SECTION("no prediction: compute until a chunk is resident") {
    const FrontStep step = NextFrontStep(plan, started, 5, nothing_loaded, std::nullopt, started);
    CHECK(step.action == Action::kCompute);
    CHECK(step.compute_through == 12);
    CHECK(NextFrontStep(plan, started, 9, 9, std::nullopt, started).action == Action::kStop);
    CHECK(NextFrontStep(plan, started, 12, nothing_loaded, std::nullopt, started).action == Action::kStop);
  }
  SECTION("a prediction: compute up to it, wait there until the deadline, then compute on") {
    plan.predicted_meeting_chunk = 7;
    plan.predicted_cake_s = 2.0;
    const FrontStep before = NextFrontStep(plan, started, 3, nothing_loaded, std::nullopt, started);
    CHECK(before.action == Action::kCompute);
    CHECK(before.compute_through == 7);
    const FrontStep at = NextFrontStep(plan, started, 7, nothing_loaded, std::nullopt, seconds(1.0));
    CHECK(at.action == Action::kWait);
    CHECK(std::chrono::duration<double>(at.until - started).count() == Approx(2.0 * 1.2 + 1e-3));
    CHECK(NextFrontStep(plan, started, 7, 7, std::nullopt, seconds(1.0)).action == Action::kStop);  // it landed
    const FrontStep late = NextFrontStep(plan, started, 7, nothing_loaded, std::nullopt, seconds(2.5));
    CHECK(late.action == Action::kCompute);  // the loads fell behind
    CHECK(late.compute_through == 12);
  }
  SECTION("Done: compute up to its meeting chunk (failed reads move it up), then stop") {
    const FrontStep below = NextFrontStep(plan, started, 4, 9, 9, started);
    CHECK(below.action == Action::kCompute);
    CHECK(below.compute_through == 9);
    CHECK(NextFrontStep(plan, started, 9, 9, 9, started).action == Action::kStop);
  }
  SECTION("I/O-only computes only below lowest_loadable; compute-only everything") {
    plan.strategy = Strategy::kIoOnly;
    CHECK(NextFrontStep(plan, started, 1, nothing_loaded, std::nullopt, started).action == Action::kCompute);
    CHECK(NextFrontStep(plan, started, 2, nothing_loaded, std::nullopt, started).action == Action::kStop);
    plan.strategy = Strategy::kComputeOnly;
    plan.predicted_meeting_chunk = 7;
    plan.predicted_cake_s = 2.0;
    CHECK(NextFrontStep(plan, started, 7, nothing_loaded, std::nullopt, started).action == Action::kCompute);
  }
}
