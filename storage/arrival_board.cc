#include "storage/arrival_board.h"

namespace cake {

bool ArrivalBoard::Begin(const ChunkKey& key, bool networked) {
  MutexLock lock(&mu_);
  if (!copies_.emplace(key, networked).second) return false;
  count_.store(copies_.size(), std::memory_order_relaxed);
  return true;
}

void ArrivalBoard::End(const ChunkKey& key) {
  {
    MutexLock lock(&mu_);
    copies_.erase(key);
    count_.store(copies_.size(), std::memory_order_relaxed);
  }
  ended_.SignalAll();
}

void ArrivalBoard::Await(const ChunkKey& key) const {
  if (count_.load(std::memory_order_relaxed) == 0) return;
  MutexLock lock(&mu_);
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  ended_.WaitUntil(&mu_, deadline, [&] {
    mu_.AssertHeld();
    const auto it = copies_.find(key);
    return it == copies_.end() || it->second;  // ended, or a networked copy this read does not wait for
  });
}

std::vector<bool> ArrivalBoard::ArrivingLocally(std::span<const ChunkKey> keys) const {
  if (count_.load(std::memory_order_relaxed) == 0) return {};
  std::vector<bool> out(keys.size(), false);
  MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (auto it = copies_.find(keys[i]); it != copies_.end() && !it->second) out[i] = true;
  }
  return out;
}

}  // namespace cake
