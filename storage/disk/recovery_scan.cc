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

}  // namespace

absl::StatusOr<std::vector<ScannedChunk>> ScanChunkFolder(const RecoveryScanOptions& options, RecoveryStats& recovery) {
  const fs::path& layout = options.layout;
  const uint32_t threads = options.threads;
  struct Found {
    ChunkKey key;
    uint64_t bytes;
    bool from_index;  // then `position` orders it, else `mtime`
    uint64_t position;
    timespec mtime;
  };
  struct WorkerResult {
    RecoveryStats stats;
    std::vector<Found> found;
    uint64_t index_names_found = 0;  // files the clean-stop index names, trusted or not
    absl::Status error;
  };

  // What the last clean stop left: every chunk's length and its place in the recency order. A file it names is
  // indexed without reading its header (every read checks the header anyway); a file it does not name is
  // inspected as after a crash, and a name it lists without a file is dropped, so even an index older than the
  // folder (a daemon that did not know the index ran in between) cannot make the tier serve what is not there.
  struct IndexedEntry {
    uint64_t bytes;
    uint64_t position;
  };
  absl::flat_hash_map<ChunkKey, IndexedEntry> indexed;
  if (absl::StatusOr<std::vector<IndexedChunk>> index = TakeCleanStopIndex(layout); index.ok()) {
    recovery.clean_stop_index_used = true;
    indexed.reserve(index->size());
    for (size_t i = 0; i < index->size(); ++i)
      indexed.emplace((*index)[i].key, IndexedEntry{(*index)[i].payload_bytes, i});
  } else if (!absl::IsNotFound(index.status())) {
    spdlog::warn("disk tier: not using the clean-stop index ({}); reading every chunk header instead",
                 std::string(index.status().message()));
  }

  auto remove_file = [](const fs::path& path, const char* why) {
    spdlog::warn("disk tier: removing {}: {}", path.string(), why);
    ::unlink(path.c_str());
  };
  // Validates one "<key>.chunk" file by its header; returns its entry, or nothing after dealing with it.
  auto inspect = [&](const fs::path& path, const ChunkKey& key, AlignedBuffer& header,
                     RecoveryStats& stats) -> std::optional<Found> {
    UniqueFd fd(::open(path.c_str(), options.open_flags));
    struct stat st {};
    if (!fd.valid() || ::fstat(fd.get(), &st) != 0) {
      spdlog::warn("disk tier: cannot open {}: {}; left in place, not indexed", path.string(), std::strerror(errno));
      return std::nullopt;
    }
    if (static_cast<uint64_t>(st.st_size) < kChunkHeaderBytes) {
      remove_file(path, "shorter than a chunk header");
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
    } else if (parsed->payload_length > options.max_chunk_bytes) {
      // A file costs only the blocks written to it: a sparse one can match any length it claims.
      problem = "the header claims more than max_chunk_bytes (this tier never wrote it)";
    }
    if (problem != nullptr) {
      remove_file(path, problem);
      ++stats.corrupt_files_removed;
      return std::nullopt;
    }
    if (!options.may_hold(parsed->payload_length)) {
      // Larger than the whole (now smaller) capacity: indexed, it would evict every other chunk before itself.
      remove_file(path, "the chunk is larger than the tier's whole capacity");
      ++stats.evicted_over_capacity;
      return std::nullopt;
    }
    return Found{key, parsed->payload_length, false, 0, st.st_mtim};
  };

  // The 256 key folders first (one thread: a few hundred names), then each folder listed and its files
  // inspected by whichever worker claims it, so listing one folder overlaps the header reads of the others.
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

  auto scan_folder = [&](const fs::path& folder, AlignedBuffer& header, WorkerResult& out) {
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
        remove_file(path, "a chunk file in the wrong folder");
        ++out.stats.corrupt_files_removed;
        continue;
      }
      auto hit = indexed.find(*named);
      if (hit != indexed.end()) ++out.index_names_found;
      // A length the tier could never have written (more than max_chunk_bytes or its whole capacity) is not
      // believed: that file's header is read instead, with the same checks, which also keeps a forged index from
      // wrapping the byte budget.
      if (hit != indexed.end() && options.may_hold(hit->second.bytes)) {
        out.found.push_back(Found{*named, hit->second.bytes, true, hit->second.position, {}});
        ++out.stats.chunks_trusted_from_index;
      } else if (std::optional<Found> f = inspect(path, *named, header, out.stats)) {
        out.found.push_back(*f);
      }
    }
    if (sub_ec && out.error.ok()) {
      out.error = absl::FailedPreconditionError(
          absl::StrCat("disk tier: cannot list ", folder.string(), ": ", sub_ec.message()));
    }
  };

  const size_t workers = std::clamp<size_t>(threads, 1, std::max<size_t>(folders.size(), 1));
  std::vector<WorkerResult> results(workers);
  std::atomic<size_t> next{0};
  std::atomic<bool> out_of_memory{false};
  auto work = [&](size_t w) {
    AlignedBuffer header(kChunkHeaderBytes);
    if (!header.ok()) {
      out_of_memory = true;
      return;
    }
    for (size_t i; (i = next.fetch_add(1)) < folders.size();) scan_folder(folders[i], header, results[w]);
  };
  {
    std::vector<std::jthread> pool;
    for (size_t w = 1; w < workers; ++w) pool.emplace_back(work, w);
    work(0);
  }
  if (out_of_memory) return absl::ResourceExhaustedError("out of memory for 4 KiB header buffers");
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
  recovery.index_entries_without_file = indexed.size() - index_names_found;

  // Oldest first, so the newest chunk ends up at the front of the LRU list. The clean-stop index knows the
  // recency order exactly; for files it does not name, modification time is the best record of use that
  // survives a restart, and they count as older than anything the index names.
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

}  // namespace cake
