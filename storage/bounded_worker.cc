#include "storage/bounded_worker.h"

namespace cake {

BoundedWorker::BoundedWorker(uint64_t max_queued_bytes)
    : max_queued_bytes_(max_queued_bytes), thread_([this] { Run(); }) {}

BoundedWorker::~BoundedWorker() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
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
    running_ = true;
    lock.unlock();
    next.job(true);
    next.job = nullptr;  // releases what the job held before the bytes stop counting
    lock.lock();
    running_ = false;
    queued_bytes_ -= next.bytes;
    cv_.notify_all();
  }
}

size_t BoundedWorker::WaitIdle(Duration bound) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, bound, [&] { return queue_.empty() && !running_; });
  return queue_.size() + (running_ ? 1 : 0);
}

uint64_t BoundedWorker::queued_bytes() const {
  std::lock_guard lock(mu_);
  return queued_bytes_;
}

}  // namespace cake
