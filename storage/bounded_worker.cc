#include "storage/bounded_worker.h"

#include <algorithm>

namespace cake {

BoundedWorker::BoundedWorker(uint64_t max_queued_bytes, uint32_t threads) : max_queued_bytes_(max_queued_bytes) {
  for (uint32_t i = 0; i < std::max(threads, 1u); ++i) threads_.emplace_back([this] { Run(); });
}

BoundedWorker::~BoundedWorker() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  for (std::thread& t : threads_) t.join();
  std::deque<Queued> left;
  {
    MutexLock lock(&mu_);
    left.swap(queue_);
  }
  for (Queued& q : left) q.job(false);
}

bool BoundedWorker::TryPush(uint64_t bytes, Job job) {
  {
    MutexLock lock(&mu_);
    if (stopping_ || queued_bytes_ + bytes > max_queued_bytes_) return false;
    queued_bytes_ += bytes;
    queue_.push_back(Queued{bytes, std::move(job)});
  }
  cv_.SignalAll();
  return true;
}

void BoundedWorker::Run() {
  MutexLock lock(&mu_);
  for (;;) {
    cv_.Wait(&mu_, [&] {
      mu_.AssertHeld();
      return stopping_ || !queue_.empty();
    });
    if (stopping_) return;
    Queued next = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    mu_.Unlock();  // the job runs without the lock
    next.job(true);
    next.job = nullptr;  // releases what the job held before the bytes stop counting
    mu_.Lock();
    --running_;
    queued_bytes_ -= next.bytes;
    cv_.SignalAll();
  }
}

size_t BoundedWorker::WaitIdle(Duration bound) {
  MutexLock lock(&mu_);
  cv_.WaitFor(&mu_, bound, [&] {
    mu_.AssertHeld();
    return queue_.empty() && running_ == 0;
  });
  return queue_.size() + running_;
}

uint64_t BoundedWorker::queued_bytes() const {
  MutexLock lock(&mu_);
  return queued_bytes_;
}

}  // namespace cake
