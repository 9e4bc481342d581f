// TokenBucket pacing under a fake clock, and ThrottledTier capping reads (not writes) under fake and real clocks.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "storage/dram_tier.h"
#include "storage/throttled_tier.h"
#include "tests/storage/tier_test_util.h"

namespace cake {
namespace {

using namespace std::chrono_literals;
using testing::Eventually;
using testing::TestKey;
using testing::TestValue;

// Runs one blocking call on its own thread so the test can watch whether it returned.
class Background {
 public:
  explicit Background(std::function<void()> fn)
      : thread_([this, fn = std::move(fn)] {
          fn();
          done_ = true;
        }) {}
  ~Background() {
    if (thread_.joinable()) thread_.join();
  }
  bool done() const { return done_; }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// 512 bytes per second, so one byte is exactly 1953125 ns and every deadline below is exact in integer
// nanoseconds (no rounding can move a caller across a deadline by one tick). The burst is 512 bytes: 1 s.
constexpr double kRate = 512;
constexpr double kBurst = 512;
constexpr Duration ForBytes(uint64_t n) { return Duration(n * 1953125); }

// Whether the call finished without the clock moving. A caller that went to sleep instead is woken by advancing
// the clock far enough, so no thread is left behind on failure.
bool ReturnsAtOnce(FakeClock& clock, const std::function<void()>& fn) {
  Background call(fn);
  const bool finished = Eventually([&] { return call.done() || clock.sleepers() > 0; }) && call.done();
  while (!call.done()) {
    clock.Advance(24h);
    std::this_thread::sleep_for(1ms);
  }
  return finished;
}

// Starts `fn`, checks that it sleeps on the clock, is still asleep `slack` before `needed` has passed, and
// returns once `needed` has.
void ExpectBlocksFor(FakeClock& clock, Duration needed, const std::function<void()>& fn, Duration slack = 1ns) {
  Background call(fn);
  CHECK(Eventually([&] { return call.done() || clock.sleepers() == 1; }));
  CHECK_FALSE(call.done());
  clock.Advance(needed - slack);
  // Give the sleeper time to re-check its deadline: it must go back to sleep.
  std::this_thread::sleep_for(5ms);
  CHECK_FALSE(call.done());
  clock.Advance(slack);
  if (!Eventually([&] { return call.done(); })) {
    FAIL_CHECK("still blocked after the time it needed");
    while (!call.done()) {
      clock.Advance(24h);
      std::this_thread::sleep_for(1ms);
    }
  }
}

}  // namespace

TEST_CASE("token bucket: a full bucket lets the burst through at once, and no more", "[throttle]") {
  FakeClock clock;
  TokenBucket bucket(kRate, kBurst, &clock);
  CHECK(bucket.rate() == kRate);
  CHECK(ReturnsAtOnce(clock, [&] { bucket.Acquire(512); }));
  ExpectBlocksFor(clock, ForBytes(256), [&] { bucket.Acquire(256); });
}

TEST_CASE("token bucket: more than the burst waits for the excess only", "[throttle]") {
  FakeClock clock;
  TokenBucket bucket(kRate, kBurst, &clock);
  ExpectBlocksFor(clock, ForBytes(1280 - 512), [&] { bucket.Acquire(1280); });
}

TEST_CASE("token bucket: idle time refills up to the burst, never beyond", "[throttle]") {
  FakeClock clock;
  TokenBucket bucket(kRate, kBurst, &clock);
  CHECK(ReturnsAtOnce(clock, [&] { bucket.Acquire(512); }));
  clock.Advance(1h);
  CHECK(ReturnsAtOnce(clock, [&] { bucket.Acquire(512); }));
  ExpectBlocksFor(clock, ForBytes(1), [&] { bucket.Acquire(1); });

  // A partial refill grants just what the idle time paid for.
  clock.Advance(ForBytes(300));
  CHECK(ReturnsAtOnce(clock, [&] { bucket.Acquire(300); }));
  ExpectBlocksFor(clock, ForBytes(100), [&] { bucket.Acquire(100); });
}

TEST_CASE("token bucket: a sustained stream runs at the rate", "[throttle]") {
  FakeClock clock;
  TokenBucket bucket(kRate, kBurst, &clock);
  CHECK(ReturnsAtOnce(clock, [&] { bucket.Acquire(512); }));
  for (int i = 0; i < 4; ++i) ExpectBlocksFor(clock, ForBytes(128), [&] { bucket.Acquire(128); });
}

TEST_CASE("token bucket: concurrent callers share the rate", "[throttle]") {
  FakeClock clock;
  TokenBucket bucket(kRate, kBurst, &clock);
  CHECK(ReturnsAtOnce(clock, [&] { bucket.Acquire(512); }));
  Background first([&] { bucket.Acquire(512); });
  CHECK(Eventually([&] { return clock.sleepers() == 1; }));
  Background second([&] { bucket.Acquire(512); });
  CHECK(Eventually([&] { return clock.sleepers() == 2; }));
  clock.Advance(1s);
  CHECK(Eventually([&] { return first.done(); }));
  std::this_thread::sleep_for(5ms);
  CHECK_FALSE(second.done());  // its bytes queue behind the first caller's
  clock.Advance(1s);
  CHECK(Eventually([&] { return second.done(); }));
  clock.Advance(24h);  // unblocks anything a failure left asleep
}

TEST_CASE("token bucket: rate 0 is unlimited", "[throttle]") {
  FakeClock clock;
  TokenBucket bucket(0, kBurst, &clock);
  CHECK(ReturnsAtOnce(clock, [&] {
    for (int i = 0; i < 100; ++i) bucket.Acquire(uint64_t{1} << 40);
  }));
}

TEST_CASE("token bucket: SetRate changes the pacing", "[throttle]") {
  FakeClock clock;
  TokenBucket bucket(kRate, kBurst, &clock);
  CHECK(ReturnsAtOnce(clock, [&] { bucket.Acquire(512); }));

  bucket.SetRate(2 * kRate, kBurst);
  CHECK(bucket.rate() == 2 * kRate);
  // A new rate starts with a full bucket (still 512 bytes), then paces at 1024 bytes/s.
  CHECK(ReturnsAtOnce(clock, [&] { bucket.Acquire(512); }));
  ExpectBlocksFor(clock, 500ms, [&] { bucket.Acquire(512); });

  bucket.SetRate(0, kBurst);
  CHECK(ReturnsAtOnce(clock, [&] { bucket.Acquire(uint64_t{1} << 40); }));

  bucket.SetRate(kRate / 2, kBurst);
  CHECK(ReturnsAtOnce(clock, [&] { bucket.Acquire(512); }));
  ExpectBlocksFor(clock, 1s, [&] { bucket.Acquire(256); });
}

TEST_CASE("token bucket: a raised rate frees a reader queued under a tiny one at once", "[throttle]") {
  FakeClock clock;
  TokenBucket bucket(kRate, kBurst, &clock);
  CHECK(ReturnsAtOnce(clock, [&] { bucket.Acquire(512); }));  // the burst, spent
  {
    // 5120 bytes at 512 bytes/s: 10 s. After 1 s the rate goes up 100 times: the 9 s still owed become 90 ms.
    Background call([&] { bucket.Acquire(5120); });
    REQUIRE(Eventually([&] { return clock.sleepers() == 1; }));
    clock.Advance(1s);
    bucket.SetRate(100 * kRate, kBurst);
    clock.Advance(89ms);
    std::this_thread::sleep_for(5ms);
    CHECK_FALSE(call.done());
    clock.Advance(2ms);
    CHECK(Eventually([&] { return call.done(); }));
    while (!call.done()) clock.Advance(24h);
  }
  // Later callers queue behind at the new rate: 5120 bytes at 51200 bytes/s take 100 ms, less the 1 ms since the
  // queue drained (a credit well within the 10 ms burst).
  ExpectBlocksFor(clock, 99ms, [&] { bucket.Acquire(5120); });
}

TEST_CASE("token bucket: Interrupt ends every wait, and later ones pass at once", "[throttle]") {
  FakeClock clock;
  TokenBucket bucket(kRate, kBurst, &clock);
  Background call([&] { bucket.Acquire(uint64_t{1} << 30); });  // years at 512 bytes/s
  REQUIRE(Eventually([&] { return clock.sleepers() == 1; }));
  bucket.Interrupt();
  clock.Advance(10ms);  // one wake-up slice: the sleeper looks again and leaves
  CHECK(Eventually([&] { return call.done(); }));
  while (!call.done()) clock.Advance(24h);
  CHECK(ReturnsAtOnce(clock, [&] { bucket.Acquire(uint64_t{1} << 30); }));
}

TEST_CASE("throttled tier: reads are paced, writes are not", "[throttle]") {
  FakeClock clock;
  // 0.008 Gbps = 1e6 bytes/s; the tier's burst is 1 ms of that, 1000 bytes.
  ThrottledTier tier(std::make_unique<DramTier>(8 << 20), 0.008, &clock);
  CHECK(tier.read_cap_gbps() == Approx(0.008));
  CHECK(tier.name() == "dram");
  const auto value = TestValue(1, 3 << 20);

  absl::Status write0, write1;
  CHECK(ReturnsAtOnce(clock, [&] {
    write0 = tier.Write(TestKey(0), value);
    write1 = tier.Write(TestKey(1), value);
  }));
  CHECK(write0.ok());
  CHECK(write1.ok());

  std::vector<std::byte> out(value.size());
  absl::Status read;
  // 3 MiB from a full 1000-byte bucket at 1 byte/µs. Gbps conversions are not exact in binary: the check
  // brackets the deadline by 1 ms on either side.
  const Duration paced = std::chrono::microseconds((3 << 20) - 1000);
  ExpectBlocksFor(
      clock, paced + 1ms, [&] { read = tier.Read(TestKey(0), out); }, 2ms);
  CHECK(read.ok());
  CHECK(out == value);

  REQUIRE(tier.SetReadCapGbps(0).ok());
  CHECK(tier.read_cap_gbps() == 0);
  CHECK(ReturnsAtOnce(clock, [&] {
    for (int i = 0; i < 10; ++i) read = tier.Read(TestKey(1), out);
  }));
  CHECK(read.ok());
  CHECK(out == value);
}

TEST_CASE("throttled tier: lending is paced like a read, the cap and stats are on the interface", "[throttle]") {
  FakeClock clock;
  auto dram = std::make_unique<DramTier>(8 << 20);
  ThrottledTier tier(std::move(dram), 0.008, &clock);
  const auto value = TestValue(2, 1 << 20);
  REQUIRE(tier.Write(TestKey(2), value).ok());

  // A lent chunk's bytes leave the tier as surely as a read's: without the bucket a device copy from a capped
  // DRAM tier would run at memory speed.
  std::shared_ptr<const std::span<const std::byte>> lent;
  ExpectBlocksFor(
      clock, std::chrono::microseconds((1 << 20) - 1000) + 1ms, [&] { lent = tier.Lend(TestKey(2)); }, 2ms);
  REQUIRE(lent != nullptr);
  CHECK(std::equal(lent->begin(), lent->end(), value.begin(), value.end()));
  std::shared_ptr<const std::span<const std::byte>> absent;
  CHECK(ReturnsAtOnce(clock, [&] { absent = tier.Lend(TestKey(99)); }));  // nothing lent, nothing paid
  CHECK(absent == nullptr);

  // Through the Tier interface, with no cast: the cap, and the wrapped tier's counters.
  Tier& as_tier = tier;
  CHECK(as_tier.read_cap_gbps() == Approx(0.008));
  REQUIRE(as_tier.SetReadCapGbps(0.016).ok());
  CHECK(as_tier.read_cap_gbps() == Approx(0.016));
  CHECK(as_tier.SetReadCapGbps(-1).code() == absl::StatusCode::kInvalidArgument);
  CHECK(as_tier.SetReadCapGbps(1e-6).code() == absl::StatusCode::kInvalidArgument);  // below the floor
  CHECK(as_tier.read_cap_gbps() == Approx(0.016));
  CHECK(as_tier.Stats().evictions == 0);

  DramTier plain(8 << 20);
  CHECK(plain.read_cap_gbps() == 0);
  CHECK(plain.SetReadCapGbps(10).code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("throttled tier: a real-clock read takes at least its paced time", "[throttle]") {
  constexpr double kBytesPerSecond = 16e6;
  constexpr size_t kBytes = 4 << 20;
  ThrottledTier tier(std::make_unique<DramTier>(8 << 20), kBytesPerSecond * 8 / 1e9);
  const auto value = TestValue(7, kBytes);
  REQUIRE(tier.Write(TestKey(7), value).ok());
  std::vector<std::byte> out(kBytes);

  const auto start = std::chrono::steady_clock::now();
  REQUIRE(tier.Read(TestKey(7), out).ok());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Beyond the 1 ms burst, 4 MiB take 0.26 s. Only a lower bound: a busy machine is slower, never faster.
  const double paced = (kBytes - kBytesPerSecond * 1e-3) / kBytesPerSecond;
  CHECK(seconds >= 0.9 * paced);
  CHECK(out == value);
}

}  // namespace cake
