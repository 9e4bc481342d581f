// Where one load's chunks land, and the read that puts each there: in the message itself (a client without a
// shared region), in a host region's pages, or in a device region (a DRAM chunk's own bytes by one DMA, any other
// chunk read into pinned host memory first). The load stream decides which chunk to read and when; this decides
// how its bytes travel.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "cuda/cuda_backend.h"
#include "cuda/region.h"
#include "keys/namespace.h"
#include "keys/tier_kind.h"
#include "storage/lossy_codec.h"

namespace cake {

class TierManager;

class ChunkLanding {
 public:
  // Chunks travel inline, one per message.
  static ChunkLanding Inline(uint64_t chunk_bytes);
  // Chunk `first_chunk` lands at `base_offset` of `region`, each later one a chunk further.
  static ChunkLanding InRegion(std::shared_ptr<Region> region, uint64_t base_offset, uint32_t first_chunk,
                               uint64_t chunk_bytes);

  struct Landed {
    absl::Status status;                      // any error: the chunk is a miss the engine computes
    std::string inline_bytes;                 // inline: the chunk, moved into its ChunkLoaded message
    std::span<const std::byte> region_bytes;  // in a host region or the staging buffer; empty when lent or inline
    std::shared_ptr<StagingBuffer> staging;   // holds a staged read's bytes until its promotion is done
    // The read came from a slower tier and its copy into DRAM is the caller's to hand to TierManager::PromoteLater
    // once it has reported the read (an inline chunk's copy is made in Land: its bytes move into the message).
    bool promote_later = false;

    // Where the bytes were read to, for a promotion copy into DRAM (empty when the chunk came lent from DRAM:
    // it is there already). Taken from inline_bytes each time: a short string's bytes move with the object.
    std::span<const std::byte> bytes() const {
      if (!inline_bytes.empty()) return std::as_bytes(std::span(inline_bytes.data(), inline_bytes.size()));
      return region_bytes;
    }
  };
  // Reads `key` from `tier` into chunk `chunk`'s place, and with `promote` keeps a copy of a slower tier's chunk in
  // DRAM. Runs on an I/O thread; any number at once. Never throws: a read that throws (out of memory or
  // descriptors) is a failed one.
  Landed Land(TierManager& tiers, TierKind tier, const ChunkKey& key, uint32_t chunk, bool promote = false) const;

  // How the slower tiers store the namespace's chunks (quantized for a lossy namespace): reads decode with it.
  void set_stored_format(const LossyFormat& format) { format_ = format; }
  const LossyFormat& stored_format() const { return format_; }

  bool is_inline() const { return region_ == nullptr; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  // Byte offset of `chunk` in the region (0 inline).
  uint64_t OffsetOf(uint32_t chunk) const {
    return is_inline() ? 0 : base_offset_ + uint64_t{chunk - first_chunk_} * chunk_bytes_;
  }

 private:
  Landed LandOrThrow(TierManager& tiers, TierKind tier, const ChunkKey& key, uint32_t chunk) const;
  ChunkLanding(std::shared_ptr<Region> region, uint64_t base_offset, uint32_t first_chunk, uint64_t chunk_bytes)
      : region_(std::move(region)), base_offset_(base_offset), first_chunk_(first_chunk), chunk_bytes_(chunk_bytes) {}

  std::shared_ptr<Region> region_;  // null: inline
  uint64_t base_offset_ = 0;
  uint32_t first_chunk_ = 0;
  uint64_t chunk_bytes_ = 0;
  LossyFormat format_;
};

}  // namespace cake
