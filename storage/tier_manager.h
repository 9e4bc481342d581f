// The tiers of one daemon, fastest first: prefix lookup across them, reads from the tier that holds a chunk,
// writes into the fastest with background write-back to the slower ones, promotion of what was read from a slower
// tier, and the measured load bandwidth the planner uses.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include "storage/clock.h"
#include "storage/tier.h"

namespace cake {

// Values match cake.v1.TierKind on the wire.
enum class TierKind : int { kNone = 0, kDram = 1, kDisk = 2, kRemote = 3 };
const char* TierKindName(TierKind kind);

class TierManager {
 public:
  struct Options {
    // Bytes of chunks waiting to be written back; past it, Write copies to the slower tiers itself (the caller
    // is slowed down, nothing is dropped and memory stays bounded).
    uint64_t write_back_queue_bytes = uint64_t{1} << 30;
  };
  TierManager() : TierManager(Options{}) {}
  explicit TierManager(const Options& options);
  ~TierManager();  // abandons queued write-backs: call FlushWriteBack first to bound the wait for them

  // Tiers are added once, at start-up, fastest first, before any other call.
  void AddTier(TierKind kind, std::unique_ptr<Tier> tier);

  // For each key in order, the fastest tier holding it; stops at the first key that no tier holds, so the
  // result's size is the number of cached leading chunks.
  std::vector<TierKind> LookupPrefix(std::span<const ChunkKey> keys) const;

  // Reads from `kind`'s tier; any error means the chunk is a miss for this load (the engine computes it).
  absl::Status Read(TierKind kind, const ChunkKey& key, std::span<std::byte> dst);
  // Stores into the fastest tier and queues a write-back to every slower one. An error means the fastest tier
  // refused it (RESOURCE_EXHAUSTED when full); write-back failures are counted, never returned.
  absl::Status Write(const ChunkKey& key, std::span<const std::byte> src);
  // After a read from a slower tier: keeps a copy in the fastest, so the next load of it is a DRAM hit.
  void Promote(const ChunkKey& key, std::span<const std::byte> bytes);
  // Waits until every queued write-back is done or `bound` passes; returns the number still queued.
  size_t FlushWriteBack(Duration bound);

  struct WriteBackStats {
    uint64_t written = 0;      // chunk copies that reached a slower tier
    uint64_t failed = 0;       // a slower tier refused one (full, I/O error)
    uint64_t inline_writes = 0;  // done by the writer itself because the queue was full
    uint64_t promotions = 0;
    uint64_t queued_bytes = 0;
  };
  WriteBackStats write_back_stats() const;
  bool Contains(const ChunkKey& key) const;

  // A load moved `bytes` from `kind` in `seconds` of wall time with its window of reads in flight.
  void RecordLoadThroughput(TierKind kind, uint64_t bytes, double seconds);
  // Seconds per byte that loads from `kind` achieved lately, or 0 when nothing was measured yet.
  double LoadSecondsPerByte(TierKind kind) const;

  Tier* tier(TierKind kind) const;
  struct Entry {
    TierKind kind;
    std::unique_ptr<Tier> tier;
    std::atomic<double> seconds_per_byte{0};
  };
  const std::vector<std::unique_ptr<Entry>>& tiers() const { return tiers_; }

 private:
  struct WriteBackJob {
    ChunkKey key;
    std::shared_ptr<std::vector<std::byte>> bytes;
  };
  Entry* Find(TierKind kind) const;
  void WriteToSlowerTiers(const ChunkKey& key, std::span<const std::byte> bytes);
  void RunWriteBack();

  const Options options_;
  std::vector<std::unique_ptr<Entry>> tiers_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<WriteBackJob> queue_;
  bool writing_back_ = false;  // the thread holds a job outside the queue
  bool stopping_ = false;
  WriteBackStats stats_;
  std::thread write_back_thread_;
};

}  // namespace cake
