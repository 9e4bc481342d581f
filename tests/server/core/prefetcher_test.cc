// Prefetch: chunks only a slower tier holds copied into DRAM ahead of a load, the tail first, within a budget;
// a chunk being copied counts as DRAM to a lookup and its read waits for the copy, so it is read once.
#include "server/core/prefetcher.h"

#include <catch2/catch.hpp>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "scheduler/io_pool.h"
#include "storage/dram_tier.h"
#include "storage/tier_manager.h"
#include "tests/storage/tier_test_util.h"

namespace cake {
namespace {

using testing::Eventually;
using testing::TestKey;
using testing::TestValue;

constexpr uint64_t kChunk = 4096;

// The slower tier: a DRAM tier under the disk's kind whose reads are counted and, while closed, wait; `networked`
// makes it say it waits on a network, as Redis does.
class GatedTier final : public TierDecorator {
 public:
  explicit GatedTier(bool networked = false)
      : TierDecorator(std::make_unique<DramTier>(64 << 20)), networked_(networked) {}
  TierCapabilities Capabilities() const override {
    TierCapabilities c = TierDecorator::Capabilities();
    c.waits_on_network = networked_;
    return c;
  }
  absl::Status Read(const ChunkKey& key, std::span<std::byte> dst) override {
    {
      std::unique_lock lock(mu_);
      ++reads_;
      ++waiting_;
      changed_.notify_all();
      changed_.wait(lock, [&] { return open_; });
      --waiting_;
    }
    return TierDecorator::Read(key, dst);
  }
  void Close() {
    std::lock_guard lock(mu_);
    open_ = false;
  }
  void Open() {
    std::lock_guard lock(mu_);
    open_ = true;
    changed_.notify_all();
  }
  bool WaitForReader() {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, std::chrono::seconds(5), [&] { return waiting_ > 0; });
  }
  int reads() {
    std::lock_guard lock(mu_);
    return reads_;
  }

 private:
  const bool networked_;
  std::mutex mu_;
  std::condition_variable changed_;
  bool open_ = true;
  int reads_ = 0;
  int waiting_ = 0;
};

// A slower tier whose reads throw, as a library out of memory or descriptors may.
class ThrowingTier final : public TierDecorator {
 public:
  ThrowingTier() : TierDecorator(std::make_unique<DramTier>(1 << 20)) {}
  absl::Status Read(const ChunkKey&, std::span<std::byte>) override { throw std::runtime_error("no descriptors"); }
};

struct Tiers {
  explicit Tiers(bool networked = false) {
    auto gated = std::make_unique<GatedTier>(networked);
    slow = gated.get();
    manager.AddTier(TierKind::kDram, std::make_unique<DramTier>(64 << 20));
    manager.AddTier(TierKind::kDisk, std::move(gated));
  }
  // Chunks [0, n) on the slower tier only.
  std::vector<ChunkKey> OnDisk(uint32_t first, uint32_t n) {
    std::vector<ChunkKey> keys;
    for (uint32_t i = first; i < first + n; ++i) {
      keys.push_back(TestKey(i));
      REQUIRE(slow->Write(keys.back(), TestValue(i, kChunk)).ok());
    }
    return keys;
  }
  TierManager manager;
  GatedTier* slow = nullptr;
};

// Copies the test runs itself, one at a time, in the order the prefetcher submits them.
struct ManualCopies {
  Prefetcher::SubmitIdle Submit() {
    return [this](TierKind, std::function<void()> copy) {
      std::lock_guard lock(mu);
      tasks.push_back(std::move(copy));
      return true;
    };
  }
  bool RunOne() {
    std::function<void()> task;
    {
      std::lock_guard lock(mu);
      if (tasks.empty()) return false;
      task = std::move(tasks.front());
      tasks.pop_front();
    }
    task();
    return true;
  }
  size_t pending() {
    std::lock_guard lock(mu);
    return tasks.size();
  }
  std::mutex mu;
  std::deque<std::function<void()>> tasks;
};

}  // namespace

TEST_CASE("prefetch: a chunk being copied counts as DRAM, and a read of it waits for the copy and reads once",
          "[prefetch]") {
  Tiers t;
  const std::vector<ChunkKey> keys = t.OnDisk(0, 2);
  CHECK(t.manager.LookupPrefix(keys) == std::vector<TierKind>{TierKind::kDisk, TierKind::kDisk});
  t.slow->Close();
  // Statuses are checked on this thread: Catch2's assertions are not thread-safe (TSan saw two threads race in them).
  absl::Status copied, read;
  std::thread copier([&] { copied = t.manager.Prefetch(keys[1], TierKind::kDisk, kChunk); });
  REQUIRE(t.slow->WaitForReader());
  CHECK(t.manager.arrivals_in_flight() == 1);
  CHECK(t.manager.LookupPrefix(keys) == std::vector<TierKind>{TierKind::kDisk, TierKind::kDram});
  // A load's read from DRAM waits for the copy rather than reading the slower tier again.
  std::vector<std::byte> got(kChunk);
  std::thread reader([&] { read = t.manager.Read(TierKind::kDram, keys[1], got); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  t.slow->Open();
  reader.join();
  copier.join();
  CHECK(copied.ok());
  CHECK(read.ok());
  CHECK(got == TestValue(1, kChunk));
  CHECK(t.slow->reads() == 1);
  CHECK(t.manager.arrivals_in_flight() == 0);
  CHECK(t.manager.InFastestTier(keys[1]));
  // Copied already, or copying: not again.
  CHECK(absl::IsAlreadyExists(t.manager.Prefetch(keys[1], TierKind::kDisk, kChunk)));
  // A chunk no tier holds: the read's NOT_FOUND, and nothing is left waiting.
  CHECK(absl::IsNotFound(t.manager.Prefetch(TestKey(99), TierKind::kDisk, kChunk)));
  CHECK(t.manager.arrivals_in_flight() == 0);
}

TEST_CASE("prefetch: a copy from a networked tier is not waited for: a DRAM read of it misses at once", "[prefetch]") {
  Tiers t(/*networked=*/true);
  const std::vector<ChunkKey> keys = t.OnDisk(0, 1);
  t.slow->Close();
  absl::Status copied;  // checked on this thread: Catch2's assertions are not thread-safe
  std::thread copier([&] { copied = t.manager.Prefetch(keys[0], TierKind::kDisk, kChunk); });
  REQUIRE(t.slow->WaitForReader());
  // A frozen Redis must not hold the threads DRAM reads need: the lookup does not call it DRAM, and a read does not
  // wait for the copy.
  CHECK(t.manager.LookupPrefixInMemory(keys).Prefix().empty());
  std::vector<std::byte> got(kChunk);
  CHECK(absl::IsNotFound(t.manager.Read(TierKind::kDram, keys[0], got)));
  t.slow->Open();
  copier.join();
  CHECK(copied.ok());
  CHECK(t.manager.InFastestTier(keys[0]));
}

TEST_CASE("prefetch: a copy whose read throws is an error, and its chunk is no arrival any more", "[prefetch]") {
  TierManager manager;
  manager.AddTier(TierKind::kDram, std::make_unique<DramTier>(1 << 20));
  manager.AddTier(TierKind::kDisk, std::make_unique<ThrowingTier>());
  const absl::Status copied = manager.Prefetch(TestKey(1), TierKind::kDisk, kChunk);
  CHECK(copied.code() == absl::StatusCode::kInternal);
  CHECK(copied.message().find("no descriptors") != std::string_view::npos);
  CHECK(manager.arrivals_in_flight() == 0);
  std::vector<std::byte> got(kChunk);
  const auto started = std::chrono::steady_clock::now();
  CHECK(absl::IsNotFound(manager.Read(TierKind::kDram, TestKey(1), got)));  // at once: nothing to wait for
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
}

TEST_CASE("prefetch: the tail is copied first, one at a time, and a later load uses what was copied", "[prefetch]") {
  Tiers t;
  Counters counters;
  ManualCopies copies;
  Prefetcher prefetcher({.max_bytes = 64 * kChunk, .reads_in_flight = 1}, t.manager, copies.Submit(), counters,
                        Clock::Real());
  const std::vector<ChunkKey> keys = t.OnDisk(0, 6);
  std::vector<TierKind> tiers = t.manager.LookupPrefix(keys);
  // Chunk 0 is in DRAM already: nothing to copy.
  REQUIRE(t.manager.Write(keys[0], TestValue(0, kChunk)).ok());
  tiers[0] = TierKind::kDram;
  CHECK(prefetcher.Prefetch(keys, tiers, kChunk) == 5);
  CHECK(prefetcher.held_bytes() == 5 * kChunk);
  for (uint32_t expected = 5; expected >= 1; --expected) {
    REQUIRE(copies.pending() == 1);  // one copy in flight at a time
    REQUIRE(copies.RunOne());
    CHECK(t.manager.InFastestTier(keys[expected]));  // the highest chunk not yet copied
    if (expected > 1) CHECK_FALSE(t.manager.InFastestTier(keys[expected - 1]));
  }
  CHECK(copies.pending() == 0);
  CHECK(counters.prefetch_chunks_copied == 5);
  CHECK(counters.prefetch_bytes_copied == 5 * kChunk);
  // A second prefetch of the same prompt finds nothing left to copy.
  CHECK(prefetcher.Prefetch(keys, t.manager.LookupPrefix(keys), kChunk) == 0);
  prefetcher.LoadStarted(keys);
  CHECK(counters.prefetch_chunks_used == 5);
  CHECK(prefetcher.held_bytes() == 0);
  CHECK(prefetcher.prefetch_to_load_seconds.Read().count == 5);
  // The load reads every chunk from DRAM, the slower tier no more.
  const int slow_reads = t.slow->reads();
  std::vector<std::byte> got(kChunk);
  for (uint32_t c = 0; c < 6; ++c) {
    REQUIRE(t.manager.Read(TierKind::kDram, keys[c], got).ok());
    CHECK(got == TestValue(c, kChunk));
  }
  CHECK(t.slow->reads() == slow_reads);
}

TEST_CASE("prefetch: a load that starts first reads the queued chunks itself", "[prefetch]") {
  Tiers t;
  Counters counters;
  ManualCopies copies;
  Prefetcher prefetcher({.max_bytes = 64 * kChunk, .reads_in_flight = 1}, t.manager, copies.Submit(), counters,
                        Clock::Real());
  const std::vector<ChunkKey> keys = t.OnDisk(0, 4);
  CHECK(prefetcher.Prefetch(keys, t.manager.LookupPrefix(keys), kChunk) == 4);
  REQUIRE(copies.RunOne());  // chunk 3 copied; chunk 2's copy submitted, not started; 1 and 0 queued
  prefetcher.LoadStarted(keys);
  CHECK(counters.prefetch_chunks_used == 1);     // copied
  CHECK(counters.prefetch_chunks_dropped == 3);  // submitted or queued: the load reads them
  CHECK(prefetcher.held_bytes() == 0);
  const int slow_reads = t.slow->reads();
  REQUIRE(copies.RunOne());  // the submitted copy runs, finds its chunk taken, and reads nothing
  CHECK(copies.pending() == 0);
  CHECK(t.slow->reads() == slow_reads);
  CHECK_FALSE(t.manager.InFastestTier(keys[2]));
  CHECK(counters.prefetch_chunks_copied == 1);
  CHECK(prefetcher.held_bytes() == 0);
}

TEST_CASE("prefetch: the budget holds under 1000 prefetches of distinct prompts, and what nobody loads expires",
          "[prefetch]") {
  Tiers t;
  Counters counters;
  ManualCopies copies;
  FakeClock clock;
  constexpr uint64_t kBudgetChunks = 16;
  Prefetcher prefetcher({.max_bytes = kBudgetChunks * kChunk, .reads_in_flight = 2, .ttl = std::chrono::seconds(30)},
                        t.manager, copies.Submit(), counters, &clock);
  const std::vector<TierKind> on_disk(4, TierKind::kDisk);
  for (uint32_t p = 0; p < 1000; ++p) {
    std::vector<ChunkKey> keys;
    for (uint32_t c = 0; c < 4; ++c) keys.push_back(TestKey(100000 + p * 4 + c));
    prefetcher.Prefetch(keys, on_disk, kChunk);
    CHECK(prefetcher.held_bytes() <= kBudgetChunks * kChunk);
  }
  CHECK(counters.prefetches == 1000);
  // One tenant's prefetches hold at most three quarters of the budget.
  constexpr uint64_t kTenantShare = kBudgetChunks - kBudgetChunks / 4;
  CHECK(counters.prefetch_chunks_queued == kTenantShare);
  CHECK(counters.prefetch_chunks_over_budget == 4000 - kTenantShare);
  CHECK(copies.pending() == 2);  // reads_in_flight
  // These chunks are on no tier: the copies fail and give their share back.
  while (copies.RunOne()) {
  }
  CHECK(counters.prefetch_chunks_failed == kTenantShare);
  CHECK(prefetcher.held_bytes() == 0);

  // Copied, then never loaded: forgotten once the ttl has passed, and counted wasted.
  const std::vector<ChunkKey> keys = t.OnDisk(0, 3);
  CHECK(prefetcher.Prefetch(keys, t.manager.LookupPrefix(keys), kChunk) == 3);
  while (copies.RunOne()) {
  }
  CHECK(prefetcher.held_bytes() == 3 * kChunk);
  clock.Advance(std::chrono::seconds(29));
  prefetcher.Expire();
  CHECK(counters.prefetch_chunks_wasted == 0);
  clock.Advance(std::chrono::seconds(2));
  prefetcher.Expire();
  CHECK(counters.prefetch_chunks_wasted == 3);
  CHECK(prefetcher.held_bytes() == 0);
}

TEST_CASE("prefetch: one tenant's prefetches cannot take the whole budget from another's", "[prefetch]") {
  // Issue 46 (lows): at 4054af8 one budget served every tenant, and one that prefetched long prompts starved
  // another's in 7 of 10 rounds of the audit.
  Tiers t;
  Counters counters;
  ManualCopies copies;
  constexpr uint64_t kBudgetChunks = 16;
  Prefetcher prefetcher({.max_bytes = kBudgetChunks * kChunk, .reads_in_flight = 1}, t.manager, copies.Submit(),
                        counters, Clock::Real());
  auto prompt = [](uint32_t first, uint32_t n) {
    std::vector<ChunkKey> keys;
    for (uint32_t c = 0; c < n; ++c) keys.push_back(TestKey(first + c));
    return keys;
  };
  const std::vector<TierKind> on_disk(100, TierKind::kDisk);
  CHECK(prefetcher.Prefetch(prompt(1000, 100), on_disk, kChunk, {}, "greedy") == 12);  // three quarters
  CHECK(prefetcher.Prefetch(prompt(2000, 8), std::span(on_disk).first(8), kChunk, {}, "other") == 2);
  // The last eighth is kept for tenants holding little: every newcomer still gets a chunk in.
  CHECK(prefetcher.Prefetch(prompt(3000, 8), std::span(on_disk).first(8), kChunk, {}, "third") == 1);
  CHECK(prefetcher.Prefetch(prompt(4000, 8), std::span(on_disk).first(8), kChunk, {}, "fourth") == 1);
  CHECK(prefetcher.held_bytes() == kBudgetChunks * kChunk);
  CHECK(prefetcher.Prefetch(prompt(5000, 8), std::span(on_disk).first(8), kChunk, {}, "greedy") == 0);
}

TEST_CASE("prefetch: copies run on idle I/O threads only, after a running load's reads", "[prefetch]") {
  Tiers t;
  Counters counters;
  IoPool pool(2, 64);
  Prefetcher prefetcher(
      {.max_bytes = 64 * kChunk, .reads_in_flight = 2}, t.manager,
      [&](TierKind, std::function<void()> copy) { return pool.TrySubmitIdle(std::move(copy)); }, counters,
      Clock::Real());
  const std::vector<ChunkKey> keys = t.OnDisk(0, 4);
  // A load's read holds the pool: no copy starts until it is done, though a thread is free.
  std::mutex mu;
  std::condition_variable cv;
  bool release = false, running = false;
  auto group = pool.NewGroup();
  REQUIRE(pool.TrySubmit(group, [&] {
    std::unique_lock lock(mu);
    running = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  }));
  {
    std::unique_lock lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(5), [&] { return running; }));
  }
  CHECK(prefetcher.Prefetch(keys, t.manager.LookupPrefix(keys), kChunk) == 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(t.slow->reads() == 0);
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  CHECK(Eventually([&] { return counters.prefetch_chunks_copied.load() == 4; }));
  for (const ChunkKey& key : keys) CHECK(t.manager.InFastestTier(key));
  prefetcher.Stop();
}

}  // namespace cake
