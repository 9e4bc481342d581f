// The tiers of one daemon, fastest first: prefix lookup across them, reads from the tier that holds a chunk,
// writes into the fastest, and the measured load bandwidth the planner uses.
#pragma once

#include <atomic>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "storage/tier.h"

namespace cake {

// Values match cake.v1.TierKind on the wire.
enum class TierKind : int { kNone = 0, kDram = 1, kDisk = 2, kRemote = 3 };
const char* TierKindName(TierKind kind);

class TierManager {
 public:
  // Tiers are added once, at start-up, fastest first.
  void AddTier(TierKind kind, std::unique_ptr<Tier> tier);

  // For each key in order, the fastest tier holding it; stops at the first key that no tier holds, so the
  // result's size is the number of cached leading chunks.
  std::vector<TierKind> LookupPrefix(std::span<const ChunkKey> keys) const;

  // Reads from `kind`'s tier; any error means the chunk is a miss for this load (the engine computes it).
  absl::Status Read(TierKind kind, const ChunkKey& key, std::span<std::byte> dst);
  // Stores into the fastest tier.
  absl::Status Write(const ChunkKey& key, std::span<const std::byte> src);
  bool Contains(const ChunkKey& key) const;

  // A load moved `bytes` from `kind` in `seconds` of wall time with its window of reads in flight.
  void RecordLoadThroughput(TierKind kind, uint64_t bytes, double seconds);
  // Seconds per byte that loads from `kind` achieved lately, or 0 when nothing was measured yet.
  double LoadSecondsPerByte(TierKind kind) const;

  Tier* tier(TierKind kind) const;
  struct Entry {
    TierKind kind;
    std::unique_ptr<Tier> tier;
    std::atomic<double> seconds_per_byte{0};
  };
  const std::vector<std::unique_ptr<Entry>>& tiers() const { return tiers_; }

 private:
  Entry* Find(TierKind kind) const;
  std::vector<std::unique_ptr<Entry>> tiers_;
};

}  // namespace cake
