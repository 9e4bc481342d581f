#include "server/core/daemon_state.h"

#include <cassert>

namespace cake {
namespace {

RegionRegistry::Limits RegionLimits(const DaemonConfig& c) {
  return RegionRegistry::Limits{c.max_region_bytes,
                                c.max_regions_per_client,
                                c.cuda_max_region_bytes,
                                c.max_regions,
                                c.max_total_region_bytes,
                                std::chrono::milliseconds(c.region_lease_ms),
                                c.max_region_bytes_per_principal != 0
                                    ? c.max_region_bytes_per_principal
                                    : c.max_total_region_bytes - c.max_total_region_bytes / 4};
}

// A read pool holds every live load's full window, so a load that got admitted is never refused a read.
size_t ReadQueueCapacity(const DaemonConfig& c) { return size_t{c.max_concurrent_loads} * c.max_load_window + 1024; }

}  // namespace

DaemonState::DaemonState(const DaemonConfig& c, AccessPolicy access_policy)
    : config(c),
      tiers(TierManager::Options{c.write_back_queue_bytes, c.dram_promotion_queue_bytes, c.remote_promote_to_disk,
                                 c.write_back_threads}),
      regions(RegionLimits(c)),
      load_metrics(c.metrics_max_namespace_series),
      inline_budget(c.max_inline_bytes, c.max_inline_bytes_per_principal),
      unstarted_streams(c.max_unstarted_streams, c.max_unstarted_streams_per_principal),
      prefetcher(
          Prefetcher::Options{std::min(c.prefetch_max_bytes, c.dram_capacity_bytes / 2),
                              std::min(c.prefetch_reads_in_flight, std::max(1u, c.io_threads - 1)),
                              std::chrono::milliseconds(c.prefetch_ttl_ms)},
          tiers,
          [this](TierKind from, std::function<void()> copy) {
            return (from == TierKind::kRemote ? remote_reads() : local_reads).TrySubmitIdle(std::move(copy));
          },
          counters, Clock::Real()),
      local_reads(static_cast<int>(c.io_threads), ReadQueueCapacity(c), c.arbiter,
                  std::chrono::milliseconds(c.arbiter_starvation_ms)),
      remote_calls(kRemoteCallThreads, kRemoteCallQueue, ArbiterPolicy::kFifo),
      region_and_store_work(kRegionAndStoreThreads, kRegionAndStoreQueue, ArbiterPolicy::kFifo),
      access_(std::make_shared<const AccessPolicy>(std::move(access_policy))),
      effective_config_(c) {
  // A region is unmapped (or cudaFree'd) on a pool thread, never on the gRPC or I/O thread that let it go.
  regions.SetDisposer(
      [this](std::function<void()> destroy) { return region_and_store_work.TrySubmit(std::move(destroy)); });
  // A pool from the start (what the masters are is not known yet), so a DaemonState built without Daemon::Start
  // (the unit tests) reads too; Daemon::Start replaces it once the tiers are open.
  StartRemoteReads(c.remote_endpoints.empty() ? 1 : static_cast<int>(c.RemoteReadThreads(0)));
}

void DaemonState::StartRemoteReads(int threads) {
  remote_reads_.emplace(threads, ReadQueueCapacity(config), config.arbiter,
                        std::chrono::milliseconds(config.arbiter_starvation_ms));
}

void DaemonState::PublishStartupFacts(StartupFacts facts) {
  assert(!facts_published_ && "startup facts are published once, before serving");
  facts_ = std::move(facts);
  facts_published_ = true;
}

void DaemonState::Stop() {
  if (stopped_) return;
  stopped_ = true;
  prefetcher.Stop();  // no copy starts from here on: one finishing must not hand the next to a pool that is going
  timers.Stop();      // no load's idle watch or re-check fires into a pool or tier that is going
  regions.SetDisposer(nullptr);  // regions let go from now on unmap in place
  local_reads.Stop();
  if (remote_reads_) remote_reads_->Stop();
  region_and_store_work.Stop();  // Store's copies finish: then nothing references a region any more
  remote_calls.Stop();
  dram_pinned = PinnedRange();  // before the DRAM arena can go with the tiers
}

}  // namespace cake
