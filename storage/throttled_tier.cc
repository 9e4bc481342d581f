#include "storage/throttled_tier.h"

#include <algorithm>

namespace cake {

TokenBucket::TokenBucket(double rate_bytes_per_s, double burst_bytes, Clock* clock)
    : clock_(clock), rate_(rate_bytes_per_s), burst_bytes_(burst_bytes) {}

void TokenBucket::Acquire(uint64_t n) {
  TimePoint ready;
  {
    std::lock_guard lock(mu_);
    if (rate_ <= 0) return;
    const TimePoint now = clock_->Now();
    const auto burst = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(burst_bytes_ / rate_));
    const auto cost = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(n / rate_));
    // An idle bucket refills up to the burst, never beyond: credit older than `burst` is forgotten.
    next_free_ = std::max(next_free_, now - burst);
    next_free_ += cost;
    ready = next_free_ - burst;
  }
  if (ready > clock_->Now()) clock_->SleepUntil(ready);
}

void TokenBucket::SetRate(double rate_bytes_per_s) {
  std::lock_guard lock(mu_);
  rate_ = rate_bytes_per_s;
  next_free_ = clock_->Now();
}

double TokenBucket::rate() const {
  std::lock_guard lock(mu_);
  return rate_;
}

ThrottledTier::ThrottledTier(std::unique_ptr<Tier> inner, double read_gbps, Clock* clock)
    // A burst of 1 MiB keeps small reads smooth without letting a chunk-sized read skip the cap.
    : TierDecorator(std::move(inner)), bucket_(GbpsToBytesPerSecond(read_gbps), 1 << 20, clock) {}

absl::Status ThrottledTier::Read(const ChunkKey& key, std::span<std::byte> dst) {
  bucket_.Acquire(dst.size());
  return TierDecorator::Read(key, dst);
}

void ThrottledTier::SetReadGbps(double gbps) { bucket_.SetRate(GbpsToBytesPerSecond(gbps)); }

double ThrottledTier::read_gbps() const { return bucket_.rate() * 8 / 1e9; }

}  // namespace cake
