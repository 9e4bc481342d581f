// Region caps against an engine that releases regions under its own live loads (issue 31 row 3): a released
// region a load still maps keeps counting, stays visible to operators, and an operator can end its loads.
#include "tests/integration/fixture.h"

using namespace cake;
using namespace cake::testing;

namespace {

constexpr uint64_t kChunkBytes = 256 * kSmallBytesPerToken;

// A daemon whose regions may hold 4 chunks' bytes, all clients together (and this test's one principal all of them).
SpawnedDaemon StartCappedDaemon(const std::vector<std::string>& extra_args = {}) {
  auto config = WriteFile("/tmp", "cake-region-caps-" + std::to_string(getpid()) + ".toml",
                          "[limits]\nmax_total_region_bytes = " + std::to_string(4 * kChunkBytes) +
                              "\nmax_region_bytes_per_principal = " + std::to_string(4 * kChunkBytes) + "\n");
  std::vector<std::string> args = {"--config", config};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  auto daemon = StartDaemon(args);
  std::remove(config.c_str());
  return daemon;
}

v1::ListRegionsResponse ListRegions(RawStubs& raw) {
  grpc::ClientContext context;
  v1::ListRegionsResponse response;
  REQUIRE(raw.admin->ListRegions(&context, v1::ListRegionsRequest(), &response).ok());
  return response;
}

v1::ReleaseAnyRegionResponse ReleaseAny(RawStubs& raw, const std::string& region_id, bool end_loads) {
  grpc::ClientContext context;
  v1::ReleaseAnyRegionRequest request;
  request.set_region_id(region_id);
  request.set_end_loads(end_loads);
  v1::ReleaseAnyRegionResponse response;
  const grpc::Status status = raw.admin->ReleaseAnyRegion(&context, request, &response);
  INFO(status.error_message());
  REQUIRE(status.ok());
  return response;
}

}  // namespace

TEST_CASE("a region released under a live load counts against the caps until an operator ends the load",
          "[regions][hostile]") {
  auto daemon = StartCappedDaemon();
  auto client = Connect(daemon);
  RawStubs raw(daemon);
  const std::string cakectl = std::string(CAKE_CAKECTL_PATH) + " --socket " + daemon.socket_path();
  const auto ns = SmallNamespace(256);
  const auto tokens = Tokens(256 * 4);
  StorePrompt(*client, ns, tokens, 1, 4, kChunkBytes);

  // The finding's loop: register a region the size of the cap, keep a load on it, release it, register again.
  auto region = client->RegisterRegion(4 * kChunkBytes);
  REQUIRE(region.ok());
  LoadOptions options{ns, {tokens, {}}, &*region};
  options.io_only = true;
  auto session = client->StartLoad(options);
  REQUIRE(session.ok());
  REQUIRE((*session)->WaitDone().ok());  // loaded; the load lives (and maps the region) until the engine releases it
  REQUIRE(client->ReleaseRegion(*region).ok());

  const auto refused = client->RegisterRegion(kChunkBytes);
  CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("limits.max_total_region_bytes") && Catch::Contains("released but still in use"));

  const v1::StatusResponse status = raw.Status();
  CHECK(status.regions() == 1);
  CHECK(status.region_bytes() == 4 * kChunkBytes);
  CHECK(status.regions_released_in_use() == 1);
  CHECK(status.region_bytes_released_in_use() == 4 * kChunkBytes);

  const v1::ListRegionsResponse listed = ListRegions(raw);
  REQUIRE(listed.regions_size() == 1);
  const std::string region_id = listed.regions(0).region_id();
  CHECK(listed.regions(0).released());
  CHECK(listed.regions(0).loads_using() == 1);
  CHECK(listed.regions(0).client_id() == "engine-a");
  const auto shown = Run(cakectl + " regions");
  CHECK(shown.exit_code == 0);
  CHECK(shown.output.find("released, in use by 1 load") != std::string::npos);
  CHECK(Run(cakectl + " status").output.find("1 of them (1.0 MiB) released, still in use by loads") !=
        std::string::npos);

  // Its owner cannot release it twice; an operator can end the load that keeps it.
  CHECK(client->ReleaseRegion(*region).code() == absl::StatusCode::kNotFound);
  const auto ended = Run(cakectl + " regions release " + region_id + " --end-loads");
  INFO(ended.output);
  CHECK(ended.exit_code == 0);
  CHECK(ended.output.find("already released") != std::string::npos);
  CHECK(ended.output.find("1 loads using it ended") != std::string::npos);

  // The load's stream ends with the operator's reason; the engine computes the rest.
  CHECK(Eventually([&] { return raw.Status().active_loads() == 0; }));
  const absl::Status load_end = (*session)->Release();
  CHECK(load_end.code() == absl::StatusCode::kCancelled);
  CHECK_THAT(std::string(load_end.message()), Catch::Contains("an operator released the region"));
  CHECK(Eventually([&] { return raw.Status().regions() == 0; }));
  CHECK(raw.Status().region_bytes_released_in_use() == 0);
  CHECK(client->RegisterRegion(4 * kChunkBytes).ok());  // the cap is free again
}

TEST_CASE("an operator's release of a region in use keeps it counted until it ends the loads", "[regions][hostile]") {
  // Slow reads (4 Mbit/s: a 256 KiB chunk takes about 0.5 s) keep the load reading while the operator acts.
  auto daemon = StartCappedDaemon({"--dram-read-gbps", "0.004"});
  auto client = Connect(daemon);
  RawStubs raw(daemon);
  const auto ns = SmallNamespace(256);
  const auto tokens = Tokens(256 * 4);
  StorePrompt(*client, ns, tokens, 2, 4, kChunkBytes);
  auto region = client->RegisterRegion(4 * kChunkBytes);
  REQUIRE(region.ok());
  LoadOptions options{ns, {tokens, {}}, &*region};
  options.io_only = true;
  auto session = client->StartLoad(options);
  REQUIRE(session.ok());
  REQUIRE((*session)->WaitPlan().ok());
  const std::string region_id = ListRegions(raw).regions(0).region_id();

  const v1::ReleaseAnyRegionResponse kept = ReleaseAny(raw, region_id, false);
  CHECK(kept.loads_using() == 1);
  CHECK(kept.loads_ended() == 0);
  CHECK_FALSE(kept.already_released());
  CHECK(client->RegisterRegion(kChunkBytes).status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(raw.Status().regions_released_in_use() == 1);

  const v1::ReleaseAnyRegionResponse ended = ReleaseAny(raw, region_id, true);
  CHECK(ended.already_released());
  CHECK(ended.loads_ended() == 1);
  CHECK(ended.client_id() == "engine-a");
  CHECK_FALSE((*session)->WaitDone().ok());  // ended before its Done; Release() says why
  CHECK((*session)->Release().code() == absl::StatusCode::kCancelled);
  CHECK(Eventually([&] { return raw.Status().regions() == 0; }));
  CHECK(client->RegisterRegion(4 * kChunkBytes).ok());
}
