// How a chunk may be encoded on its way to a slower tier (disk, Redis) and decoded on its way back. Pure functions,
// no I/O, so the format and its checks can be tested and fuzzed without a tier.
//
// Codec "planes-zstd" (lossless): the chunk's bytes are split into 4 byte planes (plane p holds bytes i with
// i % 4 == p) and each plane is compressed with zstd level 1, or stored as it is when that saves under 3%. Four
// planes whatever the dtype: for bf16 and fp16 planes 1 and 3 hold the sign and exponent bytes, for fp32 plane 3
// does, and those are what compress (real bf16 KV: 3 bits of entropy per exponent byte, 8 per mantissa byte), so
// the codec needs no dtype and the tiers stay keys and bytes. docs/research/codec-study/ measured the choice.
//
// Encoded layout, all integers little-endian:
//   offset  size  field
//        0     8  magic, the ASCII bytes "CAKEKVC1"
//        8     4  codec (u32): 1 = planes-zstd
//       12     4  codec version (u32) = 1
//       16     8  raw length in bytes (u64): what decoding yields
//       24     4  plane count (u32) = 4
//       28     4  reserved, zero
//       32  16*4  per plane: method (u32: 0 stored, 1 zstd frame), reserved u32 (zero), stored length (u64)
//       96     -  the planes' stored bytes, one after another, nothing after the last
// The tier the encoded bytes live in checksums them whole (disk and Redis payload checksums), so the codec's
// header is covered by the chunk's checksum like its data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/enum_names.h"

namespace cake {

enum class ChunkCodec : uint32_t { kNone = 0, kPlanesZstd = 1 };
inline constexpr EnumName<ChunkCodec> kChunkCodecNames[] = {{ChunkCodec::kNone, "none"},
                                                            {ChunkCodec::kPlanesZstd, "planes-zstd"}};

// "none" or "planes-zstd"; INVALID_ARGUMENT names the accepted ones.
absl::StatusOr<ChunkCodec> ParseChunkCodec(std::string_view name);
std::string_view ChunkCodecName(ChunkCodec codec);

inline constexpr size_t kCodecHeaderBytes = 96;
inline constexpr uint32_t kCodecPlanes = 4;

// The largest encoding of a raw value of raw_bytes (the header, and every plane at worst zstd's bound): what a
// reader may accept from a tier before decoding.
uint64_t MaxEncodedBytes(uint64_t raw_bytes);

// Encodes raw with codec (not kNone). Never fails for a value the caller holds: a plane that does not compress is
// stored as it is.
std::vector<std::byte> EncodeChunk(ChunkCodec codec, std::span<const std::byte> raw);

// The raw length an encoded value says it decodes to, after checking its header. DATA_LOSS: not an encoded value
// (too short, bad magic, a header whose planes do not add up). FAILED_PRECONDITION: a codec or version this
// daemon does not know (another daemon's: not corrupt).
absl::StatusOr<uint64_t> EncodedRawBytes(std::span<const std::byte> encoded);

// What a thread keeps between calls for decoding (and a codec tier for the encoded value it reads): a chunk
// larger than this gets buffers of its own for the call, so no thread holds more for good, whatever it once read.
inline constexpr size_t kThreadBufferCeiling = size_t{64} << 20;

// Whether encoded decodes, as DecodeChunk would judge it, without producing the chunk: each zstd plane is inflated
// through a small window, so the memory it takes is independent of what the header claims. The raw length, or the
// errors of DecodeChunk; INVALID_ARGUMENT when the header claims more than max_raw_bytes.
absl::StatusOr<uint64_t> CheckEncodedChunk(std::span<const std::byte> encoded, uint64_t max_raw_bytes);

// Decodes into dst, which must be exactly the raw length (INVALID_ARGUMENT otherwise, dst untouched). Errors as
// EncodedRawBytes, and DATA_LOSS for a plane that does not decode to exactly its length (a truncated or forged
// zstd frame, trailing bytes). Never writes outside dst, whatever the encoded bytes say.
absl::Status DecodeChunk(std::span<const std::byte> encoded, std::span<std::byte> dst);

}  // namespace cake
