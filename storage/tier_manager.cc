#include "storage/tier_manager.h"

#include "absl/strings/str_cat.h"

namespace cake {

const char* TierKindName(TierKind kind) {
  switch (kind) {
    case TierKind::kDram:
      return "dram";
    case TierKind::kDisk:
      return "disk";
    case TierKind::kRemote:
      return "remote";
    case TierKind::kNone:
      break;
  }
  return "none";
}

TierManager::TierManager(const Options& options)
    : options_(options), write_back_thread_([this] { RunWriteBack(); }) {}

TierManager::~TierManager() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  write_back_thread_.join();
}

void TierManager::AddTier(TierKind kind, std::unique_ptr<Tier> tier) {
  auto entry = std::make_unique<Entry>();
  entry->kind = kind;
  entry->tier = std::move(tier);
  tiers_.push_back(std::move(entry));
}

TierManager::Entry* TierManager::Find(TierKind kind) const {
  for (const auto& e : tiers_) {
    if (e->kind == kind) return e.get();
  }
  return nullptr;
}

Tier* TierManager::tier(TierKind kind) const {
  Entry* e = Find(kind);
  return e ? e->tier.get() : nullptr;
}

std::vector<TierKind> TierManager::LookupPrefix(std::span<const ChunkKey> keys) const {
  std::vector<TierKind> found;
  found.reserve(keys.size());
  for (const ChunkKey& key : keys) {
    TierKind holder = TierKind::kNone;
    for (const auto& e : tiers_) {
      if (e->tier->Contains(key)) {
        holder = e->kind;
        break;
      }
    }
    if (holder == TierKind::kNone) break;
    found.push_back(holder);
  }
  return found;
}

bool TierManager::Contains(const ChunkKey& key) const {
  for (const auto& e : tiers_) {
    if (e->tier->Contains(key)) return true;
  }
  return false;
}

absl::Status TierManager::Read(TierKind kind, const ChunkKey& key, std::span<std::byte> dst) {
  Entry* e = Find(kind);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no ", TierKindName(kind), " tier is configured"));
  return e->tier->Read(key, dst);
}

absl::Status TierManager::Write(const ChunkKey& key, std::span<const std::byte> src) {
  if (tiers_.empty()) return absl::FailedPreconditionError("no tier is configured");
  absl::Status status = tiers_.front()->tier->Write(key, src);
  if (!status.ok() || tiers_.size() == 1) return status;
  {
    std::lock_guard lock(mu_);
    if (stats_.queued_bytes + src.size() <= options_.write_back_queue_bytes) {
      // The job owns its copy: the fastest tier may evict the chunk before the slower ones have it.
      auto bytes = std::make_shared<std::vector<std::byte>>(src.begin(), src.end());
      stats_.queued_bytes += src.size();
      queue_.push_back(WriteBackJob{key, std::move(bytes)});
      cv_.notify_all();
      return absl::OkStatus();
    }
    ++stats_.inline_writes;
  }
  WriteToSlowerTiers(key, src);
  return absl::OkStatus();
}

void TierManager::WriteToSlowerTiers(const ChunkKey& key, std::span<const std::byte> bytes) {
  for (size_t i = 1; i < tiers_.size(); ++i) {
    Tier& tier = *tiers_[i]->tier;
    if (tier.Contains(key)) continue;
    const bool ok = tier.Write(key, bytes).ok();
    std::lock_guard lock(mu_);
    ++(ok ? stats_.written : stats_.failed);
  }
}

void TierManager::RunWriteBack() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    // Stopping abandons what is still queued: the owner bounds the wait with FlushWriteBack first, and the
    // fastest tier's copy was never the only one that mattered for correctness (a miss is recomputed).
    if (stopping_) return;
    WriteBackJob job = std::move(queue_.front());
    queue_.pop_front();
    writing_back_ = true;
    lock.unlock();
    WriteToSlowerTiers(job.key, *job.bytes);
    lock.lock();
    writing_back_ = false;
    stats_.queued_bytes -= job.bytes->size();
    cv_.notify_all();
  }
}

size_t TierManager::FlushWriteBack(Duration bound) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, bound, [&] { return queue_.empty() && !writing_back_; });
  return queue_.size() + (writing_back_ ? 1 : 0);
}

void TierManager::Promote(const ChunkKey& key, std::span<const std::byte> bytes) {
  if (tiers_.size() < 2 || tiers_.front()->tier->Contains(key)) return;
  if (tiers_.front()->tier->Write(key, bytes).ok()) {
    std::lock_guard lock(mu_);
    ++stats_.promotions;
  }
}

TierManager::WriteBackStats TierManager::write_back_stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void TierManager::RecordLoadThroughput(TierKind kind, uint64_t bytes, double seconds) {
  Entry* e = Find(kind);
  if (e == nullptr || bytes == 0 || seconds <= 0) return;
  const double sample = seconds / static_cast<double>(bytes);
  const double old = e->seconds_per_byte.load(std::memory_order_relaxed);
  // A moving average: recent loads count most, one outlier does not swing the planner.
  e->seconds_per_byte.store(old == 0 ? sample : 0.7 * old + 0.3 * sample, std::memory_order_relaxed);
}

double TierManager::LoadSecondsPerByte(TierKind kind) const {
  Entry* e = Find(kind);
  return e ? e->seconds_per_byte.load(std::memory_order_relaxed) : 0;
}

}  // namespace cake
