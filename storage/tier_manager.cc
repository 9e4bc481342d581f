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
  return tiers_.front()->tier->Write(key, src);
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
