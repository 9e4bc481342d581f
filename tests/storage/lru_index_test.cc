// LruIndex: eviction order, read pins (taken under the owner's lock, released with or without it), and the
// generations that keep a stale pin or a stale writer from touching a newer entry under the same key.
#include "storage/lru_index.h"

#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "tests/storage/tier_test_util.h"

namespace cake {
namespace {

using testing::TestKey;

struct Sized {
  uint64_t bytes = 0;
};

// An owner as the tiers are: a budget in bytes, the index under its mutex.
struct Owner {
  Mutex mu;
  LruIndex<Sized> index{mu};
  uint64_t used = 0;
  std::vector<uint32_t> evicted;  // key numbers, in eviction order

  void Add(uint32_t k, uint64_t bytes) {
    MutexLock lock(&mu);
    REQUIRE(index.Insert(TestKey(k), Sized{bytes}));
    used += bytes;
  }
  bool MakeRoom(uint64_t capacity, uint64_t bytes) {
    MutexLock lock(&mu);
    return index.EvictUntil([&] { return used + bytes <= capacity; },
                            [&](const ChunkKey& key, const Sized& v) {
                              used -= v.bytes;
                              for (uint32_t k = 0; k < 64; ++k) {
                                if (TestKey(k) == key) evicted.push_back(k);
                              }
                            });
  }
};

}  // namespace

TEST_CASE("lru index: the least recently used goes first, a touch or a read makes an entry recent", "[lru]") {
  Owner o;
  for (uint32_t k = 0; k < 4; ++k) o.Add(k, 10);
  {
    MutexLock lock(&o.mu);
    CHECK(o.index.Touch(TestKey(0)) != nullptr);   // 0 is now the most recent
    CHECK(o.index.Find(TestKey(1))->bytes == 10);  // Find is not a use
    CHECK(o.index.Touch(TestKey(9)) == nullptr);
    CHECK_FALSE(o.index.Insert(TestKey(2), Sized{99}));  // indexed already: kept as it was
    CHECK(o.index.Find(TestKey(2))->bytes == 10);
  }
  REQUIRE(o.MakeRoom(40, 15));  // two must go
  CHECK(o.evicted == std::vector<uint32_t>{1, 2});
  CHECK(o.used == 20);
  MutexLock lock(&o.mu);
  CHECK(o.index.size() == 2);
}

TEST_CASE("lru index: a pinned entry is skipped by eviction until its pin goes", "[lru]") {
  Owner o;
  for (uint32_t k = 0; k < 3; ++k) o.Add(k, 10);
  LruIndex<Sized>::ReadPin pin;
  {
    MutexLock lock(&o.mu);
    pin = *o.index.PinForRead(TestKey(0));  // also a use: 0 becomes the most recent
    CHECK(pin.current());
    CHECK_FALSE(o.index.PinForRead(TestKey(7)));
  }
  // Room for nothing but pinned entries: everything else goes, and the call says it could not make room.
  CHECK_FALSE(o.MakeRoom(10, 5));
  CHECK(o.evicted == std::vector<uint32_t>{1, 2});
  pin.Release();  // takes the owner's lock itself
  CHECK(o.MakeRoom(10, 5));
  CHECK(o.evicted == std::vector<uint32_t>{1, 2, 0});
}

TEST_CASE("lru index: a pin outlives the entry it pinned, and never pins a newer one", "[lru]") {
  Owner o;
  LruIndex<Sized>::ReadPin stale;
  uint64_t first_generation = 0, second_generation = 0;
  {
    MutexLock lock(&o.mu);
    first_generation = o.index.Insert(TestKey(1), Sized{10}).value();
    stale = *o.index.PinForRead(TestKey(1));
    REQUIRE(o.index.Erase(TestKey(1)));  // removed while being read
    CHECK_FALSE(stale.current());
    auto again = o.index.Insert(TestKey(1), Sized{20});  // and written again
    REQUIRE(again);
    second_generation = *again;
    CHECK(second_generation != first_generation);
    CHECK(o.index.Current(TestKey(1), second_generation));
    CHECK_FALSE(o.index.Current(TestKey(1), first_generation));
  }
  stale.Release();  // the old reader finishes: the new entry was never pinned by it, so it can be evicted
  o.used = 20;
  CHECK(o.MakeRoom(10, 5));
  CHECK(o.evicted == std::vector<uint32_t>{1});
}

TEST_CASE("lru index: pins taken and released from many threads balance out", "[lru]") {
  Owner o;
  for (uint32_t k = 0; k < 8; ++k) o.Add(k, 1);
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&o, t] {
      for (int i = 0; i < 2000; ++i) {
        std::optional<LruIndex<Sized>::ReadPin> pin;
        {
          MutexLock lock(&o.mu);
          pin = o.index.PinForRead(TestKey((t + i) % 8));
        }
        // the read would run here, unlocked; the pin goes at the end of the iteration
      }
    });
  }
  for (auto& r : readers) r.join();
  CHECK(o.MakeRoom(0, 0));  // nothing is left pinned: everything can go
  CHECK(o.evicted.size() == 8);
}

}  // namespace cake
