// The DRAM tier's memory: the extent allocator, the arena, lending, and the bounded background worker that the
// write-back and promotion queues run on.
#include "storage/host_arena.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "storage/bounded_worker.h"
#include "storage/dram_tier.h"
#include "tests/storage/tier_test_util.h"

using namespace cake;
using namespace cake::testing;

TEST_CASE("extent allocator: page-rounded first fit, neighbours merged on free", "[arena]") {
  ExtentAllocator a(16 * ExtentAllocator::kPage);
  CHECK(a.free_bytes() == 16 * ExtentAllocator::kPage);
  const auto x = a.Allocate(1);  // one byte still takes a page
  const auto y = a.Allocate(ExtentAllocator::kPage + 1);
  const auto z = a.Allocate(4 * ExtentAllocator::kPage);
  REQUIRE((x && y && z));
  CHECK(*x == 0);
  CHECK(*y == ExtentAllocator::kPage);
  CHECK(*z == 3 * ExtentAllocator::kPage);
  CHECK(a.free_bytes() == 9 * ExtentAllocator::kPage);
  CHECK(!a.Allocate(10 * ExtentAllocator::kPage));

  // Freeing the middle leaves a two-page hole that a three-page request skips and a two-page one fills.
  a.Free(*y, ExtentAllocator::kPage + 1);
  CHECK(a.largest_free_extent() == 9 * ExtentAllocator::kPage);
  CHECK(*a.Allocate(3 * ExtentAllocator::kPage) == 7 * ExtentAllocator::kPage);
  CHECK(*a.Allocate(2 * ExtentAllocator::kPage) == ExtentAllocator::kPage);

  // Everything freed merges back into one extent of the whole range.
  a.Free(*x, 1);
  a.Free(ExtentAllocator::kPage, 2 * ExtentAllocator::kPage);
  a.Free(*z, 4 * ExtentAllocator::kPage);
  a.Free(7 * ExtentAllocator::kPage, 3 * ExtentAllocator::kPage);
  CHECK(a.free_bytes() == 16 * ExtentAllocator::kPage);
  CHECK(a.largest_free_extent() == 16 * ExtentAllocator::kPage);
}

TEST_CASE("host arena: reserved, prefaulted, writable, an impossible size is a clear error", "[arena]") {
  auto arena = HostArena::Reserve(1 << 20);
  REQUIRE(arena.ok());
  CHECK(arena->size() == 1 << 20);
  arena->Prefault(arena->size());
  std::memset(arena->data(), 0x5a, arena->size());
  CHECK(arena->data()[12345] == std::byte{0x5a});

  HostArena moved = std::move(*arena);
  CHECK(moved.data() != nullptr);
  CHECK(arena->data() == nullptr);

  auto huge = HostArena::Reserve(uint64_t{1} << 62);
  REQUIRE(!huge.ok());
  CHECK(huge.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(huge.status().message().find("DRAM tier") != std::string_view::npos);
}

TEST_CASE("DRAM tier: a tier whose memory cannot be reserved refuses writes with the reason", "[dram]") {
  DramTier tier(uint64_t{1} << 62);
  CHECK(tier.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(tier.Write(TestKey(1), TestValue(1, 4096)).code() == absl::StatusCode::kResourceExhausted);
  CHECK(!tier.Contains(TestKey(1)));
}

TEST_CASE("DRAM tier: lent bytes stay intact after eviction and removal, then return to the arena", "[dram]") {
  constexpr size_t kChunk = 64 << 10;
  DramTier tier(2 * kChunk, /*prefault=*/true);
  REQUIRE(tier.status().ok());
  REQUIRE(tier.Write(TestKey(0), TestValue(0, kChunk)).ok());
  auto lent = tier.Lend(TestKey(0));
  REQUIRE(lent != nullptr);
  CHECK(tier.Lend(TestKey(9)) == nullptr);

  // Chunks 1 and 2 evict chunk 0; its memory is not reused while lent, so the lent bytes do not change.
  REQUIRE(tier.Write(TestKey(1), TestValue(1, kChunk)).ok());
  REQUIRE(tier.Write(TestKey(2), TestValue(2, kChunk)).ok());
  CHECK(!tier.Contains(TestKey(0)));
  CHECK(std::equal(lent->begin(), lent->end(), TestValue(0, kChunk).begin()));
  auto lent2 = tier.Lend(TestKey(2));
  REQUIRE(tier.Remove(TestKey(2)).ok());
  REQUIRE(tier.Write(TestKey(3), TestValue(3, kChunk)).ok());
  CHECK(std::equal(lent2->begin(), lent2->end(), TestValue(2, kChunk).begin()));

  // Once let go, the memory is reused: many more chunks cycle through without the tier refusing any.
  lent.reset();
  lent2.reset();
  for (uint32_t i = 10; i < 40; ++i) REQUIRE(tier.Write(TestKey(i), TestValue(i, kChunk)).ok());
  std::vector<std::byte> out(kChunk);
  REQUIRE(tier.Read(TestKey(39), out).ok());
  CHECK(out == TestValue(39, kChunk));
  CHECK(tier.Usage().chunks == 2);
}

TEST_CASE("bounded worker: runs jobs in order, refuses past its bound, abandons the queue at shutdown",
          "[write-back]") {
  std::atomic<int> ran{0};
  std::atomic<int> abandoned{0};
  std::atomic<bool> release{false};
  std::thread releaser;
  {
    BoundedWorker worker(3);
    // The first job blocks the worker until released, so the queue fills behind it.
    REQUIRE(worker.TryPush(1, [&](bool run) {
      while (run && !release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ++(run ? ran : abandoned);
    }));
    REQUIRE(worker.TryPush(2, [&](bool run) { ++(run ? ran : abandoned); }));
    CHECK(worker.queued_bytes() == 3);
    CHECK(!worker.TryPush(1, [&](bool) { FAIL("a refused job must not run"); }));
    CHECK(worker.WaitIdle(std::chrono::milliseconds(20)) == 2);
    release = true;
    CHECK(worker.WaitIdle(std::chrono::seconds(10)) == 0);
    CHECK(ran == 2);
    CHECK(worker.queued_bytes() == 0);

    // At destruction the running job finishes and the queued ones are called with run=false, so they can let go
    // of what they hold.
    release = false;
    std::atomic<bool> started{false};
    REQUIRE(worker.TryPush(1, [&](bool run) {
      started = true;
      while (run && !release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ++(run ? ran : abandoned);
    }));
    REQUIRE(worker.TryPush(1, [&](bool run) { ++(run ? ran : abandoned); }));
    while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    releaser = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      release = true;
    });
  }
  releaser.join();
  CHECK(ran == 3);
  CHECK(abandoned == 1);
}
