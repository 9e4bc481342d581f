// Bandwidth caps: a token bucket shared by all readers of a tier, and the decorator that applies it, so
// experiments can reproduce a given disk or network speed (the paper's 7 to 100 Gbps settings).
#pragma once

#include "absl/base/thread_annotations.h"
#include "base/clock.h"
#include "base/mutex.h"
#include "storage/tier.h"

namespace cake {

// Lets `rate` bytes per second through on average, with bursts of up to `burst` bytes. Concurrent callers
// queue up in arrival order, so the cap holds for their sum.
class TokenBucket {
 public:
  // rate_bytes_per_s == 0 means unlimited.
  TokenBucket(double rate_bytes_per_s, double burst_bytes, Clock* clock = Clock::Real());

  // Blocks until n bytes may pass, or the bucket is interrupted.
  void Acquire(uint64_t n);
  // Bytes granted but not yet passed are re-timed at the new rate, in the same order, and waiting callers see it
  // within one wake-up slice: a cap raised after a tiny one frees the reads queued under it.
  void SetRate(double rate_bytes_per_s, double burst_bytes);
  double rate() const;
  // Every wait ends now, and later Acquires pass at once: the daemon is stopping.
  void Interrupt();

 private:
  // How long a waiter sleeps at most before it looks again at the rate and at an interrupt.
  static constexpr Duration kWakeSlice = std::chrono::milliseconds(5);

  Clock* const clock_;
  mutable Mutex mu_;
  double rate_ ABSL_GUARDED_BY(mu_);
  double burst_bytes_ ABSL_GUARDED_BY(mu_);
  // When the bytes already granted will all have passed; min() makes a new bucket start full, whatever the clock.
  TimePoint next_free_ ABSL_GUARDED_BY(mu_) = TimePoint::min();
  uint64_t granted_bytes_ ABSL_GUARDED_BY(mu_) =
      0;  // ever: a waiter's place is the count when its own bytes were added
  bool interrupted_ ABSL_GUARDED_BY(mu_) = false;
};

inline double GbpsToBytesPerSecond(double gbps) { return gbps * 1e9 / 8; }

// The lowest read cap there is: below it one chunk would take hours, and a load stays stalled long after the cap
// is raised again.
inline constexpr double kMinReadCapGbps = 0.001;

class ThrottledTier final : public TierDecorator {
 public:
  // Caps reads at read_gbps (0: unlimited); writes pass untouched, since the load path is what is modelled. An
  // idle tier lets `burst_s` worth of bytes through at once (1 ms: the cap holds at every time scale a load can
  // notice); 0 makes it a simulated device that serves one read after another, each taking size / bandwidth.
  ThrottledTier(std::unique_ptr<Tier> inner, double read_gbps, Clock* clock = Clock::Real(), double burst_s = 1e-3);

  absl::Status Read(const ChunkKey& key, std::span<std::byte> dst) override;
  // Paced by the bytes it brought back, once they are known.
  absl::Status ReadValue(const ChunkKey& key, uint64_t max_bytes, std::vector<std::byte>& out) override;
  // A lent chunk's bytes are read by whoever holds them (a DMA to a device, the write-back queue): they pass the
  // cap like a Read of the same size.
  std::shared_ptr<const std::span<const std::byte>> Lend(const ChunkKey& key) override;
  double read_cap_gbps() const override;
  TierCapabilities Capabilities() const override {
    TierCapabilities capabilities = TierDecorator::Capabilities();
    capabilities.capped = true;
    return capabilities;
  }
  // 0: no cap, as when constructed with 0; INVALID_ARGUMENT below kMinReadCapGbps.
  absl::Status SetReadCapGbps(double gbps) override;
  void Interrupt() override;

 private:
  TokenBucket bucket_;
  double burst_s_;
};

}  // namespace cake
