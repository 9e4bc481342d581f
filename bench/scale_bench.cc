// cake-bench scale: how caked's costs grow. Four curves, each with a fitted slope:
//  - calls: Lookup of a stored 16K-token prompt and Ping per second, and their p99, with more clients at once;
//  - loads: the daemon's CPU per loaded chunk and the time to first token (load Start to Done) with more I/O-only
//    loads from the DRAM tier at once;
//  - dram, disk: the daemon's memory per stored chunk beyond the chunks' own bytes (the tiers' indexes), at growing
//    chunk counts, and for the disk tier the start-up after a clean stop and after a crash.
// Every figure comes from a private caked the bench configures itself, so its limits and memory are known.
#include <sys/statvfs.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <mutex>
#include <span>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "bench/bench_command.h"
#include "bench/bench_common.h"
#include "bench/benchmarks.h"
#include "keys/namespace.h"
#include "spdlog/spdlog.h"
#include "storage/chunk_file.h"
#include "storage/disk/clean_stop_index.h"
#include "storage/disk/disk_tier.h"
#include "storage/host_arena.h"

namespace cake::bench {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
// 32 bytes of KV per token (one layer, one KV head, head_dim 8, bf16): what a chunk costs the daemon besides its
// bytes does not depend on the model, and small chunks keep millions of them within this machine's memory.
constexpr uint32_t kBytesPerToken = 32;
// The daemon's smallest chunk (limits.min_chunk_bytes) and a DRAM extent's page: 128 tokens here.
constexpr uint64_t kSmallChunkBytes = 4096;
constexpr uint32_t kSmallChunkTokens = kSmallChunkBytes / kBytesPerToken;
// The Lookup prompt: 16K tokens in 64 chunks of 256 tokens, all stored, so each Lookup hashes the prompt and finds
// every chunk (docs/benchmarks.md section 1's short prompt).
constexpr uint32_t kLookupTokens = 16 * 1024;
constexpr uint32_t kLookupChunkTokens = 256;
// Time each calls phase runs before it is measured: every client connected and past its first calls.
constexpr auto kCallWarmup = std::chrono::milliseconds(300);
// Each concurrency of loads runs rounds until at least this many loads were timed, so p99 is a percentile of
// hundreds of samples rather than the slowest of a handful.
constexpr uint32_t kLoadsPerPoint = 256;
constexpr uint32_t kMinLoadRounds = 3;
// Chunks per Store while the DRAM tier fills: limits.max_prompt_tokens (1M) / 128 tokens.
constexpr uint32_t kStoreBatchChunks = 8192;
// Disk: threads creating chunk files in process (each Write syncs its file and folder: many overlap those waits),
// a file's footprint on disk (a 4 KiB header and the 4 KiB payload), and how long a start may take.
constexpr uint32_t kDiskWriters = 16;
constexpr uint64_t kDiskFileBytes = 8192;
constexpr auto kCakedStartLimit = std::chrono::seconds(300);
constexpr auto kCheckpointWait = std::chrono::seconds(120);

NamespaceSpec ScaleNamespace(uint32_t chunk_tokens) {
  NamespaceSpec ns;
  ns.model_id = "cake-bench/scale";
  ns.num_layers = 1;
  ns.num_kv_heads = 1;
  ns.head_dim = 8;
  ns.dtype = DType::kBf16;
  ns.chunk_tokens = chunk_tokens;
  ns.tenant = "cake-bench";
  return ns;
}

// ---- fits ----

// y = intercept + slope * x by least squares; r2 is the share of y's variance the line explains. NaN with fewer
// than two distinct x.
struct Fit {
  size_t points = 0;
  double slope = std::numeric_limits<double>::quiet_NaN();
  double intercept = std::numeric_limits<double>::quiet_NaN();
  double r2 = std::numeric_limits<double>::quiet_NaN();
};

Fit LinearFit(const std::vector<double>& xs, const std::vector<double>& ys) {
  Fit fit;
  const size_t n = std::min(xs.size(), ys.size());
  fit.points = n;
  if (n < 2) return fit;
  double mx = 0, my = 0;
  for (size_t i = 0; i < n; ++i) {
    mx += xs[i];
    my += ys[i];
  }
  mx /= static_cast<double>(n);
  my /= static_cast<double>(n);
  double sxx = 0, sxy = 0, syy = 0;
  for (size_t i = 0; i < n; ++i) {
    sxx += (xs[i] - mx) * (xs[i] - mx);
    sxy += (xs[i] - mx) * (ys[i] - my);
    syy += (ys[i] - my) * (ys[i] - my);
  }
  if (sxx == 0) return fit;
  fit.slope = sxy / sxx;
  fit.intercept = my - fit.slope * mx;
  fit.r2 = syy == 0 ? 1 : sxy * sxy / (sxx * syy);
  return fit;
}

// The exponent b of y = a * x^b: least squares on log y against log x, over the points where both are positive
// and finite. b = 1 is linear growth, 0 none.
Fit LogLogFit(const std::vector<double>& xs, const std::vector<double>& ys) {
  std::vector<double> lx, ly;
  for (size_t i = 0; i < std::min(xs.size(), ys.size()); ++i) {
    if (xs[i] > 0 && ys[i] > 0 && std::isfinite(xs[i]) && std::isfinite(ys[i])) {
      lx.push_back(std::log(xs[i]));
      ly.push_back(std::log(ys[i]));
    }
  }
  return LinearFit(lx, ly);
}

std::string FitText(const Fit& fit) {
  if (!std::isfinite(fit.slope)) return "n/a";
  // Through two points a line fits exactly: r2 says something only from three on.
  return fit.points >= 3 ? absl::StrFormat("%.3f (r2 %.3f)", fit.slope, fit.r2) : absl::StrFormat("%.3f", fit.slope);
}

// ---- the JSON rows ----

std::string JsonArray(const std::vector<JsonReport>& rows) {
  return absl::StrCat(
      "[", absl::StrJoin(rows, ",", [](std::string* out, const JsonReport& r) { out->append(r.ToString()); }), "]");
}

// A label as part of a JSON key: "crash-no-index" -> "crash_no_index".
std::string JsonKey(std::string label) {
  std::replace(label.begin(), label.end(), '-', '_');
  return label;
}

// What one thread of many saw first go wrong.
class FirstError {
 public:
  void Set(const absl::Status& status) {
    std::lock_guard lock(mu_);
    if (status_.ok()) status_ = status;
  }
  absl::Status Get() {
    std::lock_guard lock(mu_);
    return status_;
  }

 private:
  std::mutex mu_;
  absl::Status status_;
};

// ---- /proc ----

// The daemon's resident memory. Its DRAM tier is one anonymous mapping (storage/host_arena.h) holding the chunks'
// bytes in whole pages; everything else anonymous (the heap: indexes, gRPC, thread stacks) lies beyond it.
// Regions are shared memory, not anonymous, so the bench's own regions mapped into the daemon count in neither.
struct DaemonMemory {
  uint64_t vm_rss = 0;           // /proc/<pid>/status VmRSS: everything resident, shared memory included
  uint64_t anonymous = 0;        // the Anonymous of every mapping in /proc/<pid>/smaps
  uint64_t arena_anonymous = 0;  // ... of the DRAM arena's mapping
  uint64_t BeyondArena() const { return anonymous - arena_anonymous; }
};

// `arena_bytes`: the size of the DRAM arena's mapping, which is how it is told from the others.
absl::StatusOr<DaemonMemory> ReadDaemonMemory(pid_t pid, uint64_t arena_bytes) {
  DaemonMemory memory;
  {
    std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
    for (std::string line; std::getline(status, line);) {
      unsigned long long kb = 0;
      if (std::sscanf(line.c_str(), "VmRSS: %llu kB", &kb) == 1) memory.vm_rss = kb * 1024;
    }
  }
  std::ifstream smaps(absl::StrCat("/proc/", pid, "/smaps"));
  if (!smaps) return absl::UnavailableError(absl::StrCat("cannot read /proc/", pid, "/smaps"));
  bool in_arena = false, arena_found = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long long begin = 0, end = 0, kb = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx ", &begin, &end) == 2 && line.find(':') > line.find(' ')) {
      in_arena = end - begin == arena_bytes;
      arena_found = arena_found || in_arena;
    } else if (std::sscanf(line.c_str(), "Anonymous: %llu kB", &kb) == 1) {
      memory.anonymous += kb * 1024;
      if (in_arena) memory.arena_anonymous += kb * 1024;
    }
  }
  if (!arena_found) {
    return absl::InternalError(
        absl::StrCat("no mapping of ", arena_bytes, " bytes (the DRAM arena) in /proc/", pid, "/smaps"));
  }
  return memory;
}

// The DRAM arena's mapping for caked --dram-capacity-mib `mib` (DramTier reserves half again its capacity).
uint64_t ArenaBytes(uint64_t mib) { return ExtentAllocator::Rounded(mib * kMiB + mib * kMiB / 2); }

// MemAvailable from /proc/meminfo, bytes; 0 when unknown.
uint64_t MemAvailableBytes() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    unsigned long long kb = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kb) == 1) return kb * 1024;
  }
  return 0;
}

// ---- clients with connections of their own ----

// `count` clients of one daemon, each on a connection of its own, as engines in separate processes would be.
// gRPC shares one connection among the channels of a process that name the same address with the same arguments
// (its global subchannel pool), so each client reaches the socket through a symbolic link of its own: a distinct
// address, a distinct connection. Each has its own client id, so the per-client load cap counts each alone.
class ClientPool {
 public:
  static absl::StatusOr<ClientPool> Connect(const std::string& socket_path, uint32_t count) {
    CAKE_ASSIGN_OR_RETURN(auto links, ScratchDir::Create("cake-bench-scale-links"));
    ClientPool pool(std::move(links));
    for (uint32_t i = 0; i < count; ++i) {
      const fs::path link = pool.links_.path() / absl::StrCat("c", i, ".sock");
      std::error_code ec;
      fs::create_symlink(socket_path, link, ec);
      if (ec) return absl::InternalError(absl::StrCat("cannot link ", link.string(), ": ", ec.message()));
      CAKE_ASSIGN_OR_RETURN(auto client, Client::Connect({link.string(), absl::StrCat(kClientId, "-scale-", i)}));
      pool.clients_.push_back(std::move(client));
    }
    return pool;
  }
  std::span<const std::unique_ptr<Client>> clients() const { return clients_; }
  Client& operator[](size_t i) const { return *clients_[i]; }

 private:
  explicit ClientPool(ScratchDir links) : links_(std::move(links)) {}
  ScratchDir links_;  // declared first: the clients go before their links
  std::vector<std::unique_ptr<Client>> clients_;
};

// The config of the daemon serving the calls and loads: room for every client's connection (all one uid, one
// peer to the daemon) and for every load at once (single-user mode: one principal).
std::string CallsAndLoadsConfig(uint32_t clients, uint32_t loads, uint64_t dram_bytes) {
  const uint32_t per_peer = clients + 16;  // the bench's own client, and slack for connections closing
  const uint32_t max_loads = std::max<uint32_t>(256, loads);
  return absl::StrCat("[server]\nmax_connections = ", std::max<uint32_t>(1024, per_peer),
                      "\nmax_connections_per_peer = ", per_peer, "\n[limits]\nmax_concurrent_loads = ", max_loads,
                      "\nmax_concurrent_loads_per_principal = ", max_loads, "\n[dram]\ncapacity_bytes = ", dram_bytes,
                      "\n");
}

// ---- calls: Lookup and Ping with more clients at once ----

struct PhaseSamples {
  std::vector<double> latency_us;
  double seconds = 0;
};

// `call` in a loop on each of `clients` at once: after kCallWarmup, the calls that started and ended within the
// next `seconds` are timed.
absl::StatusOr<PhaseSamples> RunCallPhase(std::span<const std::unique_ptr<Client>> clients, double seconds,
                                          const std::function<absl::Status(Client&)>& call) {
  enum : int { kWarm, kMeasure, kStop };
  std::atomic<int> phase{kWarm};
  std::vector<std::vector<double>> samples(clients.size());
  FirstError error;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < clients.size(); ++i) {
    threads.emplace_back([&, i] {
      for (;;) {
        const int at_start = phase.load();
        if (at_start == kStop) return;
        const Clock::time_point start = Clock::now();
        const absl::Status s = call(*clients[i]);
        const double us = MicrosecondsSince(start);
        if (!s.ok()) {
          error.Set(s);
          phase = kStop;
          return;
        }
        if (at_start == kMeasure && phase.load() == kMeasure) samples[i].push_back(us);
      }
    });
  }
  std::this_thread::sleep_for(kCallWarmup);
  int warm = kWarm;
  phase.compare_exchange_strong(warm, kMeasure);
  const Clock::time_point start = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  phase = kStop;
  PhaseSamples out;
  out.seconds = SecondsSince(start);
  for (std::thread& t : threads) t.join();
  CAKE_RETURN_IF_ERROR(error.Get());
  for (const auto& s : samples) out.latency_us.insert(out.latency_us.end(), s.begin(), s.end());
  return out;
}

struct CallPoint {
  uint32_t clients = 0;
  double ping_per_s = 0, ping_p50_us = 0, ping_p99_us = 0;
  double lookup_per_s = 0, lookup_p50_us = 0, lookup_p99_us = 0;
};

absl::StatusOr<std::vector<CallPoint>> MeasureCalls(const ScaleOptions& options, Client& client,
                                                    const ClientPool& pool) {
  const NamespaceSpec ns = ScaleNamespace(kLookupChunkTokens);
  const uint32_t chunks = kLookupTokens / kLookupChunkTokens;
  const uint64_t chunk_bytes = uint64_t{kLookupChunkTokens} * kBytesPerToken;
  const std::vector<uint32_t> tokens = SyntheticPrompt(kLookupTokens, 16);
  const PromptRef prompt = TokensPrompt(tokens);
  {
    CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(chunks * chunk_bytes));
    absl::Cleanup release_region = [&] { client.ReleaseRegion(region).IgnoreError(); };
    for (uint32_t c = 0; c < chunks; ++c) FillChunkPattern({region.data() + c * chunk_bytes, chunk_bytes}, c);
    CAKE_RETURN_IF_ERROR(client.Store(ns, prompt, 0, chunks, region, 0).status());
  }
  const auto lookup = [&](Client& on) -> absl::Status {
    CAKE_ASSIGN_OR_RETURN(auto found, on.Lookup(ns, prompt));
    if (found.cached_chunks != chunks) {
      return absl::FailedPreconditionError(
          absl::StrCat("the stored 16K-token prompt had ", found.cached_chunks, " of ", chunks, " chunks cached"));
    }
    return absl::OkStatus();
  };
  const auto ping = [](Client& on) { return on.Ping(); };

  std::vector<CallPoint> points;
  for (uint32_t n : options.clients) {
    const auto clients = pool.clients().first(n);
    PhaseSamples pings, lookups;
    double ping_s = 0, lookup_s = 0;
    // Ping and Lookup phases alternate, so a slow spell of the shared machine falls on both.
    for (uint32_t round = 0; round < options.rounds; ++round) {
      CAKE_ASSIGN_OR_RETURN(auto p, RunCallPhase(clients, options.seconds, ping));
      CAKE_ASSIGN_OR_RETURN(auto l, RunCallPhase(clients, options.seconds, lookup));
      pings.latency_us.insert(pings.latency_us.end(), p.latency_us.begin(), p.latency_us.end());
      lookups.latency_us.insert(lookups.latency_us.end(), l.latency_us.begin(), l.latency_us.end());
      ping_s += p.seconds;
      lookup_s += l.seconds;
    }
    CallPoint point;
    point.clients = n;
    point.ping_per_s = static_cast<double>(pings.latency_us.size()) / ping_s;
    point.ping_p50_us = Percentile(pings.latency_us, 50);
    point.ping_p99_us = Percentile(pings.latency_us, 99);
    point.lookup_per_s = static_cast<double>(lookups.latency_us.size()) / lookup_s;
    point.lookup_p50_us = Percentile(lookups.latency_us, 50);
    point.lookup_p99_us = Percentile(lookups.latency_us, 99);
    std::printf("  calls, %3u clients: Lookup %8.0f/s p99 %9.1f us; Ping %8.0f/s p99 %9.1f us\n", n, point.lookup_per_s,
                point.lookup_p99_us, point.ping_per_s, point.ping_p99_us);
    std::fflush(stdout);
    points.push_back(point);
  }
  return points;
}

// ---- loads: daemon CPU per chunk and TTFT with more loads at once ----

struct LoadPoint {
  uint32_t loads = 0, rounds = 0;
  double cpu_us_per_chunk = 0, wall_us_per_chunk = 0;
  double ttft_mean_ms = 0, ttft_p50_ms = 0, ttft_p99_ms = 0, ttft_max_ms = 0;
};

absl::StatusOr<std::vector<LoadPoint>> MeasureLoads(const ScaleOptions& options, pid_t daemon_pid,
                                                    const ClientPool& pool) {
  const NamespaceSpec ns = ScaleNamespace(kSmallChunkTokens);
  const uint32_t chunks = options.load_chunks;
  const uint64_t load_bytes = uint64_t{chunks} * kSmallChunkBytes;
  const uint32_t most = *std::max_element(options.loads.begin(), options.loads.end());
  // Each client stores a prompt of its own and registers a region of its own to load it into.
  std::vector<std::vector<uint32_t>> prompts(most);
  std::vector<MappedRegion> regions;
  absl::Cleanup release_regions = [&] {
    for (size_t i = 0; i < regions.size(); ++i) pool[i].ReleaseRegion(regions[i]).IgnoreError();
  };
  for (uint32_t i = 0; i < most; ++i) {
    prompts[i] = SyntheticPrompt(uint64_t{chunks} * kSmallChunkTokens, 1000 + i);
    CAKE_ASSIGN_OR_RETURN(auto region, pool[i].RegisterRegion(load_bytes));
    regions.push_back(std::move(region));
    for (uint32_t c = 0; c < chunks; ++c) {
      FillChunkPattern({regions[i].data() + c * kSmallChunkBytes, kSmallChunkBytes}, c);
    }
    CAKE_RETURN_IF_ERROR(pool[i].Store(ns, TokensPrompt(prompts[i]), 0, chunks, regions[i], 0).status());
  }

  std::vector<LoadPoint> points;
  for (uint32_t n : options.loads) {
    const uint32_t rounds = std::max(kMinLoadRounds, (kLoadsPerPoint + n - 1) / n);
    std::vector<std::vector<double>> ttft_ms(n);
    FirstError error;
    // Every load of a round starts at once; the bytes are checked and the loads released after all are Done,
    // outside the timed part, so no client's checking takes CPU from another's load.
    std::barrier start_line(static_cast<std::ptrdiff_t>(n) + 1);
    std::barrier finish_line(static_cast<std::ptrdiff_t>(n) + 1);
    std::vector<std::thread> threads;
    for (uint32_t i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        LoadOptions load;
        load.ns = ns;
        load.prompt = TokensPrompt(prompts[i]);
        load.region = &regions[i];
        load.io_only = true;
        // A client that failed keeps arriving at both lines, so the others never wait for it forever.
        bool failed = false;
        for (uint32_t round = 0; round < rounds; ++round) {
          std::memset(regions[i].data(), 0, load_bytes);
          start_line.arrive_and_wait();
          std::unique_ptr<LoadSession> session;
          if (!failed) {
            const Clock::time_point start = Clock::now();
            absl::StatusOr<std::unique_ptr<LoadSession>> started = pool[i].StartLoad(load);
            absl::Status s = started.status();
            if (s.ok()) {
              session = std::move(*started);
              absl::StatusOr<LoadDone> done = session->WaitDone();
              ttft_ms[i].push_back(1e3 * SecondsSince(start));
              s = done.status();
              if (s.ok() && done->loaded_chunks != chunks) {
                s = absl::InternalError(absl::StrCat("a load of ", chunks, " chunks loaded ", done->loaded_chunks));
              }
            }
            if (!s.ok()) {
              error.Set(s);
              failed = true;
            }
          }
          finish_line.arrive_and_wait();
          if (failed || session == nullptr) continue;
          for (uint32_t c = 0; c < chunks && !failed; ++c) {
            const absl::Status s =
                CheckChunkPattern({regions[i].data() + session->RegionOffset(c), kSmallChunkBytes}, c);
            if (!s.ok()) {
              error.Set(s);
              failed = true;
            }
          }
          if (absl::Status s = session->Release(); !s.ok()) {
            error.Set(s);
            failed = true;
          }
        }
      });
    }
    CAKE_ASSIGN_OR_RETURN(const double cpu_before, ProcessCpuSeconds(daemon_pid));
    const Clock::time_point start = Clock::now();
    for (uint32_t round = 0; round < rounds; ++round) {
      start_line.arrive_and_wait();
      finish_line.arrive_and_wait();
    }
    for (std::thread& t : threads) t.join();
    const double wall_s = SecondsSince(start);
    CAKE_ASSIGN_OR_RETURN(const double cpu_after, ProcessCpuSeconds(daemon_pid));
    CAKE_RETURN_IF_ERROR(error.Get());

    std::vector<double> all;
    for (const auto& t : ttft_ms) all.insert(all.end(), t.begin(), t.end());
    const double total_chunks = static_cast<double>(all.size()) * chunks;
    LoadPoint point;
    point.loads = n;
    point.rounds = rounds;
    point.cpu_us_per_chunk = (cpu_after - cpu_before) / total_chunks * 1e6;
    point.wall_us_per_chunk = wall_s / total_chunks * 1e6;
    point.ttft_mean_ms = Mean(all);
    point.ttft_p50_ms = Median(all);
    point.ttft_p99_ms = Percentile(all, 99);
    point.ttft_max_ms = Max(all);
    std::printf("  loads, %3u at once x %u rounds: daemon CPU %.1f us/chunk; TTFT mean %.2f ms, p99 %.2f ms\n", n,
                rounds, point.cpu_us_per_chunk, point.ttft_mean_ms, point.ttft_p99_ms);
    std::fflush(stdout);
    points.push_back(point);
  }
  return points;
}

// ---- memory per stored chunk ----

struct MemoryPoint {
  std::string tier;   // "dram" or "disk"
  std::string start;  // disk: how the daemon came up ("clean", "crash", "crash-no-index"); dram: "stored"
  uint64_t chunks = 0;
  DaemonMemory memory;
  double beyond_arena_delta = 0;  // over the same daemon's (dram) or an empty tier's (disk) baseline
  double per_chunk = 0;
  double fill_s = 0;  // dram: the Stores of this step; disk: creating this step's files
};

struct Skipped {
  std::string tier;
  uint64_t chunks = 0;
  std::string why;
};

// Fills the DRAM tier of one daemon step by step to each size (Stores of 8,192 chunks of 4 KiB named by engine
// keys) and reads its memory at each.
absl::StatusOr<std::vector<MemoryPoint>> MeasureDramMemory(const std::vector<uint64_t>& sizes) {
  std::vector<MemoryPoint> points;
  if (sizes.empty()) return points;
  constexpr uint32_t kWarmupChunks = 64;
  const uint64_t most = sizes.back();
  const uint64_t dram_mib = ((most + kWarmupChunks) * kSmallChunkBytes + kMiB - 1) / kMiB + 64;
  CAKE_ASSIGN_OR_RETURN(auto target, OpenDaemon("", {"--dram-capacity-mib", absl::StrCat(dram_mib), "--no-cuda"}));
  Client& client = *target.client;
  const pid_t pid = target.spawned->pid();
  const uint64_t arena_bytes = ArenaBytes(dram_mib);
  const NamespaceSpec ns = ScaleNamespace(kSmallChunkTokens);
  CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(uint64_t{kStoreBatchChunks} * kSmallChunkBytes));
  absl::Cleanup release_region = [&] { client.ReleaseRegion(region).IgnoreError(); };
  // The bytes do not matter to the index: one batch's worth, filled once, stored under ever new keys.
  for (uint32_t c = 0; c < kStoreBatchChunks; ++c) {
    FillChunkPattern({region.data() + c * kSmallChunkBytes, kSmallChunkBytes}, c);
  }
  uint32_t batch = 0;
  const auto store_batch = [&](uint32_t count) -> absl::Status {
    std::vector<std::string> keys;
    keys.reserve(count);
    for (uint32_t i = 0; i < count; ++i) keys.push_back(absl::StrFormat("%08x%08x", batch, i));
    ++batch;
    CAKE_ASSIGN_OR_RETURN(auto stored, client.Store(ns, PromptRef{{}, keys}, 0, count, region, 0));
    if (stored.stored_chunks != count) {
      return absl::InternalError(absl::StrCat("a Store of ", count, " new chunks stored ", stored.stored_chunks));
    }
    return absl::OkStatus();
  };
  // The baseline is read after one small Store, so the threads and buffers every Store needs are there already.
  CAKE_RETURN_IF_ERROR(store_batch(kWarmupChunks));
  CAKE_ASSIGN_OR_RETURN(const DaemonMemory baseline, ReadDaemonMemory(pid, arena_bytes));
  uint64_t stored = 0;
  for (uint64_t n : sizes) {
    const Clock::time_point start = Clock::now();
    while (stored < n) {
      const uint32_t count = static_cast<uint32_t>(std::min<uint64_t>(kStoreBatchChunks, n - stored));
      CAKE_RETURN_IF_ERROR(store_batch(count));
      stored += count;
    }
    const double fill_s = SecondsSince(start);
    CAKE_ASSIGN_OR_RETURN(auto status, client.Status());
    for (const DaemonStatus::Tier& tier : status.tiers) {
      if (tier.kind == TierKind::kDram && tier.chunks != n + kWarmupChunks) {
        return absl::InternalError(
            absl::StrCat("the DRAM tier holds ", tier.chunks, " chunks, not ", n + kWarmupChunks, ": evicted?"));
      }
    }
    CAKE_ASSIGN_OR_RETURN(const DaemonMemory memory, ReadDaemonMemory(pid, arena_bytes));
    MemoryPoint point;
    point.tier = "dram";
    point.start = "stored";
    point.chunks = n;
    point.memory = memory;
    point.beyond_arena_delta = static_cast<double>(memory.BeyondArena()) - static_cast<double>(baseline.BeyondArena());
    point.per_chunk = point.beyond_arena_delta / static_cast<double>(n);
    point.fill_s = fill_s;
    std::printf("  dram, %9llu chunks: %.1f bytes/chunk beyond the arena; arena %.0f bytes/chunk; VmRSS %.0f MiB\n",
                static_cast<unsigned long long>(n), point.per_chunk,
                static_cast<double>(memory.arena_anonymous) / static_cast<double>(n + kWarmupChunks),
                static_cast<double>(memory.vm_rss) / kMiB);
    std::fflush(stdout);
    points.push_back(point);
  }
  return points;
}

// Distinct keys whose first 8 bytes (what the index hashes) are well mixed, as real (SHA-256) keys are.
ChunkKey SyntheticDiskKey(uint64_t i) {
  uint64_t mixed = i + 0x9e3779b97f4a7c15ull;
  mixed = (mixed ^ (mixed >> 30)) * 0xbf58476d1ce4e5b9ull;
  mixed = (mixed ^ (mixed >> 27)) * 0x94d049bb133111ebull;
  mixed ^= mixed >> 31;
  ChunkKey key;
  std::memcpy(key.bytes.data(), &mixed, 8);
  std::memcpy(key.bytes.data() + 8, &i, 8);
  return key;
}

// Creates chunk files [from, to) in the disk tier at `root`, in this process through DiskTier::Write (as
// cake-bench rebuild does: far faster than Stores and write-back), and closes the tier, which writes its
// clean-stop index.
absl::Status CreateDiskChunks(const fs::path& root, uint64_t capacity_bytes, uint64_t from, uint64_t to) {
  DiskTier::Options o;
  o.root = root;
  o.capacity_bytes = capacity_bytes;
  o.index_checkpoint_interval = std::chrono::milliseconds(0);  // the close writes the index
  CAKE_ASSIGN_OR_RETURN(auto tier, DiskTier::Open(o));
  if (tier->recovery().chunks_recovered != from) {
    return absl::InternalError(absl::StrCat("the disk tier at ", root.string(), " held ",
                                            tier->recovery().chunks_recovered, " chunks, not ", from));
  }
  std::atomic<uint64_t> next{from};
  FirstError error;
  std::vector<std::thread> writers;
  for (uint32_t t = 0; t < kDiskWriters; ++t) {
    writers.emplace_back([&] {
      std::vector<std::byte> payload(kSmallChunkBytes);
      for (uint64_t i = next++; i < to; i = next++) {
        std::memcpy(payload.data(), &i, sizeof i);
        if (absl::Status s = tier->Write(SyntheticDiskKey(i), payload); !s.ok()) {
          error.Set(s);
          next = to;
        }
      }
    });
  }
  for (std::thread& w : writers) w.join();
  return error.Get();
}

struct StartPoint {
  uint64_t chunks = 0;
  std::string start;    // "clean", "crash" (SIGKILL after the post-start checkpoint), "crash-no-index"
  double wall_s = 0;    // spawn until Ping answers
  double logged_s = 0;  // the disk tier's recovery as caked logged it
};

// Waits until the disk tier at `root` has written an index of `chunks` entries (the checkpoint a start that
// recovered chunks writes right away), so what the daemon holds is its steady state and a SIGKILL leaves it.
absl::Status WaitForCheckpoint(const fs::path& root, uint64_t chunks) {
  const fs::path index = root / std::string(kChunkLayoutFolder) / std::string(kCleanStopIndexName);
  const uint64_t bytes = kCleanStopIndexHeaderBytes + chunks * kCleanStopIndexEntryBytes;
  const Clock::time_point deadline = Clock::now() + kCheckpointWait;
  for (;;) {
    std::error_code ec;
    if (fs::file_size(index, ec) == bytes && !ec) return absl::OkStatus();
    if (Clock::now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("no index checkpoint of ", chunks, " chunks at ", index.string(),
                                                      " after ", kCheckpointWait.count(), " s"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

struct DiskResults {
  std::vector<MemoryPoint> memory;
  std::vector<StartPoint> starts;
  double baseline_beyond_arena = 0;
  bool cache_dropped = true;
};

// For each size: create the files up to it, then start caked on them three ways, cold (page cache, dentries and
// inodes dropped first): after a clean stop (the index its close wrote), after a SIGKILL once its start-up
// checkpoint was written (what a crash leaves now), and after a SIGKILL with the index deleted (a crash before
// any checkpoint: every header read). Each start is timed until Ping answers, and its memory read once it has
// written its own checkpoint.
absl::StatusOr<DiskResults> MeasureDisk(const ScaleOptions& options, const std::vector<uint64_t>& sizes) {
  DiskResults results;
  if (sizes.empty()) return results;
  spdlog::set_level(spdlog::level::warn);  // the in-process tier's recovery lines; the summary says what matters
  CAKE_ASSIGN_OR_RETURN(auto root, FreshPath(options.dir, "cake-bench-scale"));
  absl::Cleanup remove_root = [&] { RemoveQuietly(root); };
  const uint64_t capacity_bytes = 2 * sizes.back() * kSmallChunkBytes;
  constexpr uint64_t kDiskDaemonDramMib = 64;  // untouched: no chunk is stored through this daemon
  const uint64_t arena_bytes = ArenaBytes(kDiskDaemonDramMib);
  const std::vector<std::string> caked_args = {"--disk-root",
                                               root.string(),
                                               "--disk-capacity-mib",
                                               absl::StrCat(capacity_bytes / kMiB + 1),
                                               "--dram-capacity-mib",
                                               absl::StrCat(kDiskDaemonDramMib),
                                               "--no-cuda"};
  const fs::path index = root / std::string(kChunkLayoutFolder) / std::string(kCleanStopIndexName);
  const auto start_daemon = [&]() -> absl::StatusOr<std::pair<SpawnedDaemon, double>> {
    results.cache_dropped = DropPageCache() && results.cache_dropped;
    const Clock::time_point spawn = Clock::now();
    CAKE_ASSIGN_OR_RETURN(auto daemon,
                          SpawnedDaemon::Start(SpawnedDaemon::SiblingCakedPath(), caked_args, kCakedStartLimit));
    const double wall = SecondsSince(spawn);
    return std::make_pair(std::move(daemon), wall);
  };

  // The baseline: the same daemon on an empty tier.
  {
    CAKE_ASSIGN_OR_RETURN(auto started, start_daemon());
    CAKE_ASSIGN_OR_RETURN(const DaemonMemory memory, ReadDaemonMemory(started.first.pid(), arena_bytes));
    results.baseline_beyond_arena = static_cast<double>(memory.BeyondArena());
    if (started.first.Stop() != 0) return absl::InternalError("caked did not stop cleanly: " + started.first.log());
  }

  uint64_t created = 0;
  for (uint64_t n : sizes) {
    const Clock::time_point create_start = Clock::now();
    CAKE_RETURN_IF_ERROR(CreateDiskChunks(root, capacity_bytes, created, n));
    const double create_s = SecondsSince(create_start);
    std::printf("  disk, %9llu chunks: %llu files created in %.1f s\n", static_cast<unsigned long long>(n),
                static_cast<unsigned long long>(n - created), create_s);
    std::fflush(stdout);
    created = n;

    for (const char* kind : {"clean", "crash", "crash-no-index"}) {
      const bool expect_index = std::string(kind) != "crash-no-index";
      if (!expect_index) {
        std::error_code ec;
        fs::remove(index, ec);
      }
      CAKE_ASSIGN_OR_RETURN(auto started, start_daemon());
      SpawnedDaemon& daemon = started.first;
      const std::string log = daemon.log();
      const auto logged = LoggedDiskRecovery(log);
      const bool used_index = log.find("from the clean-stop index") != std::string::npos;
      if (!logged || logged->first != n || used_index != expect_index) {
        return absl::InternalError(absl::StrCat("caked did not log recovering ", n, " chunks ",
                                                expect_index ? "from" : "without", " the index; its log:\n", log));
      }
      CAKE_RETURN_IF_ERROR(WaitForCheckpoint(root, n));
      CAKE_ASSIGN_OR_RETURN(const DaemonMemory memory, ReadDaemonMemory(daemon.pid(), arena_bytes));
      StartPoint start;
      start.chunks = n;
      start.start = kind;
      start.wall_s = started.second;
      start.logged_s = logged->second;
      results.starts.push_back(start);
      MemoryPoint point;
      point.tier = "disk";
      point.start = kind;
      point.chunks = n;
      point.memory = memory;
      point.beyond_arena_delta = static_cast<double>(memory.BeyondArena()) - results.baseline_beyond_arena;
      point.per_chunk = point.beyond_arena_delta / static_cast<double>(n);
      point.fill_s = create_s;
      results.memory.push_back(point);
      std::printf("  disk, %9llu chunks, start after %-14s: %.2f s (recovery %.2f s); %.1f bytes/chunk\n",
                  static_cast<unsigned long long>(n), kind, start.wall_s, start.logged_s, point.per_chunk);
      std::fflush(stdout);
      // The next start's premise: a clean start follows a crash, each crash follows a running daemon, and the
      // last one stops cleanly so the next size's files join an indexed tier.
      if (std::string(kind) == "crash-no-index") {
        if (daemon.Stop() != 0) return absl::InternalError("caked did not stop cleanly: " + daemon.log());
      } else {
        daemon.Kill();
      }
    }
  }
  return results;
}

// Which sizes each tier can hold on this machine, and why the others are left out.
void PlanSizes(const ScaleOptions& options, std::vector<uint64_t>& dram, std::vector<uint64_t>& disk,
               std::vector<Skipped>& skipped) {
  std::vector<uint64_t> sizes = options.sizes;
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  const bool want_dram = std::find(options.parts.begin(), options.parts.end(), "dram") != options.parts.end();
  const bool want_disk = std::find(options.parts.begin(), options.parts.end(), "disk") != options.parts.end();
  // DRAM: each chunk takes a whole 4 KiB page of the arena (limits.min_chunk_bytes is 4 KiB too), so the chunks'
  // bytes alone, plus room for the index and the rest of the machine, must fit in what the kernel has free.
  const uint64_t available = MemAvailableBytes();
  for (uint64_t n : want_dram ? sizes : std::vector<uint64_t>{}) {
    const uint64_t need = n * (kSmallChunkBytes + 512) + 2 * kGiB;
    if (available != 0 && need > available) {
      skipped.push_back({"dram", n,
                         absl::StrFormat("needs about %.1f GiB (%llu chunks of at least a 4 KiB page each, plus the "
                                         "index and 2 GiB of room); this machine has %.1f GiB available",
                                         static_cast<double>(need) / kGiB, static_cast<unsigned long long>(n),
                                         static_cast<double>(available) / kGiB)});
    } else {
      dram.push_back(n);
    }
  }
  // Disk: one file per chunk (8 KiB on disk, an inode each); the files stay for every larger size, so the largest
  // size decides. Creating them runs at 6,000 (docs/benchmarks.md section 4.2) to 13,000 a second here.
  struct statvfs fs_stats {};
  std::error_code ec;
  if (want_disk) fs::create_directories(options.dir, ec);
  const bool have_stats = want_disk && ::statvfs(options.dir.c_str(), &fs_stats) == 0;
  const uint64_t free_bytes = have_stats ? uint64_t{fs_stats.f_bavail} * fs_stats.f_frsize : 0;
  const uint64_t free_inodes = have_stats ? uint64_t{fs_stats.f_favail} : 0;
  for (uint64_t n : want_disk ? sizes : std::vector<uint64_t>{}) {
    const uint64_t need = n * kDiskFileBytes + n * kDiskFileBytes / 10 + kGiB;
    std::vector<std::string> why;
    if (have_stats && (need > free_bytes || n + n / 10 > free_inodes)) {
      why.push_back(absl::StrFormat(
          "needs about %.0f GB and %llu inodes in %s (a file of 8 KiB per chunk); it has %.0f GB and %llu inodes free",
          static_cast<double>(need) / 1e9, static_cast<unsigned long long>(n), options.dir.c_str(),
          static_cast<double>(free_bytes) / 1e9, static_cast<unsigned long long>(free_inodes)));
    }
    if (n > options.max_disk_chunks) {
      why.push_back(absl::StrFormat(
          "above --max-disk-chunks %llu: creating %llu chunk files at 6,000 to 13,000 a second takes %.0f to %.0f "
          "minutes",
          static_cast<unsigned long long>(options.max_disk_chunks), static_cast<unsigned long long>(n),
          static_cast<double>(n) / 13000 / 60, static_cast<double>(n) / 6000 / 60));
    }
    if (!why.empty()) {
      skipped.push_back({"disk", n, absl::StrJoin(why, "; and ")});
    } else {
      disk.push_back(n);
    }
  }
}

bool Wants(const ScaleOptions& options, const std::string& part) {
  return std::find(options.parts.begin(), options.parts.end(), part) != options.parts.end();
}

}  // namespace

absl::Status RunScaleBench(const ScaleOptions& options) {
  for (const std::string& part : options.parts) {
    if (part != "calls" && part != "loads" && part != "dram" && part != "disk") {
      return absl::InvalidArgumentError(absl::StrCat("unknown --parts entry ", part, ": calls, loads, dram, disk"));
    }
  }
  if (options.clients.empty() || options.loads.empty() || options.seconds <= 0 || options.rounds == 0 ||
      options.load_chunks == 0) {
    return absl::InvalidArgumentError("need --clients, --loads, --seconds, --rounds and --load-chunks above 0");
  }
  if (*std::min_element(options.clients.begin(), options.clients.end()) == 0 ||
      *std::min_element(options.loads.begin(), options.loads.end()) == 0) {
    return absl::InvalidArgumentError("--clients and --loads take counts of at least 1");
  }
  JsonReport report;
  std::vector<std::string> summary;  // printed at the end, after the progress lines

  // ---- calls and loads: one daemon, with room for every client's connection and every load ----
  if (Wants(options, "calls") || Wants(options, "loads")) {
    const uint32_t most_clients = *std::max_element(options.clients.begin(), options.clients.end());
    const uint32_t most_loads = *std::max_element(options.loads.begin(), options.loads.end());
    const uint32_t pool_size =
        std::max(Wants(options, "calls") ? most_clients : 0u, Wants(options, "loads") ? most_loads : 0u);
    const uint64_t dram_bytes = uint64_t{most_loads} * options.load_chunks * kSmallChunkBytes + 256 * kMiB;
    CAKE_ASSIGN_OR_RETURN(auto scratch, ScratchDir::Create("cake-bench-scale"));
    const std::string config = scratch.WriteFile("caked.toml", CallsAndLoadsConfig(pool_size, most_loads, dram_bytes));
    CAKE_ASSIGN_OR_RETURN(auto target, OpenDaemon("", {"--config", config, "--no-cuda"}));
    const pid_t pid = target.spawned->pid();
    CAKE_ASSIGN_OR_RETURN(auto pool, ClientPool::Connect(target.socket_path, pool_size));
    uint64_t connections = 0;
    if (auto stats = target.client->Stats(); stats.ok() && stats->contains("connections_open")) {
      connections = stats->at("connections_open");
    }
    std::printf("cake-bench scale: %u clients, each on a connection of its own (the daemon serves %llu)\n", pool_size,
                static_cast<unsigned long long>(connections));
    report.Set("connections_open", static_cast<double>(connections));

    if (Wants(options, "calls")) {
      CAKE_ASSIGN_OR_RETURN(auto points, MeasureCalls(options, *target.client, pool));
      std::vector<double> xs, lookup_rate, lookup_p99, ping_rate, ping_p99;
      std::vector<JsonReport> rows;
      std::string table = absl::StrFormat(
          "Lookup (16K tokens, 64 chunks, all cached) and Ping, %u rounds of %.1f s each per point\n"
          "  %8s %12s %11s %11s %12s %11s %11s %10s %10s\n",
          options.rounds, options.seconds, "clients", "Lookup/s", "p50 us", "p99 us", "Ping/s", "p50 us", "p99 us",
          "rate L/P", "p99 L/P");
      for (const CallPoint& p : points) {
        absl::StrAppendFormat(&table, "  %8u %12.0f %11.1f %11.1f %12.0f %11.1f %11.1f %10.3f %10.2f\n", p.clients,
                              p.lookup_per_s, p.lookup_p50_us, p.lookup_p99_us, p.ping_per_s, p.ping_p50_us,
                              p.ping_p99_us, p.lookup_per_s / p.ping_per_s, p.lookup_p99_us / p.ping_p99_us);
        xs.push_back(p.clients);
        lookup_rate.push_back(p.lookup_per_s);
        lookup_p99.push_back(p.lookup_p99_us);
        ping_rate.push_back(p.ping_per_s);
        ping_p99.push_back(p.ping_p99_us);
        JsonReport row;
        row.Set("clients", p.clients);
        row.Set("lookup_per_s", p.lookup_per_s);
        row.Set("lookup_p50_us", p.lookup_p50_us);
        row.Set("lookup_p99_us", p.lookup_p99_us);
        row.Set("ping_per_s", p.ping_per_s);
        row.Set("ping_p50_us", p.ping_p50_us);
        row.Set("ping_p99_us", p.ping_p99_us);
        row.Set("rate_lookup_over_ping", p.lookup_per_s / p.ping_per_s);
        row.Set("p99_lookup_over_ping", p.lookup_p99_us / p.ping_p99_us);
        rows.push_back(row);
      }
      const Fit f_lookup_rate = LogLogFit(xs, lookup_rate), f_lookup_p99 = LogLogFit(xs, lookup_p99),
                f_ping_rate = LogLogFit(xs, ping_rate), f_ping_p99 = LogLogFit(xs, ping_p99);
      absl::StrAppendFormat(&table,
                            "  log-log slopes against clients (1: grows in proportion, 0: flat): Lookup/s %s, "
                            "Lookup p99 %s; Ping/s %s, Ping p99 %s\n",
                            FitText(f_lookup_rate), FitText(f_lookup_p99), FitText(f_ping_rate), FitText(f_ping_p99));
      summary.push_back(table);
      report.SetRaw("calls", JsonArray(rows));
      report.Set("calls_seconds_per_phase", options.seconds);
      report.Set("calls_rounds", options.rounds);
      report.Set("lookup_per_s_loglog_slope", f_lookup_rate.slope);
      report.Set("lookup_p99_loglog_slope", f_lookup_p99.slope);
      report.Set("ping_per_s_loglog_slope", f_ping_rate.slope);
      report.Set("ping_p99_loglog_slope", f_ping_p99.slope);
    }

    if (Wants(options, "loads")) {
      CAKE_ASSIGN_OR_RETURN(auto points, MeasureLoads(options, pid, pool));
      std::vector<double> xs, cpu, mean, p99;
      std::vector<JsonReport> rows;
      std::string table = absl::StrFormat(
          "I/O-only loads from the DRAM tier into host regions, %u chunks of 4 KiB each, all starting at once\n"
          "  %8s %7s %14s %14s %11s %11s %11s %11s\n",
          options.load_chunks, "loads", "rounds", "CPU us/chunk", "wall us/chunk", "TTFT mean", "p50 ms", "p99 ms",
          "max ms");
      for (const LoadPoint& p : points) {
        absl::StrAppendFormat(&table, "  %8u %7u %14.2f %14.2f %11.3f %11.3f %11.3f %11.3f\n", p.loads, p.rounds,
                              p.cpu_us_per_chunk, p.wall_us_per_chunk, p.ttft_mean_ms, p.ttft_p50_ms, p.ttft_p99_ms,
                              p.ttft_max_ms);
        xs.push_back(p.loads);
        cpu.push_back(p.cpu_us_per_chunk);
        mean.push_back(p.ttft_mean_ms);
        p99.push_back(p.ttft_p99_ms);
        JsonReport row;
        row.Set("loads", p.loads);
        row.Set("rounds", p.rounds);
        row.Set("daemon_cpu_us_per_chunk", p.cpu_us_per_chunk);
        row.Set("wall_us_per_chunk", p.wall_us_per_chunk);
        row.Set("ttft_mean_ms", p.ttft_mean_ms);
        row.Set("ttft_p50_ms", p.ttft_p50_ms);
        row.Set("ttft_p99_ms", p.ttft_p99_ms);
        row.Set("ttft_max_ms", p.ttft_max_ms);
        rows.push_back(row);
      }
      const Fit f_cpu = LogLogFit(xs, cpu), f_mean = LogLogFit(xs, mean), f_p99 = LogLogFit(xs, p99);
      absl::StrAppendFormat(&table,
                            "  log-log slopes against loads at once: CPU per chunk %s (0: constant), TTFT mean %s, "
                            "TTFT p99 %s (1: in proportion)\n",
                            FitText(f_cpu), FitText(f_mean), FitText(f_p99));
      summary.push_back(table);
      report.SetRaw("loads", JsonArray(rows));
      report.Set("load_chunks", options.load_chunks);
      report.Set("load_chunk_bytes", static_cast<double>(kSmallChunkBytes));
      report.Set("cpu_per_chunk_loglog_slope", f_cpu.slope);
      report.Set("ttft_mean_loglog_slope", f_mean.slope);
      report.Set("ttft_p99_loglog_slope", f_p99.slope);
    }
  }

  // ---- memory and start-up at growing chunk counts ----
  std::vector<uint64_t> dram_sizes, disk_sizes;
  std::vector<Skipped> skipped;
  PlanSizes(options, dram_sizes, disk_sizes, skipped);
  for (const Skipped& s : skipped) {
    std::printf("  %s, %llu chunks: left out: %s\n", s.tier.c_str(), static_cast<unsigned long long>(s.chunks),
                s.why.c_str());
  }
  std::vector<MemoryPoint> memory;
  if (!dram_sizes.empty()) {
    CAKE_ASSIGN_OR_RETURN(auto points, MeasureDramMemory(dram_sizes));
    memory.insert(memory.end(), points.begin(), points.end());
  }
  DiskResults disk;
  if (!disk_sizes.empty()) {
    CAKE_ASSIGN_OR_RETURN(disk, MeasureDisk(options, disk_sizes));
    memory.insert(memory.end(), disk.memory.begin(), disk.memory.end());
  }
  if (!memory.empty() || !skipped.empty()) {
    std::string table =
        "Memory per stored chunk (4 KiB chunks): the daemon's anonymous memory outside the DRAM arena, over its "
        "baseline\n";
    absl::StrAppendFormat(&table, "  %-5s %-15s %10s %14s %12s %11s %10s %10s\n", "tier", "after", "chunks",
                          "beyond arena", "bytes/chunk", "arena MiB", "VmRSS MiB", "fill s");
    std::vector<JsonReport> rows;
    for (const MemoryPoint& p : memory) {
      absl::StrAppendFormat(&table, "  %-5s %-15s %10llu %12.1f M %12.1f %11.1f %10.1f %10.1f\n", p.tier, p.start,
                            static_cast<unsigned long long>(p.chunks), p.beyond_arena_delta / kMiB, p.per_chunk,
                            static_cast<double>(p.memory.arena_anonymous) / kMiB,
                            static_cast<double>(p.memory.vm_rss) / kMiB, p.fill_s);
      JsonReport row;
      row.Set("tier", p.tier);
      row.Set("after", p.start);
      row.Set("chunks", static_cast<double>(p.chunks));
      row.Set("beyond_arena_bytes", p.beyond_arena_delta);
      row.Set("bytes_per_chunk", p.per_chunk);
      row.Set("arena_anonymous_bytes", static_cast<double>(p.memory.arena_anonymous));
      row.Set("anonymous_bytes", static_cast<double>(p.memory.anonymous));
      row.Set("vm_rss_bytes", static_cast<double>(p.memory.vm_rss));
      row.Set(p.tier == "dram" ? "store_s" : "create_s", p.fill_s);
      rows.push_back(row);
    }
    // Memory against chunks: a straight line's slope is the bytes each chunk adds (the natural reading), and the
    // log-log slope says whether the growth is linear (1).
    for (const auto& [tier, after] : std::vector<std::pair<std::string, std::string>>{
             {"dram", "stored"}, {"disk", "clean"}, {"disk", "crash"}, {"disk", "crash-no-index"}}) {
      std::vector<double> xs, ys;
      for (const MemoryPoint& p : memory) {
        if (p.tier == tier && p.start == after) {
          xs.push_back(static_cast<double>(p.chunks));
          ys.push_back(p.beyond_arena_delta);
        }
      }
      if (xs.empty()) continue;
      const Fit linear = LinearFit(xs, ys), loglog = LogLogFit(xs, ys);
      if (std::isfinite(linear.slope)) {
        absl::StrAppendFormat(&table, "  %s after %s: linear fit %s bytes/chunk (intercept %.1f MiB); log-log %s\n",
                              tier, after, FitText(linear), linear.intercept / kMiB, FitText(loglog));
      } else {
        absl::StrAppendFormat(&table, "  %s after %s: one size, no fit\n", tier, after);
      }
      const std::string key = absl::StrCat(tier, "_", after == "stored" ? "" : JsonKey(after) + "_");
      report.Set(absl::StrCat(key, "bytes_per_chunk_linear_slope"), linear.slope);
      report.Set(absl::StrCat(key, "memory_loglog_slope"), loglog.slope);
    }
    std::vector<JsonReport> skipped_rows;
    for (const Skipped& s : skipped) {
      absl::StrAppendFormat(&table, "  %s at %llu chunks left out: %s\n", s.tier,
                            static_cast<unsigned long long>(s.chunks), s.why);
      JsonReport row;
      row.Set("tier", s.tier);
      row.Set("chunks", static_cast<double>(s.chunks));
      row.Set("why", s.why);
      skipped_rows.push_back(row);
    }
    summary.push_back(table);
    report.SetRaw("memory", JsonArray(rows));
    report.SetRaw("left_out", JsonArray(skipped_rows));
    if (!disk_sizes.empty()) report.Set("disk_baseline_beyond_arena_bytes", disk.baseline_beyond_arena);
  }
  if (!disk.starts.empty()) {
    std::string table = absl::StrFormat(
        "Disk tier start-up, until Ping answers (the tier's own recovery as caked logged it); page cache %s\n"
        "  %10s %-15s %10s %12s\n",
        disk.cache_dropped ? "dropped before each start" : "NOT dropped (needs root)", "chunks", "after", "start s",
        "recovery s");
    std::vector<JsonReport> rows;
    for (const StartPoint& s : disk.starts) {
      absl::StrAppendFormat(&table, "  %10llu %-15s %10.3f %12.3f\n", static_cast<unsigned long long>(s.chunks),
                            s.start, s.wall_s, s.logged_s);
      JsonReport row;
      row.Set("chunks", static_cast<double>(s.chunks));
      row.Set("after", s.start);
      row.Set("start_s", s.wall_s);
      row.Set("recovery_s", s.logged_s);
      rows.push_back(row);
    }
    for (const char* after : {"clean", "crash", "crash-no-index"}) {
      std::vector<double> xs, ys;
      for (const StartPoint& s : disk.starts) {
        if (s.start == after) {
          xs.push_back(static_cast<double>(s.chunks));
          ys.push_back(s.wall_s);
        }
      }
      const Fit loglog = LogLogFit(xs, ys), linear = LinearFit(xs, ys);
      if (std::isfinite(loglog.slope)) {
        absl::StrAppendFormat(&table, "  after %s: log-log slope %s; linear %.2f us per chunk\n", after,
                              FitText(loglog), linear.slope * 1e6);
      } else {
        absl::StrAppendFormat(&table, "  after %s: one size, no fit\n", after);
      }
      report.Set(absl::StrCat("start_", JsonKey(after), "_loglog_slope"), loglog.slope);
      report.Set(absl::StrCat("start_", JsonKey(after), "_us_per_chunk"), linear.slope * 1e6);
    }
    table +=
        "  after: clean = after a clean stop (its index); crash = SIGKILL once the start-up checkpoint was written; "
        "crash-no-index = SIGKILL with the index deleted (a crash before any checkpoint: every header read)\n";
    summary.push_back(table);
    report.SetRaw("starts", JsonArray(rows));
    report.Set("page_cache_dropped", disk.cache_dropped ? 1.0 : 0.0);
  }

  std::printf("\ncake-bench scale: how caked's costs grow\n");
  for (const std::string& table : summary) std::printf("\n%s", table.c_str());
  return report.WriteTo(options.json_path);
}

void AddScaleCommand(CLI::App& app) {
  auto options = std::make_shared<ScaleOptions>();
  CLI::App* command = app.add_subcommand(
      "scale", "how costs grow: calls and loads with more clients, index memory and start-up with more chunks");
  command->add_option("--json", options->json_path, "also write the results to this file as one JSON object");
  command->add_option("--dir", options->dir, "folder for the disk tier's chunk files")->capture_default_str();
  command->add_option("--parts", options->parts, "calls, loads, dram, disk (comma-separated)")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--clients", options->clients, "clients calling at once, one point each")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(1u, 4096u));
  command->add_option("--loads", options->loads, "loads at once, one point each")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(1u, 4096u));
  command->add_option("--sizes", options->sizes, "stored chunks, one point each per tier")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 32));
  command->add_option("--seconds", options->seconds, "each measured phase of calls")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 600.0));
  command->add_option("--rounds", options->rounds, "Ping and Lookup phases per point, alternating")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100u));
  command->add_option("--load-chunks", options->load_chunks, "4 KiB chunks per load")
      ->capture_default_str()
      ->check(CLI::Range(1u, 8192u));
  command->add_option("--max-disk-chunks", options->max_disk_chunks, "larger disk sizes are left out (time)")
      ->capture_default_str();
  RunWhenParsed(command, options, RunScaleBench);
}

}  // namespace cake::bench
