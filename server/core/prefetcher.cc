#include "server/core/prefetcher.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "base/shared_pool.h"
#include "spdlog/spdlog.h"
#include "storage/tier_manager.h"

namespace cake {

Prefetcher::Prefetcher(Options options, TierManager& tiers, SubmitIdle submit, Counters& counters, Clock* clock)
    : options_(options), tiers_(tiers), submit_(std::move(submit)), counters_(counters), clock_(clock) {}

uint32_t Prefetcher::Prefetch(std::span<const ChunkKey> keys, std::span<const TierKind> tiers, uint64_t chunk_bytes,
                              const LossyFormat& format, const std::string& tenant) {
  uint32_t queued = 0;
  MutexLock lock(&mu_);
  if (stopped_) return 0;
  Bump(counters_.prefetches);
  const TimePoint now = clock_->Now();
  uint64_t over_budget = 0;
  for (size_t c = std::min(keys.size(), tiers.size()); c-- > 0;) {
    if (tiers[c] == TierKind::kDram || tiers[c] == TierKind::kNone || entries_.contains(keys[c])) continue;
    const SharedPool budget{options_.max_bytes, options_.max_bytes - options_.max_bytes / 4};
    uint64_t& mine = held_by_tenant_[tenant];
    if (budget.Check(held_bytes_, mine, chunk_bytes) != SharedPool::Verdict::kFits) {
      // The tail is queued first, so what the budget leaves out is the head: the part an engine computes first.
      if (mine == 0) held_by_tenant_.erase(tenant);
      ++over_budget;
      continue;
    }
    entries_.emplace(keys[c], Entry{State::kQueued, tiers[c], chunk_bytes, now, format, tenant});
    queue_.push_back(keys[c]);
    held_bytes_ += chunk_bytes;
    mine += chunk_bytes;
    ++queued;
  }
  Bump(counters_.prefetch_chunks_queued, queued);
  Bump(counters_.prefetch_chunks_over_budget, over_budget);
  PumpLocked();
  return queued;
}

void Prefetcher::PumpLocked() {
  while (!stopped_ && copying_ < options_.reads_in_flight && !queue_.empty()) {
    const ChunkKey key = queue_.front();
    queue_.pop_front();
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.state != State::kQueued) continue;  // taken by a load meanwhile
    const TierKind from = it->second.from;
    const uint64_t bytes = it->second.bytes;
    const LossyFormat format = it->second.format;
    it->second.state = State::kSubmitted;
    ++copying_;
    if (!submit_(from, [this, key, from, bytes, format] { Copy(key, from, bytes, format); })) {
      --copying_;
      Bump(counters_.prefetch_chunks_failed);
      ForgetLocked(it);
    }
  }
}

// On an idle I/O thread. TierManager::Prefetch throws nothing (a read that throws is an error it returns).
void Prefetcher::Copy(const ChunkKey& key, TierKind from, uint64_t bytes, const LossyFormat& format) {
  {
    MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.state != State::kSubmitted) {  // a load took it before the copy began
      --copying_;
      PumpLocked();
      return;
    }
    it->second.state = State::kCopying;
  }
  const absl::Status copied = tiers_.Prefetch(key, from, bytes, format);
  // ALREADY_EXISTS: the chunk reached DRAM another way (a load's promotion, a Store) or is being copied: in DRAM.
  const bool in_dram = copied.ok() || absl::IsAlreadyExists(copied);
  if (copied.ok()) {
    Bump(counters_.prefetch_chunks_copied);
    Bump(counters_.prefetch_bytes_copied, bytes);
  } else if (!in_dram) {
    Bump(counters_.prefetch_chunks_failed);
    spdlog::debug("prefetch: a chunk could not be copied from the {} tier ({})", TierKindName(from), copied.ToString());
  }
  MutexLock lock(&mu_);
  --copying_;
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.state == State::kCopying) {  // else a load took it over meanwhile
    if (in_dram) {
      it->second.state = State::kCopied;
      it->second.since = clock_->Now();
    } else {
      ForgetLocked(it);
    }
  }
  PumpLocked();
}

void Prefetcher::LoadStarted(std::span<const ChunkKey> keys) {
  MutexLock lock(&mu_);
  if (entries_.empty()) return;
  const TimePoint now = clock_->Now();
  for (const ChunkKey& key : keys) {
    auto it = entries_.find(key);
    if (it == entries_.end()) continue;
    if (it->second.state == State::kQueued || it->second.state == State::kSubmitted) {
      Bump(counters_.prefetch_chunks_dropped);  // the load reads it itself
    } else {
      Bump(counters_.prefetch_chunks_used);
      prefetch_to_load_seconds.Observe(std::chrono::duration<double>(now - it->second.since).count());
    }
    ForgetLocked(it);
  }
}

void Prefetcher::Expire() {
  MutexLock lock(&mu_);
  const TimePoint now = clock_->Now();
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);
    if (it->second.state != State::kCopying && now - it->second.since >= options_.ttl) {
      Bump(counters_.prefetch_chunks_wasted);
      ForgetLocked(it);
    }
    it = next;
  }
  // Keys a load took or the ttl ended leave the queue when popped; while no copy can start, drop them here.
  std::erase_if(queue_, [&](const ChunkKey& key) {
    mu_.AssertHeld();
    const auto found = entries_.find(key);
    return found == entries_.end() || found->second.state != State::kQueued;
  });
}

void Prefetcher::ForgetLocked(absl::flat_hash_map<ChunkKey, Entry>::iterator it) {
  held_bytes_ -= it->second.bytes;
  if (auto mine = held_by_tenant_.find(it->second.tenant); mine != held_by_tenant_.end()) {
    mine->second -= std::min(mine->second, it->second.bytes);
    if (mine->second == 0) held_by_tenant_.erase(mine);
  }
  entries_.erase(it);
}

void Prefetcher::Stop() {
  MutexLock lock(&mu_);
  stopped_ = true;
}

uint64_t Prefetcher::held_bytes() const {
  MutexLock lock(&mu_);
  return held_bytes_;
}

}  // namespace cake
