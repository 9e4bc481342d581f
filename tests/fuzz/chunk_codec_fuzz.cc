// libFuzzer target: an encoded chunk comes from disk or Redis, a peer's word even after its checksum. DecodeChunk
// (the lossless codec) and DecodeLossy (the quantized one) answer any bytes with a status or exactly the raw length
// promised, and never write outside their destination (ASan sees any byte past it); anything the lossless codec
// encodes decodes back to itself.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "storage/chunk_codec.h"
#include "storage/lossy_codec.h"

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

  // As a quantized chunk: sized as its header's shape says, when that is small (the caller's destination is a
  // namespace's chunk), and with the wrong size.
  if (size >= cake::kLossyHeaderBytes) {
    uint32_t shape[5];  // dtype, layers, kv_heads, head_dim, tokens
    std::memcpy(shape, data + 16, sizeof(shape));
    const uint64_t element = shape[0] == 1 ? 4 : 2;
    uint64_t raw = 2 * element;
    bool small = true;
    for (int i = 1; i < 5 && small; ++i)
      small = !__builtin_mul_overflow(raw, uint64_t{shape[i]}, &raw) && raw <= (1u << 24);
    if (small) {
      std::vector<std::byte> out(raw);
      (void)cake::DecodeLossy(bytes, out);
    }
  }
  (void)cake::DecodeLossy(bytes, small);

  // The input as raw bytes: encoding is lossless.
  const std::vector<std::byte> encoded = cake::EncodeChunk(cake::ChunkCodec::kPlanesZstd, bytes);
  if (encoded.size() > cake::MaxEncodedBytes(size)) __builtin_trap();
  std::vector<std::byte> back(size);
  if (!cake::DecodeChunk(encoded, back).ok()) __builtin_trap();
  if (size > 0 && std::memcmp(back.data(), data, size) != 0) __builtin_trap();
  return 0;
}
