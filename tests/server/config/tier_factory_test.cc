// The tier factory: which tiers a configuration builds, in which order, behind which caps (real DRAM, a real
// disk root, a remote whose Redis is not running: the remote tier opens without it).
#include "server/config/tier_factory.h"

#include <catch2/catch.hpp>
#include <fstream>

#include "tests/storage/tier_test_util.h"

namespace cake {

TEST_CASE("tier factory: DRAM always, disk with a root, remote with endpoints, fastest first", "[tier_factory]") {
  testing::TempDir root;
  DaemonConfig config = DefaultConfig();
  config.dram_capacity_bytes = 4 << 20;
  TierManager tiers;
  PinnedRange pinned;

  SECTION("the embedded defaults: DRAM alone, uncapped") {
    REQUIRE(AddTiersFromConfig(config, false, tiers, pinned).ok());
    REQUIRE(tiers.tiers().size() == 1);
    CHECK(tiers.tiers()[0]->kind == TierKind::kDram);
    CHECK(tiers.tiers()[0]->tier->read_cap_gbps() == 0);
    CHECK(tiers.tiers()[0]->tier->Usage().capacity_bytes == 4u << 20);
    CHECK_FALSE(tiers.has_network_tier());
  }
  SECTION("all three, with read caps where set") {
    config.disk_root = root.path().string();
    config.disk_capacity_bytes = 8 << 20;
    config.disk_allow_buffered = true;
    config.disk_read_gbps = 2;
    config.remote_endpoints = {"127.0.0.1:1"};  // nothing listens there: a remote that is down is a miss
    config.remote_connect_timeout_ms = 50;
    config.dram_read_gbps = 8;
    REQUIRE(AddTiersFromConfig(config, false, tiers, pinned).ok());
    REQUIRE(tiers.tiers().size() == 3);
    CHECK(tiers.tiers()[0]->kind == TierKind::kDram);
    CHECK(tiers.tiers()[1]->kind == TierKind::kDisk);
    CHECK(tiers.tiers()[2]->kind == TierKind::kRemote);
    CHECK(tiers.tiers()[0]->tier->read_cap_gbps() == Approx(8));
    CHECK(tiers.tiers()[1]->tier->read_cap_gbps() == Approx(2));
    CHECK(tiers.tiers()[2]->tier->read_cap_gbps() == 0);
    CHECK(tiers.tiers()[2]->tier->waits_on_network());  // through no cap: the decorator forwards it
    CHECK(tiers.has_network_tier());
  }
  SECTION("an unusable disk root is an error, not a daemon without its disk") {
    config.disk_root = (root.path() / "file").string();
    { std::ofstream(config.disk_root) << "not a folder"; }
    CHECK_FALSE(AddTiersFromConfig(config, false, tiers, pinned).ok());
  }
  SECTION("a malformed remote endpoint is INVALID_ARGUMENT") {
    config.remote_endpoints = {"no-port"};
    CHECK(AddTiersFromConfig(config, false, tiers, pinned).code() == absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace cake
