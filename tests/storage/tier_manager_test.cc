// TierManager: prefix lookup across tiers, where writes land, and the load-throughput average the planner reads.
#include "storage/tier_manager.h"

#include <catch2/catch.hpp>
#include <memory>
#include <vector>

#include "storage/dram_tier.h"
#include "tests/storage/tier_test_util.h"

namespace cake {
namespace {

using testing::TestKey;
using testing::TestValue;

constexpr size_t kBytes = 256;

struct TwoTiers {
  TwoTiers() {
    auto fast = std::make_unique<DramTier>(1 << 20);
    auto slow = std::make_unique<DramTier>(1 << 20);
    dram = fast.get();
    disk = slow.get();
    manager.AddTier(TierKind::kDram, std::move(fast));
    manager.AddTier(TierKind::kDisk, std::move(slow));
  }
  TierManager manager;
  DramTier* dram;
  DramTier* disk;  // a second DRAM tier standing in for the disk: lookups only care about kinds and order
};

// A tier that says it waits on a network, and counts how often it is asked: which step of a lookup reaches it.
class NetworkedTier final : public TierDecorator {
 public:
  explicit NetworkedTier(std::unique_ptr<Tier> inner) : TierDecorator(std::move(inner)) {}
  TierCapabilities Capabilities() const override { return {.waits_on_network = true}; }
  std::vector<bool> ContainsEach(std::span<const ChunkKey> keys) const override {
    ++asked;
    return TierDecorator::ContainsEach(keys);
  }
  mutable int asked = 0;
};

std::vector<ChunkKey> Keys(uint32_t n) {
  std::vector<ChunkKey> keys;
  for (uint32_t i = 0; i < n; ++i) keys.push_back(TestKey(i));
  return keys;
}

}  // namespace

TEST_CASE("tier manager: LookupPrefix reports the fastest holder and stops at the first miss", "[tier_manager]") {
  TwoTiers t;
  const auto keys = Keys(6);
  REQUIRE(t.dram->Write(keys[0], TestValue(0, kBytes)).ok());
  REQUIRE(t.disk->Write(keys[1], TestValue(1, kBytes)).ok());
  REQUIRE(t.dram->Write(keys[2], TestValue(2, kBytes)).ok());
  REQUIRE(t.disk->Write(keys[2], TestValue(2, kBytes)).ok());  // in both: the faster one wins
  // keys[3] is nowhere; keys[4] is cached but unreachable behind the gap.
  REQUIRE(t.dram->Write(keys[4], TestValue(4, kBytes)).ok());

  CHECK(t.manager.LookupPrefix(keys) == std::vector<TierKind>{TierKind::kDram, TierKind::kDisk, TierKind::kDram});
  CHECK(t.manager.LookupPrefix({}).empty());
  CHECK(t.manager.LookupPrefix(std::span(keys).subspan(3)).empty());
  CHECK(t.manager.LookupPrefix(std::span(keys).subspan(4, 1)) == std::vector<TierKind>{TierKind::kDram});
}

TEST_CASE("tier manager: a two-step lookup asks a networked tier only in its second step, and only when needed",
          "[tier_manager]") {
  TierManager manager;
  auto dram = std::make_unique<DramTier>(1 << 20);
  auto remote = std::make_unique<NetworkedTier>(std::make_unique<DramTier>(1 << 20));
  DramTier* dram_tier = dram.get();
  NetworkedTier* remote_tier = remote.get();
  manager.AddTier(TierKind::kDram, std::move(dram));
  manager.AddTier(TierKind::kRemote, std::move(remote));
  CHECK(manager.has_network_tier());
  const auto keys = Keys(4);
  for (uint32_t i = 0; i < 2; ++i) REQUIRE(dram_tier->Write(keys[i], TestValue(i, kBytes)).ok());
  for (uint32_t i = 2; i < 4; ++i) REQUIRE(remote_tier->Write(keys[i], TestValue(i, kBytes)).ok());

  // All in DRAM: the network is never needed.
  auto local = manager.LookupPrefixInMemory(std::span(keys).first(2));
  CHECK_FALSE(local.needs_network());
  CHECK(local.Prefix() == std::vector<TierKind>{TierKind::kDram, TierKind::kDram});
  CHECK(remote_tier->asked == 0);

  // The tail is remote: the first step stops at DRAM's prefix, the second asks Redis once for the rest.
  auto lookup = manager.LookupPrefixInMemory(keys);
  CHECK(lookup.needs_network());
  CHECK(lookup.Prefix().size() == 2);
  CHECK(remote_tier->asked == 0);
  manager.FinishLookupOverNetwork(lookup);
  CHECK(remote_tier->asked == 1);
  CHECK_FALSE(lookup.needs_network());
  CHECK(lookup.Prefix() ==
        std::vector<TierKind>{TierKind::kDram, TierKind::kDram, TierKind::kRemote, TierKind::kRemote});
  CHECK(manager.LookupPrefix(keys) == lookup.Prefix());

  TierManager memory_only;
  memory_only.AddTier(TierKind::kDram, std::make_unique<DramTier>(1 << 20));
  CHECK_FALSE(memory_only.has_network_tier());
  CHECK_FALSE(memory_only.LookupPrefixInMemory(keys).needs_network());  // a miss, but nothing else to ask
}

TEST_CASE(
    "tier manager: Write lands in the fastest tier at once and in the slower ones by write-back, Read goes to "
    "the named one",
    "[tier_manager]") {
  TwoTiers t;
  const auto value = TestValue(9, kBytes);
  REQUIRE(t.manager.Write(TestKey(9), value).ok());
  CHECK(t.dram->Contains(TestKey(9)));  // when Write returns

  std::vector<std::byte> out(kBytes);
  REQUIRE(t.manager.Read(TierKind::kDram, TestKey(9), out).ok());
  CHECK(out == value);
  // The write-back thread copies it to the disk tier afterwards.
  CHECK(t.manager.FlushWriteBack(std::chrono::seconds(10)) == 0);
  CHECK(t.disk->Contains(TestKey(9)));
  std::fill(out.begin(), out.end(), std::byte{0});
  REQUIRE(t.manager.Read(TierKind::kDisk, TestKey(9), out).ok());
  CHECK(out == value);
  CHECK(t.manager.Read(TierKind::kRemote, TestKey(9), out).code() == absl::StatusCode::kNotFound);

  CHECK(t.manager.tier(TierKind::kDram) == t.dram);
  CHECK(t.manager.tier(TierKind::kDisk) == t.disk);
  CHECK(t.manager.tier(TierKind::kRemote) == nullptr);
  REQUIRE(t.manager.tiers().size() == 2);
  CHECK(t.manager.tiers()[0]->kind == TierKind::kDram);
}

TEST_CASE("tier manager: with no tiers, writes fail and nothing is found", "[tier_manager]") {
  TierManager manager;
  const auto value = TestValue(1, kBytes);
  CHECK(manager.Write(TestKey(1), value).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(manager.LookupPrefix(Keys(2)).empty());
  CHECK_FALSE(manager.InFastestTier(TestKey(1)));
}

TEST_CASE("tier manager: kind names", "[tier_manager]") {
  CHECK(std::string(TierKindName(TierKind::kDram)) == "dram");
  CHECK(std::string(TierKindName(TierKind::kDisk)) == "disk");
  CHECK(std::string(TierKindName(TierKind::kRemote)) == "remote");
  CHECK(std::string(TierKindName(TierKind::kNone)) == "none");
}

}  // namespace cake

namespace cake {

TEST_CASE("tier manager: a stored value of another size than its chunk is removed when a load reads it",
          "[tier_manager]") {
  TwoTiers t;
  // What a forger (or a bug) left under two chunks' keys, one per tier: shorter and longer than the chunk.
  REQUIRE(t.dram->Write(TestKey(1), TestValue(1, kBytes - 1)).ok());
  REQUIRE(t.disk->Write(TestKey(2), TestValue(2, kBytes + 1)).ok());
  std::vector<std::byte> dst(kBytes);
  // At 4054af8 INVALID_ARGUMENT, and the value stayed for every later load to fail on again.
  CHECK(t.manager.Read(TierKind::kDram, TestKey(1), dst).code() == absl::StatusCode::kDataLoss);
  CHECK(t.manager.Read(TierKind::kDisk, TestKey(2), dst).code() == absl::StatusCode::kDataLoss);
  CHECK_FALSE(t.dram->Contains(TestKey(1)));
  CHECK_FALSE(t.disk->Contains(TestKey(2)));
  // A value of the chunk's size reads as ever.
  const auto value = TestValue(3, kBytes);
  REQUIRE(t.disk->Write(TestKey(3), value).ok());
  REQUIRE(t.manager.Read(TierKind::kDisk, TestKey(3), dst).ok());
  CHECK(dst == value);
}

}  // namespace cake
