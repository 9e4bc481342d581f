// libFuzzer target: a chunk file's header and the clean-stop index come from disk, which another process may have
// written. Parsing never crashes, the size a parsed header implies never wraps below the header itself, and a
// parsed index never holds more entries than its bytes can or a length above the limit.
#include <cstddef>
#include <cstdint>
#include <span>

#include "storage/chunk_file.h"
#include "storage/disk/clean_stop_index.h"

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
  auto index = cake::ParseCleanStopIndex(bytes);
  if (index.ok()) {
    if (cake::kCleanStopIndexHeaderBytes + index->size() * cake::kCleanStopIndexEntryBytes != size) __builtin_trap();
    for (const cake::IndexedChunk& c : *index) {
      if (c.payload_bytes > cake::kMaxIndexedPayloadBytes) __builtin_trap();
    }
  }
  return 0;
}
