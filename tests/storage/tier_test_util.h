// Keys and values shared by the storage tests: deterministic, so a wrong byte anywhere is caught.
#pragma once

#include <stdlib.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "keys/namespace.h"

namespace cake::testing {

inline ChunkKey TestKey(uint32_t i) {
  ChunkKey k;
  for (size_t b = 0; b < k.bytes.size(); ++b) k.bytes[b] = static_cast<uint8_t>((i >> (8 * (b % 4))) + b * 31);
  return k;
}

// Differs per key and per offset, so swapped or shifted values do not compare equal.
inline std::vector<std::byte> TestValue(uint32_t i, size_t bytes) {
  std::vector<std::byte> v(bytes);
  uint32_t x = i * 2654435761u + 1;
  for (size_t j = 0; j < bytes; ++j) {
    x = x * 1103515245u + 12345u;
    v[j] = static_cast<std::byte>(x >> 24);
  }
  return v;
}

// Bytes shaped like bf16 KV: normally distributed values (a fixed seed per key) rounded to bf16, so their exponent
// bytes compress as real KV's do and their mantissa bytes do not.
inline std::vector<std::byte> TestBf16Value(uint32_t i, size_t bytes) {
  std::vector<std::byte> v(bytes);
  uint64_t x = i * 0x9E3779B97F4A7C15ull + 7;
  auto uniform = [&x] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return (static_cast<double>(x >> 11) + 0.5) / 9007199254740992.0;
  };
  for (size_t j = 0; j + 1 < bytes; j += 2) {
    // Box-Muller; the scale varies by position like KV's channels do.
    const float value =
        static_cast<float>(std::sqrt(-2 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()) *
                           (0.05 + static_cast<double>((j / 2) % 64) / 16));
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    v[j] = static_cast<std::byte>(bits >> 16);
    v[j + 1] = static_cast<std::byte>(bits >> 24);
  }
  if (bytes % 2 == 1) v[bytes - 1] = std::byte{0x3f};
  return v;
}

// The same bytes as a string, for Redis values and replies.
inline std::string TestText(uint32_t i, size_t bytes) {
  const std::vector<std::byte> v = TestValue(i, bytes);
  return std::string(reinterpret_cast<const char*>(v.data()), v.size());
}

// Polls a condition that another thread makes true; real time bounds it only so a bug fails instead of hanging.
inline bool Eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// A fresh folder under /tmp (ext4 here, so O_DIRECT works), removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "cake-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace cake::testing
