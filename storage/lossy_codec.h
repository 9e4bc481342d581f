// The lossy codecs an engine may ask for per namespace (Namespace.stored_precision): a chunk on its way to a
// slower tier (disk, Redis) is quantized to 8 or 4 bits with one scale per (layer, K or V, token, KV head), and on
// its way back decoded to the namespace's dtype. DRAM always holds the engine's bytes as they came. Pure
// functions, no I/O; docs/research/lossy-kv measures what it costs in accuracy.
//
// The math, which the research's Python reference follows bit for bit: for each group of head_dim values (the
// chunk's layout is [layer][K,V][token][kv_head][head_dim]), in fp32, scale = max |x| / Q (Q = 127 for int8, 7 for
// int4; 0 for a group of zeros), q = round-half-to-even(x / scale) clamped to [-Q, Q]; decoding gives q * scale in
// fp32, rounded to the dtype (round to nearest even).
//
// Encoded layout, little-endian:
//   offset  size  field
//        0     8  magic "CAKEKVQ1"
//        8     4  version (u32) = 1
//       12     4  precision (u32): 1 int8, 2 int4
//       16     4  dtype (u32, keys/namespace.h's DType: fp32, fp16 or bf16)
//       20    16  layers, kv_heads, head_dim, tokens (u32 each)
//       36    28  reserved, zero
//       64     -  one fp32 scale per group, then the groups' values: int8 one byte each; int4 two per byte (the
//                 even value in the low nibble), each group starting on a byte
// The tier's checksum covers it like any stored value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "keys/namespace.h"

namespace cake {

struct LossyFormat {
  StoredPrecision precision = StoredPrecision::kExact;
  DType dtype = DType::kBf16;
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t tokens = 0;

  // The namespace's format: kExact (nothing to encode) unless it asked for a lossy precision.
  static LossyFormat Of(const NamespaceSpec& spec);
  bool lossy() const { return precision != StoredPrecision::kExact; }
  uint64_t raw_bytes() const;      // a chunk of this namespace
  uint64_t encoded_bytes() const;  // its encoding, header included
};

inline constexpr size_t kLossyHeaderBytes = 64;

// raw must be exactly format.raw_bytes(); format must be lossy with a float dtype (Namespace::Create checks both).
std::vector<std::byte> EncodeLossy(const LossyFormat& format, std::span<const std::byte> raw);

// Decodes into dst, which must be exactly the raw size the header describes (INVALID_ARGUMENT otherwise, dst
// untouched). DATA_LOSS: not an encoding (magic, sizes that disagree with the header, a scale that is negative or
// not finite, or so large that a value would decode to inf in the dtype). FAILED_PRECONDITION: a version this
// daemon does not know. Never writes outside dst.
absl::Status DecodeLossy(std::span<const std::byte> encoded, std::span<std::byte> dst);
// The same for a chunk of the namespace whose format is `expected`: a header that says another precision, dtype or
// shape is DATA_LOSS (it was not stored for this namespace, whatever its size), before anything is decoded.
absl::Status DecodeLossy(std::span<const std::byte> encoded, std::span<std::byte> dst, const LossyFormat& expected);

}  // namespace cake
