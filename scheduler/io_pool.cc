#include "scheduler/io_pool.h"

namespace cake {

IoPool::IoPool(int threads, size_t queue_capacity) : capacity_(queue_capacity) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

IoPool::~IoPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

bool IoPool::TrySubmit(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    if (stopping_ || queue_.size() >= capacity_) return false;
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return true;
}

size_t IoPool::queued() const {
  std::lock_guard lock(mu_);
  return queue_.size();
}

void IoPool::Run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace cake
