// The project's mutex: std::mutex with Abseil's lock annotations, so clang's -Wthread-safety checks the lock
// rules (scripts/check-thread-safety) and ThreadSanitizer, which sees std::mutex through pthreads, sees them too.
// absl::Mutex would give the first alone: Debian's Abseil is not built for ThreadSanitizer, whose every report on
// code under an absl::Mutex is then a false one.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace cake {

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // Tells the analysis the caller holds it (a callback run under the caller's lock); checks nothing at run time.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable for Mutex. A wait gives the mutex up and holds it again before it returns, as its annotation
// says; callers re-check their condition in a loop (or pass it), since a wake may come without a Signal.
class CondVar {
 public:
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // False when `deadline` passed first.
  template <typename Clock, typename Duration>
  bool WaitUntil(Mutex* mu, std::chrono::time_point<Clock, Duration> deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  template <typename Rep, typename Period>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return WaitUntil(mu, std::chrono::steady_clock::now() + timeout);
  }
  // Until `done()` holds (called with the mutex held).
  template <typename Done>
  void Wait(Mutex* mu, Done done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    while (!done()) Wait(mu);
  }
  // Until `done()` holds or `deadline` passes; returns done().
  template <typename Clock, typename Duration, typename Done>
  bool WaitUntil(Mutex* mu, std::chrono::time_point<Clock, Duration> deadline, Done done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    while (!done()) {
      if (!WaitUntil(mu, deadline)) return done();
    }
    return true;
  }
  template <typename Rep, typename Period, typename Done>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> timeout, Done done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return WaitUntil(mu, std::chrono::steady_clock::now() + timeout, done);
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace cake
