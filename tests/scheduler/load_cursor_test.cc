// LoadCursor's read order, window, meeting detection and failure handling, checked step by step and in a
// deterministic discrete-event simulation of an engine and an I/O device; and PredictMeetingChunk.
#include "scheduler/load_cursor.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <optional>
#include <queue>
#include <random>
#include <tuple>
#include <vector>

#include "scheduler/planner.h"

namespace cake {
namespace {

using Chunks = std::vector<uint32_t>;

LoadCursor::Options Opts(uint32_t cached, uint32_t window, uint32_t lowest_loadable = 0, bool follow = true) {
  LoadCursor::Options o;
  o.cached_chunks = cached;
  o.lowest_loadable = lowest_loadable;
  o.window = window;
  o.follow_progress = follow;
  return o;
}

// Issues reads until the cursor refuses one.
Chunks DrainReads(LoadCursor& c) {
  Chunks issued;
  while (auto chunk = c.NextRead()) issued.push_back(*chunk);
  return issued;
}

// The engine and the I/O device in simulated time. The engine computes chunk i in first_s + growth_s * i and
// then reports progress; before each chunk it looks at the loaded suffix and stops once the chunk is resident.
// Every read takes io_latency_s, with the cursor's window of reads in flight.
struct Simulation {
  uint32_t cached = 0;
  uint32_t lowest_loadable = 0;
  uint32_t window = 4;
  double io_latency_s = 1;
  double compute_first_s = 1;
  double compute_growth_s = 0;

  struct Result {
    uint32_t meeting = 0;
    uint32_t reads_issued = 0;
    uint32_t wasted_reads = 0;
    uint32_t computed_through = 0;
    uint32_t loaded_low = 0;
    uint32_t max_in_flight = 0;
    bool meeting_changed = false;
    bool read_below_progress = false;
  };

  Result Run() const {
    LoadCursor cursor(Opts(cached, window, lowest_loadable));
    struct Event {
      double time;
      uint64_t seq;  // ties resolve in the order events were scheduled: the run is fully deterministic
      bool engine;
      uint32_t chunk;
    };
    auto later = [](const Event& a, const Event& b) { return std::tie(a.time, a.seq) > std::tie(b.time, b.seq); };
    std::priority_queue<Event, std::vector<Event>, decltype(later)> events(later);
    uint64_t seq = 0;
    Result r;
    std::optional<uint32_t> meeting;

    auto observe = [&] {
      if (auto m = cursor.Meeting()) {
        if (!meeting) meeting = m;
        if (*m != *meeting) r.meeting_changed = true;
      }
    };
    auto issue = [&](double now) {
      while (auto chunk = cursor.NextRead()) {
        if (*chunk < cursor.computed_through()) r.read_below_progress = true;
        ++r.reads_issued;
        r.max_in_flight = std::max(r.max_in_flight, cursor.in_flight());
        events.push({now + io_latency_s, seq++, false, *chunk});
      }
    };
    auto engine_next = [&](double now, uint32_t chunk) {
      if (chunk >= cached || chunk >= cursor.loaded_low()) return;  // resident: the engine uses the loaded suffix
      events.push({now + compute_first_s + compute_growth_s * chunk, seq++, true, chunk});
    };

    observe();
    issue(0);
    engine_next(0, 0);
    while (!events.empty()) {
      const Event e = events.top();
      events.pop();
      if (e.engine) {
        cursor.OnProgress(e.chunk + 1);
        observe();
        engine_next(e.time, e.chunk + 1);
      } else {
        cursor.OnReadDone(e.chunk, true);
        observe();
      }
      issue(e.time);
    }
    REQUIRE(meeting.has_value());
    r.meeting = *meeting;
    r.wasted_reads = cursor.wasted_reads();
    r.computed_through = cursor.computed_through();
    r.loaded_low = cursor.loaded_low();
    return r;
  }

  SplitCosts Costs() const {
    // `window` reads every io_latency_s: one chunk per io_latency_s / window once the pipe is full.
    return SplitCosts{compute_first_s, compute_growth_s, io_latency_s / window};
  }
};

void CheckConsistent(const Simulation& sim, const Simulation::Result& r) {
  CHECK_FALSE(r.meeting_changed);
  CHECK_FALSE(r.read_below_progress);
  CHECK(r.max_in_flight <= sim.window);
  CHECK(r.meeting >= sim.lowest_loadable);
  CHECK(r.meeting <= sim.cached);
  // The split covers the prompt: the engine computed [0, m) and [m, H) is loaded.
  CHECK(r.computed_through >= r.meeting);
  CHECK(r.loaded_low <= r.meeting);
}

}  // namespace

TEST_CASE("load cursor: reads go from the tail backward, window at a time", "[load_cursor]") {
  LoadCursor c(Opts(10, 3));
  CHECK(DrainReads(c) == Chunks{9, 8, 7});
  CHECK(c.in_flight() == 3);
  CHECK_FALSE(c.NextRead().has_value());  // the window is full

  CHECK(c.OnReadDone(8, true).empty());  // 9 is not loaded yet: 8 is not usable on its own
  CHECK(c.in_flight() == 2);
  CHECK(DrainReads(c) == Chunks{6});
  CHECK(c.OnReadDone(9, true) == Chunks{9, 8});
  CHECK(c.loaded_low() == 8);
  CHECK(DrainReads(c) == Chunks{5});
  CHECK(c.in_flight() == 3);
  CHECK_FALSE(c.Meeting().has_value());
}

TEST_CASE("load cursor: a zero window still reads one chunk at a time", "[load_cursor]") {
  LoadCursor c(Opts(4, 0));
  CHECK(DrainReads(c) == Chunks{3});
  CHECK(c.OnReadDone(3, true) == Chunks{3});
  CHECK(DrainReads(c) == Chunks{2});
}

TEST_CASE("load cursor: never reads a chunk the engine has computed", "[load_cursor]") {
  LoadCursor c(Opts(10, 10));
  c.OnProgress(5);
  CHECK(DrainReads(c) == Chunks{9, 8, 7, 6, 5});

  LoadCursor d(Opts(10, 2));
  CHECK(DrainReads(d) == Chunks{9, 8});
  d.OnProgress(8);  // the engine got ahead of the reads: 7 and below are no longer worth reading
  CHECK(d.OnReadDone(9, true) == Chunks{9});
  CHECK_FALSE(d.NextRead().has_value());
  CHECK(d.OnReadDone(8, true) == Chunks{8});
  CHECK(d.Meeting() == 8u);
  // Progress only moves forward.
  d.OnProgress(3);
  CHECK(d.computed_through() == 8);
}

TEST_CASE("load cursor: nothing cached meets at 0 at once", "[load_cursor]") {
  LoadCursor c(Opts(0, 4));
  CHECK(c.Meeting() == 0u);
  CHECK_FALSE(c.NextRead().has_value());
  CHECK(c.wasted_reads() == 0);
  CHECK(c.OnReadDone(0, true).empty());
}

TEST_CASE("load cursor: lowest_loadable bounds the reads and the meeting", "[load_cursor]") {
  SECTION("reads stop at lowest_loadable, and the meeting is there when the engine is slow") {
    LoadCursor c(Opts(10, 16, /*lowest_loadable=*/6));
    CHECK(DrainReads(c) == Chunks{9, 8, 7, 6});
    for (uint32_t chunk : {9u, 8u, 7u}) c.OnReadDone(chunk, true);
    CHECK_FALSE(c.Meeting().has_value());
    CHECK(c.OnReadDone(6, true) == Chunks{6});
    CHECK(c.Meeting() == 6u);
  }
  SECTION("the meeting is above lowest_loadable when the engine is faster") {
    LoadCursor c(Opts(10, 16, 6));
    DrainReads(c);
    c.OnReadDone(9, true);
    c.OnReadDone(8, true);
    c.OnProgress(8);
    CHECK(c.Meeting() == 8u);
  }
  SECTION("no room at all: the engine computes everything") {
    LoadCursor c(Opts(10, 4, 10));
    CHECK(c.Meeting() == 10u);
    CHECK_FALSE(c.NextRead().has_value());
  }
  SECTION("lowest_loadable above the cached chunks is clamped to them") {
    LoadCursor c(Opts(5, 4, 99));
    CHECK(c.Meeting() == 5u);
    CHECK_FALSE(c.NextRead().has_value());
  }
}

TEST_CASE("load cursor: a failed read hands that chunk and everything below it to the engine", "[load_cursor]") {
  LoadCursor c(Opts(10, 3));
  CHECK(DrainReads(c) == Chunks{9, 8, 7});
  CHECK(c.OnReadDone(8, false).empty());
  CHECK(c.failed() == 1);
  CHECK(c.in_flight() == 2);
  CHECK_FALSE(c.NextRead().has_value());  // nothing below the failure is worth reading
  CHECK_FALSE(c.Meeting().has_value());   // 9 is still in flight

  CHECK(c.OnReadDone(7, true).empty());  // loaded, but below the gap
  CHECK(c.OnReadDone(9, true) == Chunks{9});
  CHECK(c.Meeting() == 9u);
  CHECK(c.loaded_low() == 9);
  CHECK(c.wasted_reads() == 1);  // chunk 7 was read for nothing; the failed read is not counted as waste
}

TEST_CASE("load cursor: a failure at the tail means the engine computes everything", "[load_cursor]") {
  LoadCursor c(Opts(4, 1));
  CHECK(DrainReads(c) == Chunks{3});
  c.OnReadDone(3, false);
  CHECK(c.Meeting() == 4u);
  CHECK_FALSE(c.NextRead().has_value());
}

TEST_CASE("load cursor: out-of-order completions only extend the contiguous suffix", "[load_cursor]") {
  LoadCursor c(Opts(6, 6));
  CHECK(DrainReads(c) == Chunks{5, 4, 3, 2, 1, 0});
  CHECK(c.OnReadDone(3, true).empty());
  CHECK(c.OnReadDone(4, true).empty());
  CHECK(c.loaded_low() == 6);
  CHECK(c.OnReadDone(5, true) == Chunks{5, 4, 3});
  CHECK(c.loaded_low() == 3);
  CHECK(c.OnReadDone(1, true).empty());
  CHECK(c.OnReadDone(2, true) == Chunks{2, 1});
  CHECK_FALSE(c.Meeting().has_value());
  CHECK(c.OnReadDone(0, true) == Chunks{0});
  CHECK(c.Meeting() == 0u);
  CHECK(c.wasted_reads() == 0);
}

TEST_CASE("load cursor: completions that are not outstanding reads change nothing", "[load_cursor]") {
  LoadCursor c(Opts(6, 2));
  DrainReads(c);
  CHECK(c.OnReadDone(5, true) == Chunks{5});
  CHECK(c.OnReadDone(5, true).empty());   // a duplicate
  CHECK(c.OnReadDone(1, true).empty());   // never issued
  CHECK(c.OnReadDone(99, true).empty());  // beyond the cached chunks
  CHECK(c.in_flight() == 1);
  CHECK(c.loaded_low() == 5);
  CHECK(c.failed() == 0);
}

TEST_CASE("load cursor: newly loaded chunks omit those the engine already computed", "[load_cursor]") {
  LoadCursor c(Opts(6, 6));
  DrainReads(c);
  c.OnProgress(4);
  CHECK(c.OnReadDone(3, true).empty());
  CHECK(c.OnReadDone(4, true).empty());
  CHECK(c.OnReadDone(5, true) == Chunks{5, 4});  // 3 joined the suffix too, but the engine has it
  CHECK(c.Meeting() == 4u);
}

TEST_CASE("load cursor: I/O-only loads ignore progress and load down to lowest_loadable", "[load_cursor]") {
  LoadCursor c(Opts(8, 2, /*lowest_loadable=*/2, /*follow=*/false));
  c.OnProgress(6);
  Chunks order;
  Chunks loaded;
  for (;;) {
    auto chunks = DrainReads(c);
    if (chunks.empty()) break;
    order.insert(order.end(), chunks.begin(), chunks.end());
    for (uint32_t chunk : chunks) {
      auto got = c.OnReadDone(chunk, true);
      loaded.insert(loaded.end(), got.begin(), got.end());
      if (chunk != 2) CHECK_FALSE(c.Meeting().has_value());
    }
  }
  CHECK(order == Chunks{7, 6, 5, 4, 3, 2});
  CHECK(loaded == Chunks{7, 6, 5, 4, 3, 2});  // computed chunks included: the engine asked for every byte
  CHECK(c.Meeting() == 2u);
  c.OnProgress(8);
  CHECK(c.Meeting() == 2u);
}

TEST_CASE("load cursor: the meeting stays put once set", "[load_cursor]") {
  SECTION("when the engine catches up") {
    LoadCursor c(Opts(8, 8));
    DrainReads(c);
    c.OnReadDone(7, true);
    c.OnReadDone(6, true);
    CHECK(c.wasted_reads() == 0);  // not final yet
    c.OnProgress(6);
    REQUIRE(c.Meeting() == 6u);
    CHECK(c.wasted_reads() == 6);  // chunks 0 to 5 are still being read for nothing
    CHECK_FALSE(c.NextRead().has_value());

    for (uint32_t chunk : {5u, 4u, 3u}) CHECK(c.OnReadDone(chunk, true).empty());
    c.OnReadDone(2, false);
    c.OnProgress(7);
    c.OnProgress(8);
    CHECK(c.Meeting() == 6u);
    CHECK(c.wasted_reads() == 5);  // 0, 1 still reading and 3, 4, 5 loaded; the failed 2 is not waste
  }
  SECTION("when the cursor bottoms out first") {
    LoadCursor c(Opts(4, 4));
    DrainReads(c);
    for (uint32_t chunk : {3u, 2u, 1u, 0u}) c.OnReadDone(chunk, true);
    REQUIRE(c.Meeting() == 0u);
    // An engine that was mid-chunk when everything arrived still reports its progress.
    c.OnProgress(1);
    c.OnProgress(3);
    CHECK(c.Meeting() == 0u);
    CHECK(c.wasted_reads() == 0);
  }
}

TEST_CASE("load cursor: simulated engine much faster than I/O meets near the tail", "[load_cursor][sim]") {
  Simulation sim;
  sim.cached = 32;
  sim.window = 4;
  sim.io_latency_s = 100;  // 25 per chunk against 1 per computed chunk
  sim.compute_first_s = 1;
  const auto r = sim.Run();
  CheckConsistent(sim, r);
  CHECK(r.meeting >= 28);
  CHECK(sim.cached - r.meeting <= 4);
  CHECK(r.reads_issued <= 8);
}

TEST_CASE("load cursor: simulated engine much slower than I/O meets at the start", "[load_cursor][sim]") {
  Simulation sim;
  sim.cached = 32;
  sim.window = 4;
  sim.io_latency_s = 1;
  sim.compute_first_s = 1000;
  const auto r = sim.Run();
  CheckConsistent(sim, r);
  CHECK(r.meeting == 0);
  CHECK(r.reads_issued == 32);
  CHECK(r.wasted_reads == 0);
}

TEST_CASE("load cursor: simulated balanced engine meets near the predicted middle", "[load_cursor][sim]") {
  Simulation sim;
  sim.cached = 64;
  sim.window = 4;

  SECTION("constant compute cost") {
    sim.io_latency_s = 40;  // 10 per chunk, the same as computing one
    sim.compute_first_s = 10;
  }
  SECTION("compute cost growing with the prefix") {
    sim.io_latency_s = 40;
    sim.compute_first_s = 4;
    sim.compute_growth_s = 0.3;
  }
  SECTION("a wider window") {
    sim.window = 16;
    sim.io_latency_s = 120;
    sim.compute_first_s = 6;
    sim.compute_growth_s = 0.1;
  }
  const auto r = sim.Run();
  CheckConsistent(sim, r);
  const uint32_t predicted = PredictMeetingChunk(sim.cached, 0, sim.Costs());
  INFO("meeting " << r.meeting << ", predicted " << predicted);
  CHECK(predicted > sim.cached / 4);
  CHECK(predicted < 3 * sim.cached / 4);
  CHECK(std::abs(static_cast<int>(r.meeting) - static_cast<int>(predicted)) <= 2);
  // Reads in flight when the engine arrives are the only waste: at most a window.
  CHECK(r.wasted_reads <= sim.window);
}

TEST_CASE("load cursor: simulated load with lowest_loadable", "[load_cursor][sim]") {
  Simulation sim;
  sim.cached = 32;
  sim.lowest_loadable = 20;
  sim.window = 4;
  sim.io_latency_s = 1;
  sim.compute_first_s = 1000;
  const auto r = sim.Run();
  CheckConsistent(sim, r);
  CHECK(r.meeting == 20);
  CHECK(r.reads_issued == 12);
}

TEST_CASE("predict meeting chunk", "[load_cursor][predict]") {
  SECTION("slow loads: the engine computes nearly everything") { CHECK(PredictMeetingChunk(32, 0, {1, 0, 100}) >= 31); }
  SECTION("fast loads: everything loadable is loaded") {
    CHECK(PredictMeetingChunk(32, 0, {1, 0, 0.01}) == 0);
    CHECK(PredictMeetingChunk(32, 5, {1, 0, 0.01}) == 5);
    CHECK(PredictMeetingChunk(32, 0, {1, 0, 0}) == 0);
  }
  SECTION("free compute: the engine computes everything") { CHECK(PredictMeetingChunk(32, 0, {0, 0, 1}) == 32); }
  SECTION("equal costs meet in the middle") {
    CHECK(PredictMeetingChunk(32, 0, {1, 0, 1}) == 16);
    CHECK(PredictMeetingChunk(33, 0, {1, 0, 1}) == 16);
  }
  SECTION("growing compute cost moves the meeting down") {
    // max(sum_{i<m} (1 + i), 4 * (32 - m)) is least at m = 12 (78 vs 80; m = 13 gives 91).
    CHECK(PredictMeetingChunk(32, 0, {1, 1, 4}) == 12);
    CHECK(PredictMeetingChunk(32, 0, {1, 1, 4}) < PredictMeetingChunk(32, 0, {1, 0, 4}));
  }
  SECTION("degenerate inputs") {
    CHECK(PredictMeetingChunk(0, 0, {1, 0, 1}) == 0);
    CHECK(PredictMeetingChunk(10, 10, {1, 0, 1}) == 10);
    CHECK(PredictMeetingChunk(10, 50, {1, 0, 1}) == 10);
  }
  SECTION("always within [lowest_loadable, H]") {
    std::mt19937 rng(42);
    std::uniform_real_distribution<double> cost(0, 10);
    for (int i = 0; i < 500; ++i) {
      const uint32_t h = rng() % 200;
      const uint32_t lowest = rng() % 220;
      const uint32_t m = PredictMeetingChunk(h, lowest, {cost(rng), cost(rng) / 10, cost(rng)});
      CHECK(m >= std::min(lowest, h));
      CHECK(m <= h);
    }
  }
}

TEST_CASE("load cursor: chunks in different tiers are read at once, a window per tier", "[load_cursor]") {
  // Chunks 0-3 on disk, 4-7 in DRAM: the DRAM chunks do not wait behind the disk reads.
  const TierKind disk = TierKind::kDisk, dram = TierKind::kDram;
  std::vector<TierKind> tiers = {disk, disk, disk, disk, dram, dram, dram, dram};
  LoadCursor cursor({8, 0, 2, true, tiers});
  CHECK(cursor.NextRead() == 7u);
  CHECK(cursor.NextRead() == 6u);
  CHECK(cursor.NextRead() == 3u);  // DRAM's window is full: the disk's starts below
  CHECK(cursor.NextRead() == 2u);
  CHECK(cursor.NextRead() == std::nullopt);
  CHECK(cursor.in_flight() == 4);

  // A disk chunk landing first is held until everything above it is loaded.
  CHECK(cursor.OnReadDone(3, true).empty());
  CHECK(cursor.OnReadDone(7, true) == std::vector<uint32_t>{7});
  CHECK(cursor.NextRead() == 5u);  // DRAM has room again; the highest unread chunk goes first
  CHECK(cursor.OnReadDone(6, true) == std::vector<uint32_t>{6});
  CHECK(cursor.OnReadDone(5, true) == std::vector<uint32_t>{5});
  CHECK(cursor.NextRead() == 4u);
  CHECK(cursor.NextRead() == 1u);  // the disk has one read in flight (2) after 3 landed: room for one more
  CHECK(cursor.NextRead() == std::nullopt);
  CHECK(cursor.OnReadDone(4, true) == (std::vector<uint32_t>{4, 3}));
  CHECK(cursor.OnReadDone(2, true) == std::vector<uint32_t>{2});
  CHECK(cursor.OnReadDone(1, true) == std::vector<uint32_t>{1});
  CHECK(cursor.NextRead() == 0u);
  CHECK(cursor.OnReadDone(0, true) == std::vector<uint32_t>{0});
  CHECK(cursor.Meeting() == 0u);
  CHECK(cursor.wasted_reads() == 0);
}

TEST_CASE("load cursor: a tier list of the wrong size means one window", "[load_cursor]") {
  LoadCursor cursor({4, 0, 1, true, {TierKind::kDram, TierKind::kDisk}});
  CHECK(cursor.NextRead() == 3u);
  CHECK(cursor.NextRead() == std::nullopt);
}

TEST_CASE("load cursor: a read judged not worth it is passed over, and so are lower ones of its class",
          "[load_cursor]") {
  LoadCursor::Options o = Opts(8, 4);
  o.chunk_tiers = {TierKind::kDisk, TierKind::kDisk, TierKind::kDisk, TierKind::kDisk,
                   TierKind::kDram, TierKind::kDram, TierKind::kDram, TierKind::kDram};  // chunks 0-3 in a second tier
  LoadCursor c(o);
  std::vector<std::pair<uint32_t, uint32_t>> asked;
  // Only reads with nothing queued ahead of them in their tier are worth it.
  auto worth = [&](uint32_t chunk, uint32_t queued) {
    asked.emplace_back(chunk, queued);
    return queued == 0;
  };
  CHECK(c.NextRead(worth) == std::optional<uint32_t>(7));
  CHECK(asked == std::vector<std::pair<uint32_t, uint32_t>>{{7, 0}});
  asked.clear();
  // Chunk 6 would queue behind 7: declined, and with it 5 and 4; the other tier's 3 has its own queue.
  CHECK(c.NextRead(worth) == std::optional<uint32_t>(3));
  CHECK(asked == std::vector<std::pair<uint32_t, uint32_t>>{{6, 1}, {3, 0}});
  asked.clear();
  CHECK_FALSE(c.NextRead(worth).has_value());
  CHECK(asked == std::vector<std::pair<uint32_t, uint32_t>>{{6, 1}, {2, 1}});
  // Without a judge the window is the only limit.
  CHECK(c.NextRead() == std::optional<uint32_t>(6));
  // The judge has the last word even with nothing in flight (the load stream then arms a re-check).
  c.OnReadDone(7, true);
  c.OnReadDone(6, true);
  c.OnReadDone(3, true);
  CHECK_FALSE(c.NextRead([](uint32_t, uint32_t) { return false; }).has_value());
  CHECK(c.NextRead([](uint32_t, uint32_t) { return true; }) == std::optional<uint32_t>(5));
}

}  // namespace cake
