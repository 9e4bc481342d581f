// The disk tier beyond the common contract: file format, restart, crash leftovers, corruption, eviction,
// injected I/O faults on both backends, backend choice and unusable roots.
#include "storage/disk/disk_tier.h"

#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>
#include <vector>

#include "base/unique_fd.h"
#include "storage/chunk_file.h"
#include "storage/disk/clean_stop_index.h"
#include "storage/io/aligned_buffer.h"
#include "storage/io/io_engine.h"
#include "tests/storage/disk/faulty_io_engine.h"
#include "tests/storage/tier_test_util.h"

namespace cake {
namespace {

namespace fs = std::filesystem;
using testing::Eventually;
using testing::FaultyEngineFactory;
using testing::IoFault;
using testing::IoFaultControl;
using testing::TempDir;
using testing::TestKey;
using testing::TestValue;

constexpr uint64_t kMiB = 1 << 20;

DiskTier::Options OptionsFor(const fs::path& root, uint64_t capacity = 64 * kMiB,
                             IoBackend backend = IoBackend::kPread) {
  DiskTier::Options o;
  o.root = root;
  o.capacity_bytes = capacity;
  o.io_backend = backend;
  o.index_checkpoint_interval = std::chrono::milliseconds(0);  // the checkpoint tests turn it on
  return o;
}

std::unique_ptr<DiskTier> MustOpen(const DiskTier::Options& options) {
  absl::StatusOr<std::unique_ptr<DiskTier>> tier = DiskTier::Open(options);
  INFO(tier.status().ToString());
  REQUIRE(tier.ok());
  return std::move(tier).value();
}

bool UringAvailable() {
  static const bool available = MakeUringEngine(1).ok();
  return available;
}

// Both backends where this machine has them; io_uring is skipped, with a warning, where the kernel refuses it.
std::vector<IoBackend> Backends() {
  if (UringAvailable()) return {IoBackend::kUring, IoBackend::kPread};
  WARN("io_uring is unavailable here: only the pread backend is tested");
  return {IoBackend::kPread};
}

std::vector<std::byte> ReadFileBytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(raw.size());
  std::memcpy(out.data(), raw.data(), raw.size());
  return out;
}

void WriteFileBytes(const fs::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void FlipByte(const fs::path& path, uint64_t offset) {
  std::vector<std::byte> bytes = ReadFileBytes(path);
  REQUIRE(offset < bytes.size());
  bytes[offset] ^= std::byte{0x5a};
  WriteFileBytes(path, bytes);
}

size_t CountFiles(const fs::path& folder) {
  size_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(folder)) n += e.is_regular_file() ? 1 : 0;
  return n;
}

// A crash leaves no clean-stop index (a start removes it before serving): deleting the one a close wrote makes
// the next Open rebuild from the headers, as after a crash.
void SimulateCrash(const fs::path& root) {
  const fs::path index = root / "v1" / std::string(kCleanStopIndexName);
  REQUIRE(fs::exists(index));
  fs::remove(index);
}

void SetMtime(const fs::path& path, time_t seconds) {
  const timespec times[2] = {{seconds, 0}, {seconds, 0}};
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0);
}

// Mounts a small filesystem on a fresh folder when the test runs as root (as here); elsewhere the test that
// needs it warns and checks what it can without it.
class ScopedMount {
 public:
  ScopedMount(const char* type, const char* data) {
    mounted_ = ::mount("none", dir_.path().c_str(), type, 0, data) == 0;
    error_ = mounted_ ? 0 : errno;
  }
  ~ScopedMount() {
    if (mounted_) ::umount2(dir_.path().c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  std::string error() const { return std::strerror(error_); }
  fs::path path() const { return dir_.path(); }

 private:
  TempDir dir_;
  bool mounted_ = false;
  int error_ = 0;
};

}  // namespace

TEST_CASE("chunk header round-trips and rejects damage with the right code", "[disk]") {
  ChunkHeader h{TestKey(7), 123456789, 0x0123456789abcdefULL};
  std::vector<std::byte> bytes(kChunkHeaderBytes);
  EncodeChunkHeader(h, bytes);
  CHECK(std::memcmp(bytes.data(), "CAKECHNK", 8) == 0);

  absl::StatusOr<ChunkHeader> parsed = ParseChunkHeader(bytes);
  REQUIRE(parsed.ok());
  CHECK(parsed->key == h.key);
  CHECK(parsed->payload_length == h.payload_length);
  CHECK(parsed->payload_checksum == h.payload_checksum);

  SECTION("bad magic is DATA_LOSS") {
    bytes[0] = std::byte{'X'};
    CHECK(ParseChunkHeader(bytes).status().code() == absl::StatusCode::kDataLoss);
  }
  SECTION("any flipped field byte breaks the header checksum: DATA_LOSS") {
    for (size_t offset : {16, 31, 32, 40, 47, 48}) {
      std::vector<std::byte> damaged = bytes;
      damaged[offset] ^= std::byte{1};
      CHECK(ParseChunkHeader(damaged).status().code() == absl::StatusCode::kDataLoss);
    }
  }
  SECTION("format version 2 is FAILED_PRECONDITION, checked before the checksum") {
    bytes[8] = std::byte{2};
    CHECK(ParseChunkHeader(bytes).status().code() == absl::StatusCode::kFailedPrecondition);
  }
  SECTION("a wrong header size is DATA_LOSS") {
    bytes[13] = std::byte{0x20};
    CHECK(ParseChunkHeader(bytes).status().code() == absl::StatusCode::kDataLoss);
  }
  SECTION("a short header is DATA_LOSS") {
    CHECK(ParseChunkHeader(std::span(bytes).first(100)).status().code() == absl::StatusCode::kDataLoss);
  }
  SECTION("sizes, paths and names") {
    CHECK(ChunkFileBytes(0) == 4096);
    CHECK(ChunkFileBytes(1) == 8192);
    CHECK(ChunkFileBytes(4096) == 8192);
    CHECK(ChunkFileBytes(4097) == 12288);
    const ChunkKey k = TestKey(3);
    CHECK(ChunkPath("/r", k) == fs::path("/r/v1") / k.Hex().substr(0, 2) / (k.Hex() + ".chunk"));
    absl::StatusOr<ChunkKey> back = ChunkKeyFromFileName(k.Hex() + ".chunk");
    REQUIRE(back.ok());
    CHECK(*back == k);
    CHECK(ChunkKeyFromFileName(k.Hex()).status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(ChunkKeyFromFileName("zz" + k.Hex().substr(2) + ".chunk").status().code() ==
          absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("disk tier round trip on both backends, through the bounce buffer and straight into aligned memory",
          "[disk]") {
  for (IoBackend backend : Backends()) {
    INFO("backend " << IoBackendName(backend));
    TempDir dir;
    auto tier = MustOpen(OptionsFor(dir.path(), 64 * kMiB, backend));
    CHECK(tier->backend() == backend);
    CHECK(tier->direct_io());
    uint32_t i = 0;
    // Sizes around block boundaries, and one spanning several 1 MiB reads.
    for (size_t bytes :
         {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{4097}, size_t{3 * kMiB + 5}, size_t{4 * kMiB}}) {
      ++i;
      INFO("value of " << bytes << " bytes");
      const auto value = TestValue(i, bytes);
      REQUIRE(tier->Write(TestKey(i), value).ok());
      const fs::path path = ChunkPath(dir.path(), TestKey(i));
      CHECK(fs::file_size(path) == ChunkFileBytes(bytes));

      std::vector<std::byte> unaligned_storage(bytes + 1);
      std::span<std::byte> unaligned(unaligned_storage.data() + 1, bytes);  // never 4096-aligned
      REQUIRE(tier->Read(TestKey(i), unaligned).ok());
      CHECK(std::equal(unaligned.begin(), unaligned.end(), value.begin()));

      AlignedBuffer aligned(bytes);
      REQUIRE(aligned.ok());
      REQUIRE(tier->Read(TestKey(i), aligned.span()).ok());
      CHECK(std::equal(aligned.span().begin(), aligned.span().end(), value.begin()));
    }
    // Large page-aligned sources (as the DRAM tier lends to the write-back) are written straight from where they
    // are; the last partial block is staged.
    for (size_t bytes : {size_t{4 * kMiB}, size_t{4 * kMiB + 5}, size_t{5 * kMiB + 4096}}) {
      ++i;
      INFO("aligned source of " << bytes << " bytes");
      const auto value = TestValue(i, bytes);
      AlignedBuffer source(bytes);
      REQUIRE(source.ok());
      std::memcpy(source.data(), value.data(), bytes);
      REQUIRE(tier->Write(TestKey(i), source.span()).ok());
      CHECK(fs::file_size(ChunkPath(dir.path(), TestKey(i))) == ChunkFileBytes(bytes));
      std::vector<std::byte> out(bytes);
      REQUIRE(tier->Read(TestKey(i), out).ok());
      CHECK(out == value);
    }
    // Nothing but chunk files is left behind: every temporary file was renamed or removed.
    CHECK(CountFiles(dir.path()) == i);
  }
}

TEST_CASE("disk tier restart: every chunk comes back byte for byte and usage is restored", "[disk]") {
  TempDir dir;
  TierUsage before;
  {
    auto tier = MustOpen(OptionsFor(dir.path()));
    for (uint32_t i = 0; i < 20; ++i) REQUIRE(tier->Write(TestKey(i), TestValue(i, 10000 + 4096 * i)).ok());
    before = tier->Usage();
  }
  auto tier = MustOpen(OptionsFor(dir.path()));
  const TierUsage after = tier->Usage();
  CHECK(after.used_bytes == before.used_bytes);
  CHECK(after.chunks == 20);
  CHECK(tier->recovery().chunks_recovered == 20);
  CHECK(tier->recovery().bytes_recovered == before.used_bytes);
  CHECK(tier->recovery().corrupt_files_removed == 0);
  for (uint32_t i = 0; i < 20; ++i) {
    REQUIRE(tier->Contains(TestKey(i)));
    std::vector<std::byte> out(10000 + 4096 * i);
    REQUIRE(tier->Read(TestKey(i), out).ok());
    CHECK(out == TestValue(i, out.size()));
  }
}

TEST_CASE("disk tier Open removes temporary files a crash left behind", "[disk]") {
  TempDir dir;
  {
    auto tier = MustOpen(OptionsFor(dir.path()));
    REQUIRE(tier->Write(TestKey(1), TestValue(1, 5000)).ok());
  }
  const fs::path folder = ChunkFolder(dir.path(), TestKey(1));
  const fs::path leftover = folder / ".tmp-0123456789abcdef";
  const fs::path other_folder_leftover = dir.path() / "v1" / "7f" / ".tmp-fedcba9876543210";
  const fs::path probe_leftover = dir.path() / "v1" / ".tmp-probe-0000000000000000";
  fs::create_directories(other_folder_leftover.parent_path());
  WriteFileBytes(leftover, TestValue(2, 3000));
  WriteFileBytes(other_folder_leftover, TestValue(3, 4096));
  WriteFileBytes(probe_leftover, {});

  auto tier = MustOpen(OptionsFor(dir.path()));
  CHECK(tier->recovery().temp_files_removed == 3);
  CHECK_FALSE(fs::exists(leftover));
  CHECK_FALSE(fs::exists(other_folder_leftover));
  CHECK_FALSE(fs::exists(probe_leftover));
  CHECK(tier->Usage().chunks == 1);
  std::vector<std::byte> out(5000);
  REQUIRE(tier->Read(TestKey(1), out).ok());
  CHECK(out == TestValue(1, 5000));
}

TEST_CASE("disk tier: a flipped payload byte is DATA_LOSS and the chunk is removed", "[disk]") {
  for (IoBackend backend : Backends()) {
    INFO("backend " << IoBackendName(backend));
    TempDir dir;
    auto tier = MustOpen(OptionsFor(dir.path(), 64 * kMiB, backend));
    const auto value = TestValue(1, 100000);
    REQUIRE(tier->Write(TestKey(1), value).ok());
    REQUIRE(tier->Write(TestKey(2), value).ok());
    const fs::path path = ChunkPath(dir.path(), TestKey(1));
    FlipByte(path, kChunkHeaderBytes + 54321);

    std::vector<std::byte> out(value.size());
    CHECK(tier->Read(TestKey(1), out).code() == absl::StatusCode::kDataLoss);
    CHECK_FALSE(fs::exists(path));
    CHECK_FALSE(tier->Contains(TestKey(1)));
    CHECK(tier->corrupt_removed() == 1);
    CHECK(tier->Usage().chunks == 1);
    CHECK(tier->Usage().used_bytes == ChunkFileBytes(value.size()));  // what the file takes, header included
    CHECK(tier->Read(TestKey(1), out).code() == absl::StatusCode::kNotFound);
    REQUIRE(tier->Read(TestKey(2), out).ok());  // the neighbour is untouched
    CHECK(out == value);
  }
}

TEST_CASE("disk tier: a damaged header or a file truncated after Open is DATA_LOSS at read time", "[disk]") {
  TempDir dir;
  auto tier = MustOpen(OptionsFor(dir.path()));
  const auto value = TestValue(1, 20000);
  REQUIRE(tier->Write(TestKey(1), value).ok());
  REQUIRE(tier->Write(TestKey(2), value).ok());
  FlipByte(ChunkPath(dir.path(), TestKey(1)), 33);  // payload length field: the header checksum catches it
  fs::resize_file(ChunkPath(dir.path(), TestKey(2)), 8192);

  std::vector<std::byte> out(value.size());
  CHECK(tier->Read(TestKey(1), out).code() == absl::StatusCode::kDataLoss);
  CHECK(tier->Read(TestKey(2), out).code() == absl::StatusCode::kDataLoss);
  CHECK(tier->corrupt_removed() == 2);
  CHECK(tier->Usage().chunks == 0);
  CHECK(CountFiles(dir.path()) == 0);
}

TEST_CASE("disk tier Open drops truncated and garbage files and counts them", "[disk]") {
  TempDir dir;
  {
    auto tier = MustOpen(OptionsFor(dir.path()));
    for (uint32_t i = 0; i < 4; ++i) REQUIRE(tier->Write(TestKey(i), TestValue(i, 30000)).ok());
  }
  SimulateCrash(dir.path());
  fs::resize_file(ChunkPath(dir.path(), TestKey(0)), 20000);               // cut mid-payload
  fs::resize_file(ChunkPath(dir.path(), TestKey(1)), 100);                 // shorter than a header
  WriteFileBytes(ChunkPath(dir.path(), TestKey(2)), TestValue(9, 40960));  // garbage under a valid name
  // A valid file under another key's name: the header and the name disagree.
  fs::create_directories(ChunkFolder(dir.path(), TestKey(4)));
  fs::copy_file(ChunkPath(dir.path(), TestKey(3)), ChunkPath(dir.path(), TestKey(4)));
  // Not ours: left alone.
  WriteFileBytes(dir.path() / "v1" / "README", TestValue(5, 10));

  auto tier = MustOpen(OptionsFor(dir.path()));
  CHECK(tier->recovery().corrupt_files_removed == 4);
  CHECK(tier->recovery().chunks_recovered == 1);
  CHECK(tier->recovery().foreign_files_ignored == 1);
  CHECK(tier->Usage().chunks == 1);
  CHECK(tier->Usage().used_bytes == ChunkFileBytes(30000));
  for (uint32_t i : {0, 1, 2, 4}) {
    CHECK_FALSE(tier->Contains(TestKey(i)));
    CHECK_FALSE(fs::exists(ChunkPath(dir.path(), TestKey(i))));
  }
  CHECK(fs::exists(dir.path() / "v1" / "README"));
  std::vector<std::byte> out(30000);
  REQUIRE(tier->Read(TestKey(3), out).ok());
  CHECK(out == TestValue(3, 30000));
}

TEST_CASE("disk tier after a clean stop: the index it left replaces the header reads and is gone once read", "[disk]") {
  TempDir dir;
  TierUsage before;
  {
    auto tier = MustOpen(OptionsFor(dir.path()));
    for (uint32_t i = 0; i < 30; ++i) REQUIRE(tier->Write(TestKey(i), TestValue(i, 5000 + 100 * i)).ok());
    before = tier->Usage();
  }
  const fs::path index = dir.path() / "v1" / std::string(kCleanStopIndexName);
  REQUIRE(fs::exists(index));
  auto tier = MustOpen(OptionsFor(dir.path()));
  CHECK_FALSE(fs::exists(index));  // a crash from here on must leave no index behind
  CHECK(tier->recovery().clean_stop_index_used);
  CHECK(tier->recovery().chunks_trusted_from_index == 30);
  CHECK(tier->recovery().index_entries_without_file == 0);
  CHECK(tier->recovery().foreign_files_ignored == 0);
  CHECK(tier->Usage().used_bytes == before.used_bytes);
  CHECK(tier->Usage().chunks == 30);
  for (uint32_t i = 0; i < 30; ++i) {
    std::vector<std::byte> out(5000 + 100 * i);
    REQUIRE(tier->Read(TestKey(i), out).ok());
    CHECK(out == TestValue(i, out.size()));
  }
}

TEST_CASE("disk tier index checkpoints: a crash reads only the headers of chunks written since the last one",
          "[disk]") {
  TempDir dir;
  const fs::path index = dir.path() / "v1" / std::string(kCleanStopIndexName);
  DiskTier::Options options = OptionsFor(dir.path());
  options.index_checkpoint_interval = std::chrono::milliseconds(20);
  std::vector<std::byte> checkpoint;
  {
    auto tier = MustOpen(options);
    CHECK_FALSE(fs::exists(index));  // nothing recovered, nothing written: no checkpoint yet
    for (uint32_t i = 0; i < 6; ++i) REQUIRE(tier->Write(TestKey(i), TestValue(i, 7000 + i)).ok());
    const auto checkpoint_lists = [&](size_t chunks) {
      if (!fs::exists(index)) return false;
      absl::StatusOr<std::vector<IndexedChunk>> listed = ParseCleanStopIndex(ReadFileBytes(index));
      return listed.ok() && listed->size() == chunks;
    };
    REQUIRE(Eventually([&] { return checkpoint_lists(6); }));
    checkpoint = ReadFileBytes(index);
    // No chunk added since: the checkpoint is not rewritten, however often the thread wakes.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const uint64_t checkpoints = tier->index_checkpoints();
    CHECK(checkpoints >= 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK(tier->index_checkpoints() == checkpoints);
    // After the checkpoint: two more chunks, and one it names removed.
    for (uint32_t i = 6; i < 8; ++i) REQUIRE(tier->Write(TestKey(i), TestValue(i, 7000 + i)).ok());
    REQUIRE(tier->Remove(TestKey(0)).ok());
  }
  // A crash at that moment leaves the checkpoint as the last index (the close wrote a newer one: put it back).
  WriteFileBytes(index, checkpoint);
  options.index_checkpoint_interval = std::chrono::hours(1);
  auto tier = MustOpen(options);
  CHECK(tier->recovery().clean_stop_index_used);
  CHECK(tier->recovery().chunks_trusted_from_index == 5);   // named and there
  CHECK(tier->recovery().index_entries_without_file == 1);  // named, removed after it: dropped
  CHECK(tier->recovery().chunks_recovered == 7);            // the two newer ones by their headers
  CHECK_FALSE(tier->Contains(TestKey(0)));
  for (uint32_t i = 1; i < 8; ++i) {
    std::vector<std::byte> out(7000 + i);
    REQUIRE(tier->Read(TestKey(i), out).ok());
    CHECK(out == TestValue(i, out.size()));
  }
  // The start took the index away; having recovered chunks, it writes a new one at once rather than leaving a
  // crash in the next interval to read every header.
  REQUIRE(Eventually([&] { return tier->index_checkpoints() == 1 && fs::exists(index); }));
  absl::StatusOr<std::vector<IndexedChunk>> listed = ParseCleanStopIndex(ReadFileBytes(index));
  REQUIRE(listed.ok());
  CHECK(listed->size() == 7);
}

TEST_CASE("disk tier after a clean stop: files damaged while it was down are caught at their first read", "[disk]") {
  for (IoBackend backend : Backends()) {
    INFO("backend " << IoBackendName(backend));
    TempDir dir;
    const auto value = TestValue(1, 100000);
    {
      auto tier = MustOpen(OptionsFor(dir.path(), 64 * kMiB, backend));
      for (uint32_t i = 1; i <= 5; ++i) REQUIRE(tier->Write(TestKey(i), value).ok());
    }
    FlipByte(ChunkPath(dir.path(), TestKey(1)), kChunkHeaderBytes + 777);  // payload
    FlipByte(ChunkPath(dir.path(), TestKey(2)), 20);                       // the key in the header
    fs::resize_file(ChunkPath(dir.path(), TestKey(3)), 8192);              // truncated
    WriteFileBytes(ChunkPath(dir.path(), TestKey(4)), TestValue(9, ChunkFileBytes(value.size())));  // garbage

    auto tier = MustOpen(OptionsFor(dir.path(), 64 * kMiB, backend));
    CHECK(tier->recovery().chunks_trusted_from_index == 5);
    std::vector<std::byte> out(value.size());
    for (uint32_t i = 1; i <= 4; ++i) {
      INFO("chunk " << i);
      CHECK(tier->Read(TestKey(i), out).code() == absl::StatusCode::kDataLoss);
      CHECK_FALSE(tier->Contains(TestKey(i)));
      CHECK_FALSE(fs::exists(ChunkPath(dir.path(), TestKey(i))));
    }
    CHECK(tier->corrupt_removed() == 4);
    CHECK(tier->Usage().chunks == 1);
    CHECK(tier->Usage().used_bytes == ChunkFileBytes(value.size()));
    REQUIRE(tier->Read(TestKey(5), out).ok());
    CHECK(out == value);
  }
}

TEST_CASE("disk tier after a clean stop: the folder wins over the index where they disagree", "[disk]") {
  TempDir dir;
  TempDir other;
  {
    auto tier = MustOpen(OptionsFor(dir.path()));
    for (uint32_t i = 1; i <= 3; ++i) REQUIRE(tier->Write(TestKey(i), TestValue(i, 6000)).ok());
    auto elsewhere = MustOpen(OptionsFor(other.path()));
    REQUIRE(elsewhere->Write(TestKey(7), TestValue(7, 9000)).ok());
  }
  // While it was down: one indexed file removed, one file the index does not name put in place (as a daemon
  // that knows no index would have written it), one stray that is garbage.
  fs::remove(ChunkPath(dir.path(), TestKey(2)));
  fs::create_directories(ChunkFolder(dir.path(), TestKey(7)));
  fs::copy_file(ChunkPath(other.path(), TestKey(7)), ChunkPath(dir.path(), TestKey(7)));
  fs::create_directories(ChunkFolder(dir.path(), TestKey(8)));
  WriteFileBytes(ChunkPath(dir.path(), TestKey(8)), TestValue(8, 3 * kChunkHeaderBytes));

  auto tier = MustOpen(OptionsFor(dir.path()));
  CHECK(tier->recovery().clean_stop_index_used);
  CHECK(tier->recovery().chunks_trusted_from_index == 2);
  CHECK(tier->recovery().index_entries_without_file == 1);
  CHECK(tier->recovery().corrupt_files_removed == 1);  // the garbage stray, found by its header
  CHECK(tier->recovery().chunks_recovered == 3);
  CHECK_FALSE(tier->Contains(TestKey(2)));
  CHECK_FALSE(tier->Contains(TestKey(8)));
  CHECK(tier->Usage().used_bytes == 2 * ChunkFileBytes(6000) + ChunkFileBytes(9000));
  std::vector<std::byte> out(9000);
  REQUIRE(tier->Read(TestKey(7), out).ok());
  CHECK(out == TestValue(7, 9000));
}

TEST_CASE("disk tier: a damaged clean-stop index or an index write cut short is removed and every header read",
          "[disk]") {
  TempDir dir;
  {
    auto tier = MustOpen(OptionsFor(dir.path()));
    for (uint32_t i = 1; i <= 3; ++i) REQUIRE(tier->Write(TestKey(i), TestValue(i, 6000)).ok());
  }
  const fs::path index = dir.path() / "v1" / std::string(kCleanStopIndexName);
  SECTION("a flipped byte") { FlipByte(index, kCleanStopIndexHeaderBytes + 5); }
  SECTION("cut short") { fs::resize_file(index, fs::file_size(index) - 1); }
  SECTION("an index that claims a huge chunk, checksums and all") {
    const std::vector<IndexedChunk> forged = {{TestKey(1), kMaxIndexedPayloadBytes + 1}};
    WriteFileBytes(index, EncodeCleanStopIndex(forged));
  }
  SECTION("an index whose entry claims more than the whole tier holds (the file's header is read instead)") {
    std::vector<IndexedChunk> forged;
    for (uint32_t i = 1; i <= 3; ++i) forged.push_back({TestKey(i), i == 2 ? 128 * kMiB : 6000});
    WriteFileBytes(index, EncodeCleanStopIndex(forged));
    auto tier = MustOpen(OptionsFor(dir.path()));
    CHECK(tier->recovery().clean_stop_index_used);
    CHECK(tier->recovery().chunks_trusted_from_index == 2);
    CHECK(tier->recovery().index_entries_without_file == 0);
    CHECK(tier->Usage().used_bytes == 3 * ChunkFileBytes(6000));
    return;
  }
  TempDir outside;  // where a symlink in the index's place points: never followed, so never read or removed
  const fs::path elsewhere = outside.path() / "elsewhere.index";
  bool symlinked = false;
  SECTION("a symlink in its place (never followed)") {
    symlinked = true;
    fs::copy_file(index, elsewhere);
    fs::remove(index);
    fs::create_symlink(elsewhere, index);
  }
  SECTION("a FIFO in its place, which would hang a plain open") {
    fs::remove(index);
    REQUIRE(::mkfifo(index.c_str(), 0600) == 0);
  }
  SECTION("a write of the next index cut short by a crash") {
    WriteFileBytes(dir.path() / "v1" / ".tmp-index-0123456789abcdef", TestValue(1, 100));
    fs::remove(index);
  }
  auto tier = MustOpen(OptionsFor(dir.path()));
  CHECK_FALSE(tier->recovery().clean_stop_index_used);
  CHECK_FALSE(fs::exists(index));
  CHECK(tier->recovery().chunks_recovered == 3);
  CHECK(tier->recovery().corrupt_files_removed == 0);
  CHECK(tier->Usage().used_bytes == 3 * ChunkFileBytes(6000));
  CHECK(CountFiles(dir.path()) == 3);           // the temporary index file is gone too
  if (symlinked) CHECK(fs::exists(elsewhere));  // the link went, what it pointed at was left alone
}

TEST_CASE("disk tier Open drops a sealed header whose length would wrap the size arithmetic", "[disk]") {
  TempDir dir;
  {
    auto tier = MustOpen(OptionsFor(dir.path()));
    REQUIRE(tier->Write(TestKey(2), TestValue(2, 5000)).ok());
  }
  // A header alone (4096 bytes) with a valid checksum claiming 2^64 - 4095 payload bytes: rounded up naively, its
  // file size would wrap to 4096 and match.
  CHECK(ChunkFileBytes(UINT64_MAX - 4094) == UINT64_MAX);
  std::vector<std::byte> forged(kChunkHeaderBytes);
  EncodeChunkHeader(ChunkHeader{TestKey(1), UINT64_MAX - 4094, 0}, forged);
  fs::create_directories(ChunkFolder(dir.path(), TestKey(1)));
  WriteFileBytes(ChunkPath(dir.path(), TestKey(1)), forged);

  auto tier = MustOpen(OptionsFor(dir.path()));
  CHECK(tier->recovery().corrupt_files_removed == 1);
  CHECK_FALSE(tier->Contains(TestKey(1)));
  CHECK(tier->Usage().used_bytes == ChunkFileBytes(5000));  // the forged length never entered the budget
  CHECK(tier->Contains(TestKey(2)));
}

TEST_CASE("disk tier Open drops a sparse file whose header claims 1 TiB and keeps every real chunk", "[disk]") {
  TempDir dir;
  constexpr uint64_t kTiB = uint64_t{1} << 40;
  DiskTier::Options options = OptionsFor(dir.path());
  bool crash = true;
  SECTION("after a crash, over max_chunk_bytes (1 GiB by default)") {}
  SECTION("after a crash, max_chunk_bytes allowing it but the capacity not") { options.max_chunk_bytes = 2 * kTiB; }
  SECTION("after a clean stop, whose index does not name it") { crash = false; }
  {
    auto tier = MustOpen(options);
    for (uint32_t i = 0; i < 3; ++i) REQUIRE(tier->Write(TestKey(i), TestValue(i, 30000)).ok());
  }
  if (crash) SimulateCrash(dir.path());
  for (uint32_t i = 0; i < 3; ++i) SetMtime(ChunkPath(dir.path(), TestKey(i)), 1000 + i);
  // A sealed header claiming 1 TiB, the file extended to exactly the size such a chunk has: holes cost nothing,
  // so the size matches. The newest by modification time, so it is what eviction would keep longest.
  std::vector<std::byte> forged(kChunkHeaderBytes);
  EncodeChunkHeader(ChunkHeader{TestKey(9), kTiB, 0}, forged);
  fs::create_directories(ChunkFolder(dir.path(), TestKey(9)));
  const fs::path sparse = ChunkPath(dir.path(), TestKey(9));
  WriteFileBytes(sparse, forged);
  fs::resize_file(sparse, ChunkFileBytes(kTiB));
  SetMtime(sparse, 5000);

  auto tier = MustOpen(options);
  CHECK_FALSE(fs::exists(sparse));
  CHECK_FALSE(tier->Contains(TestKey(9)));
  const RecoveryStats& r = tier->recovery();
  CHECK(r.corrupt_files_removed + r.evicted_over_capacity == 1);
  CHECK(r.evicted_over_capacity == (options.max_chunk_bytes > kTiB ? 1 : 0));
  CHECK(r.chunks_recovered == 3);
  CHECK(tier->Usage().used_bytes == 3 * ChunkFileBytes(30000));
  for (uint32_t i = 0; i < 3; ++i) {
    std::vector<std::byte> out(30000);
    REQUIRE(tier->Read(TestKey(i), out).ok());
    CHECK(out == TestValue(i, 30000));
  }
}

TEST_CASE("disk tier refuses a write over max_chunk_bytes, so no start drops what it wrote", "[disk]") {
  TempDir dir;
  DiskTier::Options options = OptionsFor(dir.path());
  options.max_chunk_bytes = 8192;
  {
    auto tier = MustOpen(options);
    CHECK(tier->Write(TestKey(1), TestValue(1, 8193)).code() == absl::StatusCode::kResourceExhausted);
    REQUIRE(tier->Write(TestKey(2), TestValue(2, 8192)).ok());
  }
  SimulateCrash(dir.path());
  auto tier = MustOpen(options);
  CHECK(tier->recovery().chunks_recovered == 1);
  CHECK(tier->recovery().corrupt_files_removed == 0);
  CHECK(tier->Contains(TestKey(2)));
  options.max_chunk_bytes = 0;
  CHECK(DiskTier::Open(options).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("disk tier Open reads headers on many threads and counts every outcome once", "[disk]") {
  // 600 files, so several threads claim batches of them; every 50th is damaged.
  TempDir dir;
  constexpr uint32_t kFiles = 600;
  {
    auto tier = MustOpen(OptionsFor(dir.path()));
    for (uint32_t i = 0; i < kFiles; ++i) REQUIRE(tier->Write(TestKey(i), TestValue(i, 1000 + i)).ok());
  }
  uint64_t expected_bytes = 0;
  for (uint32_t i = 0; i < kFiles; ++i) {
    if (i % 50 == 0) {
      fs::resize_file(ChunkPath(dir.path(), TestKey(i)), 100);
    } else {
      expected_bytes += ChunkFileBytes(1000 + i);
    }
  }
  for (uint32_t threads : {16u, 4u, 1u}) {
    INFO(threads << " threads");
    SimulateCrash(dir.path());
    DiskTier::Options options = OptionsFor(dir.path());
    options.recovery_threads = threads;
    auto tier = MustOpen(options);
    CHECK(tier->recovery().corrupt_files_removed == (threads == 16 ? kFiles / 50 : 0));
    CHECK(tier->recovery().chunks_recovered == kFiles - kFiles / 50);
    CHECK(tier->Usage().used_bytes == expected_bytes);
    std::vector<std::byte> out(1000 + 123);
    REQUIRE(tier->Read(TestKey(123), out).ok());
    CHECK(out == TestValue(123, 1000 + 123));
  }
}

TEST_CASE("disk tier Open skips (and keeps) a newer format version's file", "[disk]") {
  TempDir dir;
  {
    auto tier = MustOpen(OptionsFor(dir.path()));
    REQUIRE(tier->Write(TestKey(1), TestValue(1, 5000)).ok());
    REQUIRE(tier->Write(TestKey(2), TestValue(2, 5000)).ok());
  }
  SimulateCrash(dir.path());
  const fs::path path = ChunkPath(dir.path(), TestKey(1));
  std::vector<std::byte> bytes = ReadFileBytes(path);
  bytes[8] = std::byte{2};  // format version 2: a newer daemon's file
  WriteFileBytes(path, bytes);
  CHECK(ParseChunkHeader(std::span(bytes).first(kChunkHeaderBytes)).status().code() ==
        absl::StatusCode::kFailedPrecondition);

  auto tier = MustOpen(OptionsFor(dir.path()));
  CHECK(tier->recovery().newer_version_files_skipped == 1);
  CHECK(tier->recovery().corrupt_files_removed == 0);
  CHECK_FALSE(tier->Contains(TestKey(1)));
  CHECK(fs::exists(path));  // not ours to delete
  CHECK(tier->Contains(TestKey(2)));
}

TEST_CASE("disk tier evicts the least recently used chunk and unlinks its file", "[disk]") {
  TempDir dir;
  constexpr size_t kBytes = 100000;
  auto tier = MustOpen(OptionsFor(dir.path(), 3 * ChunkFileBytes(kBytes)));
  for (uint32_t i = 1; i <= 3; ++i) REQUIRE(tier->Write(TestKey(i), TestValue(i, kBytes)).ok());
  std::vector<std::byte> out(kBytes);
  REQUIRE(tier->Read(TestKey(1), out).ok());  // 1 is now the most recent; 2 the coldest
  REQUIRE(tier->Write(TestKey(4), TestValue(4, kBytes)).ok());
  CHECK_FALSE(tier->Contains(TestKey(2)));
  CHECK_FALSE(fs::exists(ChunkPath(dir.path(), TestKey(2))));
  CHECK(tier->Contains(TestKey(1)));
  CHECK(tier->Contains(TestKey(3)));
  CHECK(tier->Contains(TestKey(4)));
  CHECK(tier->evictions() == 1);
  CHECK(tier->Usage().used_bytes == 3 * ChunkFileBytes(kBytes));

  SECTION("a value larger than the whole tier is RESOURCE_EXHAUSTED and evicts nothing") {
    std::vector<std::byte> huge(3 * ChunkFileBytes(kBytes));
    CHECK(tier->Write(TestKey(9), huge).code() == absl::StatusCode::kResourceExhausted);
    CHECK(tier->Usage().chunks == 3);
  }
  SECTION("after a clean stop with a smaller capacity the least recently used go first, exactly as before it") {
    tier.reset();  // recency now, oldest first: 3, 1, 4 (2 was evicted)
    auto smaller = MustOpen(OptionsFor(dir.path(), 2 * ChunkFileBytes(kBytes)));
    CHECK(smaller->recovery().clean_stop_index_used);
    CHECK(smaller->recovery().evicted_over_capacity == 1);
    CHECK_FALSE(smaller->Contains(TestKey(3)));
    CHECK(smaller->Contains(TestKey(1)));
    CHECK(smaller->Contains(TestKey(4)));
    REQUIRE(smaller->Write(TestKey(5), TestValue(5, kBytes)).ok());  // 1 is now the oldest
    CHECK_FALSE(smaller->Contains(TestKey(1)));
    CHECK(smaller->Contains(TestKey(4)));
  }
  SECTION("after a crash with a smaller capacity the oldest files (by modification time) go first") {
    SetMtime(ChunkPath(dir.path(), TestKey(1)), 1000);
    SetMtime(ChunkPath(dir.path(), TestKey(3)), 3000);
    SetMtime(ChunkPath(dir.path(), TestKey(4)), 2000);
    tier.reset();
    SimulateCrash(dir.path());
    auto smaller = MustOpen(OptionsFor(dir.path(), 2 * ChunkFileBytes(kBytes)));
    CHECK(smaller->recovery().evicted_over_capacity == 1);
    CHECK_FALSE(smaller->Contains(TestKey(1)));
    CHECK_FALSE(fs::exists(ChunkPath(dir.path(), TestKey(1))));
    CHECK(smaller->Contains(TestKey(3)));
    CHECK(smaller->Contains(TestKey(4)));
    // 4 (older) goes before 3 when room is needed.
    REQUIRE(smaller->Write(TestKey(5), TestValue(5, kBytes)).ok());
    CHECK_FALSE(smaller->Contains(TestKey(4)));
    CHECK(smaller->Contains(TestKey(3)));
  }
}

TEST_CASE("disk tier never evicts a chunk underneath its reader", "[disk]") {
  TempDir dir;
  constexpr size_t kBytes = 50000;
  auto control = std::make_shared<IoFaultControl>();
  DiskTier::Options options = OptionsFor(dir.path(), ChunkFileBytes(kBytes));  // room for exactly one chunk
  options.engine_factory = FaultyEngineFactory(control);
  auto tier = MustOpen(options);
  const auto value = TestValue(1, kBytes);
  REQUIRE(tier->Write(TestKey(1), value).ok());

  control->Set(IoFault::kHold);
  std::vector<std::byte> out(kBytes);
  absl::Status read;
  std::thread reader([&] { read = tier->Read(TestKey(1), out); });
  control->WaitUntilHeld();
  CHECK(tier->Write(TestKey(2), TestValue(2, kBytes)).code() == absl::StatusCode::kResourceExhausted);
  CHECK(tier->Contains(TestKey(1)));
  control->Release();
  reader.join();
  REQUIRE(read.ok());
  CHECK(out == value);
  // Once the reader is done, the same write evicts it.
  REQUIRE(tier->Write(TestKey(2), TestValue(2, kBytes)).ok());
  CHECK_FALSE(tier->Contains(TestKey(1)));
}

TEST_CASE("disk tier: injected short reads and interrupts are resubmitted, zero, EIO and overlong fail cleanly",
          "[disk]") {
  for (IoBackend backend : Backends()) {
    INFO("backend " << IoBackendName(backend));
    TempDir dir;
    auto control = std::make_shared<IoFaultControl>();
    DiskTier::Options options = OptionsFor(dir.path(), 64 * kMiB, backend);
    options.engine_factory = FaultyEngineFactory(control);
    auto tier = MustOpen(options);
    CHECK(tier->backend() == backend);
    constexpr size_t kBytes = 3 * kMiB + 12345;  // several 1 MiB pieces and a partial last block
    const auto value = TestValue(1, kBytes);
    REQUIRE(tier->Write(TestKey(1), value).ok());
    std::vector<std::byte> out(kBytes);
    AlignedBuffer aligned(kBytes);

    SECTION("short reads") {
      control->Set(IoFault::kShort);
      REQUIRE(tier->Read(TestKey(1), out).ok());
      CHECK(out == value);
      REQUIRE(tier->Read(TestKey(1), aligned.span()).ok());
      CHECK(std::equal(aligned.span().begin(), aligned.span().end(), value.begin()));
      CHECK(control->injected() > 10);
    }
    SECTION("EINTR") {
      control->Set(IoFault::kInterrupt);
      // Every attempt is interrupted: bounded retries, then UNAVAILABLE, and the chunk stays.
      CHECK(tier->Read(TestKey(1), out).code() == absl::StatusCode::kUnavailable);
      CHECK(tier->Contains(TestKey(1)));
      control->Set(IoFault::kNone);
      REQUIRE(tier->Read(TestKey(1), out).ok());
      CHECK(out == value);
    }
    SECTION("EIO is UNAVAILABLE and keeps the chunk") {
      control->Set(IoFault::kError);
      const absl::Status s = tier->Read(TestKey(1), out);
      CHECK(s.code() == absl::StatusCode::kUnavailable);
      CHECK(std::string(s.message()).find(std::strerror(EIO)) != std::string::npos);
      CHECK(tier->Contains(TestKey(1)));
      control->Set(IoFault::kNone);
      REQUIRE(tier->Read(TestKey(1), out).ok());
      CHECK(out == value);
    }
    SECTION("overlong completions are UNAVAILABLE") {
      control->Set(IoFault::kTooLong);
      CHECK(tier->Read(TestKey(1), out).code() == absl::StatusCode::kUnavailable);
      CHECK(tier->Contains(TestKey(1)));
    }
    SECTION("an unexpected end of file is DATA_LOSS and the chunk is dropped") {
      control->Set(IoFault::kZero);
      CHECK(tier->Read(TestKey(1), out).code() == absl::StatusCode::kDataLoss);
      CHECK_FALSE(tier->Contains(TestKey(1)));
      CHECK(tier->corrupt_removed() == 1);
    }
  }
}

TEST_CASE("ReadSegments resubmits odd-sized short reads and retries interrupts", "[disk]") {
  TempDir dir;
  const fs::path path = dir.path() / "plain";
  const auto content = TestValue(3, 2 * kMiB + 777);
  WriteFileBytes(path, content);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));  // buffered: any offset and length is allowed
  REQUIRE(fd.valid());
  auto control = std::make_shared<IoFaultControl>();
  for (IoBackend backend : Backends()) {
    INFO("backend " << IoBackendName(backend));
    auto engine = FaultyEngineFactory(control)(backend, 4);
    REQUIRE(engine.ok());
    std::vector<std::byte> a(1000), b(content.size() - 1000);
    const ReadSegment segments[] = {{0, a}, {1000, b}};

    control->Set(IoFault::kShort, /*short_granularity=*/1);
    REQUIRE(ReadSegments(**engine, fd.get(), segments).ok());
    CHECK(std::equal(a.begin(), a.end(), content.begin()));
    CHECK(std::equal(b.begin(), b.end(), content.begin() + 1000));

    std::vector<std::byte> past_end(100);
    const ReadSegment beyond[] = {{content.size() - 50, past_end}};
    control->Set(IoFault::kNone);
    CHECK(ReadSegments(**engine, fd.get(), beyond).code() == absl::StatusCode::kDataLoss);
  }
}

TEST_CASE("disk tier picks its I/O backend visibly", "[disk]") {
  TempDir dir;
  SECTION("auto picks io_uring where the kernel allows it") {
    auto tier = MustOpen(OptionsFor(dir.path(), kMiB, IoBackend::kAuto));
    CHECK(tier->backend() == (UringAvailable() ? IoBackend::kUring : IoBackend::kPread));
  }
  SECTION("auto falls back to pread when io_uring cannot start, and still works") {
    DiskTier::Options options = OptionsFor(dir.path(), kMiB, IoBackend::kAuto);
    options.engine_factory = FaultyEngineFactory(std::make_shared<IoFaultControl>(), /*fail_uring=*/true);
    auto tier = MustOpen(options);
    CHECK(tier->backend() == IoBackend::kPread);
    REQUIRE(tier->Write(TestKey(1), TestValue(1, 9000)).ok());
    std::vector<std::byte> out(9000);
    REQUIRE(tier->Read(TestKey(1), out).ok());
    CHECK(out == TestValue(1, 9000));
  }
  SECTION("io_uring asked for explicitly and unavailable is FAILED_PRECONDITION") {
    DiskTier::Options options = OptionsFor(dir.path(), kMiB, IoBackend::kUring);
    options.engine_factory = FaultyEngineFactory(std::make_shared<IoFaultControl>(), /*fail_uring=*/true);
    const absl::Status s = DiskTier::Open(options).status();
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(std::string(s.message()).find("io_uring") != std::string::npos);
  }
}

TEST_CASE("disk tier Open refuses unusable roots and bad options", "[disk]") {
  TempDir dir;
  SECTION("empty root and zero queue depth are INVALID_ARGUMENT") {
    CHECK(DiskTier::Open(OptionsFor("")).status().code() == absl::StatusCode::kInvalidArgument);
    DiskTier::Options options = OptionsFor(dir.path());
    options.queue_depth = 0;
    CHECK(DiskTier::Open(options).status().code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("a root that is a file, or lies under one, is FAILED_PRECONDITION") {
    const fs::path file = dir.path() / "file";
    WriteFileBytes(file, TestValue(1, 10));
    CHECK(DiskTier::Open(OptionsFor(file)).status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(DiskTier::Open(OptionsFor(file / "below")).status().code() == absl::StatusCode::kFailedPrecondition);
  }
  SECTION("a read-only root is FAILED_PRECONDITION") {
    ScopedMount ro("tmpfs", "size=1m,mode=0555");
    if (!ro.mounted()) {
      WARN("cannot mount a tmpfs here (" << ro.error() << "): read-only root not tested");
      return;
    }
    fs::create_directories(ro.path() / "v1");
    REQUIRE(::mount("none", ro.path().c_str(), nullptr, MS_REMOUNT | MS_RDONLY, "size=1m") == 0);
    const absl::Status s = DiskTier::Open(OptionsFor(ro.path())).status();
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  }
}

TEST_CASE("disk tier on a filesystem without O_DIRECT fails Open unless buffered I/O is allowed", "[disk]") {
  // tmpfs gained O_DIRECT in Linux 6.6, so /dev/shm no longer shows this; ramfs still refuses it.
  ScopedMount ramfs("ramfs", nullptr);
  if (!ramfs.mounted()) {
    WARN("cannot mount a ramfs here (" << ramfs.error() << "): the no-O_DIRECT path is not tested");
    return;
  }
  const absl::Status s = DiskTier::Open(OptionsFor(ramfs.path())).status();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(s.message()).find("O_DIRECT") != std::string::npos);

  DiskTier::Options options = OptionsFor(ramfs.path());
  options.allow_buffered = true;
  auto tier = MustOpen(options);
  CHECK_FALSE(tier->direct_io());
  CHECK(tier->recovery().temp_files_removed == 0);  // the refused Open left no probe file behind
  REQUIRE(tier->Write(TestKey(1), TestValue(1, 7000)).ok());
  std::vector<std::byte> out(7000);
  REQUIRE(tier->Read(TestKey(1), out).ok());
  CHECK(out == TestValue(1, 7000));
}

TEST_CASE("disk tier: a full disk is RESOURCE_EXHAUSTED and leaves no partial file", "[disk]") {
  ScopedMount small("tmpfs", "size=256k");
  if (!small.mounted()) {
    WARN("cannot mount a small tmpfs here (" << small.error() << "): ENOSPC is not tested");
    return;
  }
  auto tier = MustOpen(OptionsFor(small.path(), 64 * kMiB));
  REQUIRE(tier->Write(TestKey(1), TestValue(1, 50000)).ok());
  const absl::Status s = tier->Write(TestKey(2), TestValue(2, 2 * kMiB));
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK_FALSE(tier->Contains(TestKey(2)));
  CHECK(CountFiles(small.path()) == 1);  // only chunk 1: no temporary file, no partial final file
  CHECK(tier->Usage().used_bytes == ChunkFileBytes(50000));
  std::vector<std::byte> out(50000);
  REQUIRE(tier->Read(TestKey(1), out).ok());
  CHECK(out == TestValue(1, 50000));
}

// The extents the filesystem gave `path` (FIEMAP), or nullopt where it cannot say (tmpfs, some network mounts).
std::optional<uint32_t> ExtentCount(const fs::path& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return std::nullopt;
  constexpr uint32_t kMaxExtents = 16;
  alignas(struct fiemap) std::byte request[sizeof(struct fiemap) + kMaxExtents * sizeof(struct fiemap_extent)] = {};
  auto* map = reinterpret_cast<struct fiemap*>(request);
  map->fm_length = FIEMAP_MAX_OFFSET;
  map->fm_flags = FIEMAP_FLAG_SYNC;
  map->fm_extent_count = kMaxExtents;
  if (::ioctl(fd.get(), FS_IOC_FIEMAP, map) != 0) return std::nullopt;
  return map->fm_mapped_extents;
}

TEST_CASE("disk tier: each chunk file is allocated whole, in one extent with its header beside its payload", "[disk]") {
  // Written as a header and then a payload without allocating first, ext4 put the header's block far from the
  // payload's (2 to 5 extents a file), and every read paid for both places.
  TempDir dir;
  auto tier = MustOpen(OptionsFor(dir.path(), 64 * kMiB));
  const auto staged = TestValue(1, 300000);  // through the staging buffer
  REQUIRE(tier->Write(TestKey(1), staged).ok());
  AlignedBuffer source(4 * kMiB);  // straight from an aligned source: header, then the payload in one write
  REQUIRE(source.ok());
  const auto aligned = TestValue(2, 4 * kMiB);
  std::memcpy(source.data(), aligned.data(), aligned.size());
  REQUIRE(tier->Write(TestKey(2), source.span()).ok());
  for (uint32_t i : {1u, 2u}) {
    const std::optional<uint32_t> extents = ExtentCount(ChunkPath(dir.path(), TestKey(i)));
    if (!extents.has_value()) {
      WARN("this filesystem does not report extents (FIEMAP): the layout is not tested");
      return;
    }
    CHECK(*extents == 1);
  }
  std::vector<std::byte> out(staged.size());
  REQUIRE(tier->Read(TestKey(1), out).ok());
  CHECK(out == staged);
}

TEST_CASE("disk tier: concurrent writers of one key leave one file", "[disk]") {
  TempDir dir;
  auto tier = MustOpen(OptionsFor(dir.path(), 64 * kMiB, IoBackend::kAuto));
  const auto value = TestValue(1, 300000);
  std::vector<std::thread> writers;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    writers.emplace_back([&] {
      if (!tier->Write(TestKey(1), value).ok()) ++failures;
    });
  }
  for (auto& w : writers) w.join();
  CHECK(failures == 0);
  CHECK(tier->Usage().chunks == 1);
  CHECK(tier->Usage().used_bytes == ChunkFileBytes(value.size()));
  CHECK(CountFiles(dir.path()) == 1);
  std::vector<std::byte> out(value.size());
  REQUIRE(tier->Read(TestKey(1), out).ok());
  CHECK(out == value);
}

}  // namespace cake
