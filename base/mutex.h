// The project's mutex: std::mutex with Abseil's lock annotations, so clang's -Wthread-safety checks the lock
// rules (scripts/check-thread-safety) and ThreadSanitizer, which sees std::mutex through pthreads, sees them too.
// absl::Mutex would give the first alone: Debian's Abseil is not built for ThreadSanitizer, whose every report on
// code under an absl::Mutex is then a false one.
#pragma once

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

}  // namespace cake
