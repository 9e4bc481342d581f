// The planner: the engine's compute cost learned from Progress spans, the choice between Cake and the two
// baselines, and, on a simulated clock, how a load adapts when the bandwidth or the engine stops mid-load.
#include "scheduler/planner.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>

#include "scheduler/load_cursor.h"

using namespace cake;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

ComputeModel Learned(double a, double b, uint32_t chunks, uint32_t step = 1) {
  ComputeModel m;
  for (uint32_t from = 0; from < chunks; from += step) {
    const uint32_t to = std::min(chunks, from + step);
    double seconds = 0;
    for (uint32_t i = from; i < to; ++i) seconds += a + b * i;
    m.Observe(from, to, seconds);
  }
  return m;
}

// One Cake load on a simulated clock: the engine computes chunk c in compute_s(c, now) (infinite: it stalls)
// and stops at the first chunk already loaded; the disk serves one read at a time, each taking load_s(now)
// (infinite: the bandwidth is gone), with `window` reads issued at once from the tail.
struct SimResult {
  uint32_t meeting = 0;
  double ttft_s = 0;
  uint32_t wasted_reads = 0;
};

SimResult Simulate(uint32_t h, const std::function<double(uint32_t, double)>& compute_s,
                   const std::function<double(double)>& load_s, uint32_t window) {
  LoadCursor cursor({h, 0, window, true});
  std::vector<double> computed_at(h, kInf), landed_at(h, kInf);
  uint32_t engine_chunk = 0;  // the chunk the engine is computing
  double engine_free = h > 0 ? compute_s(0, 0) : kInf;
  bool engine_running = h > 0;
  double disk_free = 0;
  std::vector<std::pair<double, uint32_t>> reads;  // completion time, chunk
  auto issue = [&](double now) {
    while (auto c = cursor.NextRead()) {
      const double start = std::max(disk_free, now);
      disk_free = start + load_s(start);
      reads.emplace_back(disk_free, *c);
    }
  };
  issue(0);
  for (int guard = 0; guard < 100000 && !cursor.Meeting(); ++guard) {
    auto next_read = std::min_element(reads.begin(), reads.end());
    const double read_at = next_read == reads.end() ? kInf : next_read->first;
    const double engine_at = engine_running ? engine_free : kInf;
    REQUIRE((std::isfinite(read_at) || std::isfinite(engine_at)));
    if (read_at <= engine_at) {
      const uint32_t chunk = next_read->second;
      reads.erase(next_read);
      landed_at[chunk] = read_at;
      cursor.OnReadDone(chunk, true);
      issue(read_at);
    } else {
      // The engine finished its chunk, reports it, and goes on unless its next chunk is already loaded.
      computed_at[engine_chunk] = engine_at;
      ++engine_chunk;
      cursor.OnProgress(engine_chunk);
      if (engine_chunk >= cursor.loaded_low() || engine_chunk >= h) {
        engine_running = false;
      } else {
        engine_free = engine_at + compute_s(engine_chunk, engine_at);
      }
      issue(engine_at);
    }
  }
  REQUIRE(cursor.Meeting());
  SimResult r;
  r.meeting = *cursor.Meeting();
  r.ttft_s = r.meeting > 0 ? computed_at[r.meeting - 1] : 0;
  for (uint32_t c = r.meeting; c < h; ++c) r.ttft_s = std::max(r.ttft_s, landed_at[c]);
  r.wasted_reads = cursor.wasted_reads();
  return r;
}

}  // namespace

TEST_CASE("compute model: recovers a linear cost from per-chunk and batched spans", "[planner]") {
  for (uint32_t step : {1u, 4u, 7u}) {
    INFO("spans of " << step << " chunks");
    const ComputeModel m = Learned(0.010, 0.0005, 40, step);
    CHECK(m.known());
    CHECK(m.first_chunk_s() == Approx(0.010).epsilon(1e-6));
    CHECK(m.growth_s() == Approx(0.0005).epsilon(1e-6));
    CHECK(m.RangeSeconds(10, 20) == Approx(10 * 0.010 + 0.0005 * (10 + 19) * 5).epsilon(1e-6));
  }
  CHECK(!ComputeModel().known());
  CHECK(ComputeModel().RangeSeconds(0, 10) == 0);
}

TEST_CASE("compute model: a hint plans the first load, real spans soon outweigh a wrong one", "[planner]") {
  ComputeModel m;
  m.Seed(0.050, 0);  // the engine thinks it is five times slower than it is
  CHECK(m.known());
  CHECK(m.first_chunk_s() == Approx(0.050));
  m.Merge(Learned(0.010, 0, 16));
  CHECK(m.first_chunk_s() < 0.016);
  // Nonsense hints are ignored.
  ComputeModel ignored;
  ignored.Seed(-1, 0);
  ignored.Seed(0.01, -1);
  ignored.Seed(std::nan(""), 0);
  CHECK(!ignored.known());
}

TEST_CASE("compute model: spans all at one place give the mean cost, never a negative one", "[planner]") {
  ComputeModel m;
  m.Observe(5, 6, 0.02);
  m.Observe(5, 6, 0.04);
  CHECK(m.growth_s() == 0);
  CHECK(m.first_chunk_s() == Approx(0.03));
  m.Observe(3, 3, 1.0);   // empty span: ignored
  m.Observe(0, 1, -1.0);  // negative time: ignored
  m.Observe(0, 1, kInf);  // infinite: ignored
  CHECK(m.first_chunk_s() == Approx(0.03));
}

TEST_CASE("planner: balanced costs share the work and meet in the middle", "[planner]") {
  const ComputeModel m = Learned(0.010, 0, 64);
  const PlanDecision d = Decide({64, 0, 0.010, false}, m);
  CHECK(d.strategy == Strategy::kCake);
  REQUIRE(d.meeting_chunk);
  CHECK(*d.meeting_chunk == 32);
  CHECK(*d.cake_s == Approx(0.32));
  CHECK(*d.compute_only_s == Approx(0.64));
  CHECK(*d.io_only_s == Approx(0.64));
}

TEST_CASE("planner: falls back to the better baseline when sharing cannot win", "[planner]") {
  SECTION("compute-dominant (slow engine, fast I/O): I/O-only") {
    const PlanDecision d = Decide({16, 0, 0.001, false}, Learned(0.100, 0, 16));
    CHECK(d.strategy == Strategy::kIoOnly);
    CHECK(d.meeting_chunk == 0u);
    CHECK(*d.io_only_s == Approx(0.016));
  }
  SECTION("I/O-dominant (fast engine, slow I/O): compute-only") {
    const PlanDecision d = Decide({16, 0, 0.100, false}, Learned(0.001, 0, 16));
    CHECK(d.strategy == Strategy::kComputeOnly);
    CHECK(d.meeting_chunk == 16u);
  }
  SECTION("a short prompt: computing even one chunk takes longer than loading both") {
    const PlanDecision d = Decide({2, 0, 0.004, false}, Learned(0.010, 0, 2));
    CHECK(d.strategy == Strategy::kIoOnly);
    CHECK(*d.cake_s == Approx(0.008));  // the best split is to load everything
    CHECK(*d.io_only_s == Approx(0.008));
  }
  SECTION("a short prompt where one computed chunk does win") {
    // The engine computes chunk 0 (10 ms) while chunk 1 loads (6 ms): 10 ms against 12 ms for loading both.
    const PlanDecision d = Decide({2, 0, 0.006, false}, Learned(0.010, 0, 2));
    CHECK(d.strategy == Strategy::kCake);
    CHECK(d.meeting_chunk == 1u);
  }
  SECTION("nothing fits the region: compute-only") {
    const PlanDecision d = Decide({8, 8, 0.010, false}, Learned(0.010, 0, 8));
    CHECK(d.strategy == Strategy::kComputeOnly);
    CHECK(d.meeting_chunk == 8u);
  }
  SECTION("the engine asked for I/O-only") {
    const PlanDecision d = Decide({8, 2, 0.010, true}, Learned(0.010, 0, 8));
    CHECK(d.strategy == Strategy::kIoOnly);
    CHECK(d.meeting_chunk == 2u);
  }
}

TEST_CASE("planner: with a cost unknown, Cake (it adapts at run time)", "[planner]") {
  CHECK(Decide({16, 0, 0, false}, Learned(0.010, 0, 4)).strategy == Strategy::kCake);
  CHECK(Decide({16, 0, 0.010, false}, ComputeModel()).strategy == Strategy::kCake);
  CHECK(!Decide({16, 0, 0.010, false}, ComputeModel()).meeting_chunk);
}

TEST_CASE("simulated load: balanced costs meet where the planner predicted, within the window", "[planner]") {
  const auto compute = [](uint32_t c, double) { return 0.010 + 0.0002 * c; };
  const auto load = [](double) { return 0.012; };
  const SimResult r = Simulate(64, compute, load, 4);
  ComputeModel m = Learned(0.010, 0.0002, 64);
  const PlanDecision d = Decide({64, 0, 0.012, false}, m);
  REQUIRE(d.meeting_chunk);
  CHECK(std::abs(static_cast<int>(r.meeting) - static_cast<int>(*d.meeting_chunk)) <= 1);
  CHECK(r.ttft_s <= *d.cake_s + 0.012 + 0.0002 * 64 + 1e-9);  // at most one chunk of waste
  CHECK(r.wasted_reads <= 4);
}

TEST_CASE("simulated load: bandwidth dropping to zero mid-load leaves the rest to the engine", "[planner]") {
  const auto compute = [](uint32_t, double) { return 0.010; };
  const auto load = [](double now) { return now < 0.050 ? 0.005 : kInf; };  // ten chunks, then nothing
  const SimResult r = Simulate(64, compute, load, 1);
  CHECK(r.meeting >= 64 - 11);
  CHECK(r.meeting <= 64 - 9);
  CHECK(r.ttft_s == Approx(r.meeting * 0.010));
}

TEST_CASE("simulated load: an engine stalling mid-load leaves the rest to the loads", "[planner]") {
  const auto compute = [](uint32_t c, double) { return c < 10 ? 0.010 : kInf; };  // ten chunks, then stuck
  const auto load = [](double) { return 0.004; };
  const SimResult r = Simulate(64, compute, load, 4);
  CHECK(r.meeting == 10);
  CHECK(r.ttft_s == Approx(54 * 0.004));
  CHECK(r.wasted_reads == 0);
}

TEST_CASE("planner: chunks in tiers of different speeds are planned by each tier's share", "[planner]") {
  // 64 chunks, half in DRAM (free), half on disk at 10 ms each; the engine computes 10 ms per chunk. An average
  // per chunk (0.32 s over 64 chunks, 5 ms) would place the meeting at 21 whatever the layout.
  const TierChunkSeconds chunk_s = {0, 0, 0.010, 0};
  const PlanDecision averaged = Decide({64, 0, 0.005, false}, Learned(0.010, 0, 64));
  REQUIRE(averaged.meeting_chunk);
  CHECK(*averaged.meeting_chunk == 21);

  SECTION("a hot prefix in DRAM, the tail on disk: loading alone is as fast as any split") {
    std::vector<TierKind> tier(64, TierKind::kDisk);
    for (uint32_t c = 0; c < 32; ++c) tier[c] = TierKind::kDram;
    const std::vector<double> suffix = LoadSuffixSeconds(tier, chunk_s, 0);
    REQUIRE(suffix.size() == 65);
    CHECK(suffix[64] == 0);
    CHECK(suffix[63] == Approx(0.010));
    CHECK(suffix[32] == Approx(0.32));
    CHECK(suffix[0] == Approx(0.32));  // the DRAM chunks load beside the disk's, adding nothing
    PlanInput input{64, 0, 0.005, false};
    input.load_suffix_s = suffix;
    const PlanDecision d = Decide(input, Learned(0.010, 0, 64));
    // The disk half takes 0.32 s whatever the engine does: no split beats I/O-only, which leaves the GPU free.
    CHECK(d.strategy == Strategy::kIoOnly);
    CHECK(*d.io_only_s == Approx(0.32));
  }
  SECTION("the tail in DRAM, the front on disk: the engine computes half the disk part") {
    std::vector<TierKind> tier(64, TierKind::kDram);
    for (uint32_t c = 0; c < 32; ++c) tier[c] = TierKind::kDisk;
    PlanInput input{64, 0, 0.005, false};
    input.load_suffix_s = LoadSuffixSeconds(tier, chunk_s, 0);
    const PlanDecision d = Decide(input, Learned(0.010, 0, 64));
    CHECK(d.strategy == Strategy::kCake);
    REQUIRE(d.meeting_chunk);
    CHECK(*d.meeting_chunk == 16);  // compute [0, 16) and load the disk chunks [16, 32): 0.16 s each
    CHECK(*d.cake_s == Approx(0.16));
  }
  SECTION("the slower tier's share decides; chunks below lowest_loadable are not loaded") {
    std::vector<TierKind> tier(64, TierKind::kDisk);
    for (uint32_t c = 0; c < 32; ++c) tier[c] = TierKind::kDram;
    CHECK(LoadSuffixSeconds(tier, TierChunkSeconds{0, 0.002, 0.010, 0}, 0)[0] == Approx(0.32));
    CHECK(LoadSuffixSeconds(tier, TierChunkSeconds{0, 0.020, 0.010, 0}, 0)[0] == Approx(0.64));
    CHECK(LoadSuffixSeconds(tier, chunk_s, 40)[0] == Approx(0.24));
  }
}

TEST_CASE("load costs: one tier's chunks at its speed, several tiers read at once, the slowest share decides",
          "[planner]") {
  constexpr TierKind kDram = TierKind::kDram, kDisk = TierKind::kDisk, kRemote = TierKind::kRemote;
  TierChunkSeconds chunk_s{};
  chunk_s[static_cast<size_t>(kDisk)] = 0.004;
  chunk_s[static_cast<size_t>(kRemote)] = 0.010;

  SECTION("all on disk: a single tier, whose load measures it") {
    const std::vector<TierKind> tiers(8, kDisk);
    const LoadCosts c = EstimateLoadCosts(tiers, chunk_s, 2);
    CHECK(c.single_tier);
    CHECK(c.load_chunk_s == Approx(0.004));
    CHECK(c.load_suffix_s.empty());
  }
  SECTION("DRAM unmeasured counts as free; the disk share decides") {
    const std::vector<TierKind> tiers{kDram, kDram, kDram, kDram, kDisk, kDisk};
    const LoadCosts c = EstimateLoadCosts(tiers, chunk_s, 0);
    CHECK_FALSE(c.single_tier);
    CHECK(c.load_chunk_s == Approx(2 * 0.004 / 6));
    REQUIRE(c.load_suffix_s.size() == 7);
    CHECK(c.load_suffix_s[0] == Approx(0.008));
    CHECK(c.load_suffix_s[5] == Approx(0.004));
    CHECK(c.load_suffix_s[6] == 0);
  }
  SECTION("the slower tier's share decides, not the average") {
    const std::vector<TierKind> tiers{kDisk, kDisk, kDisk, kRemote};
    const LoadCosts c = EstimateLoadCosts(tiers, chunk_s, 0);
    CHECK(c.load_chunk_s == Approx(std::max(3 * 0.004, 0.010) / 4));
  }
  SECTION("an unmeasured tier other than DRAM makes the cost unknown") {
    chunk_s[static_cast<size_t>(kRemote)] = 0;
    const std::vector<TierKind> tiers{kDisk, kRemote};
    const LoadCosts c = EstimateLoadCosts(tiers, chunk_s, 0);
    CHECK(c.load_chunk_s == 0);
    CHECK(c.load_suffix_s.empty());
    CHECK_FALSE(c.single_tier);
  }
  SECTION("chunks below the lowest loadable do not count") {
    const std::vector<TierKind> tiers{kRemote, kRemote, kDisk, kDisk};
    const LoadCosts c = EstimateLoadCosts(tiers, chunk_s, 2);
    CHECK(c.single_tier);
    CHECK(c.load_chunk_s == Approx(0.004));
  }
  SECTION("nothing to load") {
    const std::vector<TierKind> tiers{kDisk, kDisk};
    const LoadCosts c = EstimateLoadCosts(tiers, chunk_s, 2);
    CHECK(c.load_chunk_s == 0);
    CHECK_FALSE(c.single_tier);
  }
}

TEST_CASE("PlanLoad: the engine's hint over history, each chunk at its own tier's speed", "[planner]") {
  LoadPlanRequest request;
  request.chunk_tiers.assign(32, TierKind::kDisk);
  request.tier_chunk_s[static_cast<size_t>(TierKind::kDisk)] = 0.004;
  SECTION("no hint and no history: Cake, which adapts at run time") {
    const LoadPlanResult plan = PlanLoad(request);
    CHECK(plan.decision.strategy == Strategy::kCake);
    CHECK_FALSE(plan.decision.meeting_chunk);
    CHECK(plan.single_tier);
    CHECK_FALSE(plan.compute.known());
  }
  SECTION("history alone plans a split") {
    request.history.Observe(0, 8, 8 * 0.004);
    const LoadPlanResult plan = PlanLoad(request);
    CHECK(plan.compute.known());
    REQUIRE(plan.decision.meeting_chunk);
    // Computing a chunk costs about what loading one does: the split falls near the middle.
    CHECK(*plan.decision.meeting_chunk >= 8);
    CHECK(*plan.decision.meeting_chunk <= 24);
  }
  SECTION("a hint wins over history: the engine knows how busy it is now") {
    request.history.Observe(0, 8, 8 * 0.004);
    request.hint_first_chunk_s = 0.400;  // a hundred times slower than loading: compute-only cannot win,
    const LoadPlanResult plan = PlanLoad(request);
    CHECK(plan.compute.first_chunk_s() == Approx(0.400));
    CHECK(plan.decision.strategy == Strategy::kIoOnly);  // and loading everything beats any split
  }
  SECTION("I/O-only asked for: the meeting is the lowest loadable chunk") {
    request.io_only_requested = true;
    request.lowest_loadable = 5;
    const LoadPlanResult plan = PlanLoad(request);
    CHECK(plan.decision.strategy == Strategy::kIoOnly);
    CHECK(plan.decision.meeting_chunk == 5u);
  }
}
