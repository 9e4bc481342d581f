// A clock that tests can replace, so rate limits and meeting points are checked without real sleeps.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace cake {

using Duration = std::chrono::nanoseconds;
using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Duration>;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
  virtual void SleepUntil(TimePoint t) = 0;
  void SleepFor(Duration d) { SleepUntil(Now() + d); }

  // The process-wide steady clock.
  static Clock* Real();
};

// Time moves only when a test advances it; sleepers wake when it passes their deadline.
class FakeClock final : public Clock {
 public:
  TimePoint Now() const override;
  void SleepUntil(TimePoint t) override;
  void Advance(Duration d);
  // How many threads are blocked in SleepUntil right now.
  int sleepers() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  TimePoint now_{};
  int sleepers_ = 0;
};

}  // namespace cake
