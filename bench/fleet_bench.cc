// cake-bench fleet: a fleet of caked daemons on one machine sharing a Redis Cluster (masters with replicas), under
// multi-turn sessions whose turns land on a daemon drawn at random, as a router without session affinity sends
// them. Each turn's prompt is the previous turn's and some new tokens; per turn the engine looks the prompt up,
// loads what hits (I/O-only, into a host region, every chunk checked byte for byte), computes the rest (simulated:
// a fixed time per missed chunk, not slept) and stores the whole prompt. Three phases:
//   shared:   the daemons with the cluster as their remote tier
//   local:    the same turns, routed the same way, on as many daemons without it (fresh DRAM and disk each)
//   failover: fresh sessions on the shared daemons while one master is failed over by hand (CLUSTER FAILOVER on
//             its replica, then the old master killed) and later another is killed outright (its replica promotes
//             itself): errors and wrong bytes (both must be 0) and the hit rate window by window.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "bench/bench_command.h"
#include "bench/bench_common.h"
#include "bench/benchmarks.h"
#include "examples/simulated_engine/simulated_storage.h"
#include "testing/redis_process.h"

namespace cake::bench {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Chunk `chunk` of session `session`'s KV: every 8-byte word depends on the session, the chunk and its place, so
// another session's chunk, another chunk of this one or a torn one all fail the check. (FillChunkPattern knows
// only the chunk index, and chunk 3 of every session would look alike.)
void FillSessionChunk(std::span<std::byte> dst, uint64_t session, uint32_t chunk) {
  const uint64_t base = Mix(session * 0x100000001b3ULL + chunk);
  for (size_t w = 0; w * 8 < dst.size(); ++w) {
    const uint64_t word = base ^ (w * 0x9e3779b97f4a7c15ULL);
    std::memcpy(dst.data() + w * 8, &word, std::min<size_t>(8, dst.size() - w * 8));
  }
}

bool SessionChunkMatches(std::span<const std::byte> bytes, uint64_t session, uint32_t chunk) {
  const uint64_t base = Mix(session * 0x100000001b3ULL + chunk);
  for (size_t w = 0; w * 8 < bytes.size(); ++w) {
    const uint64_t word = base ^ (w * 0x9e3779b97f4a7c15ULL);
    if (std::memcmp(bytes.data() + w * 8, &word, std::min<size_t>(8, bytes.size() - w * 8)) != 0) return false;
  }
  return true;
}

// The daemon a session's turn is routed to: the same in every phase that runs the same sessions.
uint32_t DaemonFor(uint64_t session, uint32_t turn, uint32_t daemons) {
  return static_cast<uint32_t>(Mix(session * 131 + turn + 7) % daemons);
}

struct TurnResult {
  double start_s = 0;  // since the phase began
  uint32_t turn = 0;
  uint32_t tokens = 0;
  uint32_t hit_tokens = 0;     // loaded, checked and used
  uint32_t lookup_tokens = 0;  // what the Lookup said was cached
  uint32_t failed_chunks = 0;  // reads the daemon reported failed (the engine computed from there down)
  uint32_t wrong_chunks = 0;   // loaded bytes that were not what was stored: must stay 0
  bool loaded = false;         // a load ran (the Lookup found chunks)
  double io_s = 0;             // Lookup + load, wall time
  double ttft_s = 0;           // io_s + compute per missed chunk
  bool error = false;          // a Lookup, load or Store that returned an error: must stay 0
};

struct PhaseStats {
  uint64_t turns = 0, tokens = 0, hit_tokens = 0, lookup_tokens = 0, failed_chunks = 0, wrong_chunks = 0, errors = 0;
  uint64_t loads = 0;
  double ttft_sum = 0, io_sum = 0;
  uint64_t later_turns = 0;  // turns after a session's first (the first misses everywhere)
  double later_ttft_sum = 0;
  uint64_t later_tokens = 0, later_hit_tokens = 0;
  std::vector<double> ttfts;
  void Add(const TurnResult& r) {
    turns++;
    tokens += r.tokens;
    hit_tokens += r.hit_tokens;
    lookup_tokens += r.lookup_tokens;
    failed_chunks += r.failed_chunks;
    wrong_chunks += r.wrong_chunks;
    errors += r.error;
    loads += r.loaded;
    ttft_sum += r.ttft_s;
    io_sum += r.io_s;
    ttfts.push_back(r.ttft_s);
    if (r.turn > 0) {
      later_turns++;
      later_ttft_sum += r.ttft_s;
      later_tokens += r.tokens;
      later_hit_tokens += r.hit_tokens;
    }
  }
  double hit_rate() const { return tokens ? static_cast<double>(hit_tokens) / tokens : 0; }
  double later_hit_rate() const { return later_tokens ? static_cast<double>(later_hit_tokens) / later_tokens : 0; }
  double mean_ttft_ms() const { return turns ? 1e3 * ttft_sum / turns : 0; }
  double later_mean_ttft_ms() const { return later_turns ? 1e3 * later_ttft_sum / later_turns : 0; }
  double mean_io_ms() const { return turns ? 1e3 * io_sum / turns : 0; }
};

// One engine's connection to one daemon, and the region it loads into and stores from.
struct Endpoint {
  std::unique_ptr<Client> client;
  std::optional<MappedRegion> region;
};

class FleetRun {
 public:
  FleetRun(const FleetOptions& options, NamespaceSpec ns) : options_(options), ns_(std::move(ns)) {
    chunk_bytes_ = uint64_t{options.chunk_tokens} * static_cast<uint64_t>(sim::kProxyBytesPerToken);
    max_tokens_ = options.first_tokens + (options.turns - 1) * options.turn_tokens;
  }

  ~FleetRun() { Stop(); }
  FleetRun(const FleetRun&) = delete;
  FleetRun& operator=(const FleetRun&) = delete;

  uint64_t chunk_bytes() const { return chunk_bytes_; }
  uint32_t max_tokens() const { return max_tokens_; }

  // Starts the daemons (each with its own DRAM and disk under root/<name>-<i>, the cluster's seeds when given) and
  // one endpoint per worker and daemon.
  absl::Status Start(const std::filesystem::path& root, const std::string& name, const std::string& remote_seeds,
                     const std::string& key_prefix) {
    for (uint32_t d = 0; d < options_.daemons; ++d) {
      const std::filesystem::path disk = root / absl::StrCat(name, "-", d);
      std::vector<std::string> args = {"--disk-root",         disk.string(),
                                       "--dram-capacity-mib", absl::StrCat(options_.dram_mib),
                                       "--disk-capacity-mib", absl::StrCat(options_.disk_mib)};
      if (!remote_seeds.empty()) args.insert(args.end(), {"--remote", remote_seeds, "--remote-key-prefix", key_prefix});
      CAKE_ASSIGN_OR_RETURN(auto target, OpenDaemon("", args));
      daemons_.push_back(std::move(target));
    }
    endpoints_.resize(options_.workers);
    for (uint32_t w = 0; w < options_.workers; ++w) {
      for (uint32_t d = 0; d < options_.daemons; ++d) {
        Endpoint e;
        CAKE_ASSIGN_OR_RETURN(e.client,
                              Client::Connect({daemons_[d].socket_path, absl::StrCat(kClientId, "-fleet-", w)}));
        CAKE_ASSIGN_OR_RETURN(auto region,
                              e.client->RegisterRegion(uint64_t{max_tokens_ / options_.chunk_tokens} * chunk_bytes_));
        e.region.emplace(std::move(region));
        endpoints_[w].push_back(std::move(e));
      }
    }
    return absl::OkStatus();
  }

  // Regions released and clients closed before the daemons stop.
  void Stop() {
    for (auto& per_worker : endpoints_) {
      for (Endpoint& e : per_worker) {
        if (e.region) e.client->ReleaseRegion(*e.region).IgnoreError();
      }
    }
    endpoints_.clear();
    daemons_.clear();
  }

  // The daemons' counters summed.
  std::map<std::string, uint64_t> SummedStats() {
    std::map<std::string, uint64_t> sum;
    for (DaemonTarget& d : daemons_) {
      auto stats = d.client->Stats();
      if (!stats.ok()) continue;
      for (const auto& [k, v] : *stats) sum[k] += v;
    }
    return sum;
  }

  // Runs sessions on `workers` threads until `next_session` of every worker has none left, or `deadline`. Worker w
  // keeps up to `active` sessions going at once, each turn of a session at least think_ms after its previous one
  // ended (the user reading and typing; also the time a router would see between turns), the readiest next.
  std::vector<TurnResult> RunSessions(const std::function<std::optional<uint64_t>(uint32_t worker)>& next_session,
                                      uint32_t active, Clock::time_point deadline) {
    std::mutex mu;
    std::vector<TurnResult> results;
    const Clock::time_point start = Clock::now();
    std::vector<std::thread> threads;
    for (uint32_t w = 0; w < options_.workers; ++w) {
      threads.emplace_back([&, w] {
        struct Live {
          uint64_t id;
          std::vector<uint32_t> tokens;
          uint32_t turn = 0;
          Clock::time_point ready;
        };
        std::vector<Live> live;
        bool filling = true;
        auto add = [&] {
          std::optional<uint64_t> id = next_session(w);
          if (!id) return false;
          // The first sessions start spread over a few think times, so their turns do not move in step.
          const auto stagger = std::chrono::milliseconds(
              filling ? live.size() * options_.think_ms * options_.turns / std::max(active, 1u) : 0);
          live.push_back(
              Live{*id, SyntheticPrompt(max_tokens_, static_cast<uint32_t>(Mix(*id))), 0, Clock::now() + stagger});
          return true;
        };
        while (live.size() < active && add()) {
        }
        filling = false;
        while (!live.empty() && Clock::now() < deadline) {
          auto next = std::min_element(live.begin(), live.end(),
                                       [](const Live& a, const Live& b) { return a.ready < b.ready; });
          if (next->ready > Clock::now()) std::this_thread::sleep_until(std::min(next->ready, deadline));
          if (Clock::now() >= deadline) break;
          const uint32_t d = DaemonFor(next->id, next->turn, options_.daemons);
          TurnResult r = Turn(endpoints_[w][d], next->id, next->tokens, next->turn);
          r.start_s -= std::chrono::duration<double>(start.time_since_epoch()).count();
          {
            std::lock_guard lock(mu);
            results.push_back(r);
          }
          // Think times from half to one and a half think_ms, so sessions that started together drift apart (in
          // step, a window would hold many first turns, the next few).
          const double jitter = 0.5 + static_cast<double>(Mix(next->id * 31 + next->turn) % 1000) / 1000;
          next->ready =
              Clock::now() + std::chrono::microseconds(static_cast<int64_t>(options_.think_ms * 1e3 * jitter));
          if (++next->turn == options_.turns) {
            live.erase(next);
            add();
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    std::sort(results.begin(), results.end(),
              [](const TurnResult& a, const TurnResult& b) { return a.start_s < b.start_s; });
    return results;
  }

 private:
  // One turn: Lookup, an I/O-only load of what hits (zeroed region first, every loaded chunk checked), the rest
  // "computed" (its pattern written), and the whole prompt stored.
  TurnResult Turn(Endpoint& e, uint64_t session, const std::vector<uint32_t>& all_tokens, uint32_t turn) {
    TurnResult r;
    r.turn = turn;
    r.tokens = options_.first_tokens + turn * options_.turn_tokens;
    const uint32_t chunks = r.tokens / options_.chunk_tokens;
    const PromptRef prompt = TokensPrompt(std::span(all_tokens).first(r.tokens));
    MappedRegion& region = *e.region;
    std::memset(region.data(), 0, chunks * chunk_bytes_);
    const Clock::time_point t0 = Clock::now();
    r.start_s = std::chrono::duration<double>(t0.time_since_epoch()).count();
    uint32_t loaded = 0;
    auto lookup = e.client->Lookup(ns_, prompt);
    if (!lookup.ok()) {
      Note("Lookup", lookup.status());
      r.error = true;
    } else if (lookup->cached_chunks > 0) {
      r.lookup_tokens = lookup->cached_chunks * options_.chunk_tokens;
      r.loaded = true;
      LoadOptions load;
      load.ns = ns_;
      load.prompt = prompt;
      load.region = &region;
      load.io_only = true;
      auto started = e.client->StartLoad(load);
      if (!started.ok()) {
        Note("StartLoad", started.status());
        r.error = true;
      } else {
        LoadSession& s = **started;
        auto plan = s.WaitPlan();
        auto done = s.WaitDone();
        if (!plan.ok() || !done.ok()) {
          Note("load", plan.ok() ? done.status() : plan.status());
          r.error = true;
        } else {
          r.failed_chunks = done->failed_chunks;
          for (uint32_t c = done->meeting_chunk; c < plan->cached_chunks; ++c) {
            if (!s.IsResident(c)) continue;
            const std::span<const std::byte> bytes(region.data() + s.RegionOffset(c), chunk_bytes_);
            if (SessionChunkMatches(bytes, session, c)) {
              loaded++;
            } else {
              r.wrong_chunks++;
            }
          }
        }
        absl::Status released = s.Release();
        if (!released.ok()) {
          Note("Release", released);
          r.error = true;
        }
      }
    }
    r.io_s = SecondsSince(t0);
    r.hit_tokens = loaded * options_.chunk_tokens;
    r.ttft_s = r.io_s + (chunks - loaded) * options_.compute_ms_per_chunk / 1e3;
    // The engine computed the rest: the whole prompt's KV, as the next turn will expect it.
    for (uint32_t c = 0; c < chunks; ++c) {
      FillSessionChunk({region.data() + c * chunk_bytes_, chunk_bytes_}, session, c);
    }
    auto stored = e.client->Store(ns_, prompt, 0, chunks, region, 0);
    if (!stored.ok()) {
      Note("Store", stored.status());
      r.error = true;
    }
    return r;
  }

  // The first few errors are printed (they must not happen; when they do, what they were matters).
  void Note(const char* what, const absl::Status& status) {
    if (notes_.fetch_add(1) < 5) std::fprintf(stderr, "  error: %s: %s\n", what, status.ToString().c_str());
  }

  const FleetOptions& options_;
  const NamespaceSpec ns_;
  uint64_t chunk_bytes_ = 0;
  uint32_t max_tokens_ = 0;
  std::vector<DaemonTarget> daemons_;
  std::vector<std::vector<Endpoint>> endpoints_;  // [worker][daemon]
  std::atomic<int> notes_{0};
};

PhaseStats Summarize(const std::vector<TurnResult>& results, double from_s = -1, double to_s = 1e18) {
  PhaseStats s;
  for (const TurnResult& r : results) {
    if (r.start_s >= from_s && r.start_s < to_s) s.Add(r);
  }
  return s;
}

// The fixed workload of the shared and local phases: sessions [0, sessions), worker w taking those equal to w
// modulo the workers, all of them going at once.
std::function<std::optional<uint64_t>(uint32_t)> FixedSessions(const FleetOptions& options,
                                                               std::vector<uint64_t>& cursor) {
  cursor.assign(options.workers, 0);
  return [&options, &cursor](uint32_t w) -> std::optional<uint64_t> {
    const uint64_t id = cursor[w] * options.workers + w;
    if (id >= options.sessions) return std::nullopt;
    cursor[w]++;
    return id;
  };
}

struct Event {
  std::string what;
  double at_s = 0;     // since the failover phase began: the command, or the kill
  double done_s = -1;  // the replica serving as master, every node agreeing
  double recovered_s = -1;
  double low_hit_rate = 1;
  std::string error;
};

}  // namespace

absl::Status RunFleetBench(const FleetOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("--dir is required (the daemons' disk tiers)");
  if (options.daemons < 1 || options.workers < 1 || options.sessions < 1 || options.turns < 1 ||
      options.chunk_tokens == 0 || options.first_tokens == 0 || options.first_tokens % options.chunk_tokens != 0 ||
      options.turn_tokens % options.chunk_tokens != 0) {
    return absl::InvalidArgumentError(
        "need daemons, workers, sessions and turns >= 1, and --first-tokens (> 0) and --turn-tokens multiples of "
        "--chunk-tokens");
  }
  if (!(options.failover_seconds > 0) || !(options.manual_failover_at_s < options.kill_at_s) ||
      !(options.kill_at_s < options.failover_seconds) || !(options.window_s > 0)) {
    return absl::InvalidArgumentError(
        "need --manual-failover-at < --kill-at < --failover-seconds and --window-seconds > 0");
  }
  CAKE_ASSIGN_OR_RETURN(auto root, FreshPath(options.dir, "cake-fleet"));
  absl::Cleanup remove_root = [&] { RemoveQuietly(root); };

  CAKE_ASSIGN_OR_RETURN(auto cluster, RedisCluster::Start(3, 1));
  // The daemons know the masters only: the replicas they turn to after a failover come from the slot map.
  std::vector<std::string> seeds;
  for (int m = 0; m < cluster.masters(); ++m) seeds.push_back(cluster.node(m).address());
  const std::string seed_list = absl::StrJoin(seeds, ",");
  const std::string prefix = absl::StrCat("fleet-", getpid(), ":");
  const NamespaceSpec ns = sim::ProxyNamespace(absl::StrCat("fleet-", getpid()), options.chunk_tokens);
  const uint32_t per_worker = (options.sessions + options.workers - 1) / options.workers;

  std::printf(
      "cake-bench fleet: %u daemons (DRAM %u MiB, disk %u MiB each), a Redis Cluster of 3 masters with a replica "
      "each; %u engine threads; sessions of %u turns, %u tokens then %u more a turn, chunks of %u tokens (%llu KiB); "
      "think time %u ms; compute %.2f ms per missed chunk (simulated, added to the measured Lookup + load time)\n",
      options.daemons, options.dram_mib, options.disk_mib, options.workers, options.turns, options.first_tokens,
      options.turn_tokens, options.chunk_tokens,
      static_cast<unsigned long long>(options.chunk_tokens * static_cast<uint64_t>(sim::kProxyBytesPerToken) >> 10),
      options.think_ms, options.compute_ms_per_chunk);
  std::fflush(stdout);

  // Phase 1: shared.
  FleetRun shared(options, ns);
  CAKE_RETURN_IF_ERROR(shared.Start(root, "shared", seed_list, prefix));
  std::vector<uint64_t> cursor;
  const auto shared_results = shared.RunSessions(FixedSessions(options, cursor), per_worker, Clock::time_point::max());
  const PhaseStats with_cluster = Summarize(shared_results);
  std::printf("  shared: %llu turns, hit rate %.3f, mean TTFT %.2f ms\n",
              static_cast<unsigned long long>(with_cluster.turns), with_cluster.hit_rate(),
              with_cluster.mean_ttft_ms());
  std::fflush(stdout);

  // Phase 2: the same turns on daemons of their own.
  PhaseStats alone;
  {
    FleetRun local(options, ns);
    CAKE_RETURN_IF_ERROR(local.Start(root, "local", "", ""));
    alone = Summarize(local.RunSessions(FixedSessions(options, cursor), per_worker, Clock::time_point::max()));
  }
  std::printf("  local:  %llu turns, hit rate %.3f, mean TTFT %.2f ms\n", static_cast<unsigned long long>(alone.turns),
              alone.hit_rate(), alone.mean_ttft_ms());
  std::fflush(stdout);

  // Phase 3: fresh sessions on the shared daemons, a master failed over by hand and its old self killed, then
  // another master killed outright.
  const auto stats_before = shared.SummedStats();
  std::atomic<uint64_t> next_id{uint64_t{1} << 32};
  const Clock::time_point phase_start = Clock::now();
  const Clock::time_point phase_end = phase_start + std::chrono::duration_cast<Clock::duration>(
                                                        std::chrono::duration<double>(options.failover_seconds));
  std::vector<Event> events(2);
  std::thread faults([&] {
    auto at = [&](double s) {
      return phase_start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
    };
    auto since = [&] { return SecondsSince(phase_start); };
    // Master 0: its replica takes over by hand (the old master stops writes until the replica caught up), then the
    // old master, a replica now, is killed.
    std::this_thread::sleep_until(at(options.manual_failover_at_s));
    const size_t replica0 = cluster.ReplicasOf(0).at(0);
    events[0].what = "CLUSTER FAILOVER on master 0's replica, then the old master killed";
    events[0].at_s = since();
    absl::Status failed_over = cluster.Failover(replica0);
    cluster.node(0).Kill();
    if (failed_over.ok()) {
      events[0].done_s = since();
    } else {
      events[0].error = failed_over.ToString();
    }
    // Master 1: killed; its replica is promoted by the cluster (node timeout 2 s, then its election).
    std::this_thread::sleep_until(at(options.kill_at_s));
    const size_t replica1 = cluster.ReplicasOf(1).at(0);
    events[1].what = "master 1 killed (SIGKILL), its replica promoted by the cluster";
    events[1].at_s = since();
    cluster.node(1).Kill();
    absl::Status promoted = cluster.WaitUntilMaster(replica1, std::chrono::seconds(30));
    if (promoted.ok()) {
      events[1].done_s = since();
    } else {
      events[1].error = promoted.ToString();
    }
  });
  const auto failover_results = shared.RunSessions(
      [&](uint32_t) -> std::optional<uint64_t> { return next_id.fetch_add(1); }, per_worker, phase_end);
  faults.join();
  const auto stats_after = shared.SummedStats();
  shared.Stop();
  const PhaseStats during = Summarize(failover_results);

  // Windows of turns by their start.
  const size_t windows = static_cast<size_t>(std::ceil(options.failover_seconds / options.window_s));
  std::vector<PhaseStats> per_window(windows);
  for (const TurnResult& r : failover_results) {
    per_window[std::min(windows - 1, static_cast<size_t>(r.start_s / options.window_s))].Add(r);
  }
  // The hit rate before any fault, once the first sessions' later turns are under way (their first turns miss).
  const double settle_s = options.manual_failover_at_s / 2;
  const PhaseStats before = Summarize(failover_results, settle_s, options.manual_failover_at_s);
  const double target = 0.9 * before.hit_rate();
  // Recovery is read on windows of a quarter second from the fault on: the event has recovered at the start of the
  // first one that, with the three after it (a second in all), is at least 90% of the rate before the faults; 0 when
  // that is the first (no drop). The low is the worst such window until then.
  constexpr double kFine = 0.25;
  const size_t fine_windows = static_cast<size_t>(std::ceil(options.failover_seconds / kFine));
  std::vector<PhaseStats> fine(fine_windows);
  for (const TurnResult& r : failover_results) {
    fine[std::min(fine_windows - 1, static_cast<size_t>(r.start_s / kFine))].Add(r);
  }
  auto fine_ok = [&](size_t w) { return w >= fine_windows || fine[w].turns == 0 || fine[w].hit_rate() >= target; };
  for (size_t e = 0; e < events.size(); ++e) {
    // The first window that starts after the fault: the one it falls in mixes turns from before it.
    const size_t first = static_cast<size_t>(std::ceil(events[e].at_s / kFine));
    const double limit_s = e + 1 < events.size() ? events[e + 1].at_s : options.failover_seconds;
    for (size_t w = first; w < fine_windows && w * kFine < limit_s; ++w) {
      if (fine[w].turns == 0) continue;
      if (fine_ok(w) && fine_ok(w + 1) && fine_ok(w + 2) && fine_ok(w + 3)) {
        events[e].recovered_s = w == first ? 0 : w * kFine - events[e].at_s;
        break;
      }
      events[e].low_hit_rate = std::min(events[e].low_hit_rate, fine[w].hit_rate());
    }
  }
  auto delta = [&](const std::string& k) {
    auto a = stats_after.find(k), b = stats_before.find(k);
    return (a == stats_after.end() ? 0 : a->second) - (b == stats_before.end() ? 0 : b->second);
  };

  std::printf(
      "\n| setup | turns | tokens | hit rate | hit rate, turns 2+ | mean TTFT (ms) | TTFT turns 2+ (ms) | "
      "p99 TTFT (ms) | mean Lookup + load (ms) |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const auto& [name, s] : {std::pair<std::string, const PhaseStats*>{
                                    absl::StrCat(options.daemons, " daemons + shared Redis Cluster"), &with_cluster},
                                {absl::StrCat(options.daemons, " daemons, own tiers only"), &alone}}) {
    std::printf("| %s | %llu | %llu | %.3f | %.3f | %.2f | %.2f | %.2f | %.2f |\n", name.c_str(),
                static_cast<unsigned long long>(s->turns), static_cast<unsigned long long>(s->tokens), s->hit_rate(),
                s->later_hit_rate(), s->mean_ttft_ms(), s->later_mean_ttft_ms(), Percentile(s->ttfts, 99) * 1e3,
                s->mean_io_ms());
  }
  // The most a turn can hit is its session's previous prompt: the first turn nothing, a later one all but its new
  // tokens.
  uint64_t ceiling_hit = 0, ceiling_tokens = 0;
  for (uint32_t t = 0; t < options.turns; ++t) {
    ceiling_tokens += options.first_tokens + t * options.turn_tokens;
    if (t > 0) ceiling_hit += options.first_tokens + (t - 1) * options.turn_tokens;
  }
  const double ceiling = static_cast<double>(ceiling_hit) / ceiling_tokens;
  std::printf("\n  the ceiling (every turn finds its session's previous prompt): hit rate %.3f\n", ceiling);
  std::printf("  shared / own tiers: hit rate %.2fx, mean TTFT %.2fx; errors %llu / %llu, wrong chunks %llu / %llu\n",
              alone.hit_rate() > 0 ? with_cluster.hit_rate() / alone.hit_rate() : 0,
              alone.mean_ttft_ms() > 0 ? with_cluster.mean_ttft_ms() / alone.mean_ttft_ms() : 0,
              static_cast<unsigned long long>(with_cluster.errors), static_cast<unsigned long long>(alone.errors),
              static_cast<unsigned long long>(with_cluster.wrong_chunks),
              static_cast<unsigned long long>(alone.wrong_chunks));

  std::printf("\nfailover phase: %.0f s of fresh sessions on the shared daemons; windows of %.1f s\n",
              options.failover_seconds, options.window_s);
  std::printf(
      "| window (s) | turns | loads | hit rate | mean TTFT (ms) | failed chunk reads | errors | wrong chunks | |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (size_t w = 0; w < windows; ++w) {
    const PhaseStats& s = per_window[w];
    std::string mark;
    for (size_t e = 0; e < events.size(); ++e) {
      if (events[e].at_s >= w * options.window_s && events[e].at_s < (w + 1) * options.window_s) {
        absl::StrAppend(&mark, e == 0 ? "failover of master 0 " : "master 1 killed ");
      }
      if (events[e].done_s >= w * options.window_s && events[e].done_s < (w + 1) * options.window_s) {
        absl::StrAppend(&mark, e == 0 ? "(replica 0 is master) " : "(replica 1 promoted) ");
      }
    }
    std::printf("| %.1f-%.1f | %llu | %llu | %.3f | %.2f | %llu | %llu | %llu | %s|\n", w * options.window_s,
                (w + 1) * options.window_s, static_cast<unsigned long long>(s.turns),
                static_cast<unsigned long long>(s.loads), s.hit_rate(), s.mean_ttft_ms(),
                static_cast<unsigned long long>(s.failed_chunks), static_cast<unsigned long long>(s.errors),
                static_cast<unsigned long long>(s.wrong_chunks), mark.c_str());
  }
  std::printf(
      "\n  before the faults (%.1f-%.1f s): hit rate %.3f, mean TTFT %.2f ms; back = four "
      "quarter-second windows in a row at >= %.3f (90%%)\n",
      settle_s, options.manual_failover_at_s, before.hit_rate(), before.mean_ttft_ms(), target);
  for (const Event& e : events) {
    std::printf(
        "  %s at %.2f s: the cluster done after %s; hit rate %s%s\n", e.what.c_str(), e.at_s,
        e.done_s >= 0 ? absl::StrFormat("%.2f s", e.done_s - e.at_s).c_str() : "(never)",
        e.recovered_s == 0 ? "never below the 90% mark (no drop)"
        : e.recovered_s > 0
            ? absl::StrFormat("down to %.3f (a quarter second's worst), back from %.2f s after the fault (%.2f s "
                              "after the cluster was done)",
                              e.low_hit_rate, e.recovered_s, e.recovered_s - (e.done_s - e.at_s))
                  .c_str()
            : "not back within the phase",
        e.error.empty() ? "" : absl::StrCat(" [", e.error, "]").c_str());
  }
  std::printf(
      "  whole phase: %llu turns, hit rate %.3f, errors %llu, wrong chunks %llu, failed chunk reads %llu; daemons: "
      "tier_remote_errors %llu, tier_remote_fast_failures %llu, tier_remote_moved %llu, write_back_failed %llu, "
      "load_chunk_read_failures %llu\n",
      static_cast<unsigned long long>(during.turns), during.hit_rate(), static_cast<unsigned long long>(during.errors),
      static_cast<unsigned long long>(during.wrong_chunks), static_cast<unsigned long long>(during.failed_chunks),
      static_cast<unsigned long long>(delta("tier_remote_errors")),
      static_cast<unsigned long long>(delta("tier_remote_fast_failures")),
      static_cast<unsigned long long>(delta("tier_remote_moved")),
      static_cast<unsigned long long>(delta("write_back_failed")),
      static_cast<unsigned long long>(delta("load_chunk_read_failures")));

  JsonReport report;
  report.Set("daemons", options.daemons);
  report.Set("sessions", options.sessions);
  report.Set("turns", options.turns);
  report.Set("compute_ms_per_chunk", options.compute_ms_per_chunk);
  report.Set("shared_hit_rate", with_cluster.hit_rate());
  report.Set("shared_mean_ttft_ms", with_cluster.mean_ttft_ms());
  report.Set("local_hit_rate", alone.hit_rate());
  report.Set("ceiling_hit_rate", ceiling);
  report.Set("local_mean_ttft_ms", alone.mean_ttft_ms());
  report.Set("failover_turns", static_cast<double>(during.turns));
  report.Set("failover_errors", static_cast<double>(during.errors));
  report.Set("failover_wrong_chunks",
             static_cast<double>(during.wrong_chunks + with_cluster.wrong_chunks + alone.wrong_chunks));
  report.Set("failover_hit_rate_before", before.hit_rate());
  for (size_t e = 0; e < events.size(); ++e) {
    const std::string k = e == 0 ? "manual_failover" : "kill";
    report.Set(k + "_cluster_s", events[e].done_s >= 0 ? events[e].done_s - events[e].at_s : -1);
    report.Set(k + "_low_hit_rate", events[e].low_hit_rate);
    report.Set(k + "_recovered_s", events[e].recovered_s);
  }
  std::vector<std::string> rows;
  for (size_t w = 0; w < windows; ++w) {
    JsonReport row;
    row.Set("start_s", w * options.window_s);
    row.Set("turns", static_cast<double>(per_window[w].turns));
    row.Set("hit_rate", per_window[w].hit_rate());
    row.Set("mean_ttft_ms", per_window[w].mean_ttft_ms());
    rows.push_back(row.ToString());
  }
  report.SetRaw("windows", "[" + absl::StrJoin(rows, ",") + "]");
  CAKE_RETURN_IF_ERROR(report.WriteTo(options.json_path));

  const uint64_t errors = with_cluster.errors + alone.errors + during.errors;
  const uint64_t wrong = with_cluster.wrong_chunks + alone.wrong_chunks + during.wrong_chunks;
  if (errors > 0 || wrong > 0) {
    return absl::InternalError(absl::StrCat(errors, " calls failed and ", wrong,
                                            " loaded chunks held the wrong bytes: a miss must be computed, never an "
                                            "error, and nothing wrong may be served"));
  }
  for (const Event& e : events) {
    if (!e.error.empty()) return absl::InternalError(absl::StrCat(e.what, ": ", e.error));
  }
  return absl::OkStatus();
}

void AddFleetCommand(CLI::App& app) {
  auto options = std::make_shared<FleetOptions>();
  CLI::App* command = app.add_subcommand(
      "fleet",
      "daemons sharing a Redis Cluster under multi-turn sessions routed at random, against daemons alone; "
      "then a master failed over and another killed: errors, wrong bytes, hit rate over time");
  command->add_option("--dir", options->dir, "folder for the daemons' disk tiers")->required();
  command->add_option("--json", options->json_path, "also write the results to this file as one JSON object");
  command->add_option("--daemons", options->daemons, "daemons in the fleet")
      ->capture_default_str()
      ->check(CLI::Range(1u, 16u));
  command->add_option("--workers", options->workers, "engine threads")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  command->add_option("--sessions", options->sessions, "sessions in each of the shared and local phases")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100000u));
  command->add_option("--turns", options->turns, "turns a session")->capture_default_str()->check(CLI::Range(1u, 100u));
  command->add_option("--first-tokens", options->first_tokens, "the first turn's prompt")->capture_default_str();
  command->add_option("--turn-tokens", options->turn_tokens, "tokens each later turn adds")->capture_default_str();
  command->add_option("--chunk-tokens", options->chunk_tokens, "tokens a chunk (1 KiB each)")->capture_default_str();
  command->add_option("--think-ms", options->think_ms, "at least this between a session's turns")
      ->capture_default_str();
  command
      ->add_option("--compute-ms-per-chunk", options->compute_ms_per_chunk,
                   "simulated compute of a missed chunk, added to the measured Lookup + load time for the TTFT")
      ->capture_default_str();
  command->add_option("--dram-mib", options->dram_mib, "each daemon's DRAM tier")->capture_default_str();
  command->add_option("--disk-mib", options->disk_mib, "each daemon's disk tier")->capture_default_str();
  command->add_option("--failover-seconds", options->failover_seconds, "length of the failover phase")
      ->capture_default_str();
  command
      ->add_option("--manual-failover-at", options->manual_failover_at_s,
                   "when master 0 is failed over by hand (then killed), s into the phase")
      ->capture_default_str();
  command->add_option("--kill-at", options->kill_at_s, "when master 1 is killed, s into the phase")
      ->capture_default_str();
  command->add_option("--window-seconds", options->window_s, "the hit rate's windows")->capture_default_str();
  RunWhenParsed(command, options, RunFleetBench);
}

}  // namespace cake::bench
