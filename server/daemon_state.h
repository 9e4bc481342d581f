// Everything the RPC handlers share inside one caked process. Owned by Daemon; handlers hold references.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "base/mutex.h"
#include "base/timers.h"
#include "cuda/cuda_backend.h"
#include "scheduler/io_pool.h"
#include "scheduler/planner.h"
#include "server/access.h"
#include "server/config.h"
#include "server/connection_gate.h"
#include "server/counters.h"
#include "server/health_service.h"
#include "server/inline_budget.h"
#include "server/load_metrics.h"
#include "server/prefetcher.h"
#include "server/region_registry.h"
#include "server/unix_listener.h"
#include "server/unstarted_streams.h"
#include "storage/tier_manager.h"

namespace cake {

// Where a live load is (values match cake.v1.LoadPhase): asking the tiers how much of the prompt they hold,
// loading, or met (the split is final; it waits for its engine's Release).
enum class LoadPhase : int { kLookingUp = 1, kLoading = 2, kMet = 3 };

// What an operator sees of one running load (cakectl loads).
struct LoadSummary {
  std::string load_id;
  std::string principal;  // empty in single-user mode
  std::string client_id;
  std::string tenant;
  std::string model;
  Strategy strategy = Strategy::kCake;
  LoadPhase phase = LoadPhase::kLookingUp;
  uint32_t total_chunks = 0;
  uint32_t cached_chunks = 0;
  uint32_t loaded_chunks = 0;     // landed so far
  uint32_t computed_through = 0;  // what the engine reported
  bool inline_bytes = false;
  double age_s = 0;
};

// Whose a live load is: what admission counts it against, and what can end it early (an operator's release of
// its region, a reload that revokes its principal).
struct LoadOwner {
  // Who is counted for fairness: the principal's name, or in single-user mode (one principal for every local
  // user) the peer's uid as "uid N", so one local user cannot hold every slot either.
  std::string fairness_key;
  std::string client_id;  // the client's own word: only a finer split within one principal
  std::string region_id;  // empty for inline loads
  PeerFacts peer;         // as the daemon saw the caller at Start, to ask a reloaded policy again
  std::string principal;  // the name the policy gave the caller at Start
  std::string tenant;     // the load's namespace's tenant, which a reloaded policy may take from the principal
};

// How many loads run at once: all together, per principal (fairness key) and per client of one principal.
struct LoadCaps {
  uint32_t total = 256;
  uint32_t per_principal = 256;
  uint32_t per_client = 256;
};

// Live loads, so a stopping daemon can cancel them, Status can count them and an operator can list them.
class LoadTracker {
 public:
  // A load ended from outside is told why; it finishes its stream with that status.
  using CancelFn = std::function<void(const absl::Status& why)>;
  // Returns a ticket, or RESOURCE_EXHAUSTED naming the cap (limits.max_concurrent_loads, ..._per_principal,
  // ..._per_client) that is full. Both callbacks may be called from any thread, never under the tracker's lock,
  // until Remove; `describe` answers nullopt for a load that is ending.
  absl::StatusOr<uint64_t> TryAdd(const LoadCaps& caps, LoadOwner owner, CancelFn cancel,
                                  std::function<std::optional<LoadSummary>()> describe = nullptr);
  void Remove(uint64_t ticket);
  // Ends every load for which `verdict` answers a status (never called under the tracker's lock... the verdict is;
  // it must not call back into the tracker). Returns how many.
  size_t CancelIf(const std::function<std::optional<absl::Status>(const LoadOwner&)>& verdict);
  void CancelAll(const absl::Status& why);
  // Ends the loads whose window lies in `region_id` (cakectl regions release --end-loads).
  size_t CancelUsingRegion(const std::string& region_id, const absl::Status& why);
  // After a reload: ends the loads whose caller the new policy no longer names as the same principal with the
  // engine role (a revoked token, a uid taken off a principal).
  size_t CancelRevoked(const AccessPolicy& policy);
  uint32_t active() const;
  std::vector<LoadSummary> List() const;

 private:
  struct Live {
    LoadOwner owner;
    CancelFn cancel;
    std::function<std::optional<LoadSummary>()> describe;
  };
  mutable Mutex mu_;
  absl::flat_hash_map<uint64_t, Live> loads_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> per_principal_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::pair<std::string, std::string>, uint32_t> per_client_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
};

// What earlier loads taught the daemon about each namespace's engine: its compute cost per chunk. A new load's
// plan starts from it, so an engine that sends no hints still gets a planned split from its second load on.
class ComputeModels {
 public:
  ComputeModel Get(const ChunkKey& ns) const {
    MutexLock lock(&mu_);
    auto it = models_.find(ns);
    return it == models_.end() ? ComputeModel() : it->second;
  }
  // Older knowledge fades (the engine's load changes), the latest load counts most.
  void Learn(const ChunkKey& ns, const ComputeModel& observed) {
    if (!observed.known()) return;
    MutexLock lock(&mu_);
    if (models_.size() >= kMaxNamespaces && !models_.contains(ns)) models_.clear();  // rare: start over
    ComputeModel& model = models_[ns];
    model.Scale(0.5);
    model.Merge(observed);
  }

 private:
  static constexpr size_t kMaxNamespaces = 4096;
  mutable Mutex mu_;
  absl::flat_hash_map<ChunkKey, ComputeModel> models_ ABSL_GUARDED_BY(mu_);
};

struct DaemonState {
  DaemonState(const DaemonConfig& c, AccessPolicy access_policy)
      : config(c),
        access_(std::make_shared<const AccessPolicy>(std::move(access_policy))),
        tiers(TierManager::Options{c.write_back_queue_bytes, c.dram_promotion_queue_bytes, c.remote_promote_to_disk,
                                   c.write_back_threads}),
        regions(RegionRegistry::Limits{
            c.max_region_bytes, c.max_regions_per_client, c.cuda_max_region_bytes, c.max_regions,
            c.max_total_region_bytes, std::chrono::milliseconds(c.region_lease_ms),
            c.max_region_bytes_per_principal != 0 ? c.max_region_bytes_per_principal
                                                  : c.max_total_region_bytes - c.max_total_region_bytes / 4}),
        pool(static_cast<int>(c.io_threads), size_t{c.max_concurrent_loads} * c.max_load_window + 1024, c.arbiter,
             std::chrono::milliseconds(c.arbiter_starvation_ms)) {
    // A region is unmapped (or cudaFree'd) on a background thread, never on the gRPC or I/O thread that let it go.
    regions.SetDisposer([this](std::function<void()> destroy) { return background.TrySubmit(std::move(destroy)); });
    // A pool from the start (what the masters are is not known yet), so a DaemonState built without Daemon::Start
    // (the unit tests) reads too; Daemon::Start replaces it once the tiers are open.
    StartNetworkReads(c.remote_endpoints.empty() ? 1 : static_cast<int>(c.RemoteReadThreads(0)));
  }
  // `background` goes before `regions` (members end in reverse order): regions let go from now on unmap in place.
  // The timer thread stops first: no load's timer fires into a pool or tier that is going.
  ~DaemonState() {
    // No copy starts from here on: one finishing in a pool that is going must not hand the next to a pool gone.
    prefetcher.Stop();
    timers.Stop();
    regions.SetDisposer(nullptr);
  }
  DaemonState(const DaemonState&) = delete;
  DaemonState& operator=(const DaemonState&) = delete;

  const DaemonConfig config;
  // Who may do what: replaced whole on SIGHUP (Daemon::ReloadAccess); a call keeps the policy that named it.
  std::shared_ptr<const AccessPolicy> access() const {
    MutexLock lock(&access_mu_);
    return access_;
  }
  void ReplaceAccess(std::shared_ptr<const AccessPolicy> policy) {
    MutexLock lock(&access_mu_);
    access_ = std::move(policy);
  }
  // The configuration as reloads left it (cakectl config); `config` stays what the daemon started with.
  DaemonConfig effective_config() const {
    MutexLock lock(&access_mu_);
    return effective_config_;
  }
  void SetEffectiveConfig(DaemonConfig next) {
    MutexLock lock(&access_mu_);
    effective_config_ = std::move(next);
  }

 private:
  mutable Mutex access_mu_;
  std::shared_ptr<const AccessPolicy> access_ ABSL_GUARDED_BY(access_mu_);
  DaemonConfig effective_config_ ABSL_GUARDED_BY(access_mu_) = config;

 public:
  // The unix socket's accepted connections and their peers (set once, before serving starts).
  const UnixListener* unix_connections = nullptr;
  ConnectionGate* connection_gate = nullptr;  // every connection served; set once, at start
  const std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  TierManager tiers;
  RegionRegistry regions;
  Counters counters;
  LoadMetrics load_metrics{config.metrics_max_namespace_series};
  RpcMetrics rpc_metrics;
  std::string metrics_address;  // the Prometheus endpoint's "host:port" (empty: none); set once, at start
  InlineBudget inline_budget{
      config.max_inline_bytes,
      config.max_inline_bytes_per_principal};  // before the pools: queued reads hold loads that use it
  LoadTracker loads;
  UnstartedStreams unstarted_streams{config.max_unstarted_streams, config.max_unstarted_streams_per_principal};
  ComputeModels compute_models;
  TimerThread timers;  // the loads' idle watches and re-checks
  // Device regions: whether this daemon serves them (cuda.enabled, the build, a device), why not otherwise, and
  // the ordinals engines may ask for. Set once at start-up.
  bool cuda_usable = false;
  std::string cuda_off_reason;
  std::vector<int> cuda_devices;
  PinnedRange dram_pinned;  // after `tiers`: unpinned before the arena goes
  std::string listen_address;
  // Drain: new loads are refused and the health service says NOT_SERVING; with drain_exit_when_idle the
  // housekeeping thread asks for a stop (request_stop) once no load runs.
  std::atomic<bool> draining{false};
  std::atomic<bool> drain_exit_when_idle{false};
  std::atomic<bool> stopping{false};        // Daemon::Stop began: long background jobs (Verify) end early
  std::atomic<bool> verify_running{false};  // one Verify at a time
  HealthService* health = nullptr;          // grpc.health.v1.Health, served by the daemon (set once, at start)
  int tcp_port = 0;                         // the TCP listener's port (tcp.listen may ask for port 0: any)
  // Calls that wait on a networked tier (Lookups that reach Redis, Status and Stats with a remote tier, Evict of
  // it): here rather than on gRPC's threads, which Ping and every other call need, or the I/O threads, which
  // DRAM and disk reads need; a frozen Redis ties up these threads only. Destroyed before what it touches.
  IoPool network_calls{kNetworkCallThreads, kNetworkCallQueue, ArbiterPolicy::kFifo};
  // Before the pools: their idle threads run its copies, which must end before it goes. Its budget is at most half
  // the DRAM tier, as the promotions' (more would only evict its own earlier copies), and its copies leave an I/O
  // thread free for a load that starts while they run.
  Prefetcher prefetcher{
      Prefetcher::Options{std::min(config.prefetch_max_bytes, config.dram_capacity_bytes / 2),
                          std::min(config.prefetch_reads_in_flight, std::max(1u, config.io_threads - 1)),
                          std::chrono::milliseconds(config.prefetch_ttl_ms)},
      tiers,
      [this](TierKind from, std::function<void()> copy) {
        return (from == TierKind::kRemote ? network_reads() : pool).TrySubmitIdle(std::move(copy));
      },
      counters, Clock::Real()};
  // Work that is not a load's read: RegisterRegion's page mapping, Store's copies, Evict. Its own threads, so a
  // load's reads never queue behind a 1 GiB registration (they still share the cores). Before `pool`: Store
  // copies may hand write-backs to the tiers, which outlive both pools.
  IoPool background{kBackgroundThreads, kBackgroundQueue, ArbiterPolicy::kFifo};
  // The loads' reads from networked tiers (Redis), on threads of their own: a frozen or slow Redis holds these,
  // never the ones DRAM and disk reads need. Same policy as `pool`; made by StartNetworkReads once the tiers are
  // open, since how many threads it has depends on the Redis the remote tier found (DaemonConfig::RemoteReadThreads).
  IoPool& network_reads() { return *network_reads_; }
  void StartNetworkReads(int threads) {
    // Room for every live load's full window, so a load that got admitted is never refused a read.
    network_reads_.emplace(threads, size_t{config.max_concurrent_loads} * config.max_load_window + 1024, config.arbiter,
                           std::chrono::milliseconds(config.arbiter_starvation_ms));
  }
  size_t network_reads_queued() const { return network_reads_ ? network_reads_->queued() : 0; }

 private:
  std::optional<IoPool> network_reads_;

 public:
  IoPool pool;  // the loads' reads; last member: destroyed first, so queued work never outlives what it touches

  static constexpr int kNetworkCallThreads = 4;

  static constexpr size_t kNetworkCallQueue = 1024;
  static constexpr int kBackgroundThreads = 2;
  static constexpr size_t kBackgroundQueue = 4096;
};

}  // namespace cake
