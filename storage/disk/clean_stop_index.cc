#include "storage/disk/clean_stop_index.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/little_endian.h"
#include "base/random_id.h"
#include "base/unique_fd.h"
#include "storage/chunk_file.h"

namespace cake {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kIndexMagic = "CAKEINDX";
constexpr uint32_t kIndexFormatVersion = 1;
constexpr size_t kVersionOffset = 8;
constexpr size_t kEntryBytesOffset = 12;
constexpr size_t kCountOffset = 16;
constexpr size_t kEntriesChecksumOffset = 24;
constexpr size_t kHeaderChecksumOffset = 32;

}  // namespace

std::vector<std::byte> EncodeCleanStopIndex(std::span<const IndexedChunk> entries) {
  std::vector<std::byte> out(kCleanStopIndexHeaderBytes + entries.size() * kCleanStopIndexEntryBytes);
  std::byte* entry = out.data() + kCleanStopIndexHeaderBytes;
  for (const IndexedChunk& c : entries) {
    std::memcpy(entry, c.key.bytes.data(), kChunkKeyBytes);
    StoreLittleEndian<uint64_t>(entry + kChunkKeyBytes, c.payload_bytes);
    entry += kCleanStopIndexEntryBytes;
  }
  std::memcpy(out.data(), kIndexMagic.data(), kIndexMagic.size());
  StoreLittleEndian<uint32_t>(out.data() + kVersionOffset, kIndexFormatVersion);
  StoreLittleEndian<uint32_t>(out.data() + kEntryBytesOffset, kCleanStopIndexEntryBytes);
  StoreLittleEndian<uint64_t>(out.data() + kCountOffset, entries.size());
  StoreLittleEndian<uint64_t>(
      out.data() + kEntriesChecksumOffset,
      XXH3_64bits(out.data() + kCleanStopIndexHeaderBytes, out.size() - kCleanStopIndexHeaderBytes));
  StoreLittleEndian<uint64_t>(out.data() + kHeaderChecksumOffset, XXH3_64bits(out.data(), kHeaderChecksumOffset));
  return out;
}

absl::StatusOr<std::vector<IndexedChunk>> ParseCleanStopIndex(std::span<const std::byte> bytes) {
  if (bytes.size() < kCleanStopIndexHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat("the clean-stop index is ", bytes.size(), " bytes, shorter than its header"));
  }
  const std::byte* p = bytes.data();
  if (std::memcmp(p, kIndexMagic.data(), kIndexMagic.size()) != 0) {
    return absl::DataLossError("the clean-stop index has a bad magic");
  }
  if (LoadLittleEndian<uint64_t>(p + kHeaderChecksumOffset) != XXH3_64bits(p, kHeaderChecksumOffset)) {
    return absl::DataLossError("the clean-stop index header checksum does not match");
  }
  if (const uint32_t version = LoadLittleEndian<uint32_t>(p + kVersionOffset); version != kIndexFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("the clean-stop index has format version ", version, "; this daemon reads ", kIndexFormatVersion));
  }
  if (LoadLittleEndian<uint32_t>(p + kEntryBytesOffset) != kCleanStopIndexEntryBytes) {
    return absl::DataLossError("the clean-stop index has a wrong entry size");
  }
  // Divide rather than multiply: a forged count times the entry size could wrap.
  const uint64_t count = LoadLittleEndian<uint64_t>(p + kCountOffset);
  const uint64_t entry_bytes = bytes.size() - kCleanStopIndexHeaderBytes;
  if (entry_bytes % kCleanStopIndexEntryBytes != 0 || count != entry_bytes / kCleanStopIndexEntryBytes) {
    return absl::DataLossError(
        absl::StrCat("the clean-stop index claims ", count, " entries in ", entry_bytes, " bytes of entries"));
  }
  if (LoadLittleEndian<uint64_t>(p + kEntriesChecksumOffset) !=
      XXH3_64bits(p + kCleanStopIndexHeaderBytes, entry_bytes)) {
    return absl::DataLossError("the clean-stop index entries checksum does not match");
  }
  std::vector<IndexedChunk> entries(count);
  absl::flat_hash_set<ChunkKey> seen;
  seen.reserve(count);
  const std::byte* entry = p + kCleanStopIndexHeaderBytes;
  for (IndexedChunk& c : entries) {
    std::memcpy(c.key.bytes.data(), entry, kChunkKeyBytes);
    c.payload_bytes = LoadLittleEndian<uint64_t>(entry + kChunkKeyBytes);
    if (c.payload_bytes > kMaxIndexedPayloadBytes) {
      return absl::DataLossError(absl::StrCat("the clean-stop index lists chunk ", c.key.Hex(), " with ",
                                              c.payload_bytes, " bytes, above the limit of ", kMaxIndexedPayloadBytes));
    }
    if (!seen.insert(c.key).second) {
      return absl::DataLossError(absl::StrCat("the clean-stop index lists chunk ", c.key.Hex(), " twice"));
    }
    entry += kCleanStopIndexEntryBytes;
  }
  return entries;
}

absl::Status WriteCleanStopIndex(const fs::path& layout_folder, std::span<const IndexedChunk> entries) {
  const std::vector<std::byte> bytes = EncodeCleanStopIndex(entries);
  const fs::path temp = layout_folder / absl::StrCat(std::string(kTempFilePrefix), "index-", RandomHex128());
  const fs::path path = layout_folder / std::string(kCleanStopIndexName);
  UniqueFd fd(::open(temp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0640));
  if (!fd.valid()) return ErrnoStatus(errno, "creating", temp);
  auto fail = [&](absl::Status status) {
    ::unlink(temp.c_str());
    return status;
  };
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail(ErrnoStatus(n < 0 ? errno : EIO, "writing", temp));
    done += static_cast<size_t>(n);
  }
  if (::fdatasync(fd.get()) != 0) return fail(ErrnoStatus(errno, "syncing", temp));
  fd = UniqueFd();
  if (::rename(temp.c_str(), path.c_str()) != 0) return fail(ErrnoStatus(errno, "renaming", temp));
  return SyncFolder(layout_folder);
}

absl::StatusOr<std::vector<IndexedChunk>> TakeCleanStopIndex(const fs::path& layout_folder) {
  const fs::path path = layout_folder / std::string(kCleanStopIndexName);
  // O_NONBLOCK: a FIFO put in its place must not hang the start (a regular file ignores the flag).
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!fd.valid() && errno == ENOENT) return absl::NotFoundError(absl::StrCat("no ", path.string()));
  // From here on the file goes whatever it holds: once read (or found unreadable) it must not outlive this start.
  auto removed = [&](absl::StatusOr<std::vector<IndexedChunk>> result) -> absl::StatusOr<std::vector<IndexedChunk>> {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, "removing the clean-stop index", path);
    }
    if (absl::Status synced = SyncFolder(layout_folder); !synced.ok()) return synced;
    return result;
  };
  if (!fd.valid()) return removed(ErrnoStatus(errno, "opening", path));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return removed(ErrnoStatus(errno, "inspecting", path));
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) > kMaxCleanStopIndexBytes) {
    return removed(absl::DataLossError(
        absl::StrCat(path.string(), " is not a regular file of at most ", kMaxCleanStopIndexBytes, " bytes")));
  }
  std::vector<std::byte> bytes(static_cast<size_t>(st.st_size));
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::read(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return removed(ErrnoStatus(errno, "reading", path));
    if (n == 0) return removed(absl::DataLossError(absl::StrCat(path.string(), " shrank while it was read")));
    done += static_cast<size_t>(n);
  }
  absl::StatusOr<std::vector<IndexedChunk>> parsed = ParseCleanStopIndex(bytes);
  if (!parsed.ok())
    return removed(absl::Status(parsed.status().code(), absl::StrCat(path.string(), ": ", parsed.status().message())));
  return removed(std::move(parsed));
}

}  // namespace cake
