// cake-bench overhead: the daemon's CPU cost per loaded chunk (scheduling, reads from DRAM, messages), from the
// daemon's own CPU time (/proc/<pid>/stat) over many loads of many small chunks, so the copies cost next to nothing
// and what is left is the per-chunk work.
#include <cstdio>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "bench/bench_command.h"
#include "bench/bench_common.h"
#include "bench/benchmarks.h"
#include "examples/simulated_engine/simulated_storage.h"

namespace cake::bench {

absl::Status RunOverheadBench(const OverheadOptions& options) {
  if (!options.common.socket_path.empty()) {
    return absl::InvalidArgumentError("overhead measures a daemon it starts itself: leave out --socket");
  }
  CAKE_ASSIGN_OR_RETURN(auto target, OpenDaemon("", {}));
  Client& client = *target.client;
  const pid_t pid = target.spawned->pid();

  // 1 KiB of KV per token, 16-token chunks: 16 KiB a chunk, copied in about a microsecond.
  const NamespaceSpec ns = sim::ProxyNamespace("overhead", 16);
  const uint32_t chunks = options.chunks;
  const uint64_t chunk_bytes = 16 * 1024;
  const std::vector<uint32_t> prompt = SyntheticPrompt(uint64_t{chunks} * 16, 21);
  CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(uint64_t{chunks} * chunk_bytes));
  absl::Cleanup release_region = [&] { client.ReleaseRegion(region).IgnoreError(); };
  for (uint32_t c = 0; c < chunks; ++c) FillChunkPattern({region.data() + c * chunk_bytes, chunk_bytes}, c);
  CAKE_RETURN_IF_ERROR(client.Store(ns, TokensPrompt(prompt), 0, chunks, region, 0).status());

  LoadOptions load;
  load.ns = ns;
  load.prompt = TokensPrompt(prompt);
  load.region = &region;
  load.io_only = true;
  auto one_load = [&]() -> absl::Status {
    CAKE_ASSIGN_OR_RETURN(auto session, client.StartLoad(load));
    CAKE_ASSIGN_OR_RETURN(auto done, session->WaitDone());
    if (done.loaded_chunks != chunks) {
      return absl::InternalError(absl::StrCat("a load of ", chunks, " chunks loaded ", done.loaded_chunks));
    }
    return session->Release();
  };
  CAKE_RETURN_IF_ERROR(one_load());  // warm: threads, buffers, the channel

  CAKE_ASSIGN_OR_RETURN(auto cpu_before, ProcessCpuSeconds(pid));
  const Clock::time_point start = Clock::now();
  for (uint32_t i = 0; i < options.loads; ++i) {
    CAKE_RETURN_IF_ERROR(one_load());
  }
  const double wall_s = SecondsSince(start);
  CAKE_ASSIGN_OR_RETURN(auto cpu_after, ProcessCpuSeconds(pid));
  for (uint32_t c = 0; c < chunks; ++c) {
    CAKE_RETURN_IF_ERROR(CheckChunkPattern({region.data() + c * chunk_bytes, chunk_bytes}, c));
  }

  const double total_chunks = static_cast<double>(options.loads) * chunks;
  const double cpu_us = (cpu_after - cpu_before) / total_chunks * 1e6;
  const double wall_us = wall_s / total_chunks * 1e6;
  std::printf("cake-bench overhead: %u I/O-only loads of %u chunks of 16 KiB from the DRAM tier\n", options.loads,
              chunks);
  std::printf("  daemon CPU per chunk: %.1f us (goal: under 50 us); wall per chunk: %.1f us; daemon CPU %.3f s\n",
              cpu_us, wall_us, cpu_after - cpu_before);
  JsonReport report;
  report.Set("loads", options.loads);
  report.Set("chunks_per_load", chunks);
  report.Set("chunk_bytes", static_cast<double>(chunk_bytes));
  report.Set("daemon_cpu_us_per_chunk", cpu_us);
  report.Set("wall_us_per_chunk", wall_us);
  report.Set("daemon_cpu_s", cpu_after - cpu_before);
  return report.WriteTo(options.common.json_path);
}

void AddOverheadCommand(CLI::App& app) {
  auto options = std::make_shared<OverheadOptions>();
  CLI::App* command =
      app.add_subcommand("overhead", "the daemon's CPU time per loaded chunk, over many loads of small chunks");
  AddCommonOptions(command, options->common);
  command->add_option("--loads", options->loads, "measured loads")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100000u));
  command->add_option("--chunks", options->chunks, "chunks of 16 KiB per load")
      ->capture_default_str()
      ->check(CLI::Range(1u, 65536u));
  RunWhenParsed(command, options, RunOverheadBench);
}

}  // namespace cake::bench
