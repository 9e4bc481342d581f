// The remote tier's value format: key names of a chunk's header and parts, and the header's encoding.
#include "storage/remote_codec.h"

#include <xxhash.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "storage/chunk_file.h"

namespace cake {
namespace {

constexpr std::string_view kRemoteMagic = "CAKERMT1";
constexpr uint32_t kRemoteFormatVersion = 1;
constexpr size_t kRemoteCheckedBytes = 56;  // the header checksum covers everything before it

template <typename T>
void PutLe(char* out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

template <typename T>
T GetLe(const char* in) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(static_cast<uint8_t>(in[i])) << (8 * i);
  return value;
}

}  // namespace

uint64_t RemotePartCount(uint64_t payload_bytes, uint64_t part_bytes) {
  return payload_bytes / part_bytes + (payload_bytes % part_bytes != 0);  // no wrap, whatever a header says
}

RemoteHeader MakeRemoteHeader(const ChunkKey& key, std::span<const std::byte> payload, uint64_t part_bytes) {
  RemoteHeader header;
  header.key = key;
  header.payload_length = payload.size();
  header.part_bytes = part_bytes;
  header.parts = static_cast<uint32_t>(RemotePartCount(payload.size(), part_bytes));
  header.payload_checksum = PayloadChecksum(payload);
  return header;
}

std::string EncodeRemoteHeader(const RemoteHeader& h) {
  std::string out(kRemoteHeaderBytes, '\0');
  char* p = out.data();
  std::memcpy(p, kRemoteMagic.data(), kRemoteMagic.size());
  PutLe<uint32_t>(p + 8, kRemoteFormatVersion);
  PutLe<uint32_t>(p + 12, h.parts);
  std::memcpy(p + 16, h.key.bytes.data(), kChunkKeyBytes);
  PutLe<uint64_t>(p + 32, h.payload_length);
  PutLe<uint64_t>(p + 40, h.part_bytes);
  PutLe<uint64_t>(p + 48, h.payload_checksum);
  PutLe<uint64_t>(p + 56, XXH3_64bits(p, kRemoteCheckedBytes));
  return out;
}

absl::StatusOr<RemoteHeader> ParseRemoteHeader(std::string_view bytes, const ChunkKey& expected_key) {
  if (bytes.size() != kRemoteHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat("remote header is ", bytes.size(), " bytes; expected ", kRemoteHeaderBytes));
  }
  const char* p = bytes.data();
  if (std::memcmp(p, kRemoteMagic.data(), kRemoteMagic.size()) != 0) {
    return absl::DataLossError("remote header has a bad magic (not a Cake chunk)");
  }
  if (GetLe<uint64_t>(p + 56) != XXH3_64bits(p, kRemoteCheckedBytes)) {
    return absl::DataLossError("remote header checksum mismatch");
  }
  const uint32_t version = GetLe<uint32_t>(p + 8);
  if (version != kRemoteFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat("remote chunk format version ", version, " is not known here"));
  }
  RemoteHeader h;
  h.parts = GetLe<uint32_t>(p + 12);
  std::memcpy(h.key.bytes.data(), p + 16, kChunkKeyBytes);
  h.payload_length = GetLe<uint64_t>(p + 32);
  h.part_bytes = GetLe<uint64_t>(p + 40);
  h.payload_checksum = GetLe<uint64_t>(p + 48);
  if (!(h.key == expected_key)) return absl::DataLossError("remote header names another chunk key");
  if (h.part_bytes < kMinRemotePartBytes || h.part_bytes > kMaxRemotePartBytes) {
    return absl::DataLossError(absl::StrCat("remote header's part size ", h.part_bytes, " is outside [",
                                            kMinRemotePartBytes, ", ", kMaxRemotePartBytes, "]"));
  }
  if (h.parts != RemotePartCount(h.payload_length, h.part_bytes)) {
    return absl::DataLossError("remote header's part layout does not match its length");
  }
  return h;
}

RemoteChunkNames::RemoteChunkNames(std::string_view prefix, const ChunkKey& key)
    : tag_(absl::StrCat(absl::string_view(prefix.data(), prefix.size()), "{", key.Hex(), "}:")) {}

std::string RemoteChunkNames::header() const { return tag_ + "h"; }

std::string RemoteChunkNames::part(uint64_t i) const { return absl::StrCat(tag_, i); }

std::string RemoteHeaderPattern(std::string_view prefix) {
  std::string out;
  for (char c : prefix) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "{*}:h";
}

absl::StatusOr<ChunkKey> ChunkKeyFromRemoteName(std::string_view prefix, std::string_view name) {
  const size_t open = name.find('{', prefix.size());
  const size_t close = name.find('}', open);
  if (open == std::string_view::npos || close == std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", std::string(name), "' has no hash tag after the prefix"));
  }
  // A chunk file is named by the same 32 hex digits.
  return ChunkKeyFromFileName(std::string(name.substr(open + 1, close - open - 1)) + std::string(kChunkFileSuffix));
}

}  // namespace cake
