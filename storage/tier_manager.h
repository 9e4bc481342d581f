// The tiers of one daemon, fastest first: prefix lookup across them, reads from the tier that holds a chunk,
// writes into the fastest with background write-back to the slower ones, promotion of what was read from a slower
// tier, and prefetch copies into the fastest (their arrivals on an ArrivalBoard).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "base/clock.h"
#include "base/histogram.h"
#include "base/mutex.h"
#include "keys/tier_kind.h"
#include "storage/arrival_board.h"
#include "storage/bounded_worker.h"
#include "storage/lossy_codec.h"
#include "storage/tier.h"

namespace cake {

class TierManager {
 public:
  struct Options {
    // Bytes of chunks waiting to be written back; past it, Write copies to the slower tiers itself (the caller
    // is slowed down, nothing is dropped and memory stays bounded). A fastest tier that lends its bytes (DRAM)
    // is never more than half held by the queue, so Stores keep finding room in it.
    uint64_t write_back_queue_bytes = uint64_t{1} << 30;
    // Bytes of chunks waiting to be promoted; past it, promotions are dropped (the chunk stays where it was).
    uint64_t promotion_queue_bytes = uint64_t{256} << 20;
    // A chunk read from the remote tier is also copied onto the local disk (when there is one), so it stays on
    // this machine after DRAM evicts it.
    bool promote_remote_to_disk = false;
    // Chunks written back at once: each disk write ends in an fdatasync and a folder fsync, which then overlap
    // the writing of the next chunks instead of idling the disk.
    uint32_t write_back_threads = 4;
  };
  TierManager() : TierManager(Options{}) {}
  explicit TierManager(const Options& options);
  ~TierManager();  // abandons queued write-backs: call FlushWriteBack first to bound the wait for them

  // Tiers are added once, at start-up, fastest first, before any other call.
  void AddTier(TierKind kind, std::unique_ptr<Tier> tier);

  // For each key in order, the fastest tier holding it; stops at the first key that no tier holds, so the
  // result's size is the number of cached leading chunks. May wait on a networked tier.
  std::vector<TierKind> LookupPrefix(std::span<const ChunkKey> keys) const;

  // The same lookup in two steps, so that a thread which must not wait on a network (gRPC's) asks the tiers that
  // answer from memory itself and leaves the networked ones (Tier::waits_on_network) to a thread that may.
  class PrefixLookup {
   public:
    // The cached leading chunks' tiers, as far as the tiers asked so far know.
    std::vector<TierKind> Prefix() const;
    // Some key no tier asked so far holds, and a networked tier is still to be asked.
    bool needs_network() const { return !unresolved_.empty() && network_tiers_; }

   private:
    friend class TierManager;
    std::vector<TierKind> holder_;
    std::vector<ChunkKey> unresolved_;  // keys no tier asked so far holds ...
    std::vector<size_t> positions_;     // ... and where they are in the prompt
    bool network_tiers_ = false;
  };
  // Asks the tiers that answer from memory; never blocks on a network.
  PrefixLookup LookupPrefixInMemory(std::span<const ChunkKey> keys) const;
  // Asks the networked tiers about what is still unresolved; may take up to their timeouts.
  void FinishLookupOverNetwork(PrefixLookup& lookup) const;
  // Some tier waits on a network (its Usage too): Status and Stats ask it off gRPC's threads.
  bool has_network_tier() const;

  // Reads from `kind`'s tier; any error means the chunk is a miss for this load (the engine computes it). `format`
  // is how the namespace's chunks are stored below the fastest tier: a lossy one's are decoded into dst (and a
  // value that does not decode is removed: DATA_LOSS). dst is the namespace's chunk, and a key names its
  // namespace: a value the tier finds of another size (INVALID_ARGUMENT) was not stored for this key, and is
  // removed (DATA_LOSS), or every later load would fail on it again.
  absl::Status Read(TierKind kind, const ChunkKey& key, std::span<std::byte> dst, const LossyFormat& format = {});
  // `kind`'s own bytes of the chunk (Tier::Lend, through the tier's decorators); nullptr when it cannot lend.
  std::shared_ptr<const std::span<const std::byte>> Lend(TierKind kind, const ChunkKey& key);
  // Stores into the fastest tier and queues a write-back to every slower one. An error means the fastest tier
  // refused it (RESOURCE_EXHAUSTED when full); write-back failures are counted, never returned.
  // A lossy `format` quantizes the copies written back (once, for every slower tier); the fastest keeps src.
  absl::Status Write(const ChunkKey& key, std::span<const std::byte> src, const LossyFormat& format = {});
  // Whether a load reading chunks [from, end) of `chunk_tiers` should promote what it reads from slower tiers into
  // DRAM: not when nothing comes from them (or there is no DRAM tier), nor when those bytes exceed half the DRAM
  // tier (kTooLarge: each promotion would only evict an earlier one of the same load, and whatever else was hot).
  enum class PromotionFit { kNothingToPromote, kFits, kTooLarge };
  PromotionFit FitForPromotion(std::span<const TierKind> chunk_tiers, uint32_t from, uint64_t chunk_bytes) const;
  // After a read from a slower tier (`from`): keeps a copy in the fastest, so the next load of it is a DRAM hit,
  // and, for a remote hit with promote_remote_to_disk, one on the disk. Copies on the calling thread.
  // A chunk of a lossy namespace (`format`) is not copied onto the disk: its bytes are decoded approximations,
  // and quantizing them again would lose more.
  void Promote(const ChunkKey& key, std::span<const std::byte> bytes, TierKind from = TierKind::kNone,
               const LossyFormat& format = {});
  // The same, on the promotion thread, so a load's I/O threads go on reading: `done` runs there once the copy is
  // made or given up, and `bytes` must stay valid until then. Returns false, without calling `done`, when the
  // chunk is already in the fastest tier or the promotion queue is full (counted as dropped).
  bool PromoteLater(const ChunkKey& key, std::span<const std::byte> bytes, std::function<void()> done,
                    TierKind from = TierKind::kNone, const LossyFormat& format = {});
  // Prefetch: copies a chunk that only slower tiers hold into the fastest, ahead of a load that will want it, on
  // the calling thread (an idle I/O thread). While it runs the chunk is on the arrival board (ArrivalBoard says what
  // lookups and reads make of that). `from` is the tier to read it from. ALREADY_EXISTS when the fastest tier holds it
  // or another copy of it runs; a read's error as it came (a read that throws is an INTERNAL error: the arrival always
  // ends).
  absl::Status Prefetch(const ChunkKey& key, TierKind from, uint64_t chunk_bytes, const LossyFormat& format = {});
  // Chunks whose prefetch copy runs now.
  size_t arrivals_in_flight() const { return arrivals_.in_flight(); }
  // Tier::Interrupt on every tier: reads asleep in a throttle come back now (the daemon is stopping).
  void Interrupt();
  // Waits until every queued write-back is done or `bound` passes; returns the number still queued.
  size_t FlushWriteBack(Duration bound);

  struct WriteBackStats {
    uint64_t written = 0;        // chunk copies that reached a slower tier
    uint64_t failed = 0;         // a slower tier refused one (full, I/O error)
    uint64_t inline_writes = 0;  // done by the writer itself because the queue was full
    uint64_t queued_bytes = 0;
    uint64_t promotions = 0;
    uint64_t promotions_dropped = 0;  // the promotion queue was full
    uint64_t promotions_to_disk = 0;  // remote hits copied onto the local disk
  };
  WriteBackStats write_back_stats() const;
  // In the fastest tier (DRAM). A Store of a chunk held only by slower tiers (disk, or Redis, perhaps written by
  // another machine) puts the engine's fresh copy into DRAM: a copy in memory now instead of a slower read later.
  bool InFastestTier(const ChunkKey& key) const;

  Tier* tier(TierKind kind) const;
  // What went through one tier since start, for the metrics endpoint. Reads are the loads' (Read); writes are
  // Stores, write-backs and promotions.
  struct IoMeter {
    std::atomic<uint64_t> read_hits{0};
    std::atomic<uint64_t> read_misses{0};  // NOT_FOUND: evicted or expired since the lookup
    std::atomic<uint64_t> read_errors{0};  // corrupt, failed medium, timeout
    std::atomic<uint64_t> read_bytes{0};
    std::atomic<uint64_t> writes_ok{0};
    std::atomic<uint64_t> writes_failed{0};
    std::atomic<uint64_t> written_bytes{0};
    Histogram read_seconds{Histogram::LatencyBounds()};
    void CountWrite(const absl::Status& status, uint64_t bytes);
  };
  struct Entry {
    TierKind kind;
    std::unique_ptr<Tier> tier;
    IoMeter io;
  };
  const std::vector<std::unique_ptr<Entry>>& tiers() const { return tiers_; }

 private:
  using SharedBytes = std::shared_ptr<const std::span<const std::byte>>;
  Entry* Find(TierKind kind) const;
  void WriteToSlowerTiers(const ChunkKey& key, std::span<const std::byte> bytes, const LossyFormat& format);
  void Count(uint64_t WriteBackStats::*counter);
  // Read of a lossy namespace's chunk from a slower tier: its quantized value, decoded into dst.
  static absl::Status ReadQuantized(Tier& tier, const ChunkKey& key, std::span<std::byte> dst,
                                    const LossyFormat& format);
  std::atomic<uint64_t> write_back_failures_{0};

  const Options options_;
  std::vector<std::unique_ptr<Entry>> tiers_;

  mutable Mutex mu_;
  WriteBackStats stats_ ABSL_GUARDED_BY(mu_);
  ArrivalBoard arrivals_;  // prefetch copies running now
  // Declared last: their threads stop, and their queued jobs let go of chunks, before the tiers go away.
  BoundedWorker write_back_;
  BoundedWorker promotion_;
};

}  // namespace cake
