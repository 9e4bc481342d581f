// The remote tier's value format: how one chunk is laid out in Redis (the key names of its header and parts) and
// its 64-byte header. Pure functions, no I/O, so the format can be checked without a Redis.
//
// Layout of one chunk (all keys of a chunk share the hash tag {<32 hex>}, so in a cluster they live in one slot and
// one pipeline reads them):
//   <prefix>{<key hex>}:h     the 64-byte header below
//   <prefix>{<key hex>}:<i>   part i of the payload, i = 0 .. parts-1, each part_bytes long except the last
// Parts keep every value small enough to neither block Redis for long nor exceed its limits (proto-max-bulk-len).
// Writers put the parts first and the header last, so a reader that finds a header finds a complete write (unless
// Redis evicted a part since: the payload checksum catches that).
//
// Header, little-endian: magic "CAKERMT1" (8), format version u32 = 1, part count u32, chunk key (16), payload
// length u64, part bytes u64, XXH3-64 of the payload u64, XXH3-64 of header bytes [0, 56) u64.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "keys/namespace.h"

namespace cake {

inline constexpr size_t kRemoteHeaderBytes = 64;
// The part sizes a writer may choose (remote.part_bytes) and a reader accepts from a header: a forged header with
// tiny parts would otherwise turn one chunk into a million GETs; Redis holds no value above 512 MiB.
inline constexpr uint64_t kMinRemotePartBytes = 4096;
inline constexpr uint64_t kMaxRemotePartBytes = uint64_t{512} << 20;

struct RemoteHeader {
  ChunkKey key;
  uint32_t parts = 0;
  uint64_t payload_length = 0;
  uint64_t part_bytes = 0;
  uint64_t payload_checksum = 0;
};

// How many parts of part_bytes (above 0) hold payload_bytes.
uint64_t RemotePartCount(uint64_t payload_bytes, uint64_t part_bytes);

// The header of payload cut into parts of part_bytes (above 0), its checksum included.
RemoteHeader MakeRemoteHeader(const ChunkKey& key, std::span<const std::byte> payload, uint64_t part_bytes);

// kRemoteHeaderBytes bytes, the header checksum filled in. Encodes what it is given, consistent or not.
std::string EncodeRemoteHeader(const RemoteHeader& header);

// Parses and checks a header read for expected_key. DATA_LOSS: the wrong size, a bad magic or header checksum,
// another chunk's key, a part size outside [kMinRemotePartBytes, kMaxRemotePartBytes], or a part layout that does
// not match the length. FAILED_PRECONDITION: a format version
// this daemon does not know (written by a newer one: not corrupt, so not to be deleted).
absl::StatusOr<RemoteHeader> ParseRemoteHeader(std::string_view bytes, const ChunkKey& expected_key);

// The Redis key names of one chunk under a key prefix (which holds no '{' or '}').
class RemoteChunkNames {
 public:
  RemoteChunkNames(std::string_view prefix, const ChunkKey& key);
  std::string header() const;          // <prefix>{<key hex>}:h
  std::string part(uint64_t i) const;  // <prefix>{<key hex>}:<i>

 private:
  std::string tag_;  // <prefix>{<key hex>}:
};

// A SCAN MATCH pattern for the header keys of every chunk under prefix (glob characters in it escaped).
std::string RemoteHeaderPattern(std::string_view prefix);

// The chunk a key name found with that pattern belongs to: its hash tag parsed as a key. INVALID_ARGUMENT for a
// name whose tag is not a chunk key (someone else's key that happens to match).
absl::StatusOr<ChunkKey> ChunkKeyFromRemoteName(std::string_view prefix, std::string_view name);

}  // namespace cake
