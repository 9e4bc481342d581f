// Namespaces (a model's KV layout plus the tenant) and chained prefix keys for the chunks of a prompt.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace cake {

enum class DType : uint8_t { kFp32 = 1, kFp16 = 2, kBf16 = 3, kFp8 = 4, kInt8 = 5 };

// How the slower tiers (disk, Redis) may store a namespace's chunks: as they are (lossless codecs included), or
// quantized to 8 or 4 bits (storage/lossy_codec.h), which only an engine asks for. Part of the namespace's id.
enum class StoredPrecision : uint8_t { kExact = 0, kInt8 = 1, kInt4 = 2 };

// Bytes of one element, or 0 for a value outside the enum.
uint32_t DTypeBytes(DType dtype);

inline constexpr size_t kChunkKeyBytes = 16;

// Names a whole prompt prefix up to the end of one chunk, inside one namespace. SHA-256 truncated to 128 bits:
// collision resistant, so one tenant can neither poison nor probe another's cache.
struct ChunkKey {
  std::array<uint8_t, kChunkKeyBytes> bytes{};

  friend bool operator==(const ChunkKey&, const ChunkKey&) = default;
  std::string Hex() const;
  template <typename H>
  friend H AbslHashValue(H h, const ChunkKey& k) {
    // The key is already a cryptographic hash: its first 8 bytes are as good as any mix of all 16.
    uint64_t prefix;
    static_assert(sizeof(prefix) <= kChunkKeyBytes);
    __builtin_memcpy(&prefix, k.bytes.data(), sizeof(prefix));
    return H::combine(std::move(h), prefix);
  }
};

struct NamespaceSpec {
  std::string model_id;
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  DType dtype = DType::kBf16;
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
  uint32_t chunk_tokens = 256;
  std::string tenant;
  StoredPrecision stored_precision = StoredPrecision::kExact;
};

// Bounds a namespace must respect; the daemon's configuration sets them.
struct NamespaceLimits {
  uint64_t max_chunk_bytes = uint64_t{1} << 30;
  uint32_t max_chunk_tokens = 1u << 16;
};

class Namespace {
 public:
  // Validates the spec; INVALID_ARGUMENT names the first bad field and the accepted range.
  static absl::StatusOr<Namespace> Create(NamespaceSpec spec, const NamespaceLimits& limits = {},
                                          std::string_view key_secret = {});

  const NamespaceSpec& spec() const { return spec_; }
  // Hash of the canonical encoding of the spec (tenant included).
  const ChunkKey& id() const { return id_; }
  // k_{-1}: the root every chain of keys in this namespace starts from (mixes in the daemon's key secret).
  const ChunkKey& root() const { return root_; }
  uint64_t bytes_per_token() const { return bytes_per_token_; }
  uint64_t chunk_bytes() const { return bytes_per_token_ * spec_.chunk_tokens; }
  uint32_t chunk_tokens() const { return spec_.chunk_tokens; }

  // Keys of every full chunk of the prompt: k_i = H(k_{i-1} || tokens of chunk i, little-endian u32).
  // A partial tail chunk gets no key: it is never cached.
  std::vector<ChunkKey> KeysForTokens(std::span<const uint32_t> tokens) const;
  // Keys for an engine's own chunk keys: k_i = H(root || engine key i), so tenants stay isolated even when
  // engines hash blocks themselves. Each engine key must be kChunkKeyBytes long.
  absl::StatusOr<std::vector<ChunkKey>> KeysForEngineKeys(std::span<const std::string_view> engine_keys) const;

 private:
  Namespace() = default;
  NamespaceSpec spec_;
  ChunkKey id_;
  ChunkKey root_;
  uint64_t bytes_per_token_ = 0;
};

}  // namespace cake
