// Background threads that run jobs from a queue bounded in bytes, started in the order they were queued: the
// write-back and promotion queues of TierManager. With more than one thread, jobs run side by side (the
// write-back's fdatasync of one chunk overlaps the writing of the next).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "base/clock.h"
#include "base/mutex.h"

namespace cake {

class BoundedWorker {
 public:
  // `run` is false when the job is abandoned at shutdown: it must then only release what it holds.
  using Job = std::function<void(bool run)>;

  explicit BoundedWorker(uint64_t max_queued_bytes, uint32_t threads = 1);
  // Lets the running job end, then abandons the queued ones.
  ~BoundedWorker();
  BoundedWorker(const BoundedWorker&) = delete;
  BoundedWorker& operator=(const BoundedWorker&) = delete;

  // Queues `job`, which holds `bytes` until it has run; false (and `job` is dropped unrun) when that would take
  // the queue past its bound.
  bool TryPush(uint64_t bytes, Job job);
  // Waits until nothing is queued or running, or `bound` passes; returns the number of jobs left (queued or
  // running).
  size_t WaitIdle(Duration bound);
  uint64_t queued_bytes() const;

 private:
  struct Queued {
    uint64_t bytes;
    Job job;
  };
  void Run();

  const uint64_t max_queued_bytes_;
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // includes the running jobs'
  size_t running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace cake
