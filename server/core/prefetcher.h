// Prefetch: the chunks of a prompt an engine will load soon (its request waits in the engine's queue), copied from
// disk and Redis into DRAM while the tiers have nothing else to do, the tail first (Cake loads from the tail, so
// the tail is worth most). An engine asks with LookupRequest.prefetch; the Load that follows finds the copied
// chunks in DRAM, and the ones being copied as DRAM chunks whose reads wait for the copy (TierManager::Prefetch).
//
// Bounded: the chunk bytes of all prefetches together (queued, being copied, copied and not yet loaded) stay under
// prefetch.max_bytes, copies run on idle I/O threads only (a load's reads always go first) and at most
// prefetch.reads_in_flight at once, and a copied chunk no load used within prefetch.ttl_ms is forgotten and counted
// wasted (it stays in DRAM, under DRAM's own eviction, like any other chunk).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "base/clock.h"
#include "base/histogram.h"
#include "base/mutex.h"
#include "keys/namespace.h"
#include "keys/tier_kind.h"
#include "server/core/counters.h"
#include "storage/lossy_codec.h"

namespace cake {

class TierManager;

class Prefetcher {
 public:
  struct Options {
    uint64_t max_bytes = uint64_t{256} << 20;
    uint32_t reads_in_flight = 1;
    Duration ttl = std::chrono::seconds(30);
  };
  // Runs `task` on an idle I/O thread of the pool that reads `from` (IoPool::TrySubmitIdle); false when refused.
  using SubmitIdle = std::function<bool(TierKind from, std::function<void()> task)>;

  Prefetcher(Options options, TierManager& tiers, SubmitIdle submit, Counters& counters, Clock* clock);
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Queues the chunks of the cached prefix (`tiers[c]` holds chunk c, the fastest tier first) that only slower
  // tiers hold, the highest first, as far as the budget allows; returns how many it queued.
  // `format` is how the namespace's chunks are stored in the slower tiers (quantized, for a lossy namespace).
  // `tenant` is whom the chunks count against: one tenant holds at most three quarters of prefetch.max_bytes, and
  // the last eighth is kept for tenants holding little (SharedPool), so one tenant's prefetches cannot starve
  // another's.
  uint32_t Prefetch(std::span<const ChunkKey> keys, std::span<const TierKind> tiers, uint64_t chunk_bytes,
                    const LossyFormat& format = {}, const std::string& tenant = "");
  // A load of `keys` started: copied (and being copied) chunks count as used, queued ones are dropped (the load
  // reads them itself, in its own order).
  void LoadStarted(std::span<const ChunkKey> keys);
  // Forgets what is older than the ttl: copied chunks no load used, and queued ones the idle threads never got to
  // (both counted wasted). The daemon's housekeeping calls it.
  void Expire();
  // Stops starting copies (the daemon is stopping); those running finish.
  void Stop();

  uint64_t held_bytes() const;
  // Prefetch to the Load that used it, per chunk used.
  Histogram prefetch_to_load_seconds{Histogram::LatencyBounds()};

 private:
  // Queued: waiting in queue_. Submitted: handed to an idle thread, not started (a load that starts now reads the
  // chunk itself, and the copy, when it runs, finds the entry gone and reads nothing). Copying: TierManager::Prefetch
  // runs (a load waits for it). Copied: in DRAM, waiting for its load or the ttl.
  enum class State { kQueued, kSubmitted, kCopying, kCopied };
  struct Entry {
    State state = State::kQueued;
    TierKind from = TierKind::kNone;
    uint64_t bytes = 0;
    TimePoint since;  // queued, or copied
    LossyFormat format;
    std::string tenant;
  };
  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Copy(const ChunkKey& key, TierKind from, uint64_t bytes, const LossyFormat& format);
  void ForgetLocked(absl::flat_hash_map<ChunkKey, Entry>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  TierManager& tiers_;
  const SubmitIdle submit_;
  Counters& counters_;
  Clock* const clock_;
  mutable Mutex mu_;
  absl::flat_hash_map<ChunkKey, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::deque<ChunkKey> queue_ ABSL_GUARDED_BY(mu_);  // the order to copy in; keys no longer queued are skipped
  uint64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, uint64_t> held_by_tenant_ ABSL_GUARDED_BY(mu_);
  uint32_t copying_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace cake
