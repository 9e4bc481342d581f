#include "storage/throttled_tier.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace cake {

TokenBucket::TokenBucket(double rate_bytes_per_s, double burst_bytes, Clock* clock)
    : clock_(clock), rate_(rate_bytes_per_s), burst_bytes_(burst_bytes) {}

void TokenBucket::Acquire(uint64_t n) {
  MutexLock lock(&mu_);
  if (rate_ <= 0 || interrupted_) return;
  const TimePoint now = clock_->Now();
  const auto burst = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(burst_bytes_ / rate_));
  const auto cost = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(n / rate_));
  // An idle bucket refills up to the burst, never beyond: credit older than `burst` is forgotten.
  next_free_ = std::max(next_free_, now - burst);
  next_free_ += cost;
  // The clamp above already grants the burst as credit; subtracting it here again would let 2 * burst through.
  granted_bytes_ += n;
  const uint64_t mine = granted_bytes_;
  for (;;) {
    if (rate_ <= 0 || interrupted_) return;
    // My bytes have passed once everything granted after them still has its time to go.
    const auto after_me = std::chrono::duration_cast<Duration>(
        std::chrono::duration<double>(static_cast<double>(granted_bytes_ - mine) / rate_));
    const TimePoint ready = next_free_ - after_me;
    const TimePoint at = clock_->Now();
    if (ready <= at) return;
    mu_.Unlock();  // others are granted their bytes meanwhile
    clock_->SleepUntil(std::min(ready, at + kWakeSlice));
    mu_.Lock();
  }
}

void TokenBucket::SetRate(double rate_bytes_per_s, double burst_bytes) {
  MutexLock lock(&mu_);
  const TimePoint now = clock_->Now();
  if (next_free_ > now && rate_ > 0 && rate_bytes_per_s > 0) {
    // What is still owed, in bytes, paid at the new rate.
    const double owed_bytes = std::chrono::duration<double>(next_free_ - now).count() * rate_;
    next_free_ =
        now + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(owed_bytes / rate_bytes_per_s));
  }
  rate_ = rate_bytes_per_s;
  burst_bytes_ = burst_bytes;
  // An idle bucket starts full at the new rate, as after construction.
  if (next_free_ <= now) next_free_ = TimePoint::min();
}

void TokenBucket::Interrupt() {
  MutexLock lock(&mu_);
  interrupted_ = true;
}

double TokenBucket::rate() const {
  MutexLock lock(&mu_);
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

absl::Status ThrottledTier::ReadValue(const ChunkKey& key, uint64_t max_bytes, std::vector<std::byte>& out) {
  absl::Status status = TierDecorator::ReadValue(key, max_bytes, out);
  if (status.ok()) bucket_.Acquire(out.size());
  return status;
}

std::shared_ptr<const std::span<const std::byte>> ThrottledTier::Lend(const ChunkKey& key) {
  auto lent = TierDecorator::Lend(key);
  if (lent != nullptr) bucket_.Acquire(lent->size());
  return lent;
}

absl::Status ThrottledTier::SetReadCapGbps(double gbps) {
  if (!(gbps >= 0) || (gbps > 0 && gbps < kMinReadCapGbps)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a read cap is 0 (none) or at least ", kMinReadCapGbps, " Gbit/s; got ", gbps));
  }
  bucket_.SetRate(GbpsToBytesPerSecond(gbps), GbpsToBytesPerSecond(gbps) * burst_s_);
  return absl::OkStatus();
}

void ThrottledTier::Interrupt() {
  bucket_.Interrupt();
  TierDecorator::Interrupt();
}

double ThrottledTier::read_cap_gbps() const { return bucket_.rate() * 8 / 1e9; }

}  // namespace cake
