// libFuzzer target: a chunk file's header comes from disk, which another process may have written. Parsing never
// crashes, and the size a parsed header implies never wraps below the header itself.
#include <cstddef>
#include <cstdint>
#include <span>

#include "storage/chunk_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto header = cake::ParseChunkHeader(bytes);
  if (header.ok() && cake::ChunkFileBytes(header->payload_length) < cake::kChunkHeaderBytes + header->payload_length &&
      cake::ChunkFileBytes(header->payload_length) != UINT64_MAX) {
    __builtin_trap();
  }
  if (size >= 8) {
    uint64_t length;
    __builtin_memcpy(&length, data, 8);
    const uint64_t file = cake::ChunkFileBytes(length);
    if (file != UINT64_MAX && (file < length || file < cake::kChunkHeaderBytes)) __builtin_trap();
  }
  return 0;
}
