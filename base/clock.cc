#include "base/clock.h"

#include <thread>

namespace cake {
namespace {

class RealClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::time_point_cast<Duration>(std::chrono::steady_clock::now()); }
  void SleepUntil(TimePoint t) override { std::this_thread::sleep_until(t); }
};

}  // namespace

Clock* Clock::Real() {
  static RealClock clock;
  return &clock;
}

TimePoint FakeClock::Now() const {
  std::lock_guard lock(mu_);
  return now_;
}

void FakeClock::SleepUntil(TimePoint t) {
  std::unique_lock lock(mu_);
  ++sleepers_;
  cv_.wait(lock, [&] { return now_ >= t; });
  --sleepers_;
}

void FakeClock::Advance(Duration d) {
  {
    std::lock_guard lock(mu_);
    now_ += d;
  }
  cv_.notify_all();
}

int FakeClock::sleepers() const {
  std::lock_guard lock(mu_);
  return sleepers_;
}

}  // namespace cake
