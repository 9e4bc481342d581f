// Host-memory tier: chunks in page-aligned extents of one HostArena under a byte budget, least recently used
// evicted first.
#pragma once

#include <memory>

#include "absl/base/thread_annotations.h"
#include "base/mutex.h"
#include "storage/lru_index.h"
#include "storage/tier.h"

namespace cake {

class DramTier final : public Tier {
 public:
  // Reserves `capacity_bytes` of address space (rounded up to pages); with `prefault`, touches all of it first,
  // so no copy into the tier ever faults (slow start on some VMs: see HostArena). A reservation that fails leaves
  // a tier that refuses every write with status().
  explicit DramTier(uint64_t capacity_bytes, bool prefault = false);
  ~DramTier() override;

  // OK, or why the tier's memory could not be reserved.
  const absl::Status& status() const { return status_; }

  std::string_view name() const override { return "dram"; }
  bool Contains(const ChunkKey& key) const override;
  absl::Status Read(const ChunkKey& key, std::span<std::byte> dst) override;
  absl::Status ReadValue(const ChunkKey& key, uint64_t max_bytes, std::vector<std::byte>& out) override;
  absl::Status Write(const ChunkKey& key, std::span<const std::byte> src) override;
  absl::Status Remove(const ChunkKey& key) override;
  TierUsage Usage() const override;
  uint64_t Footprint(uint64_t chunk_bytes) const override { return PageFootprint(chunk_bytes); }
  void ForEach(const std::function<void(const ChunkKey&, uint64_t)>& fn) const override;
  // The chunk's extent itself: it returns to the arena only when the last holder lets go, so an evicted chunk
  // that is still lent keeps its memory (the holders' bytes are bounded by them, e.g. the write-back queue).
  std::shared_ptr<const std::span<const std::byte>> Lend(const ChunkKey& key) override;

  uint64_t evictions() const;
  TierStats Stats() const override;
  TierCapabilities Capabilities() const override { return {.lends = true}; }
  // The whole arena's address range (empty if it could not be reserved): what a CUDA host may page-lock once, so
  // loads into device memory DMA straight from lent chunks.
  std::span<std::byte> arena_bytes() const;

 private:
  struct Memory;  // the arena and its allocator; outlives the tier while any extent is held
  struct Extent;  // one chunk's bytes in the arena
  struct Entry {
    std::shared_ptr<Extent> extent;
  };

  // An extent of `bytes`, evicting unread entries from the cold end until the budget and the arena allow it;
  // nullptr when even that is not enough. Requires mu_.
  std::shared_ptr<Extent> AllocateLocked(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static uint64_t PageFootprint(uint64_t bytes);

  const uint64_t capacity_bytes_;
  absl::Status status_;
  std::shared_ptr<Memory> memory_;
  mutable Mutex mu_;
  // A chunk being copied out is pinned: never evicted underneath its reader.
  LruIndex<Entry> index_ ABSL_GUARDED_BY(mu_){mu_};
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // stored chunks plus writes in progress, in whole pages
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cake
