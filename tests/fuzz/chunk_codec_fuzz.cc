// libFuzzer target: an encoded chunk comes from disk or Redis, a peer's word even after its checksum. DecodeChunk
// answers any bytes with a status or exactly the raw length it promised, and never writes outside its destination
// (ASan sees any byte past it); anything encoded decodes back to itself.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "storage/chunk_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  // As a reader gets it: sized by what the header says, when that is a size a chunk may have.
  auto raw_bytes = cake::EncodedRawBytes(bytes);
  if (raw_bytes.ok() && *raw_bytes <= (uint64_t{64} << 20)) {
    std::vector<std::byte> out(*raw_bytes);
    (void)cake::DecodeChunk(bytes, out);
  }
  // And with a destination of the wrong size, which must be refused.
  std::vector<std::byte> small(size / 2);
  if (cake::DecodeChunk(bytes, small).ok() && (!raw_bytes.ok() || *raw_bytes != small.size())) __builtin_trap();

  // The input as raw bytes: encoding is lossless.
  const std::vector<std::byte> encoded = cake::EncodeChunk(cake::ChunkCodec::kPlanesZstd, bytes);
  if (encoded.size() > cake::MaxEncodedBytes(size)) __builtin_trap();
  std::vector<std::byte> back(size);
  if (!cake::DecodeChunk(encoded, back).ok()) __builtin_trap();
  if (size > 0 && std::memcmp(back.data(), data, size) != 0) __builtin_trap();
  return 0;
}
