// The disk tier's start-up scan on real files: written by a real DiskTier, then cut short, corrupted and littered
// the way crashes and operators leave a folder.
#include "storage/disk/recovery_scan.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <vector>

#include "storage/chunk_file.h"
#include "storage/disk/clean_stop_index.h"
#include "storage/disk/disk_tier.h"
#include "tests/storage/tier_test_util.h"

namespace cake {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::TestKey;
using testing::TestValue;

constexpr uint64_t kChunk = 8192;

// Chunks 0..n-1 written in that order by a real tier, which leaves its clean-stop index when it closes.
void WriteChunks(const fs::path& root, uint32_t n) {
  DiskTier::Options o;
  o.root = root;
  o.capacity_bytes = 64 << 20;
  o.io_backend = IoBackend::kPread;
  o.allow_buffered = true;
  o.index_checkpoint_interval = std::chrono::milliseconds(0);
  auto tier = DiskTier::Open(o);
  REQUIRE(tier.ok());
  for (uint32_t i = 0; i < n; ++i) REQUIRE((*tier)->Write(TestKey(i), TestValue(i, kChunk)).ok());
}

RecoveryScanOptions ScanOf(const fs::path& root) {
  RecoveryScanOptions scan;
  scan.layout = root / std::string(kChunkLayoutFolder);
  scan.max_chunk_bytes = 1 << 20;
  scan.may_hold = [](uint64_t bytes) { return bytes <= (64 << 20); };
  scan.threads = 4;
  scan.open_flags = O_RDONLY | O_CLOEXEC;
  return scan;
}

}  // namespace

TEST_CASE("recovery scan: after a clean stop, the index gives every chunk, oldest first, without header reads",
          "[recovery_scan]") {
  TempDir dir;
  WriteChunks(dir.path(), 5);
  RecoveryStats stats;
  auto found = ScanChunkFolder(ScanOf(dir.path()), stats);
  REQUIRE(found.ok());
  REQUIRE(found->size() == 5);
  for (uint32_t i = 0; i < 5; ++i) {
    CHECK((*found)[i].key == TestKey(i));  // written in this order: the last written is the newest
    CHECK((*found)[i].payload_bytes == kChunk);
  }
  CHECK(stats.clean_stop_index_used);
  CHECK(stats.chunks_trusted_from_index == 5);
  // The index is taken: a crash after this start must not find it again.
  CHECK_FALSE(fs::exists(dir.path() / std::string(kChunkLayoutFolder) / std::string(kCleanStopIndexName)));
}

TEST_CASE("recovery scan: after a crash, headers decide, leftovers and corrupt files go, foreign ones stay",
          "[recovery_scan]") {
  TempDir dir;
  WriteChunks(dir.path(), 4);
  const fs::path layout = dir.path() / std::string(kChunkLayoutFolder);
  fs::remove(layout / std::string(kCleanStopIndexName));  // a crash leaves none
  // A write cut short, a truncated chunk, a chunk in the wrong folder, and a file that is not ours.
  const fs::path truncated = ChunkPath(dir.path(), TestKey(1));
  fs::resize_file(truncated, 100);
  const fs::path temp = ChunkFolder(dir.path(), TestKey(2)) / (std::string(kTempFilePrefix) + "cut-short");
  std::ofstream(temp) << "half a chunk";
  const fs::path foreign = ChunkFolder(dir.path(), TestKey(2)) / "notes.txt";
  std::ofstream(foreign) << "an operator's";
  const fs::path misplaced_from = ChunkPath(dir.path(), TestKey(3));
  fs::path misplaced_folder = layout / (misplaced_from.parent_path().filename() == "00" ? "01" : "00");
  fs::create_directories(misplaced_folder);
  const fs::path misplaced = misplaced_folder / misplaced_from.filename();
  fs::rename(misplaced_from, misplaced);

  RecoveryStats stats;
  auto found = ScanChunkFolder(ScanOf(dir.path()), stats);
  REQUIRE(found.ok());
  std::vector<ChunkKey> keys;
  for (const ScannedChunk& c : *found) keys.push_back(c.key);
  CHECK(keys.size() == 2);  // chunks 0 and 2 survive
  CHECK(std::find(keys.begin(), keys.end(), TestKey(0)) != keys.end());
  CHECK(std::find(keys.begin(), keys.end(), TestKey(2)) != keys.end());
  CHECK_FALSE(stats.clean_stop_index_used);
  CHECK(stats.corrupt_files_removed == 2);  // the truncated one and the misplaced one
  CHECK(stats.temp_files_removed == 1);
  CHECK(stats.foreign_files_ignored == 1);
  CHECK_FALSE(fs::exists(truncated));
  CHECK_FALSE(fs::exists(temp));
  CHECK_FALSE(fs::exists(misplaced));
  CHECK(fs::exists(foreign));
}

TEST_CASE("recovery scan: a chunk the tier could not hold is removed, an index entry without a file dropped",
          "[recovery_scan]") {
  TempDir dir;
  WriteChunks(dir.path(), 3);
  fs::remove(ChunkPath(dir.path(), TestKey(0)));  // named by the index, gone from the folder
  RecoveryScanOptions scan = ScanOf(dir.path());
  scan.may_hold = [](uint64_t bytes) { return bytes < kChunk; };  // a capacity now smaller than one chunk
  RecoveryStats stats;
  auto found = ScanChunkFolder(scan, stats);
  REQUIRE(found.ok());
  CHECK(found->empty());
  CHECK(stats.index_entries_without_file == 1);
  CHECK(stats.evicted_over_capacity == 2);  // the index's length is not believed: each header is read and refused
}

}  // namespace cake
