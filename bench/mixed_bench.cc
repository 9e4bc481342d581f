// cake-bench mixed: Cake with a prefix spread over the DRAM, disk and remote (Redis) tiers at once, each capped at
// its own modelled bandwidth, against the same prefix held by one tier alone. The engine is the simulated one of
// `cake-bench grid` (the Cake paper's cost model); the tiers serve stand-in bytes (1 KiB per token) behind read caps
// scaled to the model's KV size, as in grid. The prefix is placed with Store and Evict, and promotion is off, so a
// load never moves chunks between tiers:
//   DRAM alone:   Store everything (write-back copies it to disk and Redis too)
//   disk alone:   evict DRAM
//   remote alone: evict DRAM and disk
//   mixed:        Store [0, dram+disk shares) again (DRAM and disk), evict DRAM, Store [0, dram share) again:
//                 DRAM holds the first share, disk the next, Redis the rest; each chunk is read from the fastest
//                 tier holding it.
#include <unistd.h>

#include <cstdio>
#include <limits>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "bench/bench_command.h"
#include "bench/bench_common.h"
#include "bench/benchmarks.h"
#include "examples/simulated_engine/models.h"
#include "examples/simulated_engine/simulated_engine.h"
#include "examples/simulated_engine/simulated_storage.h"
#include "testing/redis_process.h"

namespace cake::bench {
namespace {

enum Placement { kDramAlone, kDiskAlone, kRemoteAlone, kMixed, kPlacements };
const char* const kPlacementNames[] = {"dram", "disk", "remote", "mixed"};

struct Row {
  double remote_gbps = 0;
  double compute_s = 0;
  double io_s[kPlacements] = {};
  double cake_s[kPlacements] = {};
  double oracle_s[kPlacements] = {};
  uint32_t meet_token[kPlacements] = {};
  std::string strategy[kPlacements];
};

// The best split when the loads of each tier's chunks run in parallel: min over m of max(compute [0, m),
// max over tiers of (that tier's chunks in [m, H)) x its seconds per chunk), in modelled seconds.
double MixedOracleSeconds(const sim::GridEngine& engine, double time_scale, const std::vector<int>& chunk_tier,
                          const std::vector<double>& tier_chunk_s, uint32_t chunk_tokens) {
  const uint32_t chunks = static_cast<uint32_t>(chunk_tier.size());
  std::vector<uint32_t> remaining(tier_chunk_s.size(), 0);
  for (int t : chunk_tier) remaining[t]++;
  double best = std::numeric_limits<double>::infinity();
  for (uint32_t m = 0; m <= chunks; ++m) {
    double load = 0;
    for (size_t t = 0; t < tier_chunk_s.size(); ++t) load = std::max(load, remaining[t] * tier_chunk_s[t]);
    const double compute = engine.Seconds(0, static_cast<double>(m) * chunk_tokens) * time_scale;
    best = std::min(best, std::max(compute, load));
    if (m < chunks) remaining[chunk_tier[m]]--;
  }
  return best;
}

}  // namespace

absl::Status RunMixedBench(const MixedOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("--dir is required (the disk tier's folder)");
  const sim::ModelSpec* model = sim::FindModel(options.model);
  if (model == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown model ", options.model));
  if (options.tokens == 0 || options.tokens % options.chunk_tokens != 0) {
    return absl::InvalidArgumentError("--tokens must be a positive multiple of --chunk-tokens");
  }
  if (!(options.dram_share >= 0 && options.disk_share >= 0 && options.dram_share + options.disk_share <= 1)) {
    return absl::InvalidArgumentError("--dram-share and --disk-share must be >= 0 and sum to at most 1");
  }
  if (!(options.util > 0 && options.util <= 1) || options.time_scale <= 0 || options.gpu_tflops <= 0) {
    return absl::InvalidArgumentError("need 0 < --util <= 1, --time-scale > 0 and --gpu-tflops > 0");
  }
  CAKE_ASSIGN_OR_RETURN(auto redis, RedisServer::Start());

  const double kv_bytes_per_token = sim::KvBytesPerToken(*model);
  const uint32_t chunks = options.tokens / options.chunk_tokens;
  const uint32_t dram_chunks = static_cast<uint32_t>(options.dram_share * chunks);
  const uint32_t disk_end = static_cast<uint32_t>((options.dram_share + options.disk_share) * chunks);
  const uint64_t proxy_bytes = static_cast<uint64_t>(options.tokens * sim::kProxyBytesPerToken);
  const uint64_t chunk_bytes = proxy_bytes / chunks;
  const NamespaceSpec ns = sim::ProxyNamespace(absl::StrCat("mixed-", model->name), options.chunk_tokens);
  const std::vector<uint32_t> prompt = SyntheticPrompt(options.tokens, 13);
  const sim::PrefillCostModel cost{model->params, static_cast<double>(model->layers),
                                   static_cast<double>(model->hidden), options.gpu_tflops * 1e12};
  sim::GridEngine engine(cost, options.util, options.step_tokens, options.chunk_tokens, options.tokens,
                         options.time_scale);
  auto chunk_s = [&](double gbps) { return options.chunk_tokens * kv_bytes_per_token * 8 / (gbps * 1e9); };
  auto cap = [&](double gbps) {
    return absl::StrCat(sim::SimulatedCapGbps(gbps, kv_bytes_per_token, options.time_scale));
  };

  std::vector<Row> rows;
  for (double remote_gbps : options.remote_gbps) {
    CAKE_ASSIGN_OR_RETURN(auto root, FreshPath(options.dir, "cake-mixed"));
    absl::Cleanup remove_root = [&] { RemoveQuietly(root); };
    CAKE_ASSIGN_OR_RETURN(auto scratch, ScratchDir::Create("cake-bench-mixed"));
    // Promotion off (a queue of 0 bytes drops every promotion), so the placement holds across loads; caps with no
    // burst, so each tier serves one read after another, each taking size / bandwidth (the simulated device).
    const std::string config_path =
        scratch.WriteFile("caked.toml", "[dram]\npromotion_queue_bytes = 0\nread_burst_us = 0\n");
    CAKE_ASSIGN_OR_RETURN(
        auto target, OpenDaemon("", {"--config", config_path, "--disk-root", root.string(), "--remote", redis.address(),
                                     "--remote-key-prefix", absl::StrCat("mixed-", getpid(), "-", remote_gbps, ":"),
                                     "--dram-read-gbps", cap(options.dram_gbps), "--disk-read-gbps",
                                     cap(options.disk_gbps), "--remote-read-gbps", cap(remote_gbps),
                                     "--dram-capacity-mib", absl::StrCat(4 * (proxy_bytes >> 20) + 64)}));
    Client& client = *target.client;
    CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(proxy_bytes));
    absl::Cleanup release_region = [&] { client.ReleaseRegion(region).IgnoreError(); };
    auto store = [&](uint32_t count) -> absl::Status {
      for (uint32_t c = 0; c < count; ++c) FillChunkPattern({region.data() + c * chunk_bytes, chunk_bytes}, c);
      const std::vector<uint32_t> part(prompt.begin(), prompt.begin() + count * options.chunk_tokens);
      return client.Store(ns, TokensPrompt(part), 0, count, region, 0).status();
    };
    auto expect = [&](uint32_t in_dram, uint32_t on_disk, uint32_t in_remote) -> absl::Status {
      CAKE_ASSIGN_OR_RETURN(auto lookup, client.Lookup(ns, TokensPrompt(prompt)));
      uint32_t count[4] = {};
      for (TierKind t : lookup.tiers) count[static_cast<int>(t)]++;
      if (lookup.cached_chunks != chunks || count[1] != in_dram || count[2] != on_disk || count[3] != in_remote) {
        return absl::InternalError(absl::StrCat("placement: ", count[1], " chunks in DRAM, ", count[2], " on disk, ",
                                                count[3], " remote; expected ", in_dram, ", ", on_disk, ", ",
                                                in_remote));
      }
      return absl::OkStatus();
    };

    Row row;
    row.remote_gbps = remote_gbps;
    LoadOptions load;
    load.ns = ns;
    load.prompt = TokensPrompt(prompt);
    load.region = &region;
    auto measure = [&](Placement p) -> absl::Status {
      // Untimed first: the daemon measures each tier's speed, as earlier requests would have taught it.
      CAKE_RETURN_IF_ERROR(TimedIoOnlyLoad(client, load, chunks, chunk_bytes).status());
      CAKE_ASSIGN_OR_RETURN(auto io, TimedIoOnlyLoad(client, load, chunks, chunk_bytes));
      CAKE_ASSIGN_OR_RETURN(auto cake, sim::TimedCake(client, load, engine, options.tokens, options.chunk_tokens));
      row.io_s[p] = io * options.time_scale;
      row.cake_s[p] = cake.seconds * options.time_scale;
      row.meet_token[p] = cake.meeting_chunk * options.chunk_tokens;
      row.strategy[p] = cake.strategy;
      std::printf("  remote %g Gbps, %s: I/O-only %.3f s, Cake %.3f s (%s, meets at token %u), oracle %.3f s\n",
                  remote_gbps, kPlacementNames[p], row.io_s[p], row.cake_s[p], row.strategy[p].c_str(),
                  row.meet_token[p], row.oracle_s[p]);
      std::fflush(stdout);
      return absl::OkStatus();
    };
    const double tier_s[3] = {chunk_s(options.dram_gbps), chunk_s(options.disk_gbps), chunk_s(remote_gbps)};
    for (int p = kDramAlone; p <= kRemoteAlone; ++p) {
      row.oracle_s[p] = sim::OracleSeconds(engine, options.time_scale, chunks, options.chunk_tokens, tier_s[p]);
    }
    std::vector<int> chunk_tier(chunks);
    for (uint32_t c = 0; c < chunks; ++c) chunk_tier[c] = c < dram_chunks ? 0 : c < disk_end ? 1 : 2;
    row.oracle_s[kMixed] = MixedOracleSeconds(engine, options.time_scale, chunk_tier, {tier_s[0], tier_s[1], tier_s[2]},
                                              options.chunk_tokens);

    CAKE_RETURN_IF_ERROR(store(chunks));
    // Every chunk written back to disk and to Redis.
    CAKE_RETURN_IF_ERROR(WaitForCounter(client, "write_back_written", 2 * chunks, std::chrono::seconds(60)));
    CAKE_RETURN_IF_ERROR(expect(chunks, 0, 0));
    CAKE_RETURN_IF_ERROR(measure(kDramAlone));
    CAKE_RETURN_IF_ERROR(client.Evict(TierKind::kDram).status());
    CAKE_RETURN_IF_ERROR(expect(0, chunks, 0));
    CAKE_RETURN_IF_ERROR(measure(kDiskAlone));
    CAKE_RETURN_IF_ERROR(client.Evict(TierKind::kDisk).status());
    CAKE_RETURN_IF_ERROR(expect(0, 0, chunks));
    CAKE_RETURN_IF_ERROR(measure(kRemoteAlone));
    // The mixed placement.
    if (disk_end > 0) {
      CAKE_RETURN_IF_ERROR(store(disk_end));
      CAKE_RETURN_IF_ERROR(WaitForCounter(client, "tier_disk_chunks", disk_end, std::chrono::seconds(60)));
      CAKE_RETURN_IF_ERROR(client.Evict(TierKind::kDram).status());
    }
    if (dram_chunks > 0) {
      CAKE_RETURN_IF_ERROR(store(dram_chunks));
    }
    CAKE_RETURN_IF_ERROR(expect(dram_chunks, disk_end - dram_chunks, chunks - disk_end));
    CAKE_RETURN_IF_ERROR(measure(kMixed));
    CAKE_ASSIGN_OR_RETURN(auto computed, sim::TimedComputeOnly(engine, options.tokens));
    row.compute_s = computed * options.time_scale;
    client.Evict(TierKind::kRemote).IgnoreError();
    rows.push_back(row);
  }

  std::printf(
      "cake-bench mixed: %s, %u tokens, util %g, F = %g TFLOP/s, time scale %g; tiers capped at DRAM %g, disk %g "
      "Gbit/s and remote as listed; mixed: first %u chunks in DRAM, next %u on disk, last %u in Redis (of %u)\n\n",
      model->name, options.tokens, options.util, options.gpu_tflops, options.time_scale, options.dram_gbps,
      options.disk_gbps, dram_chunks, disk_end - dram_chunks, chunks - disk_end, chunks);
  std::printf("| remote Gbps | placement | I/O-only (s) | Cake (s) | oracle (s) | meeting token |\n");
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  JsonReport report;
  std::vector<std::string> json_rows;
  double worst_mixed_over_best_single = 0;  // against Redis, the one tier holding the whole prefix
  for (const Row& r : rows) {
    for (int p = 0; p < kPlacements; ++p) {
      std::printf("| %g | %s | %.3f | %.3f | %.3f | %u |\n", r.remote_gbps, kPlacementNames[p], r.io_s[p], r.cake_s[p],
                  r.oracle_s[p], r.meet_token[p]);
    }
    // In the mixed placement only Redis holds the whole prefix: its split with compute is the alternative to reading
    // all three tiers at once. The other single-tier rows are what the prefix would give had it all been there.
    const double holder_oracle = r.oracle_s[kRemoteAlone];
    const double best_single_oracle = std::min({r.oracle_s[0], r.oracle_s[1], r.oracle_s[2]});
    std::printf(
        "|   | compute-only %.3f s; mixed Cake / the whole-prefix holder's (Redis) best split %.3f; / the best "
        "split of any tier holding it all %.3f | | | | |\n",
        r.compute_s, r.cake_s[kMixed] / holder_oracle, r.cake_s[kMixed] / best_single_oracle);
    worst_mixed_over_best_single = std::max(worst_mixed_over_best_single, r.cake_s[kMixed] / holder_oracle);
    JsonReport row;
    row.Set("remote_gbps", r.remote_gbps);
    row.Set("ttft_compute_s", r.compute_s);
    for (int p = 0; p < kPlacements; ++p) {
      row.Set(absl::StrCat("ttft_io_", kPlacementNames[p], "_s"), r.io_s[p]);
      row.Set(absl::StrCat("ttft_cake_", kPlacementNames[p], "_s"), r.cake_s[p]);
      row.Set(absl::StrCat("ttft_oracle_", kPlacementNames[p], "_s"), r.oracle_s[p]);
      row.Set(absl::StrCat("meet_token_", kPlacementNames[p]), r.meet_token[p]);
    }
    row.Set("mixed_over_remote_oracle", r.cake_s[kMixed] / holder_oracle);
    row.Set("mixed_over_best_single_oracle", r.cake_s[kMixed] / best_single_oracle);
    json_rows.push_back(row.ToString());
  }
  std::printf("\n  worst: mixed Cake / Redis's best split = %.3f (goal < 1)\n", worst_mixed_over_best_single);
  report.Set("model", model->name);
  report.Set("tokens", options.tokens);
  report.Set("util", options.util);
  report.Set("dram_gbps", options.dram_gbps);
  report.Set("disk_gbps", options.disk_gbps);
  report.Set("worst_mixed_over_remote_oracle", worst_mixed_over_best_single);
  report.SetRaw("rows", "[" + absl::StrJoin(json_rows, ",") + "]");
  return report.WriteTo(options.json_path);
}

void AddMixedCommand(CLI::App& app) {
  auto options = std::make_shared<MixedOptions>();
  CLI::App* command = app.add_subcommand(
      "mixed", "Cake with a prefix spread over DRAM, disk and Redis at once, against each tier alone");
  command->add_option("--dir", options->dir, "folder for the disk tier")->required();
  command->add_option("--json", options->json_path, "also write the results to this file as one JSON object");
  command->add_option("--model", options->model, "llama3.1-8b, llama3.1-70b, longalpaca-7b, longalpaca-13b")
      ->capture_default_str();
  command->add_option("--tokens", options->tokens, "prompt length")->capture_default_str();
  command->add_option("--util", options->util, "the request's share of each step's budget")->capture_default_str();
  command->add_option("--gpu-tflops", options->gpu_tflops, "effective prefill TFLOP/s")->capture_default_str();
  command->add_option("--dram-gbps", options->dram_gbps, "modelled DRAM-tier bandwidth")->capture_default_str();
  command->add_option("--disk-gbps", options->disk_gbps, "modelled disk-tier bandwidth")->capture_default_str();
  command->add_option("--remote-gbps", options->remote_gbps, "modelled remote-tier bandwidths, one row each")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--dram-share", options->dram_share, "share of the prefix (its start) in DRAM")
      ->capture_default_str();
  command->add_option("--disk-share", options->disk_share, "share of the prefix (next) on disk")->capture_default_str();
  command->add_option("--time-scale", options->time_scale, "every duration divided by this")->capture_default_str();
  RunWhenParsed(command, options, RunMixedBench);
}

}  // namespace cake::bench
