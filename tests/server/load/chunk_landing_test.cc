// ChunkLanding: each way a chunk reaches an engine, read from real tiers into real memory. The device case uses
// a region without host pages (a stand-in for device memory, since these machines have no GPU) to check which
// path a chunk takes: DRAM chunks by one copy of the tier's own bytes, others staged.
#include "server/load/chunk_landing.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "storage/dram_tier.h"
#include "storage/tier_manager.h"
#include "tests/storage/tier_test_util.h"

namespace cake {
namespace {

using testing::TestKey;
using testing::TestValue;

constexpr uint64_t kChunk = 4096;

// Memory the daemon can only copy into, like a device region: no host_data. Records each copy's source.
class CopyOnlyRegion final : public Region {
 public:
  explicit CopyOnlyRegion(uint64_t bytes) : bytes_(bytes) {}
  RegionBackend backend() const override { return RegionBackend::kCudaIpc; }
  uint64_t size() const override { return bytes_.size(); }
  std::byte* host_data() override { return nullptr; }
  absl::Status CopyIn(uint64_t offset, std::span<const std::byte> src) override {
    if (offset + src.size() > bytes_.size()) return absl::OutOfRangeError("copy past the end");
    std::memcpy(bytes_.data() + offset, src.data(), src.size());
    sources.push_back(src.data());
    return absl::OkStatus();
  }
  absl::Status CopyOut(uint64_t offset, std::span<std::byte> dst) const override {
    std::memcpy(dst.data(), bytes_.data() + offset, dst.size());
    return absl::OkStatus();
  }
  std::string export_handle() const override { return "copy-only"; }
  std::span<const std::byte> at(uint64_t offset) const { return std::span(bytes_).subspan(offset, kChunk); }
  std::vector<const std::byte*> sources;

 private:
  std::vector<std::byte> bytes_;
};

struct Tiers {
  Tiers() {
    auto fast = std::make_unique<DramTier>(1 << 20);
    auto slow = std::make_unique<DramTier>(1 << 20);
    dram = fast.get();
    disk = slow.get();
    manager.AddTier(TierKind::kDram, std::move(fast));
    manager.AddTier(TierKind::kDisk, std::move(slow));  // a second DRAM tier standing in for the disk
  }
  TierManager manager;
  DramTier* dram;
  DramTier* disk;
};

bool Same(std::span<const std::byte> a, const std::vector<std::byte>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

TEST_CASE("chunk landing: inline chunks come back as message bytes", "[landing]") {
  Tiers t;
  REQUIRE(t.dram->Write(TestKey(1), TestValue(1, kChunk)).ok());
  const ChunkLanding landing = ChunkLanding::Inline(kChunk);
  CHECK(landing.is_inline());
  ChunkLanding::Landed landed = landing.Land(t.manager, TierKind::kDram, TestKey(1), 0);
  REQUIRE(landed.status.ok());
  CHECK(Same(std::as_bytes(std::span(landed.inline_bytes)), TestValue(1, kChunk)));
  CHECK(Same(landed.bytes(), TestValue(1, kChunk)));  // what a promotion would copy

  // A miss is an error the load turns into a computed chunk.
  CHECK(landing.Land(t.manager, TierKind::kDram, TestKey(2), 0).status.code() == absl::StatusCode::kNotFound);
}

TEST_CASE("chunk landing: in a host region each chunk lands at its offset from the window's first chunk", "[landing]") {
  Tiers t;
  REQUIRE(t.disk->Write(TestKey(7), TestValue(7, kChunk)).ok());
  auto created = CreateHostRegion(8 * kChunk);
  REQUIRE(created.ok());
  std::shared_ptr<Region> region = std::move(*created);
  // The window starts at byte 2 * kChunk with chunk 5: chunk 7 lands two chunks further.
  const ChunkLanding landing = ChunkLanding::InRegion(region, 2 * kChunk, 5, kChunk);
  CHECK(landing.OffsetOf(5) == 2 * kChunk);
  CHECK(landing.OffsetOf(7) == 4 * kChunk);
  ChunkLanding::Landed landed = landing.Land(t.manager, TierKind::kDisk, TestKey(7), 7);
  REQUIRE(landed.status.ok());
  CHECK(landed.inline_bytes.empty());
  CHECK(Same(std::span(region->host_data() + 4 * kChunk, kChunk), TestValue(7, kChunk)));
  CHECK(landed.bytes().data() == region->host_data() + 4 * kChunk);  // promoted from where it landed
}

TEST_CASE("chunk landing: device memory gets DRAM's own bytes in one copy, other tiers' through staging", "[landing]") {
  Tiers t;
  REQUIRE(t.dram->Write(TestKey(1), TestValue(1, kChunk)).ok());
  REQUIRE(t.disk->Write(TestKey(2), TestValue(2, kChunk)).ok());
  auto region = std::make_shared<CopyOnlyRegion>(4 * kChunk);
  const ChunkLanding landing = ChunkLanding::InRegion(region, 0, 0, kChunk);

  ChunkLanding::Landed from_dram = landing.Land(t.manager, TierKind::kDram, TestKey(1), 1);
  REQUIRE(from_dram.status.ok());
  CHECK(Same(region->at(kChunk), TestValue(1, kChunk)));
  auto lent = t.dram->Lend(TestKey(1));
  REQUIRE(region->sources.size() == 1);
  CHECK(region->sources[0] == lent->data());  // the tier's own bytes, no host copy in between
  CHECK(from_dram.bytes().empty());           // nothing to promote: it is in DRAM
  CHECK(from_dram.staging == nullptr);

  ChunkLanding::Landed from_disk = landing.Land(t.manager, TierKind::kDisk, TestKey(2), 3);
  REQUIRE(from_disk.status.ok());
  CHECK(Same(region->at(3 * kChunk), TestValue(2, kChunk)));
  REQUIRE(from_disk.staging != nullptr);
  CHECK(region->sources[1] == from_disk.staging->bytes().data());
  CHECK(from_disk.bytes().data() == from_disk.staging->bytes().data());  // promoted from the staging buffer

  // A DRAM chunk evicted since the lookup: nothing to lend, so it is read (and misses) like any other.
  CHECK(landing.Land(t.manager, TierKind::kDram, TestKey(9), 0).status.code() == absl::StatusCode::kNotFound);
}

}  // namespace cake
