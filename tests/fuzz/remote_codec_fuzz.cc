// libFuzzer target: a remote value header is a peer's word. ParseRemoteHeader answers any bytes with a header
// whose part layout is consistent and bounded, or a status; the part count never wraps.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "storage/remote_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cake::ChunkKey key;
  if (size >= cake::kChunkKeyBytes) std::memcpy(key.bytes.data(), data, cake::kChunkKeyBytes);
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (const cake::ChunkKey& expected : {key, cake::ChunkKey()}) {
    auto header = cake::ParseRemoteHeader(bytes.size() > 16 ? bytes.substr(16) : bytes, expected);
    if (header.ok()) {
      if (header->part_bytes < cake::kMinRemotePartBytes || header->part_bytes > cake::kMaxRemotePartBytes)
        __builtin_trap();
      if (header->parts != cake::RemotePartCount(header->payload_length, header->part_bytes)) __builtin_trap();
    }
  }
  // A header the fuzzer sealed itself, from its own numbers: the checks hold for encoded garbage too.
  if (size >= 24) {
    cake::RemoteHeader h;
    h.key = key;
    std::memcpy(&h.payload_length, data, 8);
    std::memcpy(&h.part_bytes, data + 8, 8);
    std::memcpy(&h.parts, data + 16, 4);
    auto parsed = cake::ParseRemoteHeader(cake::EncodeRemoteHeader(h), key);
    if (parsed.ok() && parsed->parts != cake::RemotePartCount(parsed->payload_length, parsed->part_bytes))
      __builtin_trap();
  }
  return 0;
}
