#include "storage/disk/disk_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>
#include <tuple>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/random_id.h"
#include "base/status_macros.h"
#include "base/unique_fd.h"
#include "spdlog/spdlog.h"
#include "storage/chunk_file.h"
#include "storage/disk/clean_stop_index.h"
#include "storage/disk/recovery_scan.h"
#include "storage/io/aligned_buffer.h"

namespace cake {
namespace {

namespace fs = std::filesystem;

// Writes go through a staging buffer of at most this size, so a large chunk does not need a second full copy
// in memory; a multiple of the block size, so every pwrite stays aligned.
constexpr size_t kWriteStagingBytes = size_t{4} << 20;
// Readers beyond this many idle ones are closed rather than kept: bounds the rings and bounce buffers a burst
// of concurrent reads leaves behind.
constexpr size_t kMaxIdleReaders = 16;
// A bounce buffer larger than this is freed after its read rather than kept for the next one.
constexpr size_t kMaxRetainedBounceBytes = size_t{64} << 20;
constexpr uint32_t kMaxQueueDepth = 4096;

absl::Status Annotate(const absl::Status& s, const fs::path& path) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(path.string(), ": ", s.message()));
}

bool IsAligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kDirectIoAlignment == 0; }

absl::Status WriteFull(int fd, uint64_t offset, std::span<const std::byte> data, const fs::path& path) {
  while (!data.empty()) {
    const ssize_t n = ::pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "writing", path);
    }
    if (n == 0) return absl::UnavailableError(absl::StrCat("writing ", path.string(), ": pwrite wrote nothing"));
    data = data.subspan(static_cast<size_t>(n));
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

// Creates, writes, reads back and removes one block with O_DIRECT. EINVAL anywhere means the filesystem does
// not do direct I/O (some accept the open flag and refuse the I/O); other errors mean the folder is unusable.
// Returns whether O_DIRECT works, or FAILED_PRECONDITION.
absl::StatusOr<bool> ProbeDirectIo(const fs::path& folder) {
  const fs::path probe = folder / absl::StrCat(std::string(kTempFilePrefix), "probe-", RandomHex128());
  auto unusable = [&](int err) {
    return absl::FailedPreconditionError(absl::StrCat("disk tier folder ", folder.string(),
                                                      " is not usable: cannot create and write ",
                                                      probe.filename().string(), ": ", std::strerror(err)));
  };
  // Some filesystems (ramfs) create the file before refusing O_DIRECT with EINVAL: remove it in every case.
  absl::Cleanup remove_probe = [&] { ::unlink(probe.c_str()); };
  UniqueFd fd(::open(probe.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | O_DIRECT, 0644));
  if (!fd.valid()) return errno == EINVAL ? absl::StatusOr<bool>(false) : unusable(errno);
  AlignedBuffer block(kDirectIoAlignment);
  if (!block.ok()) return absl::ResourceExhaustedError("out of memory for a 4 KiB probe buffer");
  std::memset(block.data(), 0, block.size());
  if (::pwrite(fd.get(), block.data(), block.size(), 0) != static_cast<ssize_t>(block.size())) {
    return errno == EINVAL ? absl::StatusOr<bool>(false) : unusable(errno);
  }
  if (::pread(fd.get(), block.data(), block.size(), 0) != static_cast<ssize_t>(block.size())) {
    return errno == EINVAL ? absl::StatusOr<bool>(false) : unusable(errno);
  }
  return true;
}

absl::Status ProbeBufferedWrite(const fs::path& folder) {
  const fs::path probe = folder / absl::StrCat(std::string(kTempFilePrefix), "probe-", RandomHex128());
  UniqueFd fd(::open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    return absl::FailedPreconditionError(absl::StrCat("disk tier folder ", folder.string(),
                                                      " is not usable: cannot create files: ", std::strerror(errno)));
  }
  ::unlink(probe.c_str());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(const Options& options) {
  if (options.root.empty()) return absl::InvalidArgumentError("disk tier: the root folder is empty");
  if (options.max_chunk_bytes == 0) return absl::InvalidArgumentError("disk tier: max_chunk_bytes must be above 0");
  if (options.queue_depth == 0 || options.queue_depth > kMaxQueueDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("disk tier: queue_depth ", options.queue_depth, " is outside [1, ", kMaxQueueDepth, "]"));
  }
  const fs::path layout = options.root / std::string(kChunkLayoutFolder);
  std::error_code ec;
  fs::create_directories(layout, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("disk tier: cannot create ", layout.string(), ": ", ec.message()));
  }
  if (!fs::is_directory(layout, ec)) {
    return absl::FailedPreconditionError(absl::StrCat("disk tier: ", layout.string(), " is not a folder"));
  }

  CAKE_ASSIGN_OR_RETURN(const bool direct_io, ProbeDirectIo(layout));
  if (!direct_io) {
    if (!options.allow_buffered) {
      return absl::FailedPreconditionError(absl::StrCat(
          "disk tier: the filesystem of ", options.root.string(),
          " does not support O_DIRECT (EINVAL; e.g. ramfs, some FUSE or network mounts); put the disk tier on a "
          "filesystem that does, or set allow_buffered to read and write through the page cache"));
    }
    CAKE_RETURN_IF_ERROR(ProbeBufferedWrite(layout));
    spdlog::warn("disk tier at {}: the filesystem does not support O_DIRECT; using buffered I/O (allow_buffered)",
                 options.root.string());
  }

  const IoEngineFactory factory = options.engine_factory ? options.engine_factory : IoEngineFactory(MakeIoEngine);
  IoBackend backend = options.io_backend;
  std::unique_ptr<IoEngine> first_engine;
  if (backend == IoBackend::kAuto || backend == IoBackend::kUring) {
    absl::StatusOr<std::unique_ptr<IoEngine>> uring = factory(IoBackend::kUring, options.queue_depth);
    if (uring.ok()) {
      first_engine = std::move(uring).value();
      backend = IoBackend::kUring;
    } else if (backend == IoBackend::kUring) {
      return absl::FailedPreconditionError(
          absl::StrCat("disk tier: io_uring was requested but is unavailable: ", uring.status().message()));
    } else {
      spdlog::warn("disk tier at {}: io_uring is unavailable ({}); falling back to pread", options.root.string(),
                   std::string(uring.status().message()));
      backend = IoBackend::kPread;
    }
  }
  if (backend == IoBackend::kPread) {
    CAKE_ASSIGN_OR_RETURN(first_engine, factory(IoBackend::kPread, options.queue_depth));
  }

  std::unique_ptr<DiskTier> tier(new DiskTier(options, backend, direct_io, std::move(first_engine)));
  CAKE_RETURN_IF_ERROR(tier->Recover(options.recovery_threads));
  if (options.index_checkpoint_interval.count() > 0) {
    DiskTier* raw = tier.get();
    tier->checkpointer_ = std::jthread([raw](std::stop_token stop) { raw->CheckpointLoop(std::move(stop)); });
  }
  const RecoveryStats& r = tier->recovery_;
  spdlog::info(
      "disk tier at {}: {} backend, queue depth {}, {}; recovered {} chunks ({} bytes) in {:.1f} ms; removed {} "
      "temporary and {} corrupt files; skipped {} newer-format and {} foreign files; evicted {} over capacity; {}",
      options.root.string(), IoBackendName(backend), options.queue_depth, direct_io ? "O_DIRECT" : "buffered I/O",
      r.chunks_recovered, r.bytes_recovered, r.duration.count() / 1000.0, r.temp_files_removed, r.corrupt_files_removed,
      r.newer_version_files_skipped, r.foreign_files_ignored, r.evicted_over_capacity,
      r.clean_stop_index_used ? absl::StrCat(r.chunks_trusted_from_index, " from the clean-stop index (",
                                             r.index_entries_without_file, " of its entries had no file)")
                              : std::string("no clean-stop index: every header read"));
  return tier;
}

DiskTier::DiskTier(const Options& options, IoBackend backend, bool direct_io, std::unique_ptr<IoEngine> first_engine)
    : root_(options.root),
      capacity_bytes_(options.capacity_bytes),
      max_chunk_bytes_(options.max_chunk_bytes),
      queue_depth_(options.queue_depth),
      backend_(backend),
      direct_io_(direct_io),
      engine_factory_(options.engine_factory ? options.engine_factory : IoEngineFactory(MakeIoEngine)),
      index_checkpoint_interval_(options.index_checkpoint_interval) {
  idle_readers_.push_back(Reader{AlignedBuffer(), std::move(first_engine)});
}

DiskTier::~DiskTier() {
  if (checkpointer_.joinable()) {
    checkpointer_.request_stop();
    checkpointer_.join();
  }
  // Nothing reads or writes any more (the tier is going), so the index is exactly what the folder holds.
  if (!write_index_at_close_) return;
  if (absl::Status written = WriteIndex(); !written.ok()) {
    spdlog::warn("disk tier at {}: could not write the clean-stop index ({}); the next start reads every chunk header",
                 root_.string(), std::string(written.message()));
  }
}

absl::Status DiskTier::WriteIndex() {
  std::vector<IndexedChunk> entries;
  {
    MutexLock lock(&mu_);
    entries.reserve(index_.size());
    index_.ForEachLeastRecentFirst([&](const ChunkKey& key, const Entry& entry) {
      entries.push_back(IndexedChunk{key, entry.bytes});
    });
  }
  return WriteCleanStopIndex(root_ / std::string(kChunkLayoutFolder), entries);
}

// A checkpoint is as safe to trust as a clean stop's index: a file enters the index only after its data was
// synced and it was renamed into place, so a name the checkpoint lists is either a whole file or gone (a start
// drops names without a file, and reads files it does not name header by header); every read checks the
// header, key, length and payload checksum anyway.
void DiskTier::CheckpointLoop(std::stop_token stop) {
  uint64_t checkpointed = 0;
  bool due = recovery_.chunks_recovered > 0;
  while (!stop.stop_requested()) {
    uint64_t added;
    {
      MutexLock lock(&mu_);
      added = chunks_added_;
    }
    if (due || added != checkpointed) {
      if (absl::Status written = WriteIndex(); written.ok()) {
        ++index_checkpoints_;
      } else {
        spdlog::warn("disk tier at {}: could not write an index checkpoint ({}); a crash now reads every header",
                     root_.string(), std::string(written.message()));
      }
      checkpointed = added;
      due = false;
    }
    std::unique_lock lock(checkpoint_wait_mu_);
    checkpoint_wake_.wait_for(lock, stop, index_checkpoint_interval_, [] { return false; });
  }
}

int DiskTier::OpenFlags(int access) const { return access | O_CLOEXEC | (direct_io_ ? O_DIRECT : 0); }

absl::Status DiskTier::Recover(uint32_t threads) {
  const auto start = std::chrono::steady_clock::now();
  RecoveryScanOptions scan;
  scan.layout = root_ / std::string(kChunkLayoutFolder);
  scan.max_chunk_bytes = max_chunk_bytes_;
  scan.may_hold = [this](uint64_t payload_bytes) { return MayHold(payload_bytes); };
  scan.threads = threads;
  scan.open_flags = OpenFlags(O_RDONLY);
  CAKE_ASSIGN_OR_RETURN(const std::vector<ScannedChunk> found, ScanChunkFolder(scan, recovery_));
  MutexLock lock(&mu_);
  for (const ScannedChunk& f : found) {
    if (index_.Insert(f.key, Entry{f.payload_bytes})) used_bytes_ += FileFootprint(f.payload_bytes);
  }
  const uint64_t before = evictions_;
  MakeRoom(0);  // a smaller capacity than last time: drop the oldest until the rest fits
  recovery_.evicted_over_capacity += evictions_ - before;
  evictions_ = before;
  recovery_.chunks_recovered = index_.size();
  recovery_.bytes_recovered = used_bytes_;
  recovery_.duration = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start);
  write_index_at_close_ = true;
  return absl::OkStatus();
}

bool DiskTier::Contains(const ChunkKey& key) const {
  MutexLock lock(&mu_);
  return index_.Contains(key);
}

absl::StatusOr<DiskTier::Reader> DiskTier::AcquireReader() {
  {
    MutexLock lock(&readers_mu_);
    if (!idle_readers_.empty()) {
      Reader reader = std::move(idle_readers_.back());
      idle_readers_.pop_back();
      return reader;
    }
  }
  // More concurrent readers than engines so far: one more, created outside the lock (ring setup is a syscall).
  absl::StatusOr<std::unique_ptr<IoEngine>> engine = engine_factory_(backend_, queue_depth_);
  if (!engine.ok()) {
    return absl::UnavailableError(
        absl::StrCat("disk tier: cannot create a ", IoBackendName(backend_), " engine: ", engine.status().message()));
  }
  return Reader{AlignedBuffer(), std::move(engine).value()};
}

void DiskTier::ReleaseReader(Reader reader) {
  if (reader.engine->broken()) {
    spdlog::warn("disk tier at {}: discarding a broken {} engine", root_.string(), reader.engine->name());
    return;
  }
  if (reader.bounce.size() > kMaxRetainedBounceBytes) reader.bounce = AlignedBuffer();
  MutexLock lock(&readers_mu_);
  if (idle_readers_.size() < kMaxIdleReaders) idle_readers_.push_back(std::move(reader));
}

absl::Status DiskTier::Read(const ChunkKey& key, std::span<std::byte> dst) {
  LruIndex<Entry>::ReadPin pin;
  CAKE_ASSIGN_OR_RETURN(const uint64_t bytes, PinForRead(key, pin));
  if (bytes != dst.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", key.Hex(), " holds ", bytes, " bytes; the destination has ", dst.size()));
  }
  return ReadPinned(key, pin, dst);
}

absl::Status DiskTier::ReadValue(const ChunkKey& key, uint64_t max_bytes, std::vector<std::byte>& out) {
  LruIndex<Entry>::ReadPin pin;
  CAKE_ASSIGN_OR_RETURN(const uint64_t bytes, PinForRead(key, pin));
  if (bytes > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", key.Hex(), " holds ", bytes, " bytes; at most ", max_bytes, " were expected"));
  }
  out.resize(bytes);  // outside the tier's lock: it may fault in megabytes
  return ReadPinned(key, pin, out);
}

absl::StatusOr<uint64_t> DiskTier::PinForRead(const ChunkKey& key, LruIndex<Entry>::ReadPin& pin) {
  MutexLock lock(&mu_);
  const Entry* e = index_.Find(key);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("chunk ", key.Hex(), " is not on disk"));
  pin = *index_.PinForRead(key);
  return e->bytes;
}

absl::Status DiskTier::ReadPinned(const ChunkKey& key, LruIndex<Entry>::ReadPin& pin, std::span<std::byte> dst) {
  // The read runs outside the lock so readers proceed in parallel; the pin keeps eviction away from the file,
  // and an explicit Remove meanwhile is harmless (an open file outlives its unlink).
  absl::Status status = ReadFile(key, dst);

  MutexLock lock(&mu_);
  if (!pin.current()) return status;  // removed (and maybe rewritten) meanwhile: not ours to judge
  pin.ReleaseLocked();
  switch (status.code()) {
    case absl::StatusCode::kDataLoss:
      spdlog::warn("disk tier: chunk {} is corrupt ({}); removing it", key.Hex(), std::string(status.message()));
      EraseLocked(key);
      ++corrupt_removed_;
      break;
    case absl::StatusCode::kNotFound:            // the file vanished under us (an operator cleaning up): forget it
    case absl::StatusCode::kFailedPrecondition:  // replaced by a newer daemon's file: forget it, leave the file
      used_bytes_ -= FileFootprint(index_.Find(key)->bytes);
      index_.Erase(key);
      break;
    default:
      break;
  }
  return status;
}

absl::Status DiskTier::ReadFile(const ChunkKey& key, std::span<std::byte> dst) {
  const fs::path path = ChunkPath(root_, key);
  UniqueFd fd(::open(path.c_str(), OpenFlags(O_RDONLY)));
  if (!fd.valid() && errno == ENOENT) {
    return absl::NotFoundError(absl::StrCat(path.string(), " vanished (removed outside the tier)"));
  }
  if (!fd.valid()) return ErrnoStatus(errno, "opening", path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "inspecting", path);
  const uint64_t file_bytes = ChunkFileBytes(dst.size());
  if (static_cast<uint64_t>(st.st_size) != file_bytes) {
    return absl::DataLossError(absl::StrCat(path.string(), ": the file is ", st.st_size, " bytes; a chunk of ",
                                            dst.size(), " bytes needs ", file_bytes));
  }

  CAKE_ASSIGN_OR_RETURN(Reader reader, AcquireReader());
  absl::Cleanup release = [&] { ReleaseReader(std::move(reader)); };

  // Straight into dst when it can take O_DIRECT reads: then only the header and a partial last block go
  // through the bounce buffer. Otherwise the whole file lands in the bounce buffer and is copied out.
  const bool into_dst = !dst.empty() && IsAligned(dst.data());
  const size_t body = into_dst ? dst.size() / kDirectIoAlignment * kDirectIoAlignment : 0;
  const size_t tail = into_dst ? dst.size() - body : 0;
  const size_t bounce_bytes = into_dst ? kChunkHeaderBytes + (tail > 0 ? kDirectIoAlignment : 0) : file_bytes;
  if (reader.bounce.size() < bounce_bytes) {
    reader.bounce = AlignedBuffer(bounce_bytes);
    if (!reader.bounce.ok()) {
      return absl::UnavailableError(absl::StrCat("out of memory for a ", bounce_bytes, "-byte read buffer"));
    }
  }
  const std::span<std::byte> bounce = reader.bounce.span().first(bounce_bytes);
  std::vector<ReadSegment> segments;
  if (into_dst) {
    segments.push_back({0, bounce.first(kChunkHeaderBytes)});
    if (body > 0) segments.push_back({kChunkHeaderBytes, dst.first(body)});
    if (tail > 0) segments.push_back({kChunkHeaderBytes + body, bounce.subspan(kChunkHeaderBytes)});
  } else {
    segments.push_back({0, bounce});
  }
  CAKE_RETURN_IF_ERROR(Annotate(ReadSegments(*reader.engine, fd.get(), segments), path));

  absl::StatusOr<ChunkHeader> header = ParseChunkHeader(bounce.first(kChunkHeaderBytes));
  CAKE_RETURN_IF_ERROR(Annotate(header.status(), path));
  if (!(header->key == key)) return absl::DataLossError(absl::StrCat(path.string(), ": the header names another key"));
  if (header->payload_length != dst.size()) {
    return absl::DataLossError(absl::StrCat(path.string(), ": the header says ", header->payload_length,
                                            " bytes; the index says ", dst.size()));
  }
  if (!into_dst) {
    if (!dst.empty()) std::memcpy(dst.data(), bounce.data() + kChunkHeaderBytes, dst.size());
  } else if (tail > 0) {
    std::memcpy(dst.data() + body, bounce.data() + kChunkHeaderBytes, tail);
  }
  if (PayloadChecksum(dst) != header->payload_checksum) {
    return absl::DataLossError(absl::StrCat(path.string(), ": payload checksum mismatch"));
  }
  return absl::OkStatus();
}

// What a chunk really costs the disk: its whole file (header, payload, padding to the O_DIRECT alignment), so
// the budget is what `du` says, not the sum of payloads.
uint64_t DiskTier::FileFootprint(uint64_t payload_bytes) { return ChunkFileBytes(payload_bytes); }

bool DiskTier::MakeRoom(uint64_t bytes) {
  // Both callbacks run inside EvictUntil, on this thread, under the lock this function requires.
  return index_.EvictUntil(
      [&] {
        mu_.AssertHeld();
        return used_bytes_ + reserved_bytes_ + bytes <= capacity_bytes_;
      },
      [&](const ChunkKey& key, const Entry& entry) {
        mu_.AssertHeld();
        UnlinkChunkFile(key);
        used_bytes_ -= FileFootprint(entry.bytes);
        ++evictions_;
      });
}

void DiskTier::UnlinkChunkFile(const ChunkKey& key) const {
  const fs::path path = ChunkPath(root_, key);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    // The index forgets it regardless: a file we cannot delete is left for an operator, and Open retries.
    spdlog::warn("disk tier: cannot remove {}: {}", path.string(), std::strerror(errno));
  }
}

void DiskTier::EraseLocked(const ChunkKey& key) {
  UnlinkChunkFile(key);
  used_bytes_ -= FileFootprint(index_.Find(key)->bytes);
  index_.Erase(key);
}

absl::Status DiskTier::WriteTempFile(const fs::path& temp, const ChunkKey& key, std::span<const std::byte> src) {
  const int flags = OpenFlags(O_WRONLY | O_CREAT | O_EXCL);
  UniqueFd fd(::open(temp.c_str(), flags, 0644));
  if (!fd.valid() && errno == ENOENT) {
    // First chunk in this folder (or an operator removed it): create it and try once more.
    std::error_code ec;
    fs::create_directories(temp.parent_path(), ec);
    fd = UniqueFd(::open(temp.c_str(), flags, 0644));
  }
  if (!fd.valid()) return ErrnoStatus(errno, "creating", temp);
  // From here on any failure leaves no trace: the temporary file goes, the final name is never touched.
  absl::Cleanup remove_temp = [&] { ::unlink(temp.c_str()); };

  const uint64_t file_bytes = ChunkFileBytes(src.size());
  // The whole file is allocated before the first write, so the filesystem can give it one extent: written as a
  // 4 KiB header and then the payload, ext4 put the header's block far from the payload's (filefrag: 2 to 5
  // extents a file), and a read paid for both places. It also finds a full disk before megabytes are written.
  // Filesystems without fallocate (EOPNOTSUPP) just write the file as before.
  if (::fallocate(fd.get(), 0, 0, static_cast<off_t>(file_bytes)) != 0 && errno != EOPNOTSUPP && errno != ENOSYS) {
    return ErrnoStatus(errno, "allocating", temp);
  }
  const uint64_t checksum = PayloadChecksum(src);
  const bool aligned_source = reinterpret_cast<uintptr_t>(src.data()) % kDirectIoAlignment == 0;
  if (aligned_source && src.size() >= kWriteStagingBytes) {
    // Large page-aligned sources (the DRAM tier's extents, lent to the write-back) go to disk straight from
    // where they are, in one write the kernel splits into many requests in flight; only the header and the
    // last partial block are staged.
    AlignedBuffer block(kChunkHeaderBytes);
    if (!block.ok()) return absl::ResourceExhaustedError("out of memory for a 4 KiB header buffer");
    EncodeChunkHeader(ChunkHeader{key, src.size(), checksum}, block.span());
    CAKE_RETURN_IF_ERROR(WriteFull(fd.get(), 0, block.span(), temp));
    const uint64_t bulk = src.size() / kDirectIoAlignment * kDirectIoAlignment;
    CAKE_RETURN_IF_ERROR(WriteFull(fd.get(), kChunkHeaderBytes, src.first(bulk), temp));
    if (const uint64_t tail = src.size() - bulk; tail > 0) {
      std::memcpy(block.data(), src.data() + bulk, tail);
      std::memset(block.data() + tail, 0, kDirectIoAlignment - tail);
      CAKE_RETURN_IF_ERROR(WriteFull(fd.get(), kChunkHeaderBytes + bulk, block.span(), temp));
    }
  } else {
    AlignedBuffer staging(std::min<uint64_t>(file_bytes, kWriteStagingBytes));
    if (!staging.ok()) return absl::ResourceExhaustedError("out of memory for the disk tier's write buffer");
    EncodeChunkHeader(ChunkHeader{key, src.size(), checksum}, staging.span().first(kChunkHeaderBytes));
    size_t filled = kChunkHeaderBytes;
    size_t copied = 0;
    uint64_t written = 0;
    while (written < file_bytes) {
      const size_t room = std::min<uint64_t>(staging.size(), file_bytes - written);
      const size_t take = std::min(room - filled, src.size() - copied);
      if (take > 0) std::memcpy(staging.data() + filled, src.data() + copied, take);
      copied += take;
      filled += take;
      std::memset(staging.data() + filled, 0, room - filled);  // padding up to the block, only at the very end
      CAKE_RETURN_IF_ERROR(WriteFull(fd.get(), written, staging.span().first(room), temp));
      written += room;
      filled = 0;
    }
  }
  // fdatasync covers the size too (needed to read the data back); the name is made durable by SyncFolder.
  if (::fdatasync(fd.get()) != 0) return ErrnoStatus(errno, "syncing", temp);
  if (const int err = fd.Close(); err != 0) return ErrnoStatus(err, "closing", temp);
  std::move(remove_temp).Cancel();
  return absl::OkStatus();
}

absl::Status DiskTier::Write(const ChunkKey& key, std::span<const std::byte> src) {
  const uint64_t footprint = FileFootprint(src.size());
  if (src.size() > max_chunk_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat("a chunk of ", src.size(), " bytes exceeds the disk tier's ",
                                                     max_chunk_bytes_, "-byte max_chunk_bytes"));
  }
  if (footprint > capacity_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a chunk of ", src.size(), " bytes exceeds the disk tier's ", capacity_bytes_, "-byte capacity"));
  }
  {
    MutexLock lock(&mu_);
    if (index_.Touch(key) != nullptr) return absl::OkStatus();
    // Room is taken before the (slow) file write, so concurrent writers cannot together overfill the disk.
    if (!MakeRoom(footprint)) {
      return absl::ResourceExhaustedError(absl::StrCat("disk tier is full (", used_bytes_, " stored and ",
                                                       reserved_bytes_, " being written of ", capacity_bytes_,
                                                       " bytes) and every chunk in it is being read"));
    }
    reserved_bytes_ += footprint;
  }

  const fs::path folder = ChunkFolder(root_, key);
  const fs::path temp = folder / absl::StrCat(std::string(kTempFilePrefix), RandomHex128());
  absl::Status written = WriteTempFile(temp, key, src);

  uint64_t generation;
  {
    MutexLock lock(&mu_);
    reserved_bytes_ -= footprint;
    if (!written.ok()) return written;
    if (index_.Touch(key) != nullptr) {
      // Another writer of the same key won the race; both wrote the same content.
      ::unlink(temp.c_str());
      return absl::OkStatus();
    }
    const fs::path final_path = ChunkPath(root_, key);
    if (::rename(temp.c_str(), final_path.c_str()) != 0) {
      const int err = errno;
      ::unlink(temp.c_str());
      return ErrnoStatus(err, "renaming into", final_path);
    }
    generation = *index_.Insert(key, Entry{src.size()});  // absent: checked above, under the same lock
    used_bytes_ += footprint;
    ++chunks_added_;
  }

  if (absl::Status synced = SyncFolder(folder); !synced.ok()) {
    // Not durable, so not acknowledged: forget it rather than promise a chunk a crash could take away.
    MutexLock lock(&mu_);
    if (index_.Current(key, generation)) EraseLocked(key);
    return synced;
  }
  return absl::OkStatus();
}

absl::Status DiskTier::Remove(const ChunkKey& key) {
  MutexLock lock(&mu_);
  if (!index_.Contains(key)) return absl::NotFoundError(absl::StrCat("chunk ", key.Hex(), " is not on disk"));
  EraseLocked(key);
  return absl::OkStatus();
}

TierUsage DiskTier::Usage() const {
  MutexLock lock(&mu_);
  return TierUsage{used_bytes_, capacity_bytes_, index_.size()};
}

void DiskTier::ForEach(const std::function<void(const ChunkKey&, uint64_t)>& fn) const {
  MutexLock lock(&mu_);
  index_.ForEach([&](const ChunkKey& key, const Entry& entry) { fn(key, entry.bytes); });
}

TierStats DiskTier::Stats() const {
  TierStats stats;
  stats.evictions = evictions();
  stats.corrupt_removed = corrupt_removed();
  return stats;
}

uint64_t DiskTier::evictions() const {
  MutexLock lock(&mu_);
  return evictions_;
}

uint64_t DiskTier::corrupt_removed() const {
  MutexLock lock(&mu_);
  return corrupt_removed_;
}

}  // namespace cake
