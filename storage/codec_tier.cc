#include "storage/codec_tier.h"

#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace cake {
namespace {

// Each codec's tag, XORed into the keys of the chunks it encoded. Any 16 bytes distinct per codec and version do;
// these spell the codec, so a key listed from Redis or a folder shows which codec wrote it.
constexpr std::string_view kPlanesZstdTag("planes-zstd/v1\0\0", 16);
static_assert(kPlanesZstdTag.size() == kChunkKeyBytes);

// The encoded value a thread last read, reused: a load's chunks are megabytes, and a fresh buffer per read would
// fault them in every time. Past kThreadBufferCeiling it is given back when the read ends (ReleaseIfLarge), so a
// thread that once read a huge value (a forger's, within a chunk's bound) does not hold it for good.
std::vector<std::byte>& ThreadEncodedBuffer() {
  thread_local std::vector<std::byte> buffer;
  return buffer;
}

struct ReleaseIfLarge {
  std::vector<std::byte>& buffer;
  ~ReleaseIfLarge() {
    if (buffer.capacity() > kThreadBufferCeiling) std::vector<std::byte>().swap(buffer);
  }
};

uint64_t MicrosecondsSince(std::chrono::steady_clock::time_point start) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count());
}

}  // namespace

CodecTier::CodecTier(std::unique_ptr<Tier> inner, ChunkCodec codec) : TierDecorator(std::move(inner)), codec_(codec) {}

ChunkKey CodecTier::StoredKey(const ChunkKey& key, ChunkCodec codec) {
  (void)codec;  // one codec so far
  ChunkKey stored = key;
  for (size_t i = 0; i < kChunkKeyBytes; ++i) stored.bytes[i] ^= static_cast<uint8_t>(kPlanesZstdTag[i]);
  return stored;
}

bool CodecTier::Contains(const ChunkKey& key) const { return TierDecorator::Contains(StoredKey(key, codec_)); }

std::vector<bool> CodecTier::ContainsEach(std::span<const ChunkKey> keys) const {
  std::vector<ChunkKey> stored;
  stored.reserve(keys.size());
  for (const ChunkKey& key : keys) stored.push_back(StoredKey(key, codec_));
  return TierDecorator::ContainsEach(stored);
}

absl::Status CodecTier::Read(const ChunkKey& key, std::span<std::byte> dst) {
  std::vector<std::byte>& encoded = ThreadEncodedBuffer();
  const ReleaseIfLarge release{encoded};
  // INVALID_ARGUMENT when it holds more than any encoding of dst.size() bytes: a chunk of another size, the
  // caller's mistake as far as a tier can tell (TierManager, whose callers pass the namespace's chunk, removes it).
  const absl::Status read = TierDecorator::ReadValue(StoredKey(key, codec_), MaxEncodedBytes(dst.size()), encoded);
  if (!read.ok()) return read;
  return Decode(key, encoded, dst);
}

absl::Status CodecTier::ReadValue(const ChunkKey& key, uint64_t max_bytes, std::vector<std::byte>& out) {
  std::vector<std::byte>& encoded = ThreadEncodedBuffer();
  const ReleaseIfLarge release{encoded};
  const absl::Status read = TierDecorator::ReadValue(StoredKey(key, codec_), MaxEncodedBytes(max_bytes), encoded);
  if (!read.ok()) return read;
  const absl::StatusOr<uint64_t> raw_bytes = EncodedRawBytes(encoded);
  if (raw_bytes.ok() && *raw_bytes > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", key.Hex(), " decodes to ", *raw_bytes, " bytes; at most ", max_bytes, " were expected"));
  }
  if (raw_bytes.ok()) out.resize(*raw_bytes);
  return Decode(key, encoded, out);  // an undecodable header is judged there
}

absl::StatusOr<uint64_t> CodecTier::Check(const ChunkKey& key, uint64_t max_bytes) {
  std::vector<std::byte> encoded;  // the call's own: returned when it ends
  const absl::Status read = TierDecorator::ReadValue(StoredKey(key, codec_), MaxEncodedBytes(max_bytes), encoded);
  if (!read.ok()) return read;
  const absl::StatusOr<uint64_t> checked = CheckEncodedChunk(encoded, max_bytes);
  if (absl::IsDataLoss(checked.status())) return RemoveUndecodable(key, std::string(checked.status().message()));
  if (absl::IsFailedPrecondition(checked.status())) other_codec_++;
  return checked;
}

absl::Status CodecTier::RemoveUndecodable(const ChunkKey& key, const std::string& why) {
  spdlog::warn("{} tier: chunk {} does not decode ({}); removing it", name(), key.Hex(), why);
  (void)TierDecorator::Remove(StoredKey(key, codec_));
  undecodable_removed_++;
  return absl::DataLossError(absl::StrCat("chunk ", key.Hex(), ": ", why, "; removed"));
}

absl::Status CodecTier::Decode(const ChunkKey& key, std::span<const std::byte> encoded, std::span<std::byte> dst) {
  const auto started = std::chrono::steady_clock::now();
  const absl::Status decoded = DecodeChunk(encoded, dst);
  switch (decoded.code()) {
    case absl::StatusCode::kOk:
      decode_us_ += MicrosecondsSince(started);
      chunks_decoded_++;
      raw_bytes_decoded_ += dst.size();
      return decoded;
    case absl::StatusCode::kDataLoss:
      // It passed the tier's checksum, so it was stored this way: whoever stored it, no read will decode it.
      return RemoveUndecodable(key, std::string(decoded.message()));
    case absl::StatusCode::kFailedPrecondition:
      other_codec_++;
      return decoded;
    default:
      return decoded;
  }
}

absl::Status CodecTier::Write(const ChunkKey& key, std::span<const std::byte> src) {
  const auto started = std::chrono::steady_clock::now();
  const std::vector<std::byte> encoded = EncodeChunk(codec_, src);
  encode_us_ += MicrosecondsSince(started);
  const absl::Status written = TierDecorator::Write(StoredKey(key, codec_), encoded);
  if (written.ok()) {
    chunks_encoded_++;
    raw_bytes_encoded_ += src.size();
    stored_bytes_encoded_ += encoded.size();
  }
  return written;
}

absl::Status CodecTier::Remove(const ChunkKey& key) { return TierDecorator::Remove(StoredKey(key, codec_)); }

uint64_t CodecTier::Footprint(uint64_t chunk_bytes) const {
  return TierDecorator::Footprint(MaxEncodedBytes(chunk_bytes));
}

void CodecTier::ForEach(const std::function<void(const ChunkKey&, uint64_t)>& fn) const {
  TierDecorator::ForEach([&](const ChunkKey& stored, uint64_t bytes) { fn(StoredKey(stored, codec_), bytes); });
}

std::shared_ptr<const std::span<const std::byte>> CodecTier::Lend(const ChunkKey& key) {
  (void)key;
  return nullptr;
}

TierStats CodecTier::Stats() const {
  TierStats stats = TierDecorator::Stats();
  stats.corrupt_removed += undecodable_removed_.load();
  stats.own.emplace_back("codec_chunks_encoded", chunks_encoded_.load());
  stats.own.emplace_back("codec_raw_bytes_encoded", raw_bytes_encoded_.load());
  stats.own.emplace_back("codec_stored_bytes_encoded", stored_bytes_encoded_.load());
  stats.own.emplace_back("codec_encode_microseconds", encode_us_.load());
  stats.own.emplace_back("codec_chunks_decoded", chunks_decoded_.load());
  stats.own.emplace_back("codec_raw_bytes_decoded", raw_bytes_decoded_.load());
  stats.own.emplace_back("codec_decode_microseconds", decode_us_.load());
  stats.own.emplace_back("codec_undecodable_removed", undecodable_removed_.load());
  stats.own.emplace_back("codec_other_codec_skipped", other_codec_.load());
  return stats;
}

TierCapabilities CodecTier::Capabilities() const {
  TierCapabilities capabilities = TierDecorator::Capabilities();
  capabilities.lends = false;
  return capabilities;
}

}  // namespace cake
