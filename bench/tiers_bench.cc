// cake-bench tiers: one prefix loaded from the DRAM tier alone, the disk tier alone, and half from each, with both
// tiers capped at the same bandwidth. A load reads its chunks in different tiers at the same time (a window per
// tier), so the split prefix should load in about half the time: the sum of the tiers' bandwidths.
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "bench/bench_command.h"
#include "bench/bench_common.h"
#include "bench/benchmarks.h"
#include "examples/simulated_engine/simulated_storage.h"

namespace cake::bench {
absl::Status RunTiersBench(const TiersOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("--dir is required (the disk tier's folder)");
  if (options.mib < 8 || options.gbps <= 0) return absl::InvalidArgumentError("need --mib >= 8 and --gbps > 0");
  CAKE_ASSIGN_OR_RETURN(auto root, FreshPath(options.dir, "cake-tiers"));
  absl::Cleanup remove_root = [&] { RemoveQuietly(root); };
  constexpr uint32_t kChunkTokens = 256;
  const NamespaceSpec ns = sim::ProxyNamespace("tiers", kChunkTokens);  // 256 KiB chunks
  const uint64_t chunk_bytes = static_cast<uint64_t>(kChunkTokens * sim::kProxyBytesPerToken);
  const uint32_t chunks = static_cast<uint32_t>((options.mib << 20) / chunk_bytes);
  const uint64_t bytes = uint64_t{chunks} * chunk_bytes;
  CAKE_ASSIGN_OR_RETURN(
      auto target,
      OpenDaemon("", {"--disk-root", root.string(), "--dram-read-gbps", absl::StrCat(options.gbps), "--disk-read-gbps",
                      absl::StrCat(options.gbps), "--dram-capacity-mib", absl::StrCat(4 * (bytes >> 20) + 64)}));
  Client& client = *target.client;
  CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(bytes));
  absl::Cleanup release_region = [&] { client.ReleaseRegion(region).IgnoreError(); };
  const std::vector<uint32_t> prompt = SyntheticPrompt(uint64_t{chunks} * kChunkTokens, 61);
  for (uint32_t c = 0; c < chunks; ++c) FillChunkPattern({region.data() + c * chunk_bytes, chunk_bytes}, c);
  CAKE_RETURN_IF_ERROR(client.Store(ns, TokensPrompt(prompt), 0, chunks, region, 0).status());
  CAKE_RETURN_IF_ERROR(WaitForCounter(client, "tier_disk_chunks", chunks, std::chrono::seconds(60)));

  LoadOptions load;
  load.ns = ns;
  load.prompt = TokensPrompt(prompt);
  load.region = &region;
  std::vector<double> dram_s, disk_s, split_s;
  for (uint32_t run = 0; run < options.runs; ++run) {
    // Everything in DRAM (it is, after the Store).
    CAKE_ASSIGN_OR_RETURN(auto dram, TimedIoOnlyLoad(client, load, chunks, chunk_bytes));
    dram_s.push_back(dram);
    // Everything on disk.
    CAKE_RETURN_IF_ERROR(client.Evict(TierKind::kDram).status());
    CAKE_ASSIGN_OR_RETURN(auto disk, TimedIoOnlyLoad(client, load, chunks, chunk_bytes));
    disk_s.push_back(disk);
    // Half and half: the first half back in DRAM (promoted by a load of it), the second half on disk.
    CAKE_RETURN_IF_ERROR(client.Evict(TierKind::kDram).status());
    const std::vector<uint32_t> first_half(prompt.begin(), prompt.begin() + (chunks / 2) * kChunkTokens);
    LoadOptions half = load;
    half.prompt = TokensPrompt(first_half);
    CAKE_ASSIGN_OR_RETURN(auto before, client.Stats());
    CAKE_RETURN_IF_ERROR(TimedIoOnlyLoad(client, half, chunks / 2, chunk_bytes).status());
    CAKE_RETURN_IF_ERROR(WaitForCounter(client, "write_back_promoted", before.at("write_back_promoted") + chunks / 2,
                                        std::chrono::seconds(30)));
    CAKE_ASSIGN_OR_RETURN(auto lookup, client.Lookup(ns, TokensPrompt(prompt)));
    const auto in_dram = std::count(lookup.tiers.begin(), lookup.tiers.end(), TierKind::kDram);
    if (in_dram != chunks / 2) {
      return absl::InternalError(absl::StrCat(in_dram, " of ", chunks, " chunks in DRAM; expected ", chunks / 2));
    }
    CAKE_ASSIGN_OR_RETURN(auto split, TimedIoOnlyLoad(client, load, chunks, chunk_bytes));
    split_s.push_back(split);
    // Back to everything in DRAM for the next run.
    CAKE_RETURN_IF_ERROR(TimedIoOnlyLoad(client, load, chunks, chunk_bytes).status());
    std::printf("  run %u: DRAM alone %.3f s, disk alone %.3f s, half in each %.3f s\n", run + 1, dram_s.back(),
                disk_s.back(), split_s.back());
    std::fflush(stdout);
  }
  const double best_single = std::min(Median(dram_s), Median(disk_s));
  std::printf(
      "cake-bench tiers: %u chunks of %llu KiB (%llu MiB), DRAM and disk tiers each capped at %g Gbit/s; I/O-only "
      "loads, every byte checked\n",
      chunks, static_cast<unsigned long long>(chunk_bytes >> 10), static_cast<unsigned long long>(bytes >> 20),
      options.gbps);
  std::printf("  median: DRAM alone %.3f s, disk alone %.3f s, half in each %.3f s (%.2fx the faster single tier)\n",
              Median(dram_s), Median(disk_s), Median(split_s), Median(split_s) / best_single);
  JsonReport report;
  report.Set("gbps", options.gbps);
  report.Set("bytes", static_cast<double>(bytes));
  report.Set("dram_alone_s", Median(dram_s));
  report.Set("disk_alone_s", Median(disk_s));
  report.Set("split_s", Median(split_s));
  report.Set("split_over_best_single", Median(split_s) / best_single);
  return report.WriteTo(options.json_path);
}

void AddTiersCommand(CLI::App& app) {
  auto options = std::make_shared<TiersOptions>();
  CLI::App* command = app.add_subcommand(
      "tiers", "one prefix from DRAM alone, disk alone and half from each, both tiers capped at the same bandwidth");
  command->add_option("--dir", options->dir, "folder for the disk tier")->required();
  command->add_option("--json", options->json_path, "also write the results to this file as one JSON object");
  command->add_option("--mib", options->mib, "prefix size, MiB")->capture_default_str();
  command->add_option("--gbps", options->gbps, "each tier's read cap, Gbit/s")->capture_default_str();
  command->add_option("--runs", options->runs, "runs of each")->capture_default_str()->check(CLI::Range(1u, 100u));
  RunWhenParsed(command, options, RunTiersBench);
}

}  // namespace cake::bench
