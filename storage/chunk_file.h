// The on-disk format of one chunk file of the disk tier, and where each chunk's file lives.
//
// Path: <root>/v1/<first 2 hex digits of the key>/<32 hex digits of the key>.chunk
//   (writes go through <same folder>/.tmp-<16 random hex digits>, renamed into place once synced).
//
// Layout: a 4096-byte header, then the payload, then zero bytes up to the next multiple of 4096, so every
// read and write of the file is block-aligned for O_DIRECT. File size = 4096 + round_up(payload_length, 4096).
//
// Header, all integers little-endian:
//   offset  size  field
//        0     8  magic, the ASCII bytes "CAKECHNK"
//        8     4  format version (u32) = 1
//       12     4  header size in bytes (u32) = 4096
//       16    16  chunk key
//       32     8  payload length in bytes (u64)
//       40     8  XXH3-64 of the payload (u64)
//       48     8  XXH3-64 of header bytes [0, 48) (u64)
//       56  4040  reserved, written as zero, ignored by version 1 readers
//
// Validation order: magic, then version (a newer daemon's file is FAILED_PRECONDITION: left alone, not
// called corrupt, since its layout may differ), then header size and header checksum (DATA_LOSS).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "keys/namespace.h"

namespace cake {

inline constexpr std::string_view kChunkMagic = "CAKECHNK";
inline constexpr uint32_t kChunkFormatVersion = 1;
inline constexpr size_t kChunkHeaderBytes = 4096;
inline constexpr std::string_view kChunkFileSuffix = ".chunk";
inline constexpr std::string_view kTempFilePrefix = ".tmp-";
// Bumped with kChunkFormatVersion only if paths change; a newer layout lives beside this one.
inline constexpr std::string_view kChunkLayoutFolder = "v1";

struct ChunkHeader {
  ChunkKey key;
  uint64_t payload_length = 0;
  uint64_t payload_checksum = 0;
};

// XXH3-64 of the payload bytes.
uint64_t PayloadChecksum(std::span<const std::byte> payload);

// PayloadChecksum of a payload that arrives in pieces, in order: Digest() after Add of every piece equals
// PayloadChecksum of them all, so a reader can checksum what has landed while the rest is still on its way.
class IncrementalPayloadChecksum {
 public:
  IncrementalPayloadChecksum();
  ~IncrementalPayloadChecksum();
  IncrementalPayloadChecksum(const IncrementalPayloadChecksum&) = delete;
  IncrementalPayloadChecksum& operator=(const IncrementalPayloadChecksum&) = delete;
  void Add(std::span<const std::byte> piece);
  uint64_t Digest() const;

 private:
  struct State;  // xxhash's streaming state, kept out of this header
  std::unique_ptr<State> state_;
};

// Writes the full 4096-byte header (reserved bytes zeroed) into out, which must be kChunkHeaderBytes long.
void EncodeChunkHeader(const ChunkHeader& header, std::span<std::byte> out);

// Parses and checks a header. DATA_LOSS: too short, bad magic, wrong header size or header checksum.
// FAILED_PRECONDITION: a format version this daemon does not know (written by a newer one).
absl::StatusOr<ChunkHeader> ParseChunkHeader(std::span<const std::byte> bytes);

// Header plus padded payload: the exact size a valid chunk file has (UINT64_MAX, which no file has, for a length
// too large to pad without wrapping).
uint64_t ChunkFileBytes(uint64_t payload_length);

// <root>/v1/<2 hex>; the folder a chunk's file and its temporary files live in.
std::filesystem::path ChunkFolder(const std::filesystem::path& root, const ChunkKey& key);
// <root>/v1/<2 hex>/<32 hex>.chunk
std::filesystem::path ChunkPath(const std::filesystem::path& root, const ChunkKey& key);
// The key named by a chunk file name ("<32 hex>.chunk"); INVALID_ARGUMENT for any other name.
absl::StatusOr<ChunkKey> ChunkKeyFromFileName(std::string_view file_name);

// The code a caller should act on for a failed file operation: a full disk is "does not fit" (the tier
// contract's RESOURCE_EXHAUSTED), anything else the medium failing (UNAVAILABLE); the message names what and where.
absl::Status ErrnoStatus(int err, std::string_view what, const std::filesystem::path& path);

// Makes a rename in `folder` durable: without it a crash can lose the new name even though the data is synced.
absl::Status SyncFolder(const std::filesystem::path& folder);

}  // namespace cake
