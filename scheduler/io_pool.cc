#include "scheduler/io_pool.h"

#include <algorithm>
#include <exception>
#include <tuple>

#include "spdlog/spdlog.h"

namespace cake {

IoPool::IoPool(int threads, size_t queue_capacity, ArbiterPolicy policy, std::chrono::milliseconds starvation_limit)
    : capacity_(queue_capacity), policy_(policy), starvation_limit_(starvation_limit) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

void IoPool::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

std::shared_ptr<IoGroup> IoPool::NewGroup() {
  auto group = std::make_shared<IoGroup>();
  MutexLock lock(&mu_);
  group->arrival_ = next_arrival_++;
  // The list is pruned of ended loads' groups here and in IdleMayStartLocked, so it stays about as long as the
  // loads that run.
  if (groups_.size() >= 64 && groups_.size() % 64 == 0) {
    std::erase_if(groups_, [](const std::weak_ptr<IoGroup>& g) { return g.expired(); });
  }
  groups_.push_back(group);
  return group;
}

bool IoPool::TrySubmit(std::function<void()> task) {
  {
    MutexLock lock(&mu_);
    if (stopping_ || queued_ >= capacity_) return false;
    ungrouped_.push_back(std::move(task));
    ++queued_;
  }
  cv_.Signal();
  return true;
}

bool IoPool::TrySubmit(const std::shared_ptr<IoGroup>& group, std::function<void()> task) {
  {
    MutexLock lock(&mu_);
    if (stopping_ || queued_ >= capacity_) return false;
    if (group->queue_.empty()) waiting_.push_back(group);
    group->queue_.push_back(IoGroup::Queued{std::chrono::steady_clock::now(), std::move(task)});
    ++queued_;
  }
  cv_.Signal();
  return true;
}

bool IoPool::TrySubmitIdle(std::function<void()> task) {
  {
    MutexLock lock(&mu_);
    if (stopping_ || idle_.size() >= capacity_) return false;
    idle_.push_back(std::move(task));
  }
  cv_.Signal();
  return true;
}

bool IoPool::IdleMayStartLocked() {
  if (busy_ > 0) return false;
  bool reading = false;
  std::erase_if(groups_, [&](const std::weak_ptr<IoGroup>& weak) {
    const std::shared_ptr<IoGroup> group = weak.lock();
    if (group == nullptr) return true;
    reading |= group->remaining_.load(std::memory_order_relaxed) > 0;
    return false;
  });
  return !reading;
}

size_t IoPool::queued() const {
  MutexLock lock(&mu_);
  return queued_;
}

std::function<void()> IoPool::TakeLocked() {
  --queued_;
  if (!ungrouped_.empty()) {
    std::function<void()> task = std::move(ungrouped_.front());
    ungrouped_.pop_front();
    return task;
  }
  auto key = [&](const std::shared_ptr<IoGroup>& g) {
    switch (policy_) {
      case ArbiterPolicy::kFifo:
        return std::make_tuple(g->arrival_, uint64_t{0});
      case ArbiterPolicy::kFairShare:
        return std::make_tuple(g->last_served_, g->arrival_);
      case ArbiterPolicy::kShortestRemaining:
        return std::make_tuple(uint64_t{g->remaining_.load(std::memory_order_relaxed)}, g->arrival_);
    }
    return std::make_tuple(g->arrival_, uint64_t{0});
  };
  auto best =
      std::min_element(waiting_.begin(), waiting_.end(), [&](const auto& a, const auto& b) { return key(a) < key(b); });
  if (policy_ == ArbiterPolicy::kShortestRemaining) {
    // Aging: the load whose read has waited longest goes first once that wait passes the limit.
    auto oldest = std::min_element(waiting_.begin(), waiting_.end(), [](const auto& a, const auto& b) {
      return a->queue_.front().since < b->queue_.front().since;
    });
    if (std::chrono::steady_clock::now() - (*oldest)->queue_.front().since > starvation_limit_) best = oldest;
  }
  IoGroup& group = **best;
  std::function<void()> task = std::move(group.queue_.front().task);
  group.queue_.pop_front();
  group.last_served_ = ++serve_clock_;
  if (group.queue_.empty()) waiting_.erase(best);
  return task;
}

void IoPool::Run() {
  for (;;) {
    std::function<void()> task;
    bool idle = false;
    {
      MutexLock lock(&mu_);
      for (;;) {
        if (queued_ > 0) {
          task = TakeLocked();
          ++busy_;
          break;
        }
        if (!idle_.empty() && (stopping_ || IdleMayStartLocked())) {  // stopping: what is left runs, then we go
          task = std::move(idle_.front());
          idle_.pop_front();
          idle = true;
          break;
        }
        if (stopping_) return;
        if (idle_.empty() || idle_poller_) {
          cv_.Wait(&mu_);
        } else {  // one thread looks again now and then; the rest sleep until signalled
          idle_poller_ = true;
          cv_.WaitFor(&mu_, kIdleRecheck);
          idle_poller_ = false;
        }
      }
    }
    // A task that throws (out of memory, or out of descriptors in a library that throws) must not take the daemon
    // down with it: the request it served fails, everyone else is served. Tasks that answer a caller catch their own
    // exceptions first and answer with a status; this is the last line.
    try {
      task();
    } catch (const std::exception& e) {
      failed_tasks_.fetch_add(1, std::memory_order_relaxed);
      spdlog::error("a background task failed with an exception and was dropped: {}", e.what());
    } catch (...) {
      failed_tasks_.fetch_add(1, std::memory_order_relaxed);
      spdlog::error("a background task failed with an unknown exception and was dropped");
    }
    if (!idle) {
      bool idle_may_start = false;
      {
        MutexLock lock(&mu_);
        --busy_;
        idle_may_start = busy_ == 0 && queued_ == 0 && !idle_.empty();
      }
      if (idle_may_start) cv_.Signal();
    }
  }
}

}  // namespace cake
