// cake-bench lookup: Lookup latency for fully cached 16K- and 128K-token prompts over the unix socket, measured
// beside AdminService.Ping on the same channel so the figure is relative to the transport's own cost.
#include <algorithm>
#include <cstdio>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_common.h"
#include "bench/benchmarks.h"
#include "storage/namespace.h"

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

absl::Status StorePrompt(Client& client, const NamespaceSpec& ns, const std::vector<uint32_t>& tokens,
                         const MappedRegion& region, uint64_t chunk_bytes) {
  const uint32_t chunks = static_cast<uint32_t>(tokens.size() / ns.chunk_tokens);
  for (uint32_t c = 0; c < chunks; ++c) FillChunkPattern({region.data() + c * chunk_bytes, chunk_bytes}, c);
  auto stored = client.Store(ns, TokensPrompt(tokens), 0, chunks, region, 0);
  if (!stored.ok()) return stored.status();
  auto found = client.Lookup(ns, TokensPrompt(tokens));
  if (!found.ok()) return found.status();
  if (found->cached_chunks != chunks) {
    return absl::FailedPreconditionError(absl::StrCat("the daemon holds ", found->cached_chunks, " of the ", chunks,
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

}  // namespace

absl::Status RunLookupBench(const LookupBenchOptions& options) {
  auto target = OpenDaemon(options.common.socket_path, {});
  if (!target.ok()) return target.status();
  Client& client = *target->client;

  const NamespaceSpec ns = TinyNamespace();
  auto layout = Namespace::Create(ns);
  if (!layout.ok()) return layout.status();
  const uint64_t chunk_bytes = layout->chunk_bytes();
  const std::vector<uint32_t> short_prompt = SyntheticPrompt(kShortPromptTokens, 16);
  const std::vector<uint32_t> long_prompt = SyntheticPrompt(kLongPromptTokens, 128);
  {
    auto region = client.RegisterRegion(kLongPromptTokens / ns.chunk_tokens * chunk_bytes);
    if (!region.ok()) return region.status();
    absl::Cleanup release_region = [&] { client.ReleaseRegion(*region).IgnoreError(); };
    for (const std::vector<uint32_t>* prompt : {&short_prompt, &long_prompt}) {
      if (absl::Status s = StorePrompt(client, ns, *prompt, *region, chunk_bytes); !s.ok()) return s;
    }
  }

  // Interleaving the three calls exposes each to the same background noise of a shared machine.
  std::vector<double> ping_us, short_us, long_us;
  const uint32_t warmup = std::max<uint32_t>(50, options.iterations / 10);
  for (uint32_t i = 0; i < warmup + options.iterations; ++i) {
    Clock::time_point start = Clock::now();
    if (absl::Status s = client.Ping(); !s.ok()) return s;
    const double ping = MicrosecondsSince(start);

    start = Clock::now();
    auto short_result = client.Lookup(ns, TokensPrompt(short_prompt));
    const double short_lookup = MicrosecondsSince(start);
    if (!short_result.ok()) return short_result.status();

    start = Clock::now();
    auto long_result = client.Lookup(ns, TokensPrompt(long_prompt));
    const double long_lookup = MicrosecondsSince(start);
    if (!long_result.ok()) return long_result.status();

    if (short_result->cached_chunks != short_result->total_chunks ||
        long_result->cached_chunks != long_result->total_chunks) {
      return absl::FailedPreconditionError("a stored prompt stopped being fully cached during the run (evicted?)");
    }
    if (i < warmup) continue;
    ping_us.push_back(ping);
    short_us.push_back(short_lookup);
    long_us.push_back(long_lookup);
  }

  const double trivial_p50 = Percentile(ping_us, 50);
  const double short_p50 = Percentile(short_us, 50);
  const double ratio = short_p50 / trivial_p50;
  const double hash_short_us = KeyChainMicroseconds(*layout, short_prompt, 50);
  const double hash_long_us = KeyChainMicroseconds(*layout, long_prompt, 20);

  std::printf("cake-bench lookup: %u iterations (after %u warm-up), unix socket %s\n", options.iterations, warmup,
              target->socket_path.c_str());
  std::printf("  %-22s %10s %10s %14s\n", "call", "p50 us", "p99 us", "key chain us");
  std::printf("  %-22s %10.1f %10.1f %14s\n", "Ping (trivial unary)", trivial_p50, Percentile(ping_us, 99), "-");
  std::printf("  %-22s %10.1f %10.1f %14.1f\n", "Lookup 16K tokens", short_p50, Percentile(short_us, 99),
              hash_short_us);
  std::printf("  %-22s %10.1f %10.1f %14.1f\n", "Lookup 128K tokens", Percentile(long_us, 50),
              Percentile(long_us, 99), hash_long_us);
  std::printf("  Lookup 16K p50 / Ping p50 = %.2fx (goal: at most 1.5x) -> %s\n", ratio,
              ratio <= 1.5 ? "met" : "MISSED");

  JsonReport report;
  report.Set("lookup16k_p50_us", short_p50);
  report.Set("lookup16k_p99_us", Percentile(short_us, 99));
  report.Set("lookup128k_p50_us", Percentile(long_us, 50));
  report.Set("lookup128k_p99_us", Percentile(long_us, 99));
  report.Set("trivial_p50_us", trivial_p50);
  report.Set("trivial_p99_us", Percentile(ping_us, 99));
  report.Set("ratio_16k_over_trivial", ratio);
  report.Set("goal_ratio_16k_over_trivial", 1.5);
  report.Set("keychain16k_us", hash_short_us);
  report.Set("keychain128k_us", hash_long_us);
  report.Set("iterations", options.iterations);
  return report.WriteTo(options.common.json_path);
}

}  // namespace cake::bench
