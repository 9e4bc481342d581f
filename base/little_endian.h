// Explicit little-endian integers in byte buffers: what the daemon writes to disk must read back the same on any
// host that mounts it, whatever its own byte order.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cake {

template <typename T>
void StoreLittleEndian(std::byte* out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<std::byte>((value >> (8 * i)) & 0xff);
}

template <typename T>
T LoadLittleEndian(const std::byte* in) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(std::to_integer<uint8_t>(in[i])) << (8 * i);
  return value;
}

}  // namespace cake
