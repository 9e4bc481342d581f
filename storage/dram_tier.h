// Host-memory tier: page-aligned chunk buffers under a byte budget, least recently used evicted first.
#pragma once

#include <list>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "storage/tier.h"

namespace cake {

class DramTier final : public Tier {
 public:
  explicit DramTier(uint64_t capacity_bytes);
  ~DramTier() override;

  std::string_view name() const override { return "dram"; }
  bool Contains(const ChunkKey& key) const override;
  absl::Status Read(const ChunkKey& key, std::span<std::byte> dst) override;
  absl::Status Write(const ChunkKey& key, std::span<const std::byte> src) override;
  absl::Status Remove(const ChunkKey& key) override;
  TierUsage Usage() const override;
  void ForEach(const std::function<void(const ChunkKey&, uint64_t)>& fn) const override;

  uint64_t evictions() const;

 private:
  struct Buffer;  // page-aligned bytes; freed when the last reader lets go
  struct Entry {
    std::shared_ptr<Buffer> buffer;
    std::list<ChunkKey>::iterator lru_position;
    int readers = 0;  // a chunk being copied out is never evicted underneath its reader
  };

  // Evicts unread entries from the cold end until `bytes` more fit. Requires mu_.
  bool MakeRoom(uint64_t bytes);
  // Fresh memory costs a page fault per 4 KiB on first touch (seconds per GiB on some VMs): a write reuses the
  // buffer of an evicted or removed chunk of the same size when there is one. Promotions into a full tier then
  // cost one memcpy each. At most kMaxSpareBuffers are kept, outside the byte budget.
  std::shared_ptr<Buffer> TakeBuffer(size_t bytes);
  void RecycleLocked(std::shared_ptr<Buffer> buffer);
  static constexpr size_t kMaxSpareBuffers = 4;

  const uint64_t capacity_bytes_;
  mutable std::mutex mu_;
  absl::flat_hash_map<ChunkKey, Entry> entries_;
  std::list<ChunkKey> lru_;  // front: most recently used
  uint64_t used_bytes_ = 0;
  uint64_t evictions_ = 0;
  std::vector<std::shared_ptr<Buffer>> spare_;
};

}  // namespace cake
