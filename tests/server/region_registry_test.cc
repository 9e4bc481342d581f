// RegionRegistry: regions in real host shared memory, owned by the client that registered them, and the windows
// live loads lease in them.
#include "server/region_registry.h"

#include <catch2/catch.hpp>

#include <cstring>

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
  CHECK(registry.count() == 0);  // the name is gone at once
  std::memset(region->host_data(), 0x5a, 4096);  // the load's last read still lands in mapped memory
  CHECK(static_cast<unsigned char>(region->host_data()[4095]) == 0x5a);
  region.reset();
  { RegionRegistry::WindowLease ended = std::move(*lease); }  // ending a lease on a released region is harmless
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
  CHECK(registry.count() == 1);
  CHECK(registry.Get(RegionOwner("team-b", "engine-2"), b->region_id).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(lease->region() != nullptr);  // the live load keeps its memory
  CHECK(registry.ReleaseAny(b->region_id).status().code() == absl::StatusCode::kNotFound);
}

}  // namespace cake
