// cake-bench region: how fast I/O-only loads move chunks from the DRAM tier into a registered region, against
// the plain copy of the same bytes in this process, in the same run; every load's bytes are checked. A host region
// is compared with memcpy; a CUDA device region (--cuda-device N) with one cudaMemcpy from pinned memory.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "bench/bench_command.h"
#include "bench/bench_common.h"
#include "bench/benchmarks.h"
#include "cuda/cuda_backend.h"
#include "examples/simulated_engine/models.h"

namespace cake::bench {
namespace {

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<std::byte, FreeDeleter>;

AlignedBuffer AllocatePageAligned(uint64_t bytes) {
  const uint64_t rounded = (bytes + 4095) / 4096 * 4096;
  return AlignedBuffer(static_cast<std::byte*>(std::aligned_alloc(4096, rounded)));
}

// One I/O-only load of every chunk into the zeroed region; returns its Start-to-Done seconds.
absl::StatusOr<double> TimedLoad(Client& client, const NamespaceSpec& ns, const std::vector<uint32_t>& tokens,
                                 const MappedRegion& region, uint32_t chunks, uint64_t chunk_bytes) {
  if (region.data() != nullptr) {
    std::memset(region.data(), 0, region.size());
  } else {
    const std::vector<std::byte> zeros(chunk_bytes);
    for (uint32_t c = 0; c < chunks; ++c) {
      CAKE_RETURN_IF_ERROR(region.CopyFromHost(c * chunk_bytes, zeros));
    }
  }
  LoadOptions load;
  load.ns = ns;
  load.prompt.tokens = tokens;
  load.region = &region;
  load.io_only = true;
  const Clock::time_point start = Clock::now();
  CAKE_ASSIGN_OR_RETURN(auto session, client.StartLoad(load));
  auto done = session->WaitDone();
  const double seconds = SecondsSince(start);
  if (!done.ok()) {
    absl::Status why = session->Release();
    return why.ok() ? done.status() : why;
  }
  if (done->meeting_chunk != 0 || done->loaded_chunks != chunks) {
    return absl::InternalError(absl::StrCat("an I/O-only load of ", chunks, " cached chunks loaded ",
                                            done->loaded_chunks, " (meeting chunk ", done->meeting_chunk, ", ",
                                            done->failed_chunks, " failed reads)"));
  }
  std::vector<std::byte> landed(chunk_bytes);
  for (uint32_t c = 0; c < chunks; ++c) {
    CAKE_RETURN_IF_ERROR(region.CopyToHost(session->RegionOffset(c), landed));
    CAKE_RETURN_IF_ERROR(CheckChunkPattern(landed, c));
  }
  CAKE_RETURN_IF_ERROR(session->Release());
  return seconds;
}

}  // namespace

absl::Status RunRegionBench(const RegionBenchOptions& options) {
  const sim::ModelSpec& model = *sim::FindModel("llama3.1-8b");
  const NamespaceSpec ns = sim::KvNamespace(model);
  CAKE_ASSIGN_OR_RETURN(auto layout, Namespace::Create(ns));
  const uint64_t chunk_bytes = layout.chunk_bytes();
  const uint32_t chunks = static_cast<uint32_t>((options.mib << 20) / chunk_bytes);
  if (chunks == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--mib ", options.mib, " is less than one ", chunk_bytes >> 20, " MiB chunk of ", model.name));
  }
  const uint64_t bytes = uint64_t{chunks} * chunk_bytes;

  // The DRAM tier must hold the whole prefix, with room to spare for the tier's own accounting.
  const bool on_device = options.cuda_device.has_value();
  if (on_device && !ProbeCuda().usable) {
    return absl::FailedPreconditionError(absl::StrCat("--cuda-device needs a CUDA device: ", ProbeCuda().reason));
  }
  std::vector<std::string> args = {"--dram-capacity-mib", absl::StrCat((bytes >> 20) + 256)};
  if (on_device) args.insert(args.end(), {"--cuda-devices", absl::StrCat(*options.cuda_device)});
  CAKE_ASSIGN_OR_RETURN(auto target, OpenDaemon(options.common.socket_path, args));
  Client& client = *target.client;

  const std::vector<uint32_t> tokens = SyntheticPrompt(uint64_t{chunks} * ns.chunk_tokens, 256);
  CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(bytes, on_device ? RegionRequest{RegionRequest::Kind::kCuda,
                                                                                            *options.cuda_device}
                                                                            : RegionRequest{}));
  absl::Cleanup release_region = [&] { client.ReleaseRegion(region).IgnoreError(); };
  {
    std::vector<std::byte> pattern(chunk_bytes);
    for (uint32_t c = 0; c < chunks; ++c) {
      FillChunkPattern(pattern, c);
      CAKE_RETURN_IF_ERROR(region.CopyFromHost(c * chunk_bytes, pattern));
    }
  }
  CAKE_RETURN_IF_ERROR(client.Store(ns, TokensPrompt(tokens), 0, chunks, region, 0).status());

  // Both buffers are touched first, so the baseline pays no page faults (the region's pages are mapped already).
  AlignedBuffer src = AllocatePageAligned(bytes);
  AlignedBuffer dst = AllocatePageAligned(bytes);
  if (!src || !dst) return absl::ResourceExhaustedError("cannot allocate the memcpy buffers");
  std::memset(src.get(), 0x5a, bytes);
  std::memset(dst.get(), 0, bytes);

  // Runs alternate between the two, so background load on a shared machine hits both alike.
  std::vector<double> region_gbps, memcpy_gbps;
  for (uint32_t run = 0; run <= options.runs; ++run) {
    double copy_seconds = 0;
    if (on_device) {
      CAKE_ASSIGN_OR_RETURN(auto timed, TimePinnedCopy(bytes, *options.cuda_device));
      copy_seconds = timed;
    } else {
      const Clock::time_point start = Clock::now();
      std::memcpy(dst.get(), src.get(), bytes);
      copy_seconds = SecondsSince(start);
    }
    CAKE_ASSIGN_OR_RETURN(auto load_seconds, TimedLoad(client, ns, tokens, region, chunks, chunk_bytes));
    if (run == 0) continue;  // warm-up
    memcpy_gbps.push_back(GigabytesPerSecond(bytes, copy_seconds));
    region_gbps.push_back(GigabytesPerSecond(bytes, load_seconds));
  }

  // The strictest comparison: a typical load against the best memcpy.
  const double region_median = Median(region_gbps);
  const double memcpy_best = Max(memcpy_gbps);
  const double ratio = region_median / memcpy_best;
  std::printf("cake-bench region: %u chunks of %llu MiB (%s layout, %llu MiB), %u runs, socket %s\n", chunks,
              static_cast<unsigned long long>(chunk_bytes >> 20), model.name,
              static_cast<unsigned long long>(bytes >> 20), options.runs, target.socket_path.c_str());
  std::printf("  %-34s %12s %12s\n", "GB/s (1e9 bytes/s)", "median", "best");
  const double goal = on_device ? 0.85 : 0.7;
  std::printf("  %-34s %12.2f %12.2f\n",
              on_device ? "I/O-only load, DRAM -> device region" : "I/O-only load, DRAM tier -> region", region_median,
              Max(region_gbps));
  std::printf("  %-34s %12.2f %12.2f\n", on_device ? "cudaMemcpy from pinned memory" : "memcpy, one thread",
              Median(memcpy_gbps), memcpy_best);
  std::printf("  every load verified byte for byte\n");
  std::printf("  load median / %s best = %.0f%% (goal: at least %.0f%%) -> %s\n", on_device ? "cudaMemcpy" : "memcpy",
              100 * ratio, 100 * goal, ratio >= goal ? "met" : "MISSED");

  JsonReport report;
  report.Set("region_gbps", region_median);
  report.Set("region_best_gbps", Max(region_gbps));
  report.Set("memcpy_gbps", memcpy_best);
  report.Set("memcpy_median_gbps", Median(memcpy_gbps));
  report.Set("ratio", ratio);
  report.Set("goal_ratio", goal);
  report.Set("region_kind", std::string(on_device ? "cuda" : "host"));
  report.Set("units", std::string("GB/s = 1e9 bytes per second"));
  report.Set("bytes", static_cast<double>(bytes));
  report.Set("chunk_bytes", static_cast<double>(chunk_bytes));
  report.Set("runs", options.runs);
  return report.WriteTo(options.common.json_path);
}

void AddRegionCommand(CLI::App& app) {
  auto options = std::make_shared<RegionBenchOptions>();
  CLI::App* command =
      app.add_subcommand("region", "I/O-only load throughput from the DRAM tier into a region, beside memcpy");
  AddCommonOptions(command, options->common);
  command->add_option("--mib", options->mib, "bytes of prefix to load, in MiB (whole 32 MiB chunks)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{32}, uint64_t{1} << 20));
  command->add_option("--cuda-device", options->cuda_device,
                      "load into device memory on this CUDA device (against cudaMemcpy from pinned memory)");
  command->add_option("--runs", options->runs, "measured runs of each")
      ->capture_default_str()
      ->check(CLI::Range(1u, 10000u));
  RunWhenParsed(command, options, RunRegionBench);
}

}  // namespace cake::bench
