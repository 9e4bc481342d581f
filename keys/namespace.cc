#include "keys/namespace.h"

#include <openssl/evp.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace cake {
namespace {

// One SHA-256 computation truncated to a chunk key; the digest object is fetched once per process.
class KeyHasher {
 public:
  KeyHasher() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(ctx_, Sha256(), nullptr); }
  ~KeyHasher() { EVP_MD_CTX_free(ctx_); }
  KeyHasher(const KeyHasher&) = delete;
  KeyHasher& operator=(const KeyHasher&) = delete;

  void Update(const void* data, size_t n) { EVP_DigestUpdate(ctx_, data, n); }
  void Update(std::string_view s) { Update(s.data(), s.size()); }
  void UpdateU32(uint32_t v) {
    uint8_t le[4] = {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)};
    Update(le, sizeof(le));
  }
  void UpdateString(std::string_view s) {  // length-prefixed, so field boundaries are unambiguous
    UpdateU32(static_cast<uint32_t>(s.size()));
    Update(s);
  }
  // Returns the key and resets the hasher for the next one.
  ChunkKey Finish() {
    uint8_t digest[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx_, digest, &len);
    ChunkKey key;
    std::memcpy(key.bytes.data(), digest, kChunkKeyBytes);
    EVP_DigestInit_ex(ctx_, Sha256(), nullptr);
    return key;
  }

 private:
  static const EVP_MD* Sha256() {
    static const EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    return md;
  }
  EVP_MD_CTX* ctx_;
};

bool LittleEndianHost() { return __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__; }

}  // namespace

uint32_t DTypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kFp32:
      return 4;
    case DType::kFp16:
    case DType::kBf16:
      return 2;
    case DType::kFp8:
    case DType::kInt8:
      return 1;
  }
  return 0;
}

std::string ChunkKey::Hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

absl::StatusOr<Namespace> Namespace::Create(NamespaceSpec spec, const NamespaceLimits& limits,
                                            std::string_view key_secret) {
  auto bad = [](const char* field, uint64_t value, const std::string& accepted) {
    return absl::InvalidArgumentError(absl::StrCat("namespace.", field, " is ", value, "; accepted: ", accepted));
  };
  if (spec.model_id.empty() || spec.model_id.size() > 256) {
    return absl::InvalidArgumentError("namespace.model_id must be 1 to 256 bytes long");
  }
  if (spec.tenant.size() > 256) return absl::InvalidArgumentError("namespace.tenant is longer than 256 bytes");
  if (spec.num_layers == 0 || spec.num_layers > 4096) return bad("num_layers", spec.num_layers, "1 to 4096");
  if (spec.num_kv_heads == 0 || spec.num_kv_heads > 4096) return bad("num_kv_heads", spec.num_kv_heads, "1 to 4096");
  if (spec.head_dim == 0 || spec.head_dim > 16384) return bad("head_dim", spec.head_dim, "1 to 16384");
  const uint32_t dtype_bytes = DTypeBytes(spec.dtype);
  if (dtype_bytes == 0) return bad("dtype", static_cast<uint32_t>(spec.dtype), "FP32, FP16, BF16, FP8, INT8");
  if (spec.tp_size == 0) spec.tp_size = 1;
  if (spec.tp_rank >= spec.tp_size) return bad("tp_rank", spec.tp_rank, "0 to tp_size - 1");
  if (spec.stored_precision != StoredPrecision::kExact) {
    if (static_cast<uint32_t>(spec.stored_precision) > static_cast<uint32_t>(StoredPrecision::kInt4)) {
      return bad("stored_precision", static_cast<uint32_t>(spec.stored_precision), "EXACT, INT8, INT4");
    }
    if (spec.dtype != DType::kBf16 && spec.dtype != DType::kFp16 && spec.dtype != DType::kFp32) {
      return absl::InvalidArgumentError(
          "namespace.stored_precision INT8 or INT4 needs a dtype of BF16, FP16 or FP32 (it quantizes floats)");
    }
  }
  if (spec.chunk_tokens == 0 || spec.chunk_tokens > limits.max_chunk_tokens) {
    return bad("chunk_tokens", spec.chunk_tokens, absl::StrCat("1 to ", limits.max_chunk_tokens));
  }
  Namespace ns;
  ns.bytes_per_token_ = uint64_t{2} * spec.num_layers * spec.num_kv_heads * spec.head_dim * dtype_bytes;
  // Divide rather than multiply: with a large limits.max_chunk_tokens the product can wrap past 2^64.
  if (spec.chunk_tokens > limits.max_chunk_bytes / ns.bytes_per_token_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a chunk of this namespace would be ", spec.chunk_tokens, " tokens * ", ns.bytes_per_token_,
        " bytes per token (2 * num_layers * num_kv_heads * head_dim * dtype bytes); this daemon accepts at most ",
        limits.max_chunk_bytes, " (limits.max_chunk_bytes): use smaller chunks"));
  }
  KeyHasher h;
  h.Update("cake.v1.namespace");
  h.UpdateString(spec.model_id);
  for (uint32_t v : {spec.num_layers, spec.num_kv_heads, spec.head_dim, static_cast<uint32_t>(spec.dtype), spec.tp_rank,
                     spec.tp_size, spec.chunk_tokens}) {
    h.UpdateU32(v);
  }
  h.UpdateString(spec.tenant);
  // Only when lossy, so every exact namespace keeps the id it always had; a lossy one never shares keys with it.
  if (spec.stored_precision != StoredPrecision::kExact) h.UpdateU32(static_cast<uint32_t>(spec.stored_precision));
  ns.id_ = h.Finish();
  h.Update("cake.v1.root");
  h.Update(ns.id_.bytes.data(), kChunkKeyBytes);
  h.UpdateString(key_secret);
  ns.root_ = h.Finish();
  ns.spec_ = std::move(spec);
  return ns;
}

std::vector<ChunkKey> Namespace::KeysForTokens(std::span<const uint32_t> tokens) const {
  const size_t n = tokens.size() / spec_.chunk_tokens;
  std::vector<ChunkKey> keys;
  keys.reserve(n);
  KeyHasher h;
  ChunkKey prev = root_;
  std::vector<uint32_t> le;
  for (size_t i = 0; i < n; ++i) {
    auto chunk = tokens.subspan(i * spec_.chunk_tokens, spec_.chunk_tokens);
    h.Update(prev.bytes.data(), kChunkKeyBytes);
    if (LittleEndianHost()) {
      h.Update(chunk.data(), chunk.size_bytes());
    } else {
      for (uint32_t t : chunk) h.UpdateU32(t);
    }
    prev = h.Finish();
    keys.push_back(prev);
  }
  return keys;
}

absl::StatusOr<std::vector<ChunkKey>> Namespace::KeysForEngineKeys(
    std::span<const std::string_view> engine_keys) const {
  std::vector<ChunkKey> keys;
  keys.reserve(engine_keys.size());
  KeyHasher h;
  for (size_t i = 0; i < engine_keys.size(); ++i) {
    if (engine_keys[i].size() != kChunkKeyBytes) {
      return absl::InvalidArgumentError(absl::StrCat("chunk key ", i, " is ", engine_keys[i].size(),
                                                     " bytes long; chunk keys are exactly ", kChunkKeyBytes, " bytes"));
    }
    h.Update(root_.bytes.data(), kChunkKeyBytes);
    h.Update("engine-key");
    h.Update(engine_keys[i]);
    keys.push_back(h.Finish());
  }
  return keys;
}

}  // namespace cake
