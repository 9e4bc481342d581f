#include "base/timers.h"

namespace cake {

void IdleWatch::Restart(Duration timeout, std::function<void(uint64_t)> check) {
  ++generation_;
  check_ = std::move(check);
  Arm(timers_.Now() + timeout);
}

IdleWatch::Verdict IdleWatch::Check(uint64_t generation, Duration timeout) {
  if (generation != generation_) return Verdict::kStale;
  if (timers_.Now() - last_activity_ >= timeout) return Verdict::kExpired;
  Arm(last_activity_ + timeout);
  return Verdict::kNotYet;
}

void IdleWatch::Arm(TimePoint when) {
  timers_.At(when, [check = check_, generation = generation_] { check(generation); });
}

void TimerQueue::Push(TimePoint when, std::function<void()> fire) {
  heap_.push(Entry{when, next_order_++, std::move(fire)});
}

TimePoint TimerQueue::Next() const { return heap_.empty() ? TimePoint::max() : heap_.top().when; }

std::vector<std::function<void()>> TimerQueue::PopDue(TimePoint now) {
  std::vector<std::function<void()>> due;
  while (!heap_.empty() && heap_.top().when <= now) {
    // top() is const: the callback is copied out before the entry goes (std::function copies are cheap enough
    // for the few timers a load sets).
    due.push_back(heap_.top().fire);
    heap_.pop();
  }
  return due;
}

TimerThread::TimerThread() : thread_([this] { Run(); }) {}

void TimerThread::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  std::lock_guard lock(mu_);
  queue_ = TimerQueue();  // what the callbacks hold goes now, not with the object
}

void TimerThread::At(TimePoint when, std::function<void()> fire) {
  bool earliest = false;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    earliest = when < queue_.Next();
    queue_.Push(when, std::move(fire));
  }
  if (earliest) wake_.notify_one();
}

void TimerThread::Run() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    const TimePoint next = queue_.Next();
    if (next == TimePoint::max()) {
      wake_.wait(lock);
      continue;
    }
    if (Now() < next) {
      wake_.wait_until(lock, std::chrono::steady_clock::time_point(next.time_since_epoch()));
      continue;
    }
    std::vector<std::function<void()>> due = queue_.PopDue(Now());
    lock.unlock();
    for (auto& fire : due) fire();  // outside the lock: a callback may set the next timer
    lock.lock();
  }
}

void ManualTimers::At(TimePoint when, std::function<void()> fire) {
  std::lock_guard lock(mu_);
  queue_.Push(when, std::move(fire));
}

int ManualTimers::Advance(Duration d) {
  clock_.Advance(d);
  int fired = 0;
  for (;;) {
    std::vector<std::function<void()>> due;
    {
      std::lock_guard lock(mu_);
      due = queue_.PopDue(clock_.Now());
    }
    if (due.empty()) return fired;
    for (auto& fire : due) fire();
    fired += static_cast<int>(due.size());
  }
}

size_t ManualTimers::pending() const {
  std::lock_guard lock(mu_);
  return queue_.size();
}

}  // namespace cake
