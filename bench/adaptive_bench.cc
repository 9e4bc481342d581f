// cake-bench adaptive: the paper's scheduling example. One long cached request (served by a Cake load) arrives
// with a burst of short uncached ones; the engine has a token budget per step. In the default order (first come,
// first served, as vLLM's chunked prefill) the cached request takes the budget until it meets its loads; in the
// adaptive order (the Cake paper's: decodes, then prefills without a cached prefix, then the Cake request with what is
// left) the short ones go first while the cached request's loads keep going. Reports every request's time to
// first token under both orders.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "bench/bench_command.h"
#include "bench/bench_common.h"
#include "bench/benchmarks.h"
#include "examples/simulated_engine/models.h"
#include "examples/simulated_engine/simulated_storage.h"

namespace cake::bench {
namespace {

constexpr uint32_t kChunkTokens = 128;

struct OrderResult {
  double cached_ttft_s = 0;
  double last_ttft_s = 0;
  double mean_short_ttft_s = 0;
  uint32_t meet_token = 0;
};

}  // namespace

absl::Status RunAdaptiveBench(const AdaptiveOptions& options) {
  if (!options.common.socket_path.empty()) {
    return absl::InvalidArgumentError("adaptive starts its own daemon: leave out --socket");
  }
  const sim::ModelSpec* model = sim::FindModel(options.model);
  if (model == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown --model ", options.model));
  if (options.cached_tokens == 0 || options.cached_tokens % kChunkTokens != 0) {
    return absl::InvalidArgumentError("--cached-tokens must be a positive multiple of 128");
  }
  if (options.time_scale <= 0 || options.gpu_tflops <= 0 || options.bandwidth_gbps <= 0) {
    return absl::InvalidArgumentError("--time-scale, --gpu-tflops and --bandwidth must be positive");
  }
  const sim::PrefillCostModel cost{model->params, static_cast<double>(model->layers),
                                   static_cast<double>(model->hidden), options.gpu_tflops * 1e12};
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> short_len(32, 448);
  std::vector<uint32_t> shorts(options.short_requests);
  for (uint32_t& s : shorts) s = short_len(rng);

  const uint32_t chunks = options.cached_tokens / kChunkTokens;
  const uint64_t chunk_bytes = static_cast<uint64_t>(kChunkTokens * sim::kProxyBytesPerToken);
  const uint64_t bytes = uint64_t{chunks} * chunk_bytes;
  const NamespaceSpec ns = sim::ProxyNamespace(absl::StrCat("adaptive-", model->name), kChunkTokens);
  CAKE_ASSIGN_OR_RETURN(auto target,
                        OpenDaemon("", sim::SimulatedDiskArgs(options.bandwidth_gbps, sim::KvBytesPerToken(*model),
                                                              options.time_scale, bytes)));
  Client& client = *target.client;
  CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(bytes));
  absl::Cleanup release_region = [&] { client.ReleaseRegion(region).IgnoreError(); };
  const std::vector<uint32_t> prompt = SyntheticPrompt(options.cached_tokens, 41);
  for (uint32_t c = 0; c < chunks; ++c) FillChunkPattern({region.data() + c * chunk_bytes, chunk_bytes}, c);
  CAKE_RETURN_IF_ERROR(client.Store(ns, TokensPrompt(prompt), 0, chunks, region, 0).status());

  // One run of the engine in the given order; the cached request loads through the daemon all along.
  auto run = [&](bool adaptive) -> absl::StatusOr<OrderResult> {
    std::memset(region.data(), 0, bytes);
    LoadOptions load;
    load.ns = ns;
    load.prompt = TokensPrompt(prompt);
    load.region = &region;
    const Clock::time_point start = Clock::now();
    CAKE_ASSIGN_OR_RETURN(auto started, client.StartLoad(load));
    LoadSession& session = *started;
    absl::Cleanup release = [&] { session.Release().IgnoreError(); };
    std::vector<uint32_t> short_done(shorts.size(), 0);
    std::vector<double> short_ttft(shorts.size(), 0);
    uint32_t cached_done = 0;  // tokens of the cached request computed
    bool cached_finished = false;
    double cached_ttft = 0;
    Clock::time_point gpu_free = start;
    size_t shorts_left = shorts.size();
    while (shorts_left > 0 || !cached_finished) {
      // The cached request is finished once its next chunk is loaded (all above it are too).
      if (!cached_finished && cached_done % kChunkTokens == 0 && session.IsResident(cached_done / kChunkTokens)) {
        cached_finished = true;
        cached_ttft = SecondsSince(start);
        continue;
      }
      // Fill one step's budget in this order's priority; the step costs what its tokens cost.
      uint32_t budget = options.step_tokens;
      double step_s = 0;
      auto run_cached = [&] {
        if (cached_finished || budget == 0) return;
        const uint32_t boundary = (cached_done / kChunkTokens + 1) * kChunkTokens;
        uint32_t n = std::min(budget, options.cached_tokens - cached_done);
        // Stop at a chunk boundary whose chunk is already loaded: nothing past it needs computing.
        if (cached_done + n > boundary && boundary < options.cached_tokens &&
            session.IsResident(boundary / kChunkTokens)) {
          n = boundary - cached_done;
        }
        step_s += (cost.Flop(cached_done + n) - cost.Flop(cached_done)) / cost.flops;
        cached_done += n;
        budget -= n;
      };
      auto run_shorts = [&] {
        for (size_t i = 0; i < shorts.size() && budget > 0; ++i) {
          if (short_done[i] == shorts[i]) continue;
          const uint32_t n = std::min(budget, shorts[i] - short_done[i]);
          step_s += (cost.Flop(short_done[i] + n) - cost.Flop(short_done[i])) / cost.flops;
          short_done[i] += n;
          budget -= n;
        }
      };
      if (adaptive) {
        run_shorts();
        run_cached();
      } else {
        run_cached();  // it came first
        run_shorts();
      }
      gpu_free +=
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(step_s / options.time_scale));
      PreciseSleepUntil(gpu_free);
      for (size_t i = 0; i < shorts.size(); ++i) {
        if (short_done[i] == shorts[i] && short_ttft[i] == 0) {
          short_ttft[i] = SecondsSince(start);
          --shorts_left;
        }
      }
      if (!cached_finished) {
        CAKE_RETURN_IF_ERROR(session.ReportProgress(cached_done / kChunkTokens));
        if (cached_done == options.cached_tokens) {
          cached_finished = true;
          cached_ttft = SecondsSince(start);
        }
      }
      if (step_s == 0 && !cached_finished) {
        // Nothing to compute this step (the budget went elsewhere or the request waits on a chunk): wait briefly.
        session.WaitResidentUntil(cached_done / kChunkTokens, Clock::now() + std::chrono::microseconds(200));
      }
    }
    CAKE_ASSIGN_OR_RETURN(auto done, session.WaitDone());
    for (uint32_t c = done.meeting_chunk; c < chunks; ++c) {
      CAKE_RETURN_IF_ERROR(CheckChunkPattern({region.data() + session.RegionOffset(c), chunk_bytes}, c));
    }
    std::move(release).Cancel();
    CAKE_RETURN_IF_ERROR(session.Release());
    OrderResult r;
    r.cached_ttft_s = cached_ttft * options.time_scale;
    double sum = 0, last = cached_ttft;
    for (double t : short_ttft) {
      sum += t;
      last = std::max(last, t);
    }
    r.mean_short_ttft_s = shorts.empty() ? 0 : sum / shorts.size() * options.time_scale;
    r.last_ttft_s = last * options.time_scale;
    r.meet_token = done.meeting_chunk * kChunkTokens;
    return r;
  };

  // Untimed first: the daemon measures the disk's speed.
  CAKE_RETURN_IF_ERROR(run(false).status());
  CAKE_ASSIGN_OR_RETURN(auto fcfs, run(false));
  CAKE_ASSIGN_OR_RETURN(auto adaptive, run(true));

  uint32_t short_tokens = 0;
  for (uint32_t s : shorts) short_tokens += s;
  std::printf(
      "cake-bench adaptive: %s, one cached request of %u tokens (Cake load at %g Gbit/s) and %u uncached ones of 32 "
      "to 448 tokens (%u in all), step budget %u tokens, F = %g TFLOP/s, time scale %g\n",
      model->name, options.cached_tokens, options.bandwidth_gbps, options.short_requests, short_tokens,
      options.step_tokens, options.gpu_tflops, options.time_scale);
  std::printf("  %-30s %14s %16s %16s %12s\n", "order", "everything (s)", "cached TTFT (s)", "short mean (s)",
              "meet token");
  std::printf("  %-30s %14.3f %16.3f %16.3f %12u\n", "first come, first served", fcfs.last_ttft_s, fcfs.cached_ttft_s,
              fcfs.mean_short_ttft_s, fcfs.meet_token);
  std::printf("  %-30s %14.3f %16.3f %16.3f %12u\n", "adaptive (uncached first)", adaptive.last_ttft_s,
              adaptive.cached_ttft_s, adaptive.mean_short_ttft_s, adaptive.meet_token);
  std::printf("  adaptive finishes everything %.0f%% sooner\n", 100 * (1 - adaptive.last_ttft_s / fcfs.last_ttft_s));
  JsonReport report;
  report.Set("fcfs_everything_s", fcfs.last_ttft_s);
  report.Set("fcfs_cached_ttft_s", fcfs.cached_ttft_s);
  report.Set("fcfs_short_mean_ttft_s", fcfs.mean_short_ttft_s);
  report.Set("adaptive_everything_s", adaptive.last_ttft_s);
  report.Set("adaptive_cached_ttft_s", adaptive.cached_ttft_s);
  report.Set("adaptive_short_mean_ttft_s", adaptive.mean_short_ttft_s);
  return report.WriteTo(options.common.json_path);
}

void AddAdaptiveCommand(CLI::App& app) {
  auto options = std::make_shared<AdaptiveOptions>();
  CLI::App* command = app.add_subcommand(
      "adaptive", "a long cached request and a burst of short ones: first come first served against adaptive order");
  AddCommonOptions(command, options->common);
  command->add_option("--model", options->model, "cost model and KV size")->capture_default_str();
  command->add_option("--cached-tokens", options->cached_tokens, "the cached request's prompt")->capture_default_str();
  command->add_option("--short-requests", options->short_requests, "uncached requests of 32 to 448 tokens")
      ->capture_default_str()
      ->check(CLI::Range(0u, 1000u));
  command->add_option("--step-tokens", options->step_tokens, "engine step budget")
      ->capture_default_str()
      ->check(CLI::Range(16u, 65536u));
  command->add_option("--bandwidth", options->bandwidth_gbps, "the disk's Gbit/s")->capture_default_str();
  command->add_option("--gpu-tflops", options->gpu_tflops, "F")->capture_default_str();
  command->add_option("--time-scale", options->time_scale, "divide every duration by this")->capture_default_str();
  RunWhenParsed(command, options, RunAdaptiveBench);
}

}  // namespace cake::bench
