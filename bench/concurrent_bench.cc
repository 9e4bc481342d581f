// cake-bench concurrent: many cached requests arrive at once and load from one (simulated) disk; mean and p99
// time to first token under each arbiter policy (caked --arbiter). The disk is the DRAM tier behind a burst-free
// read cap, as in `grid`, with stand-in bytes of 1 KiB per token scaled to the model's KV size.
#include <algorithm>
#include <barrier>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "bench/bench_command.h"
#include "bench/bench_common.h"
#include "bench/benchmarks.h"
#include "examples/simulated_engine/models.h"
#include "examples/simulated_engine/simulated_storage.h"

namespace cake::bench {
namespace {

constexpr uint32_t kChunkTokens = 128;

struct PolicyResult {
  std::string policy;
  double mean_s = 0, p50_s = 0, p99_s = 0, makespan_s = 0;
};

}  // namespace

absl::Status RunConcurrentBench(const ConcurrentOptions& options) {
  if (!options.common.socket_path.empty()) {
    return absl::InvalidArgumentError("concurrent starts one daemon per policy: leave out --socket");
  }
  const sim::ModelSpec* model = sim::FindModel(options.model);
  if (model == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown --model ", options.model));
  if (options.requests == 0 || options.min_tokens < kChunkTokens || options.max_tokens < options.min_tokens) {
    return absl::InvalidArgumentError("need --requests > 0 and 128 <= --min-tokens <= --max-tokens");
  }
  if (options.bandwidth_gbps <= 0 || options.time_scale <= 0) {
    return absl::InvalidArgumentError("--bandwidth and --time-scale must be positive");
  }
  // Prompt lengths drawn once, the same for every policy: whole chunks between the bounds.
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> chunks_of(options.min_tokens / kChunkTokens,
                                                    options.max_tokens / kChunkTokens);
  std::vector<uint32_t> chunks(options.requests);
  for (uint32_t& c : chunks) c = chunks_of(rng);
  std::vector<uint64_t> offsets(options.requests);
  uint64_t region_bytes = 0;
  const uint64_t chunk_bytes = static_cast<uint64_t>(kChunkTokens * sim::kProxyBytesPerToken);
  for (uint32_t i = 0; i < options.requests; ++i) {
    offsets[i] = region_bytes;
    region_bytes += chunks[i] * chunk_bytes;
  }
  const NamespaceSpec ns = sim::ProxyNamespace(absl::StrCat("concurrent-", model->name), kChunkTokens);

  std::vector<PolicyResult> results;
  for (const std::string& policy : options.policies) {
    std::vector<std::string> args =
        sim::SimulatedDiskArgs(options.bandwidth_gbps, sim::KvBytesPerToken(*model), options.time_scale, region_bytes);
    args.insert(args.end(), {"--arbiter", policy, "--window", absl::StrCat(options.window)});
    CAKE_ASSIGN_OR_RETURN(auto target, OpenDaemon("", args));
    Client& client = *target.client;
    CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(region_bytes));
    absl::Cleanup release_region = [&] { client.ReleaseRegion(region).IgnoreError(); };
    std::vector<std::vector<uint32_t>> prompts(options.requests);
    for (uint32_t i = 0; i < options.requests; ++i) {
      prompts[i] = SyntheticPrompt(chunks[i] * kChunkTokens, 100 + i);
      for (uint32_t c = 0; c < chunks[i]; ++c) {
        FillChunkPattern({region.data() + offsets[i] + c * chunk_bytes, chunk_bytes}, c);
      }
      CAKE_RETURN_IF_ERROR(client.Store(ns, TokensPrompt(prompts[i]), 0, chunks[i], region, offsets[i]).status());
    }
    std::memset(region.data(), 0, region_bytes);

    // Every request starts at once; each one's time to first token is its load's Done.
    std::vector<double> ttft(options.requests, 0);
    std::mutex error_mu;
    absl::Status error;
    std::barrier start_line(static_cast<std::ptrdiff_t>(options.requests) + 1);
    Clock::time_point start;
    std::vector<std::thread> engines;
    for (uint32_t i = 0; i < options.requests; ++i) {
      engines.emplace_back([&, i] {
        LoadOptions load;
        load.ns = ns;
        load.prompt = TokensPrompt(prompts[i]);
        load.region = &region;
        load.region_offset = offsets[i];
        load.region_bytes = chunks[i] * chunk_bytes;
        load.io_only = true;
        start_line.arrive_and_wait();
        auto session = client.StartLoad(load);
        absl::Status s = session.status();
        if (s.ok()) {
          auto done = (*session)->WaitDone();
          ttft[i] = SecondsSince(start) * options.time_scale;
          s = done.status();
          if (s.ok() && done->loaded_chunks != chunks[i]) s = absl::InternalError("a load came back incomplete");
          if (s.ok()) s = (*session)->Release();
        }
        if (!s.ok()) {
          std::lock_guard lock(error_mu);
          if (error.ok()) error = s;
        }
      });
    }
    start = Clock::now();
    start_line.arrive_and_wait();
    for (std::thread& t : engines) t.join();
    if (!error.ok()) return error;
    for (uint32_t i = 0; i < options.requests; ++i) {
      for (uint32_t c = 0; c < chunks[i]; ++c) {
        CAKE_RETURN_IF_ERROR(CheckChunkPattern({region.data() + offsets[i] + c * chunk_bytes, chunk_bytes}, c));
      }
    }
    PolicyResult r;
    r.policy = policy;
    double sum = 0;
    for (double t : ttft) sum += t;
    r.mean_s = sum / options.requests;
    r.p50_s = Median(ttft);
    r.p99_s = Percentile(ttft, 99);
    r.makespan_s = Max(ttft);
    std::printf("  %-5s mean %.3f s, p50 %.3f s, p99 %.3f s, last %.3f s\n", policy.c_str(), r.mean_s, r.p50_s, r.p99_s,
                r.makespan_s);
    std::fflush(stdout);
    results.push_back(r);
  }

  uint64_t total_tokens = 0;
  for (uint32_t c : chunks) total_tokens += uint64_t{c} * kChunkTokens;
  std::printf(
      "cake-bench concurrent: %u I/O-only requests of %u to %u tokens (%llu in all, %s KV) at once on one %g Gbit/s "
      "disk, time scale %g, window %u\n",
      options.requests, options.min_tokens, options.max_tokens, static_cast<unsigned long long>(total_tokens),
      model->name, options.bandwidth_gbps, options.time_scale, options.window);
  std::printf("  %-8s %10s %10s %10s %10s\n", "policy", "mean s", "p50 s", "p99 s", "last s");
  for (const PolicyResult& r : results) {
    std::printf("  %-8s %10.3f %10.3f %10.3f %10.3f\n", r.policy.c_str(), r.mean_s, r.p50_s, r.p99_s, r.makespan_s);
  }
  JsonReport report;
  report.Set("requests", options.requests);
  report.Set("bandwidth_gbps", options.bandwidth_gbps);
  report.Set("time_scale", options.time_scale);
  report.Set("total_tokens", static_cast<double>(total_tokens));
  for (const PolicyResult& r : results) {
    report.Set(r.policy + "_mean_s", r.mean_s);
    report.Set(r.policy + "_p50_s", r.p50_s);
    report.Set(r.policy + "_p99_s", r.p99_s);
    report.Set(r.policy + "_last_s", r.makespan_s);
  }
  return report.WriteTo(options.common.json_path);
}

void AddConcurrentCommand(CLI::App& app) {
  auto options = std::make_shared<ConcurrentOptions>();
  CLI::App* command = app.add_subcommand(
      "concurrent", "many cached requests at once on one simulated disk: mean and p99 TTFT per arbiter policy");
  AddCommonOptions(command, options->common);
  command->add_option("--policies", options->policies, "arbiter policies to compare (srf, fifo, fair)")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--requests", options->requests, "requests arriving at once")
      ->capture_default_str()
      ->check(CLI::Range(1u, 256u));
  command->add_option("--min-tokens", options->min_tokens, "shortest prompt")->capture_default_str();
  command->add_option("--max-tokens", options->max_tokens, "longest prompt")->capture_default_str();
  command->add_option("--model", options->model, "KV size per token of this model")->capture_default_str();
  command->add_option("--bandwidth", options->bandwidth_gbps, "the disk's Gbit/s")->capture_default_str();
  command->add_option("--time-scale", options->time_scale, "divide every duration by this")->capture_default_str();
  command->add_option("--window", options->window, "caked --window")->capture_default_str()->check(CLI::Range(1u, 64u));
  RunWhenParsed(command, options, RunConcurrentBench);
}

}  // namespace cake::bench
