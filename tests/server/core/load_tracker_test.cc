// LoadTracker: admission under the total, per-principal and per-client caps, and ending loads from outside (an
// operator's region release, a reload that revokes their caller).
#include <catch2/catch.hpp>

#include "server/core/daemon_state.h"

namespace cake {
namespace {

PeerFacts UnixPeer(uid_t uid) {
  PeerFacts facts;
  facts.transport = PeerFacts::Transport::kUnix;
  facts.uid = uid;
  return facts;
}

LoadOwner Owner(std::string principal, std::string client, std::string region = "", uid_t uid = 61001,
                std::string tenant = "") {
  return LoadOwner{principal, std::move(client), std::move(region), UnixPeer(uid), principal, std::move(tenant)};
}

// A load that records the status it was ended with.
struct Recorded {
  std::vector<absl::Status> ended;
  LoadTracker::CancelFn Cancel() {
    return [this](const absl::Status& why) { ended.push_back(why); };
  }
};

}  // namespace

TEST_CASE("load tracker: the total, per-principal and per-client caps each refuse naming themselves",
          "[load-tracker]") {
  LoadTracker tracker;
  const LoadCaps caps{5, 3, 2};
  Recorded r;
  REQUIRE(tracker.TryAdd(caps, Owner("a", "x"), r.Cancel()).ok());
  const auto second = tracker.TryAdd(caps, Owner("a", "x"), r.Cancel());
  REQUIRE(second.ok());
  auto refused = tracker.TryAdd(caps, Owner("a", "x"), r.Cancel());
  CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("max_concurrent_loads_per_client (2)"));
  REQUIRE(tracker.TryAdd(caps, Owner("a", "y"), r.Cancel()).ok());
  refused = tracker.TryAdd(caps, Owner("a", "z"), r.Cancel());
  CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("a is running limits.max_concurrent_loads_per_principal (3)"));
  // Another principal is not held back by the first one's loads, only by the total.
  REQUIRE(tracker.TryAdd(caps, Owner("b", "x"), r.Cancel()).ok());
  REQUIRE(tracker.TryAdd(caps, Owner("b", "y"), r.Cancel()).ok());
  refused = tracker.TryAdd(caps, Owner("c", "x"), r.Cancel());
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("limits.max_concurrent_loads (5)"));
  CHECK(tracker.active() == 5);
  // A refused add holds nothing; an ended load's slot is its principal's and client's again.
  tracker.Remove(*second);
  CHECK(tracker.active() == 4);
  CHECK(tracker.TryAdd(caps, Owner("a", "x"), r.Cancel()).ok());
  CHECK(r.ended.empty());
}

TEST_CASE("load tracker: an operator's release ends exactly the loads in that region, with its reason",
          "[load-tracker]") {
  LoadTracker tracker;
  const LoadCaps caps{8, 8, 8};
  Recorded in_region, elsewhere, inline_load;
  REQUIRE(tracker.TryAdd(caps, Owner("a", "x", "r-1"), in_region.Cancel()).ok());
  REQUIRE(tracker.TryAdd(caps, Owner("a", "x", "r-1"), in_region.Cancel()).ok());
  REQUIRE(tracker.TryAdd(caps, Owner("a", "x", "r-2"), elsewhere.Cancel()).ok());
  REQUIRE(tracker.TryAdd(caps, Owner("a", "x", ""), inline_load.Cancel()).ok());
  CHECK(tracker.CancelUsingRegion("r-1", absl::CancelledError("released")) == 2);
  REQUIRE(in_region.ended.size() == 2);
  CHECK(in_region.ended[0].message() == "released");
  CHECK(elsewhere.ended.empty());
  CHECK(inline_load.ended.empty());
  CHECK(tracker.CancelUsingRegion("r-unknown", absl::CancelledError("")) == 0);
}

TEST_CASE("load tracker: a reloaded policy ends the loads of callers it no longer lets load", "[load-tracker]") {
  DaemonConfig config;
  PrincipalConfig kept{.name = "kept", .unix_uids = {61001}, .tenants = {"a"}, .roles = {"engine"}};
  PrincipalConfig demoted{.name = "demoted", .unix_uids = {61002}, .tenants = {"b"}, .roles = {"monitor"}};
  PrincipalConfig renamed{.name = "renamed", .unix_uids = {61003}, .tenants = {"c"}, .roles = {"engine"}};
  config.principals = {kept, demoted, renamed};
  auto policy = AccessPolicy::FromConfig(config);
  REQUIRE(policy.ok());

  LoadTracker tracker;
  const LoadCaps caps{8, 8, 8};
  Recorded still_engine, now_monitor, now_other_name, unknown_uid, lost_tenant;
  REQUIRE(tracker.TryAdd(caps, Owner("kept", "x", "", 61001), still_engine.Cancel()).ok());
  REQUIRE(tracker.TryAdd(caps, Owner("kept", "x", "", 61001, "a"), still_engine.Cancel()).ok());
  // Issue 46 (lows): at 4054af8 a load in a tenant the reload took from its principal went on.
  REQUIRE(tracker.TryAdd(caps, Owner("kept", "y", "", 61001, "z"), lost_tenant.Cancel()).ok());
  REQUIRE(tracker.TryAdd(caps, Owner("demoted", "x", "", 61002), now_monitor.Cancel()).ok());
  REQUIRE(tracker.TryAdd(caps, Owner("was-named", "x", "", 61003), now_other_name.Cancel()).ok());
  REQUIRE(tracker.TryAdd(caps, Owner("gone", "x", "", 61009), unknown_uid.Cancel()).ok());
  CHECK(tracker.CancelRevoked(*policy) == 4);
  CHECK(still_engine.ended.empty());
  for (const Recorded* r : {&now_monitor, &now_other_name, &unknown_uid, &lost_tenant}) {
    REQUIRE(r->ended.size() == 1);
    CHECK(r->ended[0].code() == absl::StatusCode::kPermissionDenied);
  }
  CHECK_THAT(std::string(lost_tenant.ended[0].message()), Catch::Contains("the tenant \"z\""));
}

TEST_CASE("load tracker: two principals cannot take every load slot: a third still starts loads", "[load-tracker]") {
  // Issue 46, item 6: at 4054af8 two principals together took all 256 slots (192 and 64), and a third got
  // RESOURCE_EXHAUSTED until theirs ended.
  LoadTracker tracker;
  const LoadCaps caps{256, 192, 256};
  Recorded r;
  for (int i = 0; i < 192; ++i) REQUIRE(tracker.TryAdd(caps, Owner("a", "x"), r.Cancel()).ok());
  int b = 0;
  absl::Status b_refused;
  while (true) {
    auto added = tracker.TryAdd(caps, Owner("b", "x"), r.Cancel());
    if (!added.ok()) {
      b_refused = added.status();
      break;
    }
    ++b;
  }
  CHECK(b == 256 - 192 - 32);  // the last eighth is kept
  CHECK(b_refused.code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(b_refused.message()), Catch::Contains("kept for principals holding under 4"));
  // Every newcomer gets slots from it, up to a sixty-fourth each: eight more principals at least.
  for (const char* newcomer : {"c", "d", "e", "f", "g", "h", "i", "j"}) {
    INFO(newcomer);
    CHECK(tracker.TryAdd(caps, Owner(newcomer, "x"), r.Cancel()).ok());
  }
  CHECK(tracker.active() == 192 + 32 + 8);
}

}  // namespace cake
