#include "server/load/chunk_landing.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "storage/tier_manager.h"

namespace cake {

ChunkLanding ChunkLanding::Inline(uint64_t chunk_bytes) { return ChunkLanding(nullptr, 0, 0, chunk_bytes); }

ChunkLanding ChunkLanding::InRegion(std::shared_ptr<Region> region, uint64_t base_offset, uint32_t first_chunk,
                                    uint64_t chunk_bytes) {
  return ChunkLanding(std::move(region), base_offset, first_chunk, chunk_bytes);
}

ChunkLanding::Landed ChunkLanding::Land(TierManager& tiers, TierKind tier, const ChunkKey& key, uint32_t chunk,
                                        bool promote) const {
  try {
    Landed landed = LandOrThrow(tiers, tier, key, chunk);
    if (promote && landed.status.ok() && tier != TierKind::kDram && !landed.bytes().empty()) {
      if (is_inline()) {
        tiers.Promote(key, landed.bytes(), tier, format_);
      } else {
        landed.promote_later = true;
      }
    }
    return landed;
  } catch (const std::exception& e) {
    // Out of memory or descriptors: the chunk is one the engine computes, like any failed read.
    Landed failed;
    failed.status = absl::ResourceExhaustedError(absl::StrCat("reading the chunk threw: ", e.what()));
    return failed;
  }
}

ChunkLanding::Landed ChunkLanding::LandOrThrow(TierManager& tiers, TierKind tier, const ChunkKey& key,
                                               uint32_t chunk) const {
  Landed landed;
  if (is_inline()) {
    landed.inline_bytes.resize(chunk_bytes_);
    const std::span<std::byte> dst(reinterpret_cast<std::byte*>(landed.inline_bytes.data()), chunk_bytes_);
    landed.status = tiers.Read(tier, key, dst, format_);
    return landed;
  }
  if (std::byte* base = region_->host_data(); base != nullptr) {
    const std::span<std::byte> dst(base + OffsetOf(chunk), chunk_bytes_);
    landed.status = tiers.Read(tier, key, dst, format_);
    landed.region_bytes = dst;
    return landed;
  }
  // Device memory. A DRAM chunk goes in one DMA from the (page-locked) arena, with no host copy; the lent bytes
  // stay valid while held even if the chunk is evicted meanwhile.
  if (tier == TierKind::kDram) {
    if (auto lent = tiers.Lend(TierKind::kDram, key); lent != nullptr) {
      landed.status = region_->CopyIn(OffsetOf(chunk), *lent);
      return landed;
    }
  }
  // Anything else is read into pinned host memory, and one DMA takes it to the device.
  auto buffer = StagingBuffer::Allocate(chunk_bytes_);
  if (!buffer.ok()) {
    landed.status = buffer.status();
    return landed;
  }
  landed.staging = std::make_shared<StagingBuffer>(std::move(*buffer));
  landed.region_bytes = landed.staging->bytes();
  landed.status = tiers.Read(tier, key, landed.staging->bytes(), format_);
  if (landed.status.ok()) landed.status = region_->CopyIn(OffsetOf(chunk), landed.region_bytes);
  return landed;
}

}  // namespace cake
