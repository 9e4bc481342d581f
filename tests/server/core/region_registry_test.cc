// RegionRegistry: regions in real host shared memory, owned by the client that registered them, and the windows
// live loads lease in them.
#include "server/core/region_registry.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace cake {
namespace {

RegionRegistry::Limits SmallLimits() { return {.max_region_bytes = 1 << 20, .max_regions_per_client = 2}; }

}  // namespace

TEST_CASE("region registry: register checks size and the per-client count", "[regions]") {
  RegionRegistry registry(SmallLimits());
  CHECK(registry.Register("", 4096).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(registry.Register("engine", 0).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(registry.Register("engine", (1 << 20) + 1).status().code() == absl::StatusCode::kInvalidArgument);

  auto a = registry.Register("engine", 1 << 20);
  REQUIRE(a.ok());
  CHECK(a->region->size() >= (1u << 20));
  CHECK(a->region->host_data() != nullptr);
  auto b = registry.Register("engine", 4096);
  REQUIRE(b.ok());
  CHECK(a->region_id != b->region_id);
  const auto third = registry.Register("engine", 4096);
  CHECK(third.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(third.status().message().find("limits.max_regions_per_client") != std::string_view::npos);
  CHECK(registry.Register("other", 4096).ok());  // the count is per client
  CHECK(registry.count() == 3);
  CHECK(registry.total_bytes() == a->region->size() + b->region->size() + 4096);

  REQUIRE(registry.Release("engine", b->region_id).ok());
  CHECK(registry.Register("engine", 4096).ok());  // room again
}

TEST_CASE("region registry: only the owner uses or releases a region", "[regions]") {
  RegionRegistry registry(SmallLimits());
  auto r = registry.Register("engine", 8192);
  REQUIRE(r.ok());
  CHECK(registry.Get("intruder", r->region_id).status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(registry.Size("intruder", r->region_id).status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(registry.ReserveWindow("intruder", r->region_id, 0, 4096).status().code() ==
        absl::StatusCode::kPermissionDenied);
  CHECK(registry.Release("intruder", r->region_id).code() == absl::StatusCode::kPermissionDenied);
  CHECK(registry.Release("engine", "r-unknown").code() == absl::StatusCode::kNotFound);

  auto size = registry.Size("engine", r->region_id);
  REQUIRE(size.ok());
  CHECK(*size == r->region->size());
  REQUIRE(registry.Release("engine", r->region_id).ok());
  CHECK(registry.Get("engine", r->region_id).status().code() == absl::StatusCode::kNotFound);
  CHECK(registry.Release("engine", r->region_id).code() == absl::StatusCode::kNotFound);  // released once only
}

TEST_CASE("region registry: live loads' windows never overlap, and end with their leases", "[regions]") {
  RegionRegistry registry(SmallLimits());
  auto r = registry.Register("engine", 16384);
  REQUIRE(r.ok());
  const std::string& id = r->region_id;

  auto first = registry.ReserveWindow("engine", id, 0, 8192);
  REQUIRE(first.ok());
  CHECK(first->region() == r->region);
  const auto overlapping = registry.ReserveWindow("engine", id, 4096, 8192);
  CHECK(overlapping.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(overlapping.status().message().find("overlap") != std::string_view::npos);
  auto beside = registry.ReserveWindow("engine", id, 8192, 8192);  // touching is not overlapping
  CHECK(beside.ok());
  CHECK(registry.ReserveWindow("engine", id, 16384, 1).status().code() == absl::StatusCode::kOutOfRange);
  CHECK(registry.ReserveWindow("engine", id, 0, 0).ok());  // an empty window overlaps nothing

  { RegionRegistry::WindowLease ended = std::move(*first); }  // the load ended
  CHECK(registry.ReserveWindow("engine", id, 0, 8192).ok());
}

TEST_CASE("region registry: a region released during a load keeps its memory until the load ends", "[regions]") {
  RegionRegistry registry(SmallLimits());
  auto r = registry.Register("engine", 4096);
  REQUIRE(r.ok());
  auto lease = registry.ReserveWindow("engine", r->region_id, 0, 4096);
  REQUIRE(lease.ok());
  std::shared_ptr<Region> region = lease->region();
  r->region.reset();
  REQUIRE(registry.Release("engine", r->region_id).ok());
  // The name is gone for its owner at once; the memory still counts while the load maps it.
  CHECK(registry.Get("engine", r->region_id).status().code() == absl::StatusCode::kNotFound);
  CHECK(registry.count() == 1);
  CHECK(registry.total_bytes() == 4096);
  std::memset(region->host_data(), 0x5a, 4096);  // the load's last read still lands in mapped memory
  CHECK(static_cast<unsigned char>(region->host_data()[4095]) == 0x5a);
  region.reset();
  { RegionRegistry::WindowLease ended = std::move(*lease); }  // the load ended: the region goes with it
  CHECK(registry.count() == 0);
  CHECK(registry.total_bytes() == 0);
}

// Issue 31 row 3: releasing regions under live loads and registering new ones held any amount of memory under the
// caps, invisible to every count.
TEST_CASE("region registry: a released region still in use counts against every cap until its last load ends",
          "[regions]") {
  RegionRegistry::Limits limits = SmallLimits();
  limits.max_regions_per_client = 8;
  limits.max_regions = 8;
  limits.max_total_region_bytes = 3 * 4096;
  RegionRegistry registry(limits);
  auto first = registry.Register("engine", 2 * 4096);
  REQUIRE(first.ok());
  auto load = registry.ReserveWindow("engine", first->region_id, 0, 4096);
  REQUIRE(load.ok());
  REQUIRE(registry.Release("engine", first->region_id).ok());

  const auto past_the_cap = registry.Register("engine", 2 * 4096);
  CHECK(past_the_cap.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(past_the_cap.status().message()), Catch::Contains("limits.max_total_region_bytes"));
  CHECK_THAT(std::string(past_the_cap.status().message()),
             Catch::Contains("released but still in use by live loads") && Catch::Contains("--end-loads"));
  CHECK(registry.count() == 1);
  CHECK(registry.total_bytes() == 2 * 4096);
  const RegionRegistry::Totals totals = registry.totals();
  CHECK(totals.regions == 1);
  CHECK(totals.bytes == 2 * 4096);
  CHECK(totals.released_in_use == 1);
  CHECK(totals.released_in_use_bytes == 2 * 4096);

  const auto listed = registry.List();
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].region_id == first->region_id);
  CHECK(listed[0].released);
  CHECK(listed[0].windows == 1);
  CHECK(listed[0].lease_left_s == 0);

  // Its owner cannot use it again, nor release it twice.
  CHECK(registry.Get("engine", first->region_id).status().code() == absl::StatusCode::kNotFound);
  CHECK(registry.Size("engine", first->region_id).status().code() == absl::StatusCode::kNotFound);
  CHECK(registry.Renew("engine", first->region_id).code() == absl::StatusCode::kNotFound);
  CHECK(registry.ReserveWindow("engine", first->region_id, 4096, 4096).status().code() == absl::StatusCode::kNotFound);
  CHECK(registry.Release("engine", first->region_id).code() == absl::StatusCode::kNotFound);
  CHECK(registry.count() == 1);

  *load = RegionRegistry::WindowLease();  // the load ends
  CHECK(registry.count() == 0);
  CHECK(registry.total_bytes() == 0);
  CHECK(registry.totals().released_in_use == 0);
  CHECK(registry.totals().released_in_use_bytes == 0);
  CHECK(registry.List().empty());
  CHECK(registry.Register("engine", 2 * 4096).ok());  // room again
}

TEST_CASE("region registry: released regions in use count against max_regions and the client's own cap", "[regions]") {
  RegionRegistry::Limits limits = SmallLimits();
  limits.max_regions_per_client = 1;
  limits.max_regions = 2;
  RegionRegistry registry(limits);
  auto a = registry.Register("a", 4096);
  REQUIRE(a.ok());
  auto a_load = registry.ReserveWindow("a", a->region_id, 0, 4096);
  REQUIRE(a_load.ok());
  REQUIRE(registry.Release("a", a->region_id).ok());
  const auto own_cap = registry.Register("a", 4096);
  CHECK(own_cap.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(own_cap.status().message()),
             Catch::Contains("limits.max_regions_per_client") && Catch::Contains("released but still in use"));

  auto b = registry.Register("b", 4096);  // another client's own cap is its own
  REQUIRE(b.ok());
  auto b_load = registry.ReserveWindow("b", b->region_id, 0, 4096);
  REQUIRE(b_load.ok());
  REQUIRE(registry.Release("b", b->region_id).ok());
  const auto all_clients = registry.Register("c", 4096);
  CHECK(all_clients.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(all_clients.status().message()),
             Catch::Contains("limits.max_regions") && Catch::Contains("2 region(s)"));

  *a_load = RegionRegistry::WindowLease();
  CHECK(registry.count() == 1);
  CHECK(registry.Register("a", 4096).ok());
  CHECK(registry.Register("c", 4096).status().code() == absl::StatusCode::kResourceExhausted);  // b's load lives
  *b_load = RegionRegistry::WindowLease();
  CHECK(registry.Register("c", 4096).ok());
}

TEST_CASE("region registry: a released region stays until its last load, not its first, ends", "[regions]") {
  RegionRegistry registry(SmallLimits());
  auto r = registry.Register("engine", 2 * 4096);
  REQUIRE(r.ok());
  auto first = registry.ReserveWindow("engine", r->region_id, 0, 4096);
  auto second = registry.ReserveWindow("engine", r->region_id, 4096, 4096);
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  REQUIRE(registry.Release("engine", r->region_id).ok());
  *first = RegionRegistry::WindowLease();
  REQUIRE(registry.List().size() == 1);
  CHECK(registry.List()[0].windows == 1);
  CHECK(registry.totals().released_in_use == 1);
  *second = RegionRegistry::WindowLease();
  CHECK(registry.count() == 0);
  CHECK(registry.totals().released_in_use == 0);
}

TEST_CASE("region registry: an expired lease never takes a released region its loads still use", "[regions][lease]") {
  FakeClock clock;
  RegionRegistry::Limits limits = SmallLimits();
  limits.lease = std::chrono::milliseconds(1000);
  limits.max_total_region_bytes = 4096;
  RegionRegistry registry(limits, &clock);
  auto r = registry.Register("engine", 4096);
  REQUIRE(r.ok());
  auto load = registry.ReserveWindow("engine", r->region_id, 0, 4096);
  REQUIRE(load.ok());
  REQUIRE(registry.Release("engine", r->region_id).ok());
  clock.Advance(std::chrono::milliseconds(5000));
  CHECK(registry.ReleaseExpired().empty());  // neither dropped from the counts nor reported released twice
  CHECK(registry.count() == 1);
  CHECK(registry.Register("engine", 4096).status().code() == absl::StatusCode::kResourceExhausted);
  *load = RegionRegistry::WindowLease();
  // Gone with its load, not a lease later: its owner released it.
  CHECK(registry.count() == 0);
  CHECK(registry.ReleaseExpired().empty());
  CHECK(registry.Register("engine", 4096).ok());
}

TEST_CASE("region registry: Clear drops released regions in use too", "[regions]") {
  RegionRegistry registry(SmallLimits());
  auto r = registry.Register("engine", 4096);
  REQUIRE(r.ok());
  auto load = registry.ReserveWindow("engine", r->region_id, 0, 4096);
  REQUIRE(load.ok());
  REQUIRE(registry.Release("engine", r->region_id).ok());
  registry.Clear();
  CHECK(registry.totals().regions == 0);
  CHECK(registry.totals().released_in_use == 0);
  CHECK(registry.totals().released_in_use_bytes == 0);
  *load = RegionRegistry::WindowLease();  // a load that outlives the registry's contents ends harmlessly
  CHECK(registry.total_bytes() == 0);
}

TEST_CASE("region registry: caps over every client bound clients that rotate their ids", "[regions]") {
  RegionRegistry::Limits limits = SmallLimits();
  limits.max_regions = 3;
  limits.max_total_region_bytes = 5 * 4096;
  RegionRegistry registry(limits);
  REQUIRE(registry.Register("a", 4096).ok());
  REQUIRE(registry.Register("b", 8192).ok());
  const auto too_many_bytes = registry.Register("c", 3 * 4096);
  CHECK(too_many_bytes.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(too_many_bytes.status().message()), Catch::Contains("limits.max_total_region_bytes"));
  auto c = registry.Register("c", 4096);
  REQUIRE(c.ok());
  const auto too_many = registry.Register("d", 4096);
  CHECK(too_many.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(too_many.status().message()), Catch::Contains("limits.max_regions"));
  CHECK(registry.total_bytes() == 4 * 4096);
  REQUIRE(registry.Release("c", c->region_id).ok());
  CHECK(registry.Register("d", 4096).ok());  // room again
}

TEST_CASE("region registry: one principal cannot take every region byte, and two leave room for a third", "[regions]") {
  // Issue 46, item 7: at 4054af8 one principal (any number of client ids) took the whole max_total_region_bytes.
  RegionRegistry::Limits limits = SmallLimits();
  limits.max_regions_per_client = 64;
  limits.max_total_region_bytes = 64 * 4096;
  limits.max_region_bytes_per_principal = 48 * 4096;
  RegionRegistry registry(limits);
  int a = 0;
  absl::Status a_refused;
  for (int client = 0;; ++client) {
    auto added = registry.Register(RegionOwner("a", "engine-" + std::to_string(client)), 4096);
    if (!added.ok()) {
      a_refused = added.status();
      break;
    }
    ++a;
  }
  CHECK(a == 48);
  CHECK_THAT(std::string(a_refused.message()), Catch::Contains("limits.max_region_bytes_per_principal"));
  int b = 0;
  absl::Status b_refused;
  while (true) {
    auto added = registry.Register(RegionOwner("b", "engine"), 4096);
    if (!added.ok()) {
      b_refused = added.status();
      break;
    }
    ++b;
  }
  CHECK(b == 64 - 48 - 8);  // the last eighth is kept for principals holding under a sixty-fourth
  CHECK_THAT(std::string(b_refused.message()), Catch::Contains("kept for principals holding under 4096"));
  auto c = registry.Register(RegionOwner("c", "engine"), 4096);
  CHECK(c.ok());
  CHECK(registry.total_bytes() == (48 + 8 + 1) * 4096);
}

TEST_CASE("region registry: Clear drops every region", "[regions]") {
  RegionRegistry registry(SmallLimits());
  REQUIRE(registry.Register("a", 4096).ok());
  REQUIRE(registry.Register("b", 4096).ok());
  registry.Clear();
  CHECK(registry.count() == 0);
  CHECK(registry.total_bytes() == 0);
}

TEST_CASE("region registry: a region its owner stops naming is released once its lease runs out", "[regions][lease]") {
  FakeClock clock;
  RegionRegistry::Limits limits = SmallLimits();
  limits.max_regions_per_client = 8;
  limits.lease = std::chrono::milliseconds(1000);
  RegionRegistry registry(limits, &clock);
  auto silent = registry.Register("silent", 4096);
  auto renewing = registry.Register("renewing", 4096);
  auto loading = registry.Register("loading", 8192);
  REQUIRE(silent.ok());
  REQUIRE(renewing.ok());
  REQUIRE(loading.ok());
  auto window = registry.ReserveWindow("loading", loading->region_id, 0, 4096);
  REQUIRE(window.ok());

  clock.Advance(std::chrono::milliseconds(600));
  CHECK(registry.ReleaseExpired().empty());
  REQUIRE(registry.Renew("renewing", renewing->region_id).ok());
  CHECK(registry.Renew("intruder", renewing->region_id).code() == absl::StatusCode::kPermissionDenied);

  clock.Advance(std::chrono::milliseconds(600));  // 1.2 s: the silent one's lease ran out; the others' did not
  const auto expired = registry.ReleaseExpired();
  REQUIRE(expired.size() == 1);
  CHECK(expired[0].owner.client_id == "silent");
  CHECK(expired[0].region_id == silent->region_id);
  CHECK(expired[0].bytes == silent->region->size());
  CHECK(registry.Renew("silent", silent->region_id).code() == absl::StatusCode::kNotFound);
  CHECK(registry.count() == 2);
  CHECK(registry.total_bytes() == renewing->region->size() + loading->region->size());

  // A live load's window keeps its region however long the load runs; the owner gets a whole lease from its end.
  clock.Advance(std::chrono::milliseconds(5000));
  const auto while_loading = registry.ReleaseExpired();
  REQUIRE(while_loading.size() == 1);
  CHECK(while_loading[0].owner.client_id == "renewing");
  *window = RegionRegistry::WindowLease();  // the load ends
  clock.Advance(std::chrono::milliseconds(900));
  CHECK(registry.ReleaseExpired().empty());
  clock.Advance(std::chrono::milliseconds(200));
  CHECK(registry.ReleaseExpired().size() == 1);
  CHECK(registry.count() == 0);
  CHECK(registry.total_bytes() == 0);
  // The memory a caller still holds (a Store copying out of it) stays valid until it lets go.
  CHECK(silent->region->host_data() != nullptr);
}

}  // namespace cake

namespace cake {

TEST_CASE("region registry: an operator lists every owner's regions and releases any", "[regions]") {
  RegionRegistry registry(SmallLimits());
  auto a = registry.Register(RegionOwner("team-a", "engine-1"), 4096);
  auto b = registry.Register(RegionOwner("team-b", "engine-2"), 8192);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto lease = registry.ReserveWindow(RegionOwner("team-b", "engine-2"), b->region_id, 0, 4096);
  REQUIRE(lease.ok());
  const auto listed = registry.List();
  REQUIRE(listed.size() == 2);
  CHECK(listed[0].owner == RegionOwner("team-a", "engine-1"));
  CHECK(listed[0].windows == 0);
  CHECK(listed[1].bytes >= 8192);
  CHECK(listed[1].windows == 1);
  CHECK(listed[1].lease_left_s > 0);

  auto released = registry.ReleaseAny(b->region_id);
  REQUIRE(released.ok());
  CHECK(released->owner == RegionOwner("team-b", "engine-2"));
  CHECK(released->bytes >= 8192);
  CHECK(released->loads_using == 1);
  CHECK_FALSE(released->already_released);
  CHECK(registry.Get(RegionOwner("team-b", "engine-2"), b->region_id).status().code() == absl::StatusCode::kNotFound);
  CHECK(lease->region() != nullptr);  // the live load keeps its memory
  CHECK(registry.count() == 2);       // and the region its place under the caps
  const auto after = registry.List();
  REQUIRE(after.size() == 2);
  CHECK(after[1].released);
  CHECK(after[1].windows == 1);

  // Again on the released region (so an operator can end its loads): answered, still counted.
  auto again = registry.ReleaseAny(b->region_id);
  REQUIRE(again.ok());
  CHECK(again->already_released);
  CHECK(again->loads_using == 1);
  CHECK(again->owner == RegionOwner("team-b", "engine-2"));
  CHECK(registry.totals().released_in_use == 1);

  *lease = RegionRegistry::WindowLease();  // its load ends
  CHECK(registry.count() == 1);
  CHECK(registry.ReleaseAny(b->region_id).status().code() == absl::StatusCode::kNotFound);

  auto idle = registry.ReleaseAny(a->region_id);  // no load uses it: gone at once
  REQUIRE(idle.ok());
  CHECK(idle->loads_using == 0);
  CHECK(registry.count() == 0);
  CHECK(registry.total_bytes() == 0);
}

TEST_CASE("region registry: an operator's release of a region its owner released finds its loads", "[regions]") {
  RegionRegistry registry(SmallLimits());
  auto r = registry.Register("engine", 4096);
  REQUIRE(r.ok());
  auto load = registry.ReserveWindow("engine", r->region_id, 0, 4096);
  REQUIRE(load.ok());
  REQUIRE(registry.Release("engine", r->region_id).ok());
  auto released = registry.ReleaseAny(r->region_id);
  REQUIRE(released.ok());
  CHECK(released->already_released);
  CHECK(released->loads_using == 1);
  CHECK(released->bytes == 4096);
}

// Whether `address` lies in one of this process's mappings (/proc/self/maps): a region's memory until it is unmapped.
static bool Mapped(const void* address) {
  std::ifstream maps("/proc/self/maps");
  const auto at = reinterpret_cast<uintptr_t>(address);
  std::string line;
  while (std::getline(maps, line)) {
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &begin, &end) == 2 && begin <= at && at < end) return true;
  }
  return false;
}

TEST_CASE("region registry: the last reference hands the unmapping to the disposer", "[regions]") {
  RegionRegistry registry(SmallLimits());
  std::vector<std::function<void()>> handed;
  bool accept = true;
  registry.SetDisposer([&](std::function<void()> destroy) {
    if (!accept) return false;
    handed.push_back(std::move(destroy));
    return true;
  });
  auto released_and_dropped = [&](uint64_t bytes) {
    auto r = registry.Register("engine", bytes);
    REQUIRE(r.ok());
    const void* memory = r->region->host_data();
    REQUIRE(Mapped(memory));
    r->region.reset();
    REQUIRE(registry.Release("engine", r->region_id).ok());
    return memory;
  };

  // Released and unreferenced, but still mapped: the disposer holds the destruction, and runs it later.
  const void* first = released_and_dropped(8192);
  REQUIRE(handed.size() == 1);
  CHECK(Mapped(first));
  handed[0]();
  handed.clear();
  CHECK(!Mapped(first));

  // A disposer that cannot take it (its queue full): the region goes on the thread that let go.
  accept = false;
  CHECK(!Mapped(released_and_dropped(8192)));
  CHECK(handed.empty());

  // No disposer: in place too.
  registry.SetDisposer(nullptr);
  CHECK(!Mapped(released_and_dropped(8192)));
}

TEST_CASE("region registry: a pause of the daemon's own is credited to every lease", "[regions][lease]") {
  FakeClock clock;
  RegionRegistry::Limits limits = SmallLimits();
  limits.lease = std::chrono::milliseconds(1000);
  RegionRegistry registry(limits, &clock);
  auto r = registry.Register("engine", 4096);
  REQUIRE(r.ok());
  clock.Advance(std::chrono::milliseconds(900));
  // The daemon is stopped for 10 s: its owner's renewals wait unread in the socket meanwhile.
  clock.Advance(std::chrono::seconds(10));
  registry.CreditPause(std::chrono::seconds(10));
  CHECK(registry.ReleaseExpired().empty());
  REQUIRE(registry.Renew("engine", r->region_id).ok());  // the renewal read on resuming keeps it
  // A silent owner still loses it a lease after its last call, in the daemon's running time.
  clock.Advance(std::chrono::milliseconds(900));
  CHECK(registry.ReleaseExpired().empty());
  clock.Advance(std::chrono::milliseconds(200));
  CHECK(registry.ReleaseExpired().size() == 1);
  registry.CreditPause(std::chrono::nanoseconds(-5));  // nothing to credit: no effect, no crash
  CHECK(registry.count() == 0);
}

}  // namespace cake
