// Prefetch copies in flight into the fastest tier, by chunk. While a copy from a local tier (disk) runs, the chunk
// counts as in the fastest tier (a lookup reports it there) and a read or lend of it from there waits for the copy,
// so a load that arrives meanwhile plans it as a DRAM chunk and reads it once. A copy from a tier that waits on a
// network (Redis) is not waited for: a frozen Redis must not hold the threads DRAM reads need.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "base/mutex.h"
#include "keys/namespace.h"

namespace cake {

class ArrivalBoard {
 public:
  // The longest a read waits for an arrival; past it the read goes on with what the fastest tier holds.
  static constexpr auto kWait = std::chrono::seconds(30);

  // Marks `key` as arriving; false when a copy of it runs already. `networked`: readers do not wait for it.
  bool Begin(const ChunkKey& key, bool networked);
  // The copy ended, whatever its outcome: waiters wake (and read what the fastest tier holds).
  void End(const ChunkKey& key);
  // Waits while a local copy of `key` runs, at most kWait.
  void Await(const ChunkKey& key) const;
  // For each key, whether a local copy of it runs now; empty when no copy runs at all (the common case, no lock).
  std::vector<bool> ArrivingLocally(std::span<const ChunkKey> keys) const;
  size_t in_flight() const { return count_.load(std::memory_order_relaxed); }

 private:
  mutable Mutex mu_;
  mutable CondVar ended_;
  absl::flat_hash_map<ChunkKey, bool> copies_ ABSL_GUARDED_BY(mu_);  // chunk -> whether it comes over a network
  std::atomic<size_t> count_{0};  // copies_.size(), read without the lock on every lookup and read
};

}  // namespace cake
