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
    // The clamp above already grants the burst as credit; subtracting it here again would let 2 * burst through.
    ready = next_free_;
  }
  if (ready > clock_->Now()) clock_->SleepUntil(ready);
}

void TokenBucket::SetRate(double rate_bytes_per_s, double burst_bytes) {
  std::lock_guard lock(mu_);
  rate_ = rate_bytes_per_s;
  burst_bytes_ = burst_bytes;
  // An idle bucket starts full at the new rate, as after construction. Bytes already granted keep their times and
  // later ones queue behind them, so reads still finish in the order they were issued (a load's loaded suffix
  // grows one chunk at a time, not in a jump when a slow old read finally lands).
  if (next_free_ <= clock_->Now()) next_free_ = TimePoint::min();
}

double TokenBucket::rate() const {
  std::lock_guard lock(mu_);
  return rate_;
}

ThrottledTier::ThrottledTier(std::unique_ptr<Tier> inner, double read_gbps, Clock* clock, double burst_s)
    : TierDecorator(std::move(inner)),
      bucket_(GbpsToBytesPerSecond(read_gbps), GbpsToBytesPerSecond(read_gbps) * burst_s, clock),
      burst_s_(burst_s) {}

absl::Status ThrottledTier::Read(const ChunkKey& key, std::span<std::byte> dst) {
  bucket_.Acquire(dst.size());
  return TierDecorator::Read(key, dst);
}

std::shared_ptr<const std::span<const std::byte>> ThrottledTier::Lend(const ChunkKey& key) {
  auto lent = TierDecorator::Lend(key);
  if (lent != nullptr) bucket_.Acquire(lent->size());
  return lent;
}

absl::Status ThrottledTier::SetReadCapGbps(double gbps) {
  if (!(gbps >= 0)) return absl::InvalidArgumentError("a read cap is a number of Gbit/s, 0 for none");
  bucket_.SetRate(GbpsToBytesPerSecond(gbps), GbpsToBytesPerSecond(gbps) * burst_s_);
  return absl::OkStatus();
}

double ThrottledTier::read_cap_gbps() const { return bucket_.rate() * 8 / 1e9; }

}  // namespace cake
