// One background thread that runs jobs in order from a queue bounded in bytes: the write-back and promotion
// queues of TierManager.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "base/clock.h"

namespace cake {

class BoundedWorker {
 public:
  // `run` is false when the job is abandoned at shutdown: it must then only release what it holds.
  using Job = std::function<void(bool run)>;

  explicit BoundedWorker(uint64_t max_queued_bytes);
  // Lets the running job end, then abandons the queued ones.
  ~BoundedWorker();
  BoundedWorker(const BoundedWorker&) = delete;
  BoundedWorker& operator=(const BoundedWorker&) = delete;

  // Queues `job`, which holds `bytes` until it has run; false (and `job` is dropped unrun) when that would take
  // the queue past its bound.
  bool TryPush(uint64_t bytes, Job job);
  // Waits until nothing is queued or running, or `bound` passes; returns the number of jobs left.
  size_t WaitIdle(Duration bound);
  uint64_t queued_bytes() const;

 private:
  struct Queued {
    uint64_t bytes;
    Job job;
  };
  void Run();

  const uint64_t max_queued_bytes_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Queued> queue_;
  uint64_t queued_bytes_ = 0;  // includes the running job's
  bool running_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace cake
