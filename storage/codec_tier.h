// A decorator that keeps a tier's chunks encoded (chunk_codec.h): encoded on Write, decoded by Read into the
// caller's destination, so the tiers below it, and the loads above it, see only keys and bytes.
//
// Encoded chunks live under keys of their own: the chunk's key XOR the codec's 16-byte tag. A daemon with another
// codec, or none, sharing the folder or the Redis never finds them (a miss, never encoded bytes read as raw), and
// chunks stored before the codec was turned on are not found by it (they age out). The codec's header is inside
// the stored value, so the tier's payload checksum covers it; a value that passes the checksum and still does not
// decode (written by a forger, or a bug) is removed like a corrupt one.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "storage/chunk_codec.h"
#include "storage/tier.h"

namespace cake {

class CodecTier final : public TierDecorator {
 public:
  // codec must not be kNone (then there is nothing to decorate).
  CodecTier(std::unique_ptr<Tier> inner, ChunkCodec codec);

  // The key an encoded chunk is stored under in the inner tier; applying it twice gives the chunk's key back.
  static ChunkKey StoredKey(const ChunkKey& key, ChunkCodec codec);

  bool Contains(const ChunkKey& key) const override;
  std::vector<bool> ContainsEach(std::span<const ChunkKey> keys) const override;
  // Reads the encoded value (at most MaxEncodedBytes(dst.size()), whatever the tier says) and decodes it into dst.
  absl::Status Read(const ChunkKey& key, std::span<std::byte> dst) override;
  absl::Status ReadValue(const ChunkKey& key, uint64_t max_bytes, std::vector<std::byte>& out) override;
  // Reads the encoded value into a buffer of the call's own and checks that it decodes (CheckEncodedChunk) without
  // producing the chunk; a value that does not decode is removed, as Read would.
  absl::StatusOr<uint64_t> Check(const ChunkKey& key, uint64_t max_bytes) override;
  absl::Status Write(const ChunkKey& key, std::span<const std::byte> src) override;
  absl::Status Remove(const ChunkKey& key) override;
  // A raw chunk's footprint at worst (its encoding never compressed).
  uint64_t Footprint(uint64_t chunk_bytes) const override;
  // Keys and the bytes the tier holds for them (encoded); keys stored by other codecs come out as keys nobody asks
  // for, and removing them through this tier removes them.
  void ForEach(const std::function<void(const ChunkKey&, uint64_t)>& fn) const override;
  // Encoded bytes are not the value: nothing to lend.
  std::shared_ptr<const std::span<const std::byte>> Lend(const ChunkKey& key) override;
  // The inner tier's, with the codec's counters (codec_*) and its corrupt removals added.
  TierStats Stats() const override;
  TierCapabilities Capabilities() const override;

 private:
  // Decodes the inner tier's value for key into dst, counting it; removes a value that does not decode.
  absl::Status Decode(const ChunkKey& key, std::span<const std::byte> encoded, std::span<std::byte> dst);
  // Removes the value stored for key, which passed the tier's checksum and still does not decode (whoever stored it,
  // no read will decode it), and says so: DATA_LOSS.
  absl::Status RemoveUndecodable(const ChunkKey& key, const std::string& why);

  const ChunkCodec codec_;
  std::atomic<uint64_t> chunks_encoded_{0};
  std::atomic<uint64_t> raw_bytes_encoded_{0};
  std::atomic<uint64_t> stored_bytes_encoded_{0};
  std::atomic<uint64_t> encode_us_{0};
  std::atomic<uint64_t> chunks_decoded_{0};
  std::atomic<uint64_t> raw_bytes_decoded_{0};
  std::atomic<uint64_t> decode_us_{0};
  std::atomic<uint64_t> undecodable_removed_{0};
  std::atomic<uint64_t> other_codec_{0};  // values of a codec or version this daemon does not know: left alone
};

}  // namespace cake
