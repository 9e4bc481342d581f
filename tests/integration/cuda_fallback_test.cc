// The daemon where CUDA cannot start (no driver, no device, or device regions turned off): it starts, says why
// once in its log, and serves host regions; asking for a device region gets FAILED_PRECONDITION with the reason.
// CUDA_VISIBLE_DEVICES is emptied for the daemon, so this holds on a machine with a GPU too.
#include <cstdlib>
#include <filesystem>

#include "tests/integration/fixture.h"

using namespace cake;
using namespace cake::testing;

namespace {

// Starts caked with no CUDA device visible to it.
SpawnedDaemon StartWithoutDevices(const std::vector<std::string>& args = {}) {
  const char* previous = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string saved = previous != nullptr ? previous : "";
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  auto daemon = StartDaemon(args);
  if (previous != nullptr) {
    setenv("CUDA_VISIBLE_DEVICES", saved.c_str(), 1);
  } else {
    unsetenv("CUDA_VISIBLE_DEVICES");
  }
  return daemon;
}

}  // namespace

TEST_CASE("without a usable CUDA device the daemon serves host regions and says why", "[cuda][region]") {
  for (bool turned_off : {false, true}) {
    CAPTURE(turned_off);
    auto daemon = turned_off ? StartDaemon({"--no-cuda"}) : StartWithoutDevices();
    auto client = Connect(daemon);
    REQUIRE(Eventually([&] { return daemon.log().find("CUDA: ") != std::string::npos; }));
    CHECK(daemon.log().find("serving host regions only") != std::string::npos);
    if (turned_off) CHECK(daemon.log().find("cuda.enabled = false") != std::string::npos);

    // Auto falls back to host memory, which works as ever.
    auto region = client->RegisterRegion(64 << 10, {RegionRequest::Kind::kAuto, 0});
    REQUIRE(region.ok());
    CHECK(region->backend() == RegionBackend::kHostShm);
    REQUIRE(region->data() != nullptr);
    CHECK(region->device_data() == nullptr);
    std::vector<std::byte> bytes(4096, std::byte{0x5a});
    REQUIRE(region->CopyFromHost(4096, bytes).ok());
    CHECK(region->data()[4096] == std::byte{0x5a});
    std::vector<std::byte> back(4096);
    REQUIRE(region->CopyToHost(4096, back).ok());
    CHECK(back == bytes);
    CHECK(region->CopyToHost(region->size() - 10, back).code() == absl::StatusCode::kOutOfRange);

    // A device region is refused with the reason, and nothing is held.
    auto device = client->RegisterRegion(64 << 10, {RegionRequest::Kind::kCuda, 0});
    CHECK(device.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(std::string(device.status().message()).find("no device regions") != std::string::npos);
    auto status = client->Status();
    REQUIRE(status.ok());
    CHECK(!status->cuda_regions);
    CHECK(status->regions == 1);

    // Loads into the host region are unchanged.
    const auto ns = SmallNamespace();
    const auto tokens = Tokens(16 * 4);
    StorePrompt(*client, ns, tokens, 3, 4, 16 * kSmallBytesPerToken);
    LoadAndVerify(*client, ns, tokens, 3, &*region);
    REQUIRE(client->ReleaseRegion(*region).ok());
  }
}

TEST_CASE("cuda settings are validated", "[cuda][config]") {
  const std::string dir = "/tmp/cake-cuda-config-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string good =
      WriteFile(dir, "good.toml", "[cuda]\nenabled = false\ndevices = [0, 1]\nmax_region_bytes = 1048576\n");
  auto ok = Run(std::string(CAKE_CAKED_PATH) + " --config " + good + " --check-config");
  CHECK(ok.exit_code == 0);
  const std::string bad = WriteFile(dir, "bad.toml", "[cuda]\ndevices = [\"zero\"]\n");
  auto refused = Run(std::string(CAKE_CAKED_PATH) + " --config " + bad + " --check-config");
  CHECK(refused.exit_code == 2);
  CHECK(refused.output.find("cuda.devices") != std::string::npos);
  std::filesystem::remove_all(dir);
}
