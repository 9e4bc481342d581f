// The disk tier's clean-stop index: the whole in-memory index (every chunk's key and payload length, least
// recently used first) written as one file when the tier closes, so the next start reads one small file instead
// of one header per chunk file. It is removed as soon as a start has read it, before the tier serves anything,
// and the disk tier's checkpoint thread writes it again while it runs (disk_tier.h, index_checkpoint_interval):
// a daemon that crashes leaves its last checkpoint, and its successor reads the headers of only the files the
// checkpoint does not name. Trusting it costs
// nothing in safety, because every read checks the chunk file's header, key, length and payload checksum anyway
// (a file damaged while the daemon was down is caught at its first read and becomes a computed chunk).
//
// Path: <root>/v1/clean-stop.index. Layout, all integers little-endian:
//   offset  size  field
//        0     8  magic, the ASCII bytes "CAKEINDX"
//        8     4  format version (u32) = 1
//       12     4  entry size in bytes (u32) = 24
//       16     8  entry count (u64)
//       24     8  XXH3-64 of the entries (u64)
//       32     8  XXH3-64 of bytes [0, 32) (u64)
//       40   24n  entries: chunk key (16 bytes), payload length (u64); least recently used first
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "keys/namespace.h"

namespace cake {

inline constexpr std::string_view kCleanStopIndexName = "clean-stop.index";
inline constexpr size_t kCleanStopIndexHeaderBytes = 40;
inline constexpr size_t kCleanStopIndexEntryBytes = 24;
// A bound on what a start will read into memory: 44 million chunks, far beyond any disk tier's file count.
inline constexpr uint64_t kMaxCleanStopIndexBytes = uint64_t{1} << 30;
// The largest payload an entry may claim (1 TiB): keeps a forged length from wrapping the tier's byte budget.
inline constexpr uint64_t kMaxIndexedPayloadBytes = uint64_t{1} << 40;

struct IndexedChunk {
  ChunkKey key;
  uint64_t payload_bytes = 0;
};

// The file's bytes for these entries (least recently used first).
std::vector<std::byte> EncodeCleanStopIndex(std::span<const IndexedChunk> entries);

// Parses and checks the file's bytes. DATA_LOSS: too short, bad magic, header or entry checksum, a count that
// disagrees with the size, an entry whose length exceeds kMaxIndexedPayloadBytes, or a key listed twice.
// FAILED_PRECONDITION: a format version this daemon does not know.
absl::StatusOr<std::vector<IndexedChunk>> ParseCleanStopIndex(std::span<const std::byte> bytes);

// Writes the index durably beside the chunk folders: a temporary file, fsync, rename, fsync of the folder, so a
// crash mid-write leaves either no index or a whole one.
absl::Status WriteCleanStopIndex(const std::filesystem::path& layout_folder, std::span<const IndexedChunk> entries);

// Reads and removes the index in `layout_folder` (removal made durable before it returns, so a crash from here on
// leaves no index behind). NOT_FOUND: there is none (the last stop was not clean, or this is the first start).
// Any other error: the file was unreadable or failed ParseCleanStopIndex; it is removed all the same.
absl::StatusOr<std::vector<IndexedChunk>> TakeCleanStopIndex(const std::filesystem::path& layout_folder);

}  // namespace cake
