#include "storage/bounded_worker.h"

#include <algorithm>

namespace cake {

BoundedWorker::BoundedWorker(uint64_t max_queued_bytes, uint32_t threads) : max_queued_bytes_(max_queued_bytes) {
  for (uint32_t i = 0; i < std::max(threads, 1u); ++i) threads_.emplace_back([this] { Run(); });
}

BoundedWorker::~BoundedWorker() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  for (Queued& q : queue_) q.job(false);
}

bool BoundedWorker::TryPush(uint64_t bytes, Job job) {
  {
    std::lock_guard lock(mu_);
    if (stopping_ || queued_bytes_ + bytes > max_queued_bytes_) return false;
    queued_bytes_ += bytes;
    queue_.push_back(Queued{bytes, std::move(job)});
  }
  cv_.notify_all();
  return true;
}

void BoundedWorker::Run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    Queued next = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    lock.unlock();
    next.job(true);
    next.job = nullptr;  // releases what the job held before the bytes stop counting
    lock.lock();
    --running_;
    queued_bytes_ -= next.bytes;
    cv_.notify_all();
  }
}

size_t BoundedWorker::WaitIdle(Duration bound) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, bound, [&] { return queue_.empty() && running_ == 0; });
  return queue_.size() + running_;
}

uint64_t BoundedWorker::queued_bytes() const {
  std::lock_guard lock(mu_);
  return queued_bytes_;
}

}  // namespace cake
