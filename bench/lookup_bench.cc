// cake-bench lookup: Lookup latency for fully cached 16K- and 128K-token prompts over the unix socket, measured
// beside AdminService.Ping on the same channel so the figure is relative to the transport's own cost.
#include <algorithm>
#include <cstdio>
#include <functional>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "bench/bench_command.h"
#include "bench/bench_common.h"
#include "bench/benchmarks.h"
#include "keys/namespace.h"

namespace cake::bench {
namespace {

constexpr uint32_t kShortPromptTokens = 16 * 1024;
constexpr uint32_t kLongPromptTokens = 128 * 1024;

// Lookup's cost is hashing and the index, independent of the KV size: the smallest layout keeps storing
// 128K tokens cheap (32 bytes per token, 4 MiB in all).
NamespaceSpec TinyNamespace() {
  NamespaceSpec ns;
  ns.model_id = "cake-bench/tiny";
  ns.num_layers = 1;
  ns.num_kv_heads = 1;
  ns.head_dim = 8;
  ns.dtype = DType::kBf16;
  ns.tenant = "cake-bench";
  return ns;
}

// Engine-side chunk keys (16 bytes per chunk) for engines that hash their blocks themselves.
std::vector<std::string> SyntheticChunkKeys(uint32_t count, uint32_t seed) {
  std::vector<std::string> keys;
  for (uint32_t i = 0; i < count; ++i) keys.push_back(absl::StrFormat("%08x%08x", seed, i));
  static_assert(kChunkKeyBytes == 16);
  return keys;
}

absl::Status StorePrompt(Client& client, const NamespaceSpec& ns, const PromptRef& prompt, uint32_t chunks,
                         const MappedRegion& region, uint64_t chunk_bytes) {
  for (uint32_t c = 0; c < chunks; ++c) FillChunkPattern({region.data() + c * chunk_bytes, chunk_bytes}, c);
  CAKE_RETURN_IF_ERROR(client.Store(ns, prompt, 0, chunks, region, 0).status());
  CAKE_ASSIGN_OR_RETURN(auto found, client.Lookup(ns, prompt));
  if (found.cached_chunks != chunks) {
    return absl::FailedPreconditionError(absl::StrCat("the daemon holds ", found.cached_chunks, " of the ", chunks,
                                                      " chunks just stored; is its DRAM tier big enough?"));
  }
  return absl::OkStatus();
}

// The in-process cost of the key chain alone (SHA-256 over the tokens), to tell hashing from transport.
double KeyChainMicroseconds(const Namespace& ns, const std::vector<uint32_t>& tokens, uint32_t repeats) {
  std::vector<double> samples;
  for (uint32_t i = 0; i < repeats; ++i) {
    const Clock::time_point start = Clock::now();
    const std::vector<ChunkKey> keys = ns.KeysForTokens(tokens);
    samples.push_back(MicrosecondsSince(start));
  }
  return Median(std::move(samples));
}

struct TimedCall {
  const char* label;
  std::function<absl::Status()> call;
  std::vector<double> samples_us;
};

}  // namespace

absl::Status RunLookupBench(const LookupBenchOptions& options) {
  CAKE_ASSIGN_OR_RETURN(auto target, OpenDaemon(options.common.socket_path, {}));
  Client& client = *target.client;

  const NamespaceSpec ns = TinyNamespace();
  CAKE_ASSIGN_OR_RETURN(auto layout, Namespace::Create(ns));
  const uint64_t chunk_bytes = layout.chunk_bytes();
  const uint32_t short_chunks = kShortPromptTokens / ns.chunk_tokens;
  const uint32_t long_chunks = kLongPromptTokens / ns.chunk_tokens;
  const std::vector<uint32_t> short_tokens = SyntheticPrompt(kShortPromptTokens, 16);
  const std::vector<uint32_t> long_tokens = SyntheticPrompt(kLongPromptTokens, 128);
  const std::vector<std::string> short_keys = SyntheticChunkKeys(short_chunks, 16);
  const PromptRef short_prompt = TokensPrompt(short_tokens);
  const PromptRef long_prompt = TokensPrompt(long_tokens);
  const PromptRef short_keyed_prompt{{}, short_keys};
  {
    CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(long_chunks * chunk_bytes));
    absl::Cleanup release_region = [&] { client.ReleaseRegion(region).IgnoreError(); };
    for (auto [prompt, chunks] : {std::pair{&short_prompt, short_chunks}, std::pair{&long_prompt, long_chunks},
                                  std::pair{&short_keyed_prompt, short_chunks}}) {
      CAKE_RETURN_IF_ERROR(StorePrompt(client, ns, *prompt, chunks, region, chunk_bytes));
    }
  }

  auto fully_cached_lookup = [&](const PromptRef& prompt) {
    return [&client, &ns, &prompt]() -> absl::Status {
      CAKE_ASSIGN_OR_RETURN(auto result, client.Lookup(ns, prompt));
      if (result.cached_chunks != result.total_chunks) {
        return absl::FailedPreconditionError("a stored prompt stopped being fully cached during the run (evicted?)");
      }
      return absl::OkStatus();
    };
  };
  TimedCall ping{"Ping (trivial unary)", [&] { return client.Ping(); }, {}};
  TimedCall short_lookup{"Lookup 16K tokens", fully_cached_lookup(short_prompt), {}};
  TimedCall keyed_lookup{"Lookup 16K as 64 keys", fully_cached_lookup(short_keyed_prompt), {}};
  TimedCall long_lookup{"Lookup 128K tokens", fully_cached_lookup(long_prompt), {}};
  // A load's fixed cost: StartLoad to its Plan for a prompt of 64 engine keys nothing holds (compute-only: no
  // read follows), then Release. Issue 19's goal: at most 3x Ping.
  const std::vector<std::string> uncached_keys = SyntheticChunkKeys(short_chunks, 99);
  const PromptRef uncached_prompt{{}, uncached_keys};
  // The call's own samples are StartLoad to the Plan; what ending the stream costs after it is timed apart.
  struct PlanSamples {
    std::vector<double> plan_us, end_us;
  };
  PlanSamples plan_samples;
  auto start_to_plan_on = [&](Client& on, PlanSamples& samples) {
    return [&on, &samples, &ns, &uncached_prompt]() -> absl::Status {
      LoadOptions load;
      load.ns = ns;
      load.prompt = uncached_prompt;
      const Clock::time_point start = Clock::now();
      CAKE_ASSIGN_OR_RETURN(auto session, on.StartLoad(load));
      CAKE_ASSIGN_OR_RETURN(LoadPlan plan, session->WaitPlan());
      samples.plan_us.push_back(MicrosecondsSince(start));
      if (plan.cached_chunks != 0) return absl::FailedPreconditionError("an uncached prompt was cached");
      const Clock::time_point end = Clock::now();
      session.reset();
      samples.end_us.push_back(MicrosecondsSince(end));
      return absl::OkStatus();
    };
  };
  TimedCall start_to_plan{"Load Start to Plan", start_to_plan_on(client, plan_samples), {}};
  const std::vector<TimedCall*> calls = {&ping, &short_lookup, &keyed_lookup, &long_lookup, &start_to_plan};

  // Each kind of call runs in blocks of its own: a call right after a 128K lookup is several times slower (see
  // docs/benchmarks.md), which would bias whichever kind follows it. Alternating short blocks spreads the
  // background noise of a shared machine evenly over all kinds.
  constexpr uint32_t kBlocks = 10;
  const uint32_t warmup = std::max<uint32_t>(5, options.iterations / 10 / kBlocks);
  const uint32_t per_block = std::max<uint32_t>(1, options.iterations / kBlocks);
  for (uint32_t block = 0; block < kBlocks; ++block) {
    for (TimedCall* timed : calls) {
      for (uint32_t i = 0; i < warmup + per_block; ++i) {
        const Clock::time_point start = Clock::now();
        CAKE_RETURN_IF_ERROR(timed->call());
        if (i >= warmup) timed->samples_us.push_back(MicrosecondsSince(start));
      }
    }
  }
  // Start to Plan times itself (without ending the stream), warm-up calls included: drop those.
  start_to_plan.samples_us.clear();
  for (size_t i = 0; i < plan_samples.plan_us.size(); ++i) {
    if (i % (warmup + per_block) >= warmup) start_to_plan.samples_us.push_back(plan_samples.plan_us[i]);
  }

  const double trivial_p50 = Percentile(ping.samples_us, 50);
  const double ratio = Percentile(short_lookup.samples_us, 50) / trivial_p50;
  std::printf("cake-bench lookup: %u calls of each kind in %u blocks (each after %u warm-up calls), socket %s\n",
              per_block * kBlocks, kBlocks, warmup, target.socket_path.c_str());
  std::printf("  %-24s %10s %10s\n", "call", "p50 us", "p99 us");
  for (const TimedCall* timed : calls) {
    std::printf("  %-24s %10.1f %10.1f\n", timed->label, Percentile(timed->samples_us, 50),
                Percentile(timed->samples_us, 99));
  }
  const double keychain_short_us = KeyChainMicroseconds(layout, short_tokens, 50);
  const double keychain_long_us = KeyChainMicroseconds(layout, long_tokens, 20);
  std::printf("  in-process SHA-256 key chain: %.1f us for 16K tokens, %.1f us for 128K\n", keychain_short_us,
              keychain_long_us);
  std::printf("  Lookup 16K p50 / Ping p50 = %.2fx (goal: at most 1.5x) -> %s\n", ratio,
              ratio <= 1.5 ? "met" : "MISSED");
  const double plan_ratio = Percentile(start_to_plan.samples_us, 50) / trivial_p50;
  std::printf("  then ending that stream (Release): p50 %.1f us, p99 %.1f us\n", Percentile(plan_samples.end_us, 50),
              Percentile(plan_samples.end_us, 99));
  std::printf("  Load Start to Plan p50 / Ping p50 = %.2fx (goal: at most 3x) -> %s\n", plan_ratio,
              plan_ratio <= 3 ? "met" : "MISSED");

  JsonReport report;
  report.Set("lookup16k_p50_us", Percentile(short_lookup.samples_us, 50));
  report.Set("lookup16k_p99_us", Percentile(short_lookup.samples_us, 99));
  report.Set("lookup128k_p50_us", Percentile(long_lookup.samples_us, 50));
  report.Set("lookup128k_p99_us", Percentile(long_lookup.samples_us, 99));
  report.Set("trivial_p50_us", trivial_p50);
  report.Set("trivial_p99_us", Percentile(ping.samples_us, 99));
  report.Set("ratio_16k_over_trivial", ratio);
  report.Set("goal_ratio_16k_over_trivial", 1.5);
  report.Set("lookup16k_chunk_keys_p50_us", Percentile(keyed_lookup.samples_us, 50));
  report.Set("lookup16k_chunk_keys_p99_us", Percentile(keyed_lookup.samples_us, 99));
  report.Set("ratio_16k_chunk_keys_over_trivial", Percentile(keyed_lookup.samples_us, 50) / trivial_p50);
  report.Set("keychain16k_us", keychain_short_us);
  report.Set("keychain128k_us", keychain_long_us);
  report.Set("start_to_plan_p50_us", Percentile(start_to_plan.samples_us, 50));
  report.Set("start_to_plan_p99_us", Percentile(start_to_plan.samples_us, 99));
  report.Set("ratio_start_to_plan_over_trivial", plan_ratio);
  report.Set("load_end_p50_us", Percentile(plan_samples.end_us, 50));
  report.Set("iterations", per_block * kBlocks);
  return report.WriteTo(options.common.json_path);
}

void AddLookupCommand(CLI::App& app) {
  auto options = std::make_shared<LookupBenchOptions>();
  CLI::App* command =
      app.add_subcommand("lookup", "Lookup latency of 16K- and 128K-token prompts beside a trivial unary call");
  AddCommonOptions(command, options->common);
  command->add_option("--iterations", options->iterations, "measured calls of each kind")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1000000u));
  RunWhenParsed(command, options, RunLookupBench);
}

}  // namespace cake::bench
