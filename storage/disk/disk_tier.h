// Disk tier: one crash-safe, checksummed file per chunk under a root folder (see chunk_file.h), read with
// O_DIRECT through io_uring (or pread where io_uring is unavailable), an in-memory index rebuilt at start-up
// (from the clean-stop index the last close or checkpoint wrote, or from every file's header), and
// least-recently-used eviction under a byte budget.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "keys/namespace.h"
#include "storage/disk/recovery_scan.h"
#include "storage/io/aligned_buffer.h"
#include "storage/io/io_engine.h"
#include "storage/lru_index.h"
#include "storage/tier.h"

namespace cake {

class DiskTier final : public Tier {
 public:
  struct Options {
    std::filesystem::path root;
    // Budget in payload bytes (what Usage() reports); each file also takes a 4 KiB header and up to 4 KiB of
    // padding on disk.
    uint64_t capacity_bytes = 0;
    // The largest chunk this tier stores (the daemon passes its limits.max_chunk_bytes; the default is that
    // setting's). A Write of more is refused, so a file whose header claims more was not written by this tier:
    // a start removes it rather than let its length, sparse on disk, evict every real chunk.
    uint64_t max_chunk_bytes = NamespaceLimits{}.max_chunk_bytes;
    // Reads in flight per reader (each up to 1 MiB).
    uint32_t queue_depth = 32;
    IoBackend io_backend = IoBackend::kAuto;
    // Without it, a filesystem that refuses O_DIRECT (ramfs, some FUSE and network mounts) fails Open: silently
    // going through the page cache would double memory use and hide the real disk speed.
    bool allow_buffered = false;
    // Makes the read engines (empty: MakeIoEngine). Tests pass one that wraps engines in fault injectors or
    // makes io_uring fail.
    IoEngineFactory engine_factory;
    // Threads that list the key folders and read chunk headers when a start has no clean-stop index: each
    // header is one small random read, so a rebuild is bound by how many are in flight, and the default is the
    // count that brought it near the disk's random-read floor (docs/benchmarks.md section 4.2, cake-bench rebuild).
    uint32_t recovery_threads = 32;
    // How often the index is also written while the tier runs (the clean-stop index's file and format), when
    // chunks were added since the last time: a crash then costs header reads only for the chunks written since,
    // not for every file. Zero: only at a clean stop (and a crash reads every header).
    std::chrono::milliseconds index_checkpoint_interval{60000};
  };

  // Creates the root if needed, checks that it is writable and supports O_DIRECT, picks the I/O backend and
  // rebuilds the index from the files. INVALID_ARGUMENT: bad options. FAILED_PRECONDITION: an unusable root
  // (not creatable, not a folder, not writable, no O_DIRECT without allow_buffered) or io_uring requested and
  // unavailable.
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(const Options& options);
  ~DiskTier() override;

  std::string_view name() const override { return "disk"; }
  bool Contains(const ChunkKey& key) const override;
  absl::Status Read(const ChunkKey& key, std::span<std::byte> dst) override;
  absl::Status ReadValue(const ChunkKey& key, uint64_t max_bytes, std::vector<std::byte>& out) override;
  // RESOURCE_EXHAUSTED also for a value over max_chunk_bytes.
  absl::Status Write(const ChunkKey& key, std::span<const std::byte> src) override;
  absl::Status Remove(const ChunkKey& key) override;
  TierUsage Usage() const override;
  uint64_t Footprint(uint64_t chunk_bytes) const override { return FileFootprint(chunk_bytes); }
  void ForEach(const std::function<void(const ChunkKey&, uint64_t)>& fn) const override;

  // The backend actually in use: kUring or kPread, never kAuto.
  IoBackend backend() const { return backend_; }
  bool direct_io() const { return direct_io_; }
  const RecoveryStats& recovery() const { return recovery_; }
  uint64_t evictions() const;
  // Index checkpoints written while the tier ran (not counting the one at close).
  uint64_t index_checkpoints() const { return index_checkpoints_.load(); }
  // Chunks found corrupt by a read (checksum, header, size) and deleted.
  uint64_t corrupt_removed() const;
  TierStats Stats() const override;
  TierCapabilities Capabilities() const override { return {.checksummed = true}; }

 private:
  struct Entry {
    uint64_t bytes = 0;
  };

  // What one read needs besides its file: an engine and an aligned bounce buffer, reused across reads
  // because faulting in a fresh multi-MiB buffer per read costs more than the copy through it.
  struct Reader {
    AlignedBuffer bounce;  // declared first, destroyed last: the engine drains reads into it before it goes
    std::unique_ptr<IoEngine> engine;
  };

  DiskTier(const Options& options, IoBackend backend, bool direct_io, std::unique_ptr<IoEngine> first_engine);

  absl::Status Recover(uint32_t threads);
  // A read in two steps, so the caller may size its destination between them outside the lock: the indexed size
  // (the entry pinned against eviction), then the file's read, which judges the entry by the result (a corrupt
  // file is removed).
  absl::StatusOr<uint64_t> PinForRead(const ChunkKey& key, LruIndex<Entry>::ReadPin& pin);
  absl::Status ReadPinned(const ChunkKey& key, LruIndex<Entry>::ReadPin& pin, std::span<std::byte> dst);
  absl::Status ReadFile(const ChunkKey& key, std::span<std::byte> dst);
  absl::Status WriteTempFile(const std::filesystem::path& temp, const ChunkKey& key, std::span<const std::byte> src);
  absl::StatusOr<Reader> AcquireReader();
  void ReleaseReader(Reader reader);
  // Evicts unread entries from the cold end until `bytes` more fit beside what is stored and reserved;
  // unlinks their files. Requires mu_.
  bool MakeRoom(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static uint64_t FileFootprint(uint64_t payload_bytes);
  // Whether this tier could have stored a chunk of this many bytes: within max_chunk_bytes, and its file within
  // the whole capacity. A length read back (a header, the clean-stop index) that fails it is not believed.
  bool MayHold(uint64_t payload_bytes) const {
    return payload_bytes <= max_chunk_bytes_ && FileFootprint(payload_bytes) <= capacity_bytes_;
  }
  // Drops an entry and its file. Requires mu_ and an indexed key.
  void EraseLocked(const ChunkKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnlinkChunkFile(const ChunkKey& key) const;
  int OpenFlags(int access) const;
  // Writes the whole index as it is now (least recently used first) to <root>/v1/clean-stop.index, durably.
  absl::Status WriteIndex();
  // The checkpoint thread: writes the index every index_checkpoint_interval when chunks were added since the
  // last time, and right away when Open recovered chunks (a start removes the index it read).
  void CheckpointLoop(std::stop_token stop);

  const std::filesystem::path root_;
  const uint64_t capacity_bytes_;
  const uint64_t max_chunk_bytes_;
  const uint32_t queue_depth_;
  const IoBackend backend_;
  const bool direct_io_;
  const IoEngineFactory engine_factory_;
  RecoveryStats recovery_;
  // Set once Open has rebuilt the whole index: only then does closing write the clean-stop index.
  bool write_index_at_close_ = false;

  // Engines are not thread-safe: each is owned by one reader at a time, checked out of this pool and handed
  // back, so a thread reuses a ring without a thread_local that would outlive the tier.
  Mutex readers_mu_;
  std::vector<Reader> idle_readers_ ABSL_GUARDED_BY(readers_mu_);

  // Guards the index and every rename or unlink of a chunk file, so the index and the folder never disagree
  // about which file a key has.
  mutable Mutex mu_;
  // A chunk being read is pinned: never evicted underneath its reader.
  LruIndex<Entry> index_ ABSL_GUARDED_BY(mu_){mu_};
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // room promised to writes still writing their temporary files
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t corrupt_removed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t chunks_added_ ABSL_GUARDED_BY(mu_) = 0;  // by Write, ever: the checkpoint thread compares it

  const std::chrono::milliseconds index_checkpoint_interval_;
  std::atomic<uint64_t> index_checkpoints_{0};
  std::mutex checkpoint_wait_mu_;  // only for the checkpoint thread's timed wait, which a stop interrupts
  std::condition_variable_any checkpoint_wake_;
  std::jthread checkpointer_;  // last: stopped and joined in the destructor before anything it reads goes
};

}  // namespace cake
