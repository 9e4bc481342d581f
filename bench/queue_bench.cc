// cake-bench queue: requests arrive faster than one engine serves them, each with its whole prompt cached on disk
// only (or, with --tier remote, in a private redis-server only); the engine serves them one at a time (a Cake load of
// the prompt, then its decode), so requests wait in its queue. With prefetch, each request's Lookup asks the daemon to
// copy its prompt into DRAM when it arrives (LookupRequest.prefetch); without, the load reads it from disk when its
// turn comes. The same arrivals run both ways, alternating, in one run; TTFT counts from arrival to the whole prompt's
// KV (queueing included).
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "bench/bench_command.h"
#include "bench/bench_common.h"
#include "bench/benchmarks.h"
#include "examples/simulated_engine/simulated_storage.h"
#include "testing/redis_process.h"

namespace cake::bench {
namespace {

constexpr uint32_t kChunkTokens = 256;

struct Request {
  uint32_t prompt = 0;
  Clock::time_point arrival;
};

struct Served {
  std::vector<double> ttft_ms;
  uint64_t chunks_loaded = 0;
  uint64_t chunks_from_dram = 0;  // as planned: copied by a prefetch, or being copied
};

// One engine serving `requests` in arrival order: for each, a Cake load whose computed chunks cost
// `compute_per_chunk` each, then `decode` of busy time during which it loads nothing.
absl::StatusOr<Served> ServeQueue(Client& client, const NamespaceSpec& ns,
                                  const std::vector<std::vector<uint32_t>>& prompts, const MappedRegion& region,
                                  const std::vector<Clock::duration>& arrivals, bool prefetch,
                                  std::chrono::microseconds compute_per_chunk, std::chrono::milliseconds decode) {
  std::mutex mu;
  std::condition_variable arrived;
  std::deque<Request> queue;
  absl::Status arrival_error;
  const Clock::time_point start = Clock::now();
  // The arrivals: each request joins the queue at its time and, with prefetch, says so to the daemon.
  std::thread arrivals_thread([&] {
    for (uint32_t i = 0; i < arrivals.size(); ++i) {
      std::this_thread::sleep_until(start + arrivals[i]);
      const Clock::time_point now = Clock::now();
      {
        std::lock_guard lock(mu);
        queue.push_back(Request{i, now});
      }
      arrived.notify_all();
      if (prefetch) {
        auto looked = client.Lookup(ns, TokensPrompt(prompts[i]), {.prefetch = true});
        if (!looked.ok()) {
          std::lock_guard lock(mu);
          arrival_error = looked.status();
        }
      }
    }
  });
  absl::Cleanup join = [&] { arrivals_thread.join(); };
  Served served;
  for (uint32_t served_count = 0; served_count < arrivals.size(); ++served_count) {
    Request request;
    {
      std::unique_lock lock(mu);
      arrived.wait(lock, [&] { return !queue.empty(); });
      request = queue.front();
      queue.pop_front();
    }
    LoadOptions options;
    options.ns = ns;
    options.prompt = TokensPrompt(prompts[request.prompt]);
    options.region = &region;
    options.compute_first_chunk_s = std::chrono::duration<double>(compute_per_chunk).count();
    CAKE_ASSIGN_OR_RETURN(auto session, client.StartLoad(options));
    CAKE_ASSIGN_OR_RETURN(const LoadPlan plan, session->WaitPlan());
    for (TierKind t : plan.tiers) served.chunks_from_dram += t == TierKind::kDram;
    uint32_t computed = 0;
    for (;;) {
      auto step = session->NextStep(computed);
      if (!step.ok() || step->action == FrontStep::Action::kStop) break;
      if (step->action == FrontStep::Action::kWait) {
        session->WaitResidentUntil(computed, step->until);
        continue;
      }
      std::this_thread::sleep_for(compute_per_chunk);
      ++computed;
      if (!session->ReportProgress(computed).ok()) break;
    }
    CAKE_ASSIGN_OR_RETURN(const LoadDone done, session->WaitDone());
    if (computed < done.meeting_chunk) std::this_thread::sleep_for(compute_per_chunk * (done.meeting_chunk - computed));
    for (uint32_t c = done.meeting_chunk; c < plan.cached_chunks; ++c) {
      CAKE_RETURN_IF_ERROR(
          CheckChunkPattern({region.data() + session->RegionOffset(c), plan.chunk_bytes}, request.prompt * 4096 + c));
    }
    served.ttft_ms.push_back(1e3 * std::chrono::duration<double>(Clock::now() - request.arrival).count());
    served.chunks_loaded += done.loaded_chunks;
    CAKE_RETURN_IF_ERROR(session->Release());
    std::this_thread::sleep_for(decode);  // the request's decode: the engine is busy, the disk is not
  }
  std::move(join).Invoke();
  if (!arrival_error.ok()) return arrival_error;
  return served;
}

}  // namespace

absl::Status RunQueueBench(const QueueBenchOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("--dir is required (the disk tier's folder)");
  if (options.requests == 0 || options.prompt_mib == 0 || options.rounds == 0) {
    return absl::InvalidArgumentError("need --requests, --prompt-mib and --rounds above 0");
  }
  CAKE_ASSIGN_OR_RETURN(auto root, FreshPath(options.dir, "cake-queue"));
  absl::Cleanup remove_root = [&] { RemoveQuietly(root); };
  const NamespaceSpec ns = sim::ProxyNamespace("queue", kChunkTokens);  // 256 KiB chunks
  const uint64_t chunk_bytes = static_cast<uint64_t>(kChunkTokens * sim::kProxyBytesPerToken);
  const uint32_t chunks = static_cast<uint32_t>((options.prompt_mib << 20) / chunk_bytes);
  const uint64_t prompt_bytes = uint64_t{chunks} * chunk_bytes;
  const uint64_t all_bytes = prompt_bytes * options.requests;
  // DRAM for every prompt at once (the prefetches of a full queue, the loads' promotions), and a prefetch budget
  // as large: the bench measures prefetch, not its budget.
  const std::string config_path = (root / "caked.toml").string();
  std::filesystem::create_directories(root);
  {
    FILE* f = std::fopen(config_path.c_str(), "w");
    if (f == nullptr) return absl::InternalError(absl::StrCat("cannot write ", config_path));
    std::fprintf(f, "[prefetch]\nmax_bytes = %llu\n", static_cast<unsigned long long>(all_bytes));
    std::fclose(f);
  }
  const bool remote = options.tier == "remote";
  std::optional<RedisServer> redis;
  std::vector<std::string> args = {"--config", config_path, "--dram-capacity-mib",
                                   absl::StrCat(2 * (all_bytes >> 20) + 256)};
  if (remote) {
    if (!OnPath("redis-server")) return absl::FailedPreconditionError("--tier remote needs redis-server on PATH");
    CAKE_ASSIGN_OR_RETURN(auto started, RedisServer::Start());
    redis.emplace(std::move(started));
    args.insert(args.end(), {"--remote", redis->address()});
  } else {
    args.insert(args.end(), {"--disk-root", (root / "disk").string(), "--disk-capacity-mib",
                             absl::StrCat(2 * (all_bytes >> 20) + 256)});
    if (options.disk_gbps > 0) args.insert(args.end(), {"--disk-read-gbps", absl::StrCat(options.disk_gbps)});
  }
  CAKE_ASSIGN_OR_RETURN(auto target, OpenDaemon("", args));
  Client& client = *target.client;
  CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(prompt_bytes));
  absl::Cleanup release_region = [&] { client.ReleaseRegion(region).IgnoreError(); };

  // The prompts, stored and written back to the slower tier.
  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t p = 0; p < options.requests; ++p) {
    prompts.push_back(SyntheticPrompt(uint64_t{chunks} * kChunkTokens, 1000 + p));
    for (uint32_t c = 0; c < chunks; ++c) {
      FillChunkPattern({region.data() + c * chunk_bytes, chunk_bytes}, p * 4096 + c);
    }
    CAKE_RETURN_IF_ERROR(client.Store(ns, TokensPrompt(prompts.back()), 0, chunks, region, 0).status());
  }
  CAKE_RETURN_IF_ERROR(WaitForCounter(client, remote ? "write_back_written" : "tier_disk_chunks",
                                      uint64_t{chunks} * options.requests, std::chrono::seconds(300)));

  // Poisson arrivals at the given mean gap, the same for every round and mode.
  std::mt19937_64 rng(options.seed);
  std::exponential_distribution<double> gap(1.0 / options.arrival_ms);
  std::vector<Clock::duration> arrivals;
  double at_ms = 0;
  for (uint32_t i = 0; i < options.requests; ++i) {
    arrivals.push_back(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(at_ms)));
    at_ms += gap(rng);
  }

  std::vector<double> without_ms, with_ms;
  uint64_t from_dram_without = 0, from_dram_with = 0, loaded_without = 0, loaded_with = 0;
  for (uint32_t round = 0; round < options.rounds; ++round) {
    for (const bool prefetch : {false, true}) {
      // Every round starts with the prompts on the slower tier only.
      CAKE_RETURN_IF_ERROR(client.Evict(TierKind::kDram).status());
      CAKE_ASSIGN_OR_RETURN(const Served served, ServeQueue(client, ns, prompts, region, arrivals, prefetch,
                                                            std::chrono::microseconds(options.compute_us_per_chunk),
                                                            std::chrono::milliseconds(options.decode_ms)));
      auto& ttft = prefetch ? with_ms : without_ms;
      ttft.insert(ttft.end(), served.ttft_ms.begin(), served.ttft_ms.end());
      (prefetch ? from_dram_with : from_dram_without) += served.chunks_from_dram;
      (prefetch ? loaded_with : loaded_without) += served.chunks_loaded;
      std::printf("  round %u %s prefetch: TTFT mean %.1f ms, p99 %.1f ms; %llu chunks planned from DRAM\n", round + 1,
                  prefetch ? "with" : "without", Mean(served.ttft_ms), Percentile(served.ttft_ms, 99),
                  static_cast<unsigned long long>(served.chunks_from_dram));
      std::fflush(stdout);
    }
  }
  CAKE_ASSIGN_OR_RETURN(auto stats, client.Stats());
  auto counter = [&](const char* name) { return stats.contains(name) ? stats.at(name) : uint64_t{0}; };
  std::printf(
      "cake-bench queue: %u requests (mean gap %g ms) on one engine (%u us a computed chunk, %u ms of decode each), "
      "prompts of %u chunks of %llu KiB (%llu MiB) on %s only%s, %u rounds alternating\n",
      options.requests, options.arrival_ms, options.compute_us_per_chunk, options.decode_ms, chunks,
      static_cast<unsigned long long>(chunk_bytes >> 10), static_cast<unsigned long long>(prompt_bytes >> 20),
      remote ? "Redis" : "disk",
      !remote && options.disk_gbps > 0 ? absl::StrCat(" (reads capped at ", options.disk_gbps, " Gbit/s)").c_str() : "",
      options.rounds);
  std::printf("  without prefetch: TTFT mean %.1f ms, p50 %.1f, p99 %.1f\n", Mean(without_ms),
              Percentile(without_ms, 50), Percentile(without_ms, 99));
  std::printf("  with prefetch:    TTFT mean %.1f ms, p50 %.1f, p99 %.1f (%.2fx the mean without)\n", Mean(with_ms),
              Percentile(with_ms, 50), Percentile(with_ms, 99), Mean(with_ms) / Mean(without_ms));
  std::printf("  daemon: %llu prefetched chunks copied, %llu used, %llu wasted, %llu dropped (a load came first)\n",
              static_cast<unsigned long long>(counter("prefetch_chunks_copied")),
              static_cast<unsigned long long>(counter("prefetch_chunks_used")),
              static_cast<unsigned long long>(counter("prefetch_chunks_wasted")),
              static_cast<unsigned long long>(counter("prefetch_chunks_dropped")));
  JsonReport report;
  report.Set("tier", options.tier);
  report.Set("requests", options.requests);
  report.Set("arrival_ms", options.arrival_ms);
  report.Set("prompt_mib", static_cast<double>(options.prompt_mib));
  report.Set("rounds", options.rounds);
  report.Set("ttft_mean_ms_without", Mean(without_ms));
  report.Set("ttft_p99_ms_without", Percentile(without_ms, 99));
  report.Set("ttft_mean_ms_with", Mean(with_ms));
  report.Set("ttft_p99_ms_with", Percentile(with_ms, 99));
  report.Set("ttft_mean_with_over_without", Mean(with_ms) / Mean(without_ms));
  report.Set("chunks_planned_from_dram_without", static_cast<double>(from_dram_without));
  report.Set("chunks_planned_from_dram_with", static_cast<double>(from_dram_with));
  report.Set("chunks_loaded_without", static_cast<double>(loaded_without));
  report.Set("chunks_loaded_with", static_cast<double>(loaded_with));
  report.Set("prefetch_chunks_used", static_cast<double>(counter("prefetch_chunks_used")));
  return report.WriteTo(options.json_path);
}

void AddQueueCommand(CLI::App& app) {
  auto options = std::make_shared<QueueBenchOptions>();
  CLI::App* command = app.add_subcommand(
      "queue", "requests queued before one engine, prompts on disk only: TTFT with and without prefetch");
  command->add_option("--dir", options->dir, "folder for the disk tier")->required();
  command->add_option("--json", options->json_path, "also write the results to this file as one JSON object");
  command->add_option("--requests", options->requests, "requests per round and mode")->capture_default_str();
  command->add_option("--prompt-mib", options->prompt_mib, "each request's prompt, MiB of KV")->capture_default_str();
  command->add_option("--arrival-ms", options->arrival_ms, "mean gap between arrivals, ms")->capture_default_str();
  command->add_option("--compute-us", options->compute_us_per_chunk, "the engine's time per computed chunk, us")
      ->capture_default_str();
  command->add_option("--decode-ms", options->decode_ms, "the engine's time per request after its prefill, ms")
      ->capture_default_str();
  command->add_option("--tier", options->tier, "where the prompts are cached: disk, or remote (a private redis-server)")
      ->capture_default_str()
      ->check(CLI::IsMember({"disk", "remote"}));
  command->add_option("--disk-gbps", options->disk_gbps, "cap the disk tier's reads, Gbit/s (0: none)")
      ->capture_default_str();
  command->add_option("--rounds", options->rounds, "rounds of each mode, alternating")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100u));
  command->add_option("--seed", options->seed, "arrival times")->capture_default_str();
  RunWhenParsed(command, options, RunQueueBench);
}

}  // namespace cake::bench
