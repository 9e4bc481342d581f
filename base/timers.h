// Callbacks at points in time: the daemon's one timer thread, or a test's hand-driven queue on a FakeClock, so
// timeouts are tested without real sleeps. A timer is a callback and a time; what re-arms one keeps a generation
// and ignores the callbacks of older ones (a callback cannot be taken back once handed over).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

#include "base/clock.h"

namespace cake {

class Timers {
 public:
  virtual ~Timers() = default;
  virtual TimePoint Now() const = 0;
  // Calls `fire` once, at or after `when`, on the service's thread and under none of the caller's locks; never if
  // the service ends first (what a callback refers to must be checked there, e.g. through a weak_ptr).
  virtual void At(TimePoint when, std::function<void()> fire) = 0;
};

// Ends what its peer left silent for a timeout: checked when the timeout could first have passed, then again at
// each later point it could. Each Restart begins a new generation, whose callbacks alone count. Not thread-safe:
// its owner's lock guards it (the callback takes that lock, then calls Check).
class IdleWatch {
 public:
  explicit IdleWatch(Timers& timers) : timers_(timers), last_activity_(timers.Now()) {}
  // The peer did something: the timeout counts from now.
  void Activity() { last_activity_ = timers_.Now(); }
  // Starts a new watch: `check(generation)` runs when `timeout` may have passed since the last activity.
  void Restart(Duration timeout, std::function<void(uint64_t)> check);
  enum class Verdict { kStale, kNotYet, kExpired };
  // From `check`: kStale for an older watch's callback; kNotYet (and armed again for the rest) when there was
  // activity since; kExpired when the peer was silent for `timeout`.
  Verdict Check(uint64_t generation, Duration timeout);

 private:
  void Arm(TimePoint when);

  Timers& timers_;
  TimePoint last_activity_;
  uint64_t generation_ = 0;
  std::function<void(uint64_t)> check_;
};

// Due callbacks in deadline order (ties in the order they were set).
class TimerQueue {
 public:
  void Push(TimePoint when, std::function<void()> fire);
  // The earliest deadline; TimePoint::max() when empty.
  TimePoint Next() const;
  // Removes and returns every callback due at `now`.
  std::vector<std::function<void()>> PopDue(TimePoint now);
  size_t size() const { return heap_.size(); }

 private:
  struct Entry {
    TimePoint when;
    uint64_t order;
    std::function<void()> fire;
    bool operator>(const Entry& other) const { return when != other.when ? when > other.when : order > other.order; }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap_;
  uint64_t next_order_ = 0;
};

// One thread fires every callback when it is due, on the real steady clock. Callbacks must be short: they delay
// every later one. Stop (or the destructor) ends the thread and drops what has not fired; At does nothing after.
class TimerThread final : public Timers {
 public:
  TimerThread();
  ~TimerThread() override { Stop(); }
  void Stop();
  TimerThread(const TimerThread&) = delete;
  TimerThread& operator=(const TimerThread&) = delete;

  TimePoint Now() const override { return Clock::Real()->Now(); }
  void At(TimePoint when, std::function<void()> fire) override;

 private:
  void Run();

  // std::mutex for the condition variable it waits on; nothing else is guarded by it.
  std::mutex mu_;
  std::condition_variable wake_;
  TimerQueue queue_;
  bool stopping_ = false;
  std::thread thread_;
};

// For tests: time moves when the test advances the FakeClock through Advance, which fires what became due on the
// test's own thread (and what those callbacks arm, if due by then).
class ManualTimers final : public Timers {
 public:
  explicit ManualTimers(FakeClock& clock) : clock_(clock) {}
  TimePoint Now() const override { return clock_.Now(); }
  void At(TimePoint when, std::function<void()> fire) override;
  // Returns how many callbacks fired.
  int Advance(Duration d);
  size_t pending() const;

 private:
  FakeClock& clock_;
  mutable std::mutex mu_;
  TimerQueue queue_;
};

}  // namespace cake
