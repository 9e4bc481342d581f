// The threads that run tier reads and writes, fed through one bounded queue so overload shows up as
// backpressure (a refused submission) instead of unbounded memory.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace cake {

class IoPool {
 public:
  IoPool(int threads, size_t queue_capacity);
  ~IoPool();  // runs what is queued, then joins
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  // False when the queue is full: the caller turns that into RESOURCE_EXHAUSTED or retries later.
  bool TrySubmit(std::function<void()> task);
  size_t queued() const;

 private:
  void Run();

  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace cake
