// The threads that run tier reads and writes, fed through one bounded queue so overload shows up as
// backpressure (a refused submission) instead of unbounded memory. Loads' reads are grouped, one group per load,
// and an arbiter policy decides which load's queued read a free thread takes next: loads share a tier's
// bandwidth, and the order in which they are served decides their times to first token.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "base/mutex.h"
#include "scheduler/arbiter_policy.h"

namespace cake {

// One load's place in the arbiter. The load keeps `remaining` up to date for kShortestRemaining.
class IoGroup {
 public:
  void SetRemaining(uint32_t chunks) { remaining_.store(chunks, std::memory_order_relaxed); }

 private:
  friend class IoPool;
  uint64_t arrival_ = 0;
  uint64_t last_served_ = 0;  // guarded by the pool's mutex
  std::atomic<uint32_t> remaining_{0};
  struct Queued {
    std::chrono::steady_clock::time_point since;
    std::function<void()> task;
  };
  std::deque<Queued> queue_;  // guarded by the pool's mutex
};

class IoPool {
 public:
  // `starvation_limit`: under kShortestRemaining, a load whose oldest queued read has waited this long is served
  // first, so a long load cannot starve behind a steady stream of short ones.
  IoPool(int threads, size_t queue_capacity, ArbiterPolicy policy = ArbiterPolicy::kShortestRemaining,
         std::chrono::milliseconds starvation_limit = std::chrono::milliseconds(1000));
  ~IoPool() { Stop(); }
  // Refuses new work, runs what is queued, then joins its threads. Idempotent; never call it from a pool thread.
  void Stop();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  std::shared_ptr<IoGroup> NewGroup();
  // False when the queue is full: the caller turns that into RESOURCE_EXHAUSTED or retries later. Tasks without
  // a group (RPC work: Store, RegisterRegion, Evict) go before any load's reads, in the order they came.
  bool TrySubmit(std::function<void()> task);
  bool TrySubmit(const std::shared_ptr<IoGroup>& group, std::function<void()> task);
  // A task that starts only while the pool has nothing else to do: no other task queued or running, and no load
  // with chunks left to read (a group whose `remaining` is above 0: between two of its reads, while a promotion
  // or its client holds its window, it has none queued, yet it is reading). Prefetch reads: a load's reads always
  // go first, and a read submitted while an idle task runs waits for no more than a free thread. False when the
  // pool is stopping or `capacity` idle tasks wait already.
  bool TrySubmitIdle(std::function<void()> task);
  size_t queued() const;
  ArbiterPolicy policy() const { return policy_; }
  // Tasks that ended with an exception (logged and dropped; the thread serves on).
  uint64_t failed_tasks() const { return failed_tasks_.load(std::memory_order_relaxed); }

 private:
  void Run();
  // The next task by the policy; requires queued_ > 0.
  std::function<void()> TakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Nothing runs but idle tasks and no live group has chunks left to read (forgets the groups that are gone).
  bool IdleMayStartLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How often a thread with idle tasks waiting looks again: a load's last read landing, or its end, signals
  // nobody.
  static constexpr auto kIdleRecheck = std::chrono::milliseconds(5);

  const size_t capacity_;
  const ArbiterPolicy policy_;
  const std::chrono::steady_clock::duration starvation_limit_;
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> ungrouped_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<IoGroup>> waiting_ ABSL_GUARDED_BY(mu_);  // groups with queued tasks
  size_t queued_ ABSL_GUARDED_BY(mu_) = 0;                              // grouped and ungrouped, not idle
  size_t busy_ ABSL_GUARDED_BY(mu_) = 0;                                // tasks running, not idle ones
  std::deque<std::function<void()>> idle_ ABSL_GUARDED_BY(mu_);
  std::vector<std::weak_ptr<IoGroup>> groups_ ABSL_GUARDED_BY(mu_);  // every group handed out and still alive
  bool idle_poller_ ABSL_GUARDED_BY(mu_) = false;  // a thread waits out kIdleRecheck for the idle tasks
  uint64_t next_arrival_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t serve_clock_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> failed_tasks_{0};
  std::vector<std::thread> threads_;
};

}  // namespace cake
