// Timers: the queue's order, the hand-driven service on a fake clock, and the daemon's timer thread.
#include "base/timers.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <vector>

namespace cake {

using namespace std::chrono_literals;

TEST_CASE("timer queue: due callbacks in deadline order, ties in the order they were set", "[timers]") {
  TimerQueue queue;
  std::vector<int> fired;
  const TimePoint t0{};
  queue.Push(t0 + 3s, [&] { fired.push_back(3); });
  queue.Push(t0 + 1s, [&] { fired.push_back(1); });
  queue.Push(t0 + 1s, [&] { fired.push_back(2); });
  CHECK(queue.Next() == t0 + 1s);
  for (auto& fire : queue.PopDue(t0 + 2s)) fire();
  CHECK(fired == std::vector<int>{1, 2});
  CHECK(queue.size() == 1);
  CHECK(queue.PopDue(t0 + 2s).empty());
  for (auto& fire : queue.PopDue(t0 + 3s)) fire();
  CHECK(fired == std::vector<int>{1, 2, 3});
  CHECK(queue.Next() == TimePoint::max());
}

TEST_CASE("manual timers: time moves only when the test advances it, and a callback may set the next", "[timers]") {
  FakeClock clock;
  ManualTimers timers(clock);
  int fired = 0;
  std::function<void()> again = [&] {
    if (++fired < 3) timers.At(timers.Now() + 1s, again);
  };
  timers.At(clock.Now() + 1s, again);
  CHECK(timers.Advance(999ms) == 0);
  CHECK(timers.Advance(1ms) == 1);
  CHECK(timers.Advance(5s) == 1);  // the one set by the callback is due at 2 s; the third is set for 7 s
  CHECK(fired == 2);
  CHECK(timers.pending() == 1);
  CHECK(timers.Advance(2s) == 1);
  CHECK(fired == 3);
  CHECK(timers.pending() == 0);
}

TEST_CASE("timer thread: fires when due, earliest first, and drops what is pending when stopped", "[timers]") {
  TimerThread timers;
  std::promise<void> late_fired, early_fired;
  std::atomic<bool> early_first{false}, never{false};
  timers.At(timers.Now() + 60ms, [&] { late_fired.set_value(); });
  timers.At(timers.Now() + 10ms, [&] {
    early_first = true;
    early_fired.set_value();
  });
  timers.At(timers.Now() + 1h, [&] { never = true; });
  CHECK(early_fired.get_future().wait_for(5s) == std::future_status::ready);
  CHECK(late_fired.get_future().wait_for(5s) == std::future_status::ready);
  CHECK(early_first);
  timers.Stop();
  timers.At(timers.Now(), [&] { never = true; });  // after Stop: nothing runs
  CHECK_FALSE(never);
}

}  // namespace cake
