#include "storage/disk/recovery_scan.h"

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

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/unique_fd.h"
#include "spdlog/spdlog.h"
#include "storage/chunk_file.h"
#include "storage/disk/clean_stop_index.h"
#include "storage/io/aligned_buffer.h"

namespace cake {
namespace {

namespace fs = std::filesystem;

bool IsTwoHexDigits(std::string_view name) {
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); };
  return name.size() == 2 && hex(name[0]) && hex(name[1]);
}

struct Found {
  ChunkKey key;
  uint64_t bytes;
  bool from_index;  // then `position` orders it, else `mtime`
  uint64_t position;
  timespec mtime;
};

// One worker's findings, merged once every worker is done.
struct WorkerResult {
  RecoveryStats stats;
  std::vector<Found> found;
  uint64_t index_names_found = 0;  // files the clean-stop index names, trusted or not
  absl::Status error;
};

struct IndexedEntry {
  uint64_t bytes;
  uint64_t position;
};
using CleanStopEntries = absl::flat_hash_map<ChunkKey, IndexedEntry>;

// What the last clean stop left: every chunk's length and its place in the recency order. A file it names is
// indexed without reading its header (every read checks the header anyway); a file it does not name is
// inspected as after a crash, and a name it lists without a file is dropped, so even an index older than the
// folder (a daemon that did not know the index ran in between) cannot make the tier serve what is not there.
CleanStopEntries TakeCleanStopEntries(const fs::path& layout, RecoveryStats& recovery) {
  CleanStopEntries indexed;
  if (absl::StatusOr<std::vector<IndexedChunk>> index = TakeCleanStopIndex(layout); index.ok()) {
    recovery.clean_stop_index_used = true;
    indexed.reserve(index->size());
    for (size_t i = 0; i < index->size(); ++i)
      indexed.emplace((*index)[i].key, IndexedEntry{(*index)[i].payload_bytes, i});
  } else if (!absl::IsNotFound(index.status())) {
    spdlog::warn("disk tier: not using the clean-stop index ({}); reading every chunk header instead",
                 std::string(index.status().message()));
  }
  return indexed;
}

void RemoveFile(const fs::path& path, const char* why) {
  spdlog::warn("disk tier: removing {}: {}", path.string(), why);
  ::unlink(path.c_str());
}

// The key folders under the layout folder; what else lies beside them is a crash's leftover (removed) or not
// ours (counted, left alone).
absl::StatusOr<std::vector<fs::path>> ListKeyFolders(const fs::path& layout, RecoveryStats& recovery) {
  std::vector<fs::path> folders;
  std::error_code ec;
  for (fs::directory_iterator top(layout, ec), end; !ec && top != end; top.increment(ec)) {
    const std::string top_name = top->path().filename().string();
    if (top_name.starts_with(kTempFilePrefix)) {
      ::unlink(top->path().c_str());  // an Open probe or an index write left by a crash
      ++recovery.temp_files_removed;
    } else if (IsTwoHexDigits(top_name) && top->is_directory()) {
      folders.push_back(top->path());
    } else if (top_name != kCleanStopIndexName) {  // still there only if removing it failed (logged)
      ++recovery.foreign_files_ignored;
    }
  }
  if (ec)
    return absl::FailedPreconditionError(absl::StrCat("disk tier: cannot list ", layout.string(), ": ", ec.message()));
  return folders;
}

// Inspects the key folders' files on up to `options.threads` workers, each folder claimed by one of them.
class FolderScan {
 public:
  FolderScan(const RecoveryScanOptions& options, const CleanStopEntries& indexed, const std::vector<fs::path>& folders)
      : options_(options),
        indexed_(indexed),
        folders_(folders),
        results_(std::clamp<size_t>(options.threads, 1, std::max<size_t>(folders.size(), 1))) {}

  // One result per worker; RESOURCE_EXHAUSTED when a worker had no memory for its header buffer.
  absl::StatusOr<std::vector<WorkerResult>> Run() && {
    {
      std::vector<std::jthread> pool;
      for (size_t w = 1; w < results_.size(); ++w) pool.emplace_back([this, w] { Work(w); });
      Work(0);
    }
    if (out_of_memory_) return absl::ResourceExhaustedError("out of memory for 4 KiB header buffers");
    return std::move(results_);
  }

 private:
  void Work(size_t w) {
    AlignedBuffer header(kChunkHeaderBytes);
    if (!header.ok()) {
      out_of_memory_ = true;
      return;
    }
    for (size_t i; (i = next_.fetch_add(1)) < folders_.size();) ScanFolder(folders_[i], header, results_[w]);
  }

  void ScanFolder(const fs::path& folder, AlignedBuffer& header, WorkerResult& out) const {
    const std::string folder_name = folder.filename().string();
    std::error_code sub_ec;
    for (fs::directory_iterator it(folder, sub_ec), sub_end; !sub_ec && it != sub_end; it.increment(sub_ec)) {
      const fs::path& path = it->path();
      const std::string file_name = path.filename().string();
      if (file_name.starts_with(kTempFilePrefix)) {
        ::unlink(path.c_str());  // a write cut short before its rename: never visible, safe to drop
        ++out.stats.temp_files_removed;
        continue;
      }
      absl::StatusOr<ChunkKey> named = ChunkKeyFromFileName(file_name);
      if (!named.ok() || !it->is_regular_file()) {
        ++out.stats.foreign_files_ignored;
        continue;
      }
      if (file_name.compare(0, 2, folder_name) != 0) {
        RemoveFile(path, "a chunk file in the wrong folder");
        ++out.stats.corrupt_files_removed;
        continue;
      }
      auto hit = indexed_.find(*named);
      if (hit != indexed_.end()) ++out.index_names_found;
      // A length the tier could never have written (more than max_chunk_bytes or its whole capacity) is not
      // believed: that file's header is read instead, with the same checks, which also keeps a forged index from
      // wrapping the byte budget.
      if (hit != indexed_.end() && options_.may_hold(hit->second.bytes)) {
        out.found.push_back(Found{*named, hit->second.bytes, true, hit->second.position, {}});
        ++out.stats.chunks_trusted_from_index;
      } else if (std::optional<Found> f = Inspect(path, *named, header, out.stats)) {
        out.found.push_back(*f);
      }
    }
    if (sub_ec && out.error.ok()) {
      out.error = absl::FailedPreconditionError(
          absl::StrCat("disk tier: cannot list ", folder.string(), ": ", sub_ec.message()));
    }
  }

  // Validates one "<key>.chunk" file by its header; returns its entry, or nothing after dealing with it.
  std::optional<Found> Inspect(const fs::path& path, const ChunkKey& key, AlignedBuffer& header,
                               RecoveryStats& stats) const {
    UniqueFd fd(::open(path.c_str(), options_.open_flags));
    struct stat st {};
    if (!fd.valid() || ::fstat(fd.get(), &st) != 0) {
      spdlog::warn("disk tier: cannot open {}: {}; left in place, not indexed", path.string(), std::strerror(errno));
      return std::nullopt;
    }
    if (static_cast<uint64_t>(st.st_size) < kChunkHeaderBytes) {
      RemoveFile(path, "shorter than a chunk header");
      ++stats.corrupt_files_removed;
      return std::nullopt;
    }
    const ssize_t n = ::pread(fd.get(), header.data(), kChunkHeaderBytes, 0);
    if (n != static_cast<ssize_t>(kChunkHeaderBytes)) {
      spdlog::warn("disk tier: cannot read the header of {}: {}; left in place, not indexed", path.string(),
                   n < 0 ? std::strerror(errno) : "short read");
      return std::nullopt;
    }
    absl::StatusOr<ChunkHeader> parsed = ParseChunkHeader(header.span());
    if (parsed.status().code() == absl::StatusCode::kFailedPrecondition) {
      // Another (newer) daemon may share this folder: its files are not ours to delete.
      spdlog::warn("disk tier: skipping {}: {}", path.string(), std::string(parsed.status().message()));
      ++stats.newer_version_files_skipped;
      return std::nullopt;
    }
    const char* problem = nullptr;
    if (!parsed.ok()) {
      problem = "bad header (magic, size or checksum)";
    } else if (!(parsed->key == key)) {
      problem = "the header names another key";
    } else if (static_cast<uint64_t>(st.st_size) != ChunkFileBytes(parsed->payload_length)) {
      problem = "the file size does not match the payload length (truncated or extended)";
    } else if (parsed->payload_length > options_.max_chunk_bytes) {
      // A file costs only the blocks written to it: a sparse one can match any length it claims.
      problem = "the header claims more than max_chunk_bytes (this tier never wrote it)";
    }
    if (problem != nullptr) {
      RemoveFile(path, problem);
      ++stats.corrupt_files_removed;
      return std::nullopt;
    }
    if (!options_.may_hold(parsed->payload_length)) {
      // Larger than the whole (now smaller) capacity: indexed, it would evict every other chunk before itself.
      RemoveFile(path, "the chunk is larger than the tier's whole capacity");
      ++stats.evicted_over_capacity;
      return std::nullopt;
    }
    return Found{key, parsed->payload_length, false, 0, st.st_mtim};
  }

  const RecoveryScanOptions& options_;
  const CleanStopEntries& indexed_;
  const std::vector<fs::path>& folders_;
  std::vector<WorkerResult> results_;  // one per worker, each written by its worker only
  std::atomic<size_t> next_{0};        // the next folder to claim
  std::atomic<bool> out_of_memory_{false};
};

// Adds the workers' counts into `recovery` and returns everything they found, or the first listing error (in
// worker order).
absl::StatusOr<std::vector<Found>> MergeResults(std::vector<WorkerResult>& results, size_t index_entries,
                                                RecoveryStats& recovery) {
  std::vector<Found> found;
  uint64_t index_names_found = 0;
  for (WorkerResult& r : results) {
    CAKE_RETURN_IF_ERROR(r.error);
    recovery.temp_files_removed += r.stats.temp_files_removed;
    recovery.corrupt_files_removed += r.stats.corrupt_files_removed;
    recovery.newer_version_files_skipped += r.stats.newer_version_files_skipped;
    recovery.foreign_files_ignored += r.stats.foreign_files_ignored;
    recovery.evicted_over_capacity += r.stats.evicted_over_capacity;
    recovery.chunks_trusted_from_index += r.stats.chunks_trusted_from_index;
    index_names_found += r.index_names_found;
    found.insert(found.end(), r.found.begin(), r.found.end());
  }
  recovery.index_entries_without_file = index_entries - index_names_found;
  return found;
}

// Oldest first, so the newest chunk ends up at the front of the LRU list. The clean-stop index knows the
// recency order exactly; for files it does not name, modification time is the best record of use that
// survives a restart, and they count as older than anything the index names.
std::vector<ScannedChunk> OldestFirst(std::vector<Found> found) {
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    if (a.from_index != b.from_index) return b.from_index;
    if (a.from_index) return a.position < b.position;
    return std::tie(a.mtime.tv_sec, a.mtime.tv_nsec) < std::tie(b.mtime.tv_sec, b.mtime.tv_nsec);
  });
  std::vector<ScannedChunk> chunks;
  chunks.reserve(found.size());
  for (const Found& f : found) chunks.push_back(ScannedChunk{f.key, f.bytes});
  return chunks;
}

}  // namespace

absl::StatusOr<std::vector<ScannedChunk>> ScanChunkFolder(const RecoveryScanOptions& options, RecoveryStats& recovery) {
  const CleanStopEntries indexed = TakeCleanStopEntries(options.layout, recovery);
  // The 256 key folders first (one thread: a few hundred names), then each folder listed and its files
  // inspected by whichever worker claims it, so listing one folder overlaps the header reads of the others.
  CAKE_ASSIGN_OR_RETURN(const std::vector<fs::path> folders, ListKeyFolders(options.layout, recovery));
  CAKE_ASSIGN_OR_RETURN(std::vector<WorkerResult> results, FolderScan(options, indexed, folders).Run());
  CAKE_ASSIGN_OR_RETURN(std::vector<Found> found, MergeResults(results, indexed.size(), recovery));
  return OldestFirst(std::move(found));
}

}  // namespace cake
