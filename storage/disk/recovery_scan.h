// The disk tier's start-up scan: which chunks its folder holds, each checked, oldest first, so the tier's index
// can be rebuilt from them. Files a crash left (temporary writes, probes) are removed, corrupt ones removed with a
// warning, a newer daemon's or foreign ones left alone; the clean-stop index, when the last stop left one, lets it
// skip the header reads of the files it names. Its own code, so each of those cases is tested on real files
// without a tier (tests/storage/disk/recovery_scan_test.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "keys/namespace.h"

namespace cake {

// What Open found in the root folder.
struct RecoveryStats {
  uint64_t chunks_recovered = 0;
  uint64_t bytes_recovered = 0;     // payload bytes, as Usage() counts them
  uint64_t temp_files_removed = 0;  // leftovers of writes cut short by a crash
  // Bad magic or checksum, wrong size, name and header disagree, or a length over max_chunk_bytes.
  uint64_t corrupt_files_removed = 0;
  uint64_t newer_version_files_skipped = 0;  // left in place: another (newer) daemon may own them
  uint64_t foreign_files_ignored = 0;        // names that are not ours; never touched
  uint64_t evicted_over_capacity = 0;        // recovered chunks beyond a (now smaller) capacity, or larger than it
  bool clean_stop_index_used = false;        // the last stop was clean and left its index (clean_stop_index.h)
  uint64_t chunks_trusted_from_index = 0;    // indexed from it, headers left to their first read
  uint64_t index_entries_without_file = 0;   // named by it, but their files were gone: dropped
  std::chrono::microseconds duration{0};
};

struct ScannedChunk {
  ChunkKey key;
  uint64_t payload_bytes = 0;
};

struct RecoveryScanOptions {
  std::filesystem::path layout;  // the tier's chunk layout folder (<root>/v1)
  uint64_t max_chunk_bytes = 0;  // a header that claims more was not written by this tier
  // Whether the tier could hold a chunk of this payload at all (its whole capacity): larger ones are removed.
  std::function<bool(uint64_t payload_bytes)> may_hold;
  uint32_t threads = 1;  // header readers at once (a cold folder is seek-bound)
  int open_flags = 0;    // for reading a chunk's header (O_RDONLY, with O_DIRECT where the tier uses it)
};

// Oldest first: the clean-stop index's recency order for the files it names, modification time for the rest
// (older than anything the index names). Counts what it found and did into `stats` (every field but
// chunks_recovered, bytes_recovered and duration, which are the tier's). FAILED_PRECONDITION when a folder cannot
// be listed; RESOURCE_EXHAUSTED without memory for a header buffer.
absl::StatusOr<std::vector<ScannedChunk>> ScanChunkFolder(const RecoveryScanOptions& options, RecoveryStats& stats);

}  // namespace cake
