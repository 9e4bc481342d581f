// Everything the RPC handlers share inside one caked process. Owned by Daemon; handlers hold references.
//
// Two kinds of thing live here:
//  - facts: the configuration and what Daemon::Start learned before serving (StartupFacts), const once published;
//  - services: the tiers, regions, thread pools, timers and books the handlers use. Stop() ends them in one written
//    order (the way Daemon::Stop ends the daemon), so no lifetime here depends on where a member is declared:
//    once Stop() returned no thread runs that could touch a member, and members may go in any order.
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
#include "base/mutex.h"
#include "base/timers.h"
#include "cuda/cuda_backend.h"
#include "scheduler/compute_models.h"
#include "scheduler/io_pool.h"
#include "scheduler/tier_speeds.h"
#include "server/config/config.h"
#include "server/core/counters.h"
#include "server/core/inline_budget.h"
#include "server/core/load_metrics.h"
#include "server/core/load_tracker.h"
#include "server/core/prefetcher.h"
#include "server/core/region_registry.h"
#include "server/core/unstarted_streams.h"
#include "server/edge/access.h"
#include "storage/tier_manager.h"

namespace cake {

class ConnectionGate;
class HealthService;
class UnixListener;

// What Daemon::Start learns before it serves, published once (DaemonState::PublishStartupFacts) and never changed.
// A DaemonState built without Daemon::Start (the unit tests) keeps the defaults: no listeners, no device regions.
struct StartupFacts {
  std::string listen_address;   // "unix:<socket>"
  int tcp_port = 0;             // the TCP listener's port (tcp.listen may ask for port 0: any); 0 without one
  std::string metrics_address;  // the Prometheus endpoint's "host:port" (empty: none)
  // Device regions: whether this daemon serves them (cuda.enabled, the build, a device), why not otherwise, and
  // the ordinals engines may ask for.
  bool cuda_usable = false;
  std::string cuda_off_reason;
  std::vector<int> cuda_devices;
  // The daemon's listeners and health service (Daemon owns them and stops them after the state; null without).
  const UnixListener* unix_connections = nullptr;  // the unix socket's accepted connections and their peers
  ConnectionGate* connection_gate = nullptr;       // every connection served
  HealthService* health = nullptr;                 // grpc.health.v1.Health
};

struct DaemonState {
  DaemonState(const DaemonConfig& c, AccessPolicy access_policy);
  ~DaemonState() { Stop(); }
  DaemonState(const DaemonState&) = delete;
  DaemonState& operator=(const DaemonState&) = delete;

  // Ends the services, in this order: no new prefetch copy and no timer fires; regions let go from now on unmap in
  // place; the four pools run what they hold and join (the loads' reads first: a queued read may use the inline
  // budget, a region or a tier; then the calls' work); the DRAM arena is unpinned before the tiers can free it.
  // Idempotent; the destructor calls it.
  void Stop();

  const DaemonConfig config;

  // Set once by Daemon::Start before it serves; read by handlers from then on.
  void PublishStartupFacts(StartupFacts facts);
  const StartupFacts& facts() const { return facts_; }

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

  const std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

  // The services.
  TierManager tiers;
  PinnedRange dram_pinned;  // the DRAM arena page-locked for device copies (tier_factory); unpinned by Stop()
  RegionRegistry regions;
  Counters counters;
  LoadMetrics load_metrics;
  RpcMetrics rpc_metrics;
  InlineBudget inline_budget;
  LoadTracker loads;
  UnstartedStreams unstarted_streams;
  ComputeModels compute_models;
  TierSpeeds tier_speeds;  // what loads measured of each tier
  TimerThread timers;      // the loads' idle watches and re-checks
  // Its copies run on the read pools' idle threads. Its budget is at most half the DRAM tier, as the promotions'
  // (more would only evict its own earlier copies), and its copies leave an I/O thread free for a load that starts
  // while they run.
  Prefetcher prefetcher;

  // Drain: new loads are refused and the health service says NOT_SERVING; with drain_exit_when_idle the
  // housekeeping thread asks for a stop (request_stop) once no load runs.
  std::atomic<bool> draining{false};
  std::atomic<bool> drain_exit_when_idle{false};
  std::atomic<bool> stopping{false};        // Daemon::Stop began: long background jobs (Verify) end early
  std::atomic<bool> verify_running{false};  // one Verify at a time

  // The thread pools, by what they run.
  // The loads' reads from DRAM and disk (one group per load; the arbiter orders them).
  IoPool local_reads;
  // The loads' reads from the remote tier (Redis), on threads of their own: a frozen or slow Redis holds these,
  // never the ones DRAM and disk reads need. Same policy as local_reads; made by StartRemoteReads once the tiers
  // are open, since how many threads it has depends on the Redis the remote tier found
  // (DaemonConfig::RemoteReadThreads).
  IoPool& remote_reads() { return *remote_reads_; }
  void StartRemoteReads(int threads);
  size_t remote_reads_queued() const { return remote_reads_ ? remote_reads_->queued() : 0; }
  // Calls that wait on the remote tier (Lookups that reach Redis, Status and Stats with a remote tier, Evict of it):
  // here rather than on gRPC's threads, which Ping and every other call need, or the read pools; a frozen Redis
  // ties up these threads only.
  IoPool remote_calls;
  // Calls' work that is not a load's read: RegisterRegion's page mapping, Store's copies, Evict, and unmapping the
  // regions let go. Its own threads, so a load's reads never queue behind a 1 GiB registration (they still share
  // the cores).
  IoPool region_and_store_work;

  static constexpr int kRemoteCallThreads = 4;
  static constexpr size_t kRemoteCallQueue = 1024;
  static constexpr int kRegionAndStoreThreads = 2;
  static constexpr size_t kRegionAndStoreQueue = 4096;

 private:
  StartupFacts facts_;
  bool facts_published_ = false;
  mutable Mutex access_mu_;
  std::shared_ptr<const AccessPolicy> access_ ABSL_GUARDED_BY(access_mu_);
  DaemonConfig effective_config_ ABSL_GUARDED_BY(access_mu_);
  std::optional<IoPool> remote_reads_;
  bool stopped_ = false;
};

}  // namespace cake
