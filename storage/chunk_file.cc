#include "storage/chunk_file.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "base/little_endian.h"
#include "base/unique_fd.h"

namespace cake {
namespace {

constexpr size_t kMagicOffset = 0;
constexpr size_t kVersionOffset = 8;
constexpr size_t kHeaderSizeOffset = 12;
constexpr size_t kKeyOffset = 16;
constexpr size_t kLengthOffset = 32;
constexpr size_t kPayloadChecksumOffset = 40;
constexpr size_t kHeaderChecksumOffset = 48;
constexpr size_t kCheckedHeaderBytes = kHeaderChecksumOffset;  // the checksum covers everything before it

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // upper case is not produced by ChunkKey::Hex, so such a name is not ours
}

}  // namespace

uint64_t PayloadChecksum(std::span<const std::byte> payload) { return XXH3_64bits(payload.data(), payload.size()); }

struct IncrementalPayloadChecksum::State {
  State() : xxh3(XXH3_createState()) {
    if (xxh3 == nullptr) throw std::bad_alloc();
    XXH3_64bits_reset(xxh3);
  }
  ~State() { XXH3_freeState(xxh3); }
  XXH3_state_t* const xxh3;
};
IncrementalPayloadChecksum::IncrementalPayloadChecksum() : state_(std::make_unique<State>()) {}
IncrementalPayloadChecksum::~IncrementalPayloadChecksum() = default;
void IncrementalPayloadChecksum::Add(std::span<const std::byte> piece) {
  XXH3_64bits_update(state_->xxh3, piece.data(), piece.size());
}
uint64_t IncrementalPayloadChecksum::Digest() const { return XXH3_64bits_digest(state_->xxh3); }

void EncodeChunkHeader(const ChunkHeader& header, std::span<std::byte> out) {
  std::memset(out.data(), 0, kChunkHeaderBytes);
  std::memcpy(out.data() + kMagicOffset, kChunkMagic.data(), kChunkMagic.size());
  StoreLittleEndian<uint32_t>(out.data() + kVersionOffset, kChunkFormatVersion);
  StoreLittleEndian<uint32_t>(out.data() + kHeaderSizeOffset, kChunkHeaderBytes);
  std::memcpy(out.data() + kKeyOffset, header.key.bytes.data(), kChunkKeyBytes);
  StoreLittleEndian<uint64_t>(out.data() + kLengthOffset, header.payload_length);
  StoreLittleEndian<uint64_t>(out.data() + kPayloadChecksumOffset, header.payload_checksum);
  StoreLittleEndian<uint64_t>(out.data() + kHeaderChecksumOffset, XXH3_64bits(out.data(), kCheckedHeaderBytes));
}

absl::StatusOr<ChunkHeader> ParseChunkHeader(std::span<const std::byte> bytes) {
  if (bytes.size() < kChunkHeaderBytes) {
    return absl::DataLossError(absl::StrCat("chunk header is ", bytes.size(), " bytes; expected ", kChunkHeaderBytes));
  }
  if (std::memcmp(bytes.data() + kMagicOffset, kChunkMagic.data(), kChunkMagic.size()) != 0) {
    return absl::DataLossError("chunk header has a bad magic (not a Cake chunk file)");
  }
  const uint32_t version = LoadLittleEndian<uint32_t>(bytes.data() + kVersionOffset);
  if (version != kChunkFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat("chunk file format version ", version,
                                                      " is not supported (this daemon reads version ",
                                                      kChunkFormatVersion, "); it was written by another daemon"));
  }
  const uint32_t header_size = LoadLittleEndian<uint32_t>(bytes.data() + kHeaderSizeOffset);
  if (header_size != kChunkHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat("chunk header declares ", header_size, " bytes; version 1 uses ", kChunkHeaderBytes));
  }
  const uint64_t stored = LoadLittleEndian<uint64_t>(bytes.data() + kHeaderChecksumOffset);
  const uint64_t computed = XXH3_64bits(bytes.data(), kCheckedHeaderBytes);
  if (stored != computed) return absl::DataLossError("chunk header checksum mismatch");
  ChunkHeader header;
  std::memcpy(header.key.bytes.data(), bytes.data() + kKeyOffset, kChunkKeyBytes);
  header.payload_length = LoadLittleEndian<uint64_t>(bytes.data() + kLengthOffset);
  header.payload_checksum = LoadLittleEndian<uint64_t>(bytes.data() + kPayloadChecksumOffset);
  return header;
}

uint64_t ChunkFileBytes(uint64_t payload_length) {
  // A header's length is a peer's word: one too large to have a file is answered with a size no file has,
  // rather than one that wrapped round to a small real one.
  if (payload_length > UINT64_MAX - 2 * kChunkHeaderBytes) return UINT64_MAX;
  return kChunkHeaderBytes + (payload_length + kChunkHeaderBytes - 1) / kChunkHeaderBytes * kChunkHeaderBytes;
}

std::filesystem::path ChunkFolder(const std::filesystem::path& root, const ChunkKey& key) {
  return root / std::string(kChunkLayoutFolder) / key.Hex().substr(0, 2);
}

std::filesystem::path ChunkPath(const std::filesystem::path& root, const ChunkKey& key) {
  return ChunkFolder(root, key) / (key.Hex() + std::string(kChunkFileSuffix));
}

absl::StatusOr<ChunkKey> ChunkKeyFromFileName(std::string_view file_name) {
  constexpr size_t kHexDigits = 2 * kChunkKeyBytes;
  if (file_name.size() != kHexDigits + kChunkFileSuffix.size() || file_name.substr(kHexDigits) != kChunkFileSuffix) {
    return absl::InvalidArgumentError(absl::StrCat("'", std::string(file_name), "' is not a chunk file name"));
  }
  ChunkKey key;
  for (size_t i = 0; i < kChunkKeyBytes; ++i) {
    const int hi = HexDigit(file_name[2 * i]);
    const int lo = HexDigit(file_name[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return absl::InvalidArgumentError(absl::StrCat("'", std::string(file_name), "' is not a chunk file name"));
    }
    key.bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return key;
}

absl::Status ErrnoStatus(int err, std::string_view what, const std::filesystem::path& path) {
  std::string message = absl::StrCat(std::string(what), " ", path.string(), ": ", std::strerror(err));
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(std::move(message));
    default:
      return absl::UnavailableError(std::move(message));
  }
}

absl::Status SyncFolder(const std::filesystem::path& folder) {
  UniqueFd fd(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, "opening folder", folder);
  if (::fsync(fd.get()) != 0) return ErrnoStatus(errno, "syncing folder", folder);
  return absl::OkStatus();
}

}  // namespace cake
