// TierManager's write path: Store lands in the fastest tier and is written back to the slower ones in the
// background, bounded in memory; reads from a slower tier are promoted into the fastest.
#include <algorithm>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "storage/dram_tier.h"
#include "storage/tier_manager.h"
#include "tests/storage/tier_test_util.h"

using namespace cake;
using namespace cake::testing;
using namespace std::chrono_literals;

namespace {

constexpr size_t kChunk = 64 << 10;

// A tier whose writes take `delay`: a disk that cannot keep up with the writers.
class SlowWriteTier final : public TierDecorator {
 public:
  SlowWriteTier(std::unique_ptr<Tier> inner, std::chrono::milliseconds delay)
      : TierDecorator(std::move(inner)), delay_(delay) {}
  absl::Status Write(const ChunkKey& key, std::span<const std::byte> src) override {
    std::this_thread::sleep_for(delay_);
    return TierDecorator::Write(key, src);
  }

 private:
  std::chrono::milliseconds delay_;
};

// A tier that counts how many writes run at once: each write waits (up to `hold`) until `expected` are in flight.
class OverlapProbeTier final : public TierDecorator {
 public:
  OverlapProbeTier(std::unique_ptr<Tier> inner, int expected, std::chrono::milliseconds hold)
      : TierDecorator(std::move(inner)), expected_(expected), hold_(hold) {}
  absl::Status Write(const ChunkKey& key, std::span<const std::byte> src) override {
    {
      std::unique_lock lock(mu_);
      max_in_flight_ = std::max(max_in_flight_, ++in_flight_);
      cv_.notify_all();
      cv_.wait_for(lock, hold_, [&] { return in_flight_ >= expected_; });
    }
    absl::Status s = TierDecorator::Write(key, src);
    std::lock_guard lock(mu_);
    --in_flight_;
    return s;
  }
  int max_in_flight() const {
    std::lock_guard lock(mu_);
    return max_in_flight_;
  }

 private:
  const int expected_;
  const std::chrono::milliseconds hold_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int in_flight_ = 0;
  int max_in_flight_ = 0;
};

// Two real tiers: a small fast one and a larger one standing where the disk tier goes.
struct TwoTiers {
  explicit TwoTiers(TierManager::Options options = {}, uint64_t fast_bytes = 4 * kChunk,
                    std::chrono::milliseconds slow_write = {})
      : manager(options) {
    auto fast = std::make_unique<DramTier>(fast_bytes);
    std::unique_ptr<Tier> slow_tier = std::make_unique<DramTier>(64 * kChunk);
    if (slow_write.count() > 0) slow_tier = std::make_unique<SlowWriteTier>(std::move(slow_tier), slow_write);
    fast_tier = fast.get();
    slow = slow_tier.get();
    manager.AddTier(TierKind::kDram, std::move(fast));
    manager.AddTier(TierKind::kDisk, std::move(slow_tier));
  }
  TierManager manager;
  DramTier* fast_tier;
  Tier* slow;
};

}  // namespace

TEST_CASE("write-back: a write reaches every tier, the fastest at once", "[storage][write-back]") {
  TwoTiers t;
  for (uint32_t i = 0; i < 8; ++i) REQUIRE(t.manager.Write(TestKey(i), TestValue(i, kChunk)).ok());
  CHECK(t.manager.FlushWriteBack(std::chrono::seconds(10)) == 0);
  for (uint32_t i = 0; i < 8; ++i) {
    std::vector<std::byte> out(kChunk);
    REQUIRE(t.slow->Read(TestKey(i), out).ok());
    CHECK(out == TestValue(i, kChunk));
  }
  // The fast tier holds 4 chunks: the older ones were evicted there but survive in the slower tier.
  CHECK(t.fast_tier->Usage().chunks == 4);
  CHECK(t.manager.LookupPrefix(std::vector{TestKey(0), TestKey(7)}) == std::vector{TierKind::kDisk, TierKind::kDram});
  CHECK(t.manager.write_back_stats().written == 8);
  CHECK(t.manager.write_back_stats().queued_bytes == 0);
}

TEST_CASE("write-back writes chunks side by side on writeback.threads threads, one at a time on one",
          "[storage][write-back]") {
  for (uint32_t threads : {4u, 1u}) {
    INFO(threads << " write-back threads");
    TierManager::Options options;
    options.write_back_threads = threads;
    TierManager manager(options);
    manager.AddTier(TierKind::kDram, std::make_unique<DramTier>(16 * kChunk));
    // Four threads meet within the hold; one thread waits it out alone for each chunk, so keep it short there.
    auto probe =
        std::make_unique<OverlapProbeTier>(std::make_unique<DramTier>(16 * kChunk), 4, threads == 4 ? 10s : 20ms);
    OverlapProbeTier* slow = probe.get();
    manager.AddTier(TierKind::kDisk, std::move(probe));
    for (uint32_t i = 0; i < 4; ++i) REQUIRE(manager.Write(TestKey(i), TestValue(i, kChunk)).ok());
    CHECK(manager.FlushWriteBack(std::chrono::seconds(30)) == 0);
    CHECK(slow->max_in_flight() == static_cast<int>(threads));
    CHECK(manager.write_back_stats().written == 4);
    for (uint32_t i = 0; i < 4; ++i) {
      std::vector<std::byte> out(kChunk);
      REQUIRE(slow->Read(TestKey(i), out).ok());
      CHECK(out == TestValue(i, kChunk));
    }
  }
}

TEST_CASE("write-back: a full queue makes the writer copy itself, nothing is dropped", "[storage][write-back]") {
  // Room for one queued chunk and a second tier that takes 300 ms per write: while the first write-back is
  // under way the queue is full, so the next writer copies itself.
  TwoTiers t(TierManager::Options{kChunk}, 4 * kChunk, std::chrono::milliseconds(300));
  for (uint32_t i = 0; i < 4; ++i) REQUIRE(t.manager.Write(TestKey(i), TestValue(i, kChunk)).ok());
  CHECK(t.manager.write_back_stats().inline_writes >= 1);
  CHECK(t.manager.write_back_stats().queued_bytes <= kChunk);
  CHECK(t.manager.FlushWriteBack(std::chrono::seconds(10)) == 0);
  for (uint32_t i = 0; i < 4; ++i) CHECK(t.slow->Contains(TestKey(i)));
  CHECK(t.manager.write_back_stats().written == 4);
}

TEST_CASE("write-back: a slower tier's refusal is counted, the write still succeeds", "[storage][write-back]") {
  TierManager manager;
  manager.AddTier(TierKind::kDram, std::make_unique<DramTier>(8 * kChunk));
  manager.AddTier(TierKind::kDisk, std::make_unique<DramTier>(kChunk / 2));  // too small for any chunk
  REQUIRE(manager.Write(TestKey(1), TestValue(1, kChunk)).ok());
  CHECK(manager.FlushWriteBack(std::chrono::seconds(10)) == 0);
  CHECK(manager.write_back_stats().failed == 1);
  CHECK(manager.LookupPrefix(std::vector{TestKey(1)}) == std::vector{TierKind::kDram});
}

TEST_CASE("write-back: the fastest tier's refusal is the write's error", "[storage][write-back]") {
  TwoTiers t({}, kChunk / 2);
  CHECK(t.manager.Write(TestKey(1), TestValue(1, kChunk)).code() == absl::StatusCode::kResourceExhausted);
  CHECK(t.manager.FlushWriteBack(std::chrono::seconds(10)) == 0);
  CHECK(!t.slow->Contains(TestKey(1)));
}

TEST_CASE("promotion copies a chunk read from a slower tier into the fastest", "[storage][write-back]") {
  TwoTiers t;
  REQUIRE(t.slow->Write(TestKey(3), TestValue(3, kChunk)).ok());
  std::vector<std::byte> out(kChunk);
  REQUIRE(t.manager.Read(TierKind::kDisk, TestKey(3), out).ok());
  t.manager.Promote(TestKey(3), out);
  CHECK(t.manager.LookupPrefix(std::vector{TestKey(3)}) == std::vector{TierKind::kDram});
  t.manager.Promote(TestKey(3), out);  // already there: no second copy
  CHECK(t.manager.write_back_stats().promotions == 1);
}

TEST_CASE("a manager destroyed with write-backs queued does not wait for them", "[storage][write-back]") {
  const auto start = std::chrono::steady_clock::now();
  {
    // One second per write-back on one write-back thread: waiting for all six would take six.
    TierManager::Options one_thread;
    one_thread.write_back_threads = 1;
    TwoTiers t(one_thread, 8 * kChunk, std::chrono::milliseconds(1000));
    for (uint32_t i = 0; i < 6; ++i) REQUIRE(t.manager.Write(TestKey(i), TestValue(i, kChunk)).ok());
    CHECK(t.manager.FlushWriteBack(std::chrono::milliseconds(10)) > 0);
  }
  // Only the write-back already under way is finished.
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(4500));
}

TEST_CASE("write-back holds the DRAM tier's own bytes: evictions meanwhile lose nothing", "[storage][write-back]") {
  // 100 ms per write-back and a 4-chunk DRAM tier: chunks 0 and 1 are queued (half the tier may be lent), the
  // later writes evict them from DRAM before their write-back runs.
  TwoTiers t({}, 4 * kChunk, std::chrono::milliseconds(100));
  for (uint32_t i = 0; i < 8; ++i) REQUIRE(t.manager.Write(TestKey(i), TestValue(i, kChunk)).ok());
  CHECK(t.manager.write_back_stats().inline_writes >= 1);
  CHECK(t.manager.FlushWriteBack(std::chrono::seconds(10)) == 0);
  std::vector<std::byte> out(kChunk);
  for (uint32_t i = 0; i < 8; ++i) {
    REQUIRE(t.slow->Read(TestKey(i), out).ok());
    CHECK(out == TestValue(i, kChunk));
  }
  CHECK(t.fast_tier->Usage().chunks == 4);
  for (uint32_t i = 4; i < 8; ++i) {
    REQUIRE(t.fast_tier->Read(TestKey(i), out).ok());
    CHECK(out == TestValue(i, kChunk));
  }
  CHECK(t.manager.write_back_stats().written == 8);
}

TEST_CASE("PromoteLater copies on the promotion thread and then calls done", "[storage][write-back]") {
  TwoTiers t;
  const auto value = TestValue(5, kChunk);
  std::atomic<int> done{0};
  REQUIRE(t.manager.PromoteLater(TestKey(5), value, [&] { ++done; }));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (done == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  CHECK(done == 1);
  std::vector<std::byte> out(kChunk);
  REQUIRE(t.fast_tier->Read(TestKey(5), out).ok());
  CHECK(out == value);
  CHECK(t.manager.write_back_stats().promotions == 1);
  // Already in the fastest tier: nothing to do, and done is not called.
  CHECK(!t.manager.PromoteLater(TestKey(5), value, [&] { ++done; }));
  CHECK(done == 1);
}

TEST_CASE("a full promotion queue drops promotions and counts them", "[storage][write-back]") {
  // The fastest tier takes a second per write and the queue holds one chunk: while the first promotion runs,
  // the next ones are dropped, not waited for.
  TierManager manager(TierManager::Options{uint64_t{1} << 30, kChunk});
  auto fast = std::make_unique<SlowWriteTier>(std::make_unique<DramTier>(16 * kChunk), 1000ms);
  Tier* fast_tier = fast.get();
  manager.AddTier(TierKind::kDram, std::move(fast));
  manager.AddTier(TierKind::kDisk, std::make_unique<DramTier>(16 * kChunk));
  std::vector<std::vector<std::byte>> values;
  for (uint32_t i = 0; i < 4; ++i) values.push_back(TestValue(i, kChunk));
  std::atomic<int> done{0};
  int queued = 0;
  for (uint32_t i = 0; i < 4; ++i) queued += manager.PromoteLater(TestKey(i), values[i], [&] { ++done; }) ? 1 : 0;
  CHECK(queued == 1);
  CHECK(manager.write_back_stats().promotions_dropped == 3);
  while (done < queued) std::this_thread::sleep_for(1ms);
  CHECK(fast_tier->Contains(TestKey(0)));
  CHECK(!fast_tier->Contains(TestKey(3)));
}
