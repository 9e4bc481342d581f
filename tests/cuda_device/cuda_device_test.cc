// CUDA device regions on a machine with a GPU: the backend's own contract, and loads through a real caked into
// device memory opened over CUDA IPC, checked byte for byte. Where no device is usable the executable prints why
// and exits 77, which ctest reports as skipped (label "cuda"); every other suite runs on CPU-only machines.
#define CATCH_CONFIG_RUNNER
#include <algorithm>
#include <cstdio>

#include "cuda/cuda_backend.h"
#include "tests/integration/fixture.h"

using namespace cake;
using namespace cake::testing;

int main(int argc, char** argv) {
  const CudaProbe& probe = ProbeCuda();
  if (!probe.usable) {
    std::printf("SKIPPED: no usable CUDA device: %s\n", probe.reason.c_str());
    return 77;
  }
  std::printf("CUDA: %d device(s)\n", probe.device_count);
  return Catch::Session().run(argc, argv);
}

TEST_CASE("a device region copies in and out, exports a 64-byte handle and checks ranges", "[cuda]") {
  auto region = CreateCudaRegion(1 << 20, 0);
  REQUIRE(region.ok());
  CHECK((*region)->backend() == RegionBackend::kCudaIpc);
  CHECK((*region)->size() == (1u << 20));
  CHECK((*region)->host_data() == nullptr);
  CHECK((*region)->export_handle().size() == kCudaIpcHandleBytes);
  std::vector<std::byte> in(256 << 10), out(256 << 10);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::byte>(i * 31 + 7);
  REQUIRE((*region)->CopyIn(512 << 10, in).ok());
  REQUIRE((*region)->CopyOut(512 << 10, out).ok());
  CHECK(in == out);
  // Fresh device memory reads as zeros, like a fresh host region.
  REQUIRE((*region)->CopyOut(0, out).ok());
  CHECK(std::all_of(out.begin(), out.end(), [](std::byte b) { return b == std::byte{0}; }));
  CHECK((*region)->CopyIn((1 << 20) - 100, in).code() == absl::StatusCode::kOutOfRange);
  CHECK(CreateCudaRegion(1 << 20, ProbeCuda().device_count).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(CreateCudaRegion(0, 0).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("staging buffers are pinned where CUDA is usable", "[cuda]") {
  auto staging = StagingBuffer::Allocate(4 << 20);
  REQUIRE(staging.ok());
  CHECK(staging->pinned());
  CHECK(staging->bytes().size() == (4u << 20));
  // A returned buffer is taken again for the next read of its size.
  std::byte* first = staging->bytes().data();
  *staging = std::move(*StagingBuffer::Allocate(1 << 20));
  auto again = StagingBuffer::Allocate(4 << 20);
  REQUIRE(again.ok());
  CHECK(again->bytes().data() == first);
}

TEST_CASE("an engine opens a device region over IPC and loads land on the device byte for byte", "[cuda][load]") {
  auto daemon = StartDaemon({"--cuda-devices", "0", "--dram-capacity-mib", "256"});  // a small tier to page-lock
  auto client = Connect(daemon);
  REQUIRE(Eventually([&] { return daemon.log().find("CUDA: device regions") != std::string::npos; }));
  const auto ns = SmallNamespace();
  const uint64_t chunk_bytes = 16 * kSmallBytesPerToken;
  const uint32_t chunks = 12;
  const auto tokens = Tokens(16 * chunks);
  auto region = client->RegisterRegion(chunks * chunk_bytes, {RegionRequest::Kind::kCuda, 0});
  REQUIRE(region.ok());
  CHECK(region->backend() == RegionBackend::kCudaIpc);
  CHECK(region->data() == nullptr);
  REQUIRE(region->device_data() != nullptr);

  // Store from device memory: the daemon copies device to host.
  std::vector<std::byte> host(chunks * chunk_bytes);
  for (uint32_t c = 0; c < chunks; ++c) FillChunk(host.data() + c * chunk_bytes, chunk_bytes, 9, c);
  REQUIRE(region->CopyFromHost(0, host).ok());
  auto stored = client->Store(ns, {tokens, {}}, 0, chunks, *region, 0);
  REQUIRE(stored.ok());
  CHECK(stored->stored_chunks == chunks);

  for (bool io_only : {true, false}) {
    CAPTURE(io_only);
    std::vector<std::byte> zeros(host.size());
    REQUIRE(region->CopyFromHost(0, zeros).ok());
    LoadOptions options{ns, {tokens, {}}, &*region};
    options.io_only = io_only;
    auto session = client->StartLoad(options);
    REQUIRE(session.ok());
    auto plan = (*session)->WaitPlan();
    REQUIRE(plan.ok());
    uint32_t computed = 0;
    if (!io_only) {
      while (computed < chunks && !(*session)->IsResident(computed)) {
        REQUIRE((*session)->ReportProgress(++computed).ok());
      }
    }
    auto done = (*session)->WaitDone();
    REQUIRE(done.ok());
    // ChunkLoaded came only after each chunk's copy completed: the bytes are on the device now.
    std::vector<std::byte> back(chunk_bytes);
    for (uint32_t c = done->meeting_chunk; c < chunks; ++c) {
      REQUIRE(region->CopyToHost((*session)->RegionOffset(c), back).ok());
      INFO("chunk " << c);
      CHECK(ChunkMatches(back.data(), chunk_bytes, 9, c));
    }
    REQUIRE((*session)->Release().ok());
  }
  // A second device region and a host one side by side; a bad ordinal is refused.
  auto host_region = client->RegisterRegion(chunk_bytes, {RegionRequest::Kind::kHost, 0});
  REQUIRE(host_region.ok());
  CHECK(host_region->backend() == RegionBackend::kHostShm);
  auto bad = client->RegisterRegion(chunk_bytes, {RegionRequest::Kind::kCuda, 99});
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(client->ReleaseRegion(*host_region).ok());
  REQUIRE(client->ReleaseRegion(*region).ok());
}
