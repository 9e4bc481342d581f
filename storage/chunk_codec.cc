#include "storage/chunk_codec.h"

#include <zstd.h>

#include <array>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/little_endian.h"

namespace cake {
namespace {

constexpr std::string_view kCodecMagic = "CAKEKVC1";
constexpr uint32_t kCodecVersion = 1;
constexpr size_t kPlaneEntryBytes = 16;
constexpr uint32_t kStored = 0;
constexpr uint32_t kZstdFrame = 1;
// zstd level 1: on real KV level 3 gains 0.001 of ratio and encodes 20-40% slower (docs/research/codec-study).
constexpr int kZstdLevel = 1;
// A plane that zstd shrinks by less than this is stored: decoding it would cost more than the bytes it saves.
constexpr double kWorthCompressing = 0.97;
static_assert(kCodecHeaderBytes == 32 + kPlaneEntryBytes * kCodecPlanes);

uint64_t PlaneBytes(uint64_t raw_bytes, uint32_t plane) {
  return raw_bytes / kCodecPlanes + (plane < raw_bytes % kCodecPlanes ? 1 : 0);
}

// zstd's contexts hold about 100 KiB to 1 MiB of tables: made once per thread, not per chunk.
struct ZstdContexts {
  std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> compress{ZSTD_createCCtx(), ZSTD_freeCCtx};
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> decompress{ZSTD_createDCtx(), ZSTD_freeDCtx};
};
ZstdContexts& ThreadContexts() {
  thread_local ZstdContexts contexts;
  return contexts;
}

// Room for the planes zstd decodes before they are interleaved into the destination (uninitialized: zeroing it per
// chunk would cost as much as a plane's decode). A thread keeps one up to kThreadBufferCeiling for its next chunk;
// a larger one is the call's own, returned when it ends, so a thread that once decoded a huge chunk does not hold
// it for good.
class Scratch {
 public:
  explicit Scratch(size_t bytes) {
    if (bytes > kThreadBufferCeiling) {
      own_.reset(new std::byte[bytes]);
      at_ = own_.get();
      return;
    }
    thread_local std::unique_ptr<std::byte[]> kept;
    thread_local size_t capacity = 0;
    if (capacity < bytes) {
      kept.reset(new std::byte[bytes]);
      capacity = bytes;
    }
    at_ = kept.get();
  }
  std::byte* get() const { return at_; }

 private:
  std::unique_ptr<std::byte[]> own_;
  std::byte* at_ = nullptr;
};

// dst[4i + p] = planes[p][i]. Written as whole 32-bit words so the compiler keeps it branch-free.
void Interleave(const std::array<const std::byte*, kCodecPlanes>& planes, std::span<std::byte> dst) {
  const size_t words = dst.size() / kCodecPlanes;
  const auto* p0 = reinterpret_cast<const uint8_t*>(planes[0]);
  const auto* p1 = reinterpret_cast<const uint8_t*>(planes[1]);
  const auto* p2 = reinterpret_cast<const uint8_t*>(planes[2]);
  const auto* p3 = reinterpret_cast<const uint8_t*>(planes[3]);
  auto* out = reinterpret_cast<uint8_t*>(dst.data());
  for (size_t i = 0; i < words; ++i) {
    const uint32_t word = uint32_t{p0[i]} | uint32_t{p1[i]} << 8 | uint32_t{p2[i]} << 16 | uint32_t{p3[i]} << 24;
    std::memcpy(out + kCodecPlanes * i, &word, sizeof(word));  // little-endian, like every x86 and arm64 host
  }
  for (size_t p = 0; p < dst.size() % kCodecPlanes; ++p) dst[kCodecPlanes * words + p] = planes[p][words];
}

void Deinterleave(std::span<const std::byte> raw, const std::array<std::byte*, kCodecPlanes>& planes) {
  const size_t words = raw.size() / kCodecPlanes;
  auto* p0 = reinterpret_cast<uint8_t*>(planes[0]);
  auto* p1 = reinterpret_cast<uint8_t*>(planes[1]);
  auto* p2 = reinterpret_cast<uint8_t*>(planes[2]);
  auto* p3 = reinterpret_cast<uint8_t*>(planes[3]);
  const auto* in = reinterpret_cast<const uint8_t*>(raw.data());
  for (size_t i = 0; i < words; ++i) {
    uint32_t word;
    std::memcpy(&word, in + kCodecPlanes * i, sizeof(word));
    p0[i] = static_cast<uint8_t>(word);
    p1[i] = static_cast<uint8_t>(word >> 8);
    p2[i] = static_cast<uint8_t>(word >> 16);
    p3[i] = static_cast<uint8_t>(word >> 24);
  }
  for (size_t p = 0; p < raw.size() % kCodecPlanes; ++p) planes[p][words] = raw[kCodecPlanes * words + p];
}

struct PlaneEntry {
  uint32_t method = kStored;
  uint64_t stored_bytes = 0;
};

struct ParsedHeader {
  uint64_t raw_bytes = 0;
  std::array<PlaneEntry, kCodecPlanes> planes;
};

absl::StatusOr<ParsedHeader> ParseHeader(std::span<const std::byte> encoded) {
  if (encoded.size() < kCodecHeaderBytes) {
    return absl::DataLossError(absl::StrCat("an encoded chunk of ", encoded.size(), " bytes is shorter than its ",
                                            kCodecHeaderBytes, "-byte codec header"));
  }
  const std::byte* h = encoded.data();
  if (std::memcmp(h, kCodecMagic.data(), kCodecMagic.size()) != 0) {
    return absl::DataLossError("not an encoded chunk (bad codec magic)");
  }
  const auto codec = LoadLittleEndian<uint32_t>(h + 8);
  const auto version = LoadLittleEndian<uint32_t>(h + 12);
  if (codec != static_cast<uint32_t>(ChunkCodec::kPlanesZstd) || version != kCodecVersion) {
    return absl::FailedPreconditionError(absl::StrCat("the chunk was encoded with codec ", codec, " version ", version,
                                                      ", which this daemon does not ",
                                                      "know (it decodes codec 1 version 1)"));
  }
  ParsedHeader parsed;
  parsed.raw_bytes = LoadLittleEndian<uint64_t>(h + 16);
  if (LoadLittleEndian<uint32_t>(h + 24) != kCodecPlanes || LoadLittleEndian<uint32_t>(h + 28) != 0) {
    return absl::DataLossError("the codec header's plane count or reserved field is wrong");
  }
  // Every length is checked against what is actually there before anything is added to it: no sum can wrap.
  uint64_t left = encoded.size() - kCodecHeaderBytes;
  for (uint32_t p = 0; p < kCodecPlanes; ++p) {
    const std::byte* entry = h + 32 + kPlaneEntryBytes * p;
    PlaneEntry& plane = parsed.planes[p];
    plane.method = LoadLittleEndian<uint32_t>(entry);
    plane.stored_bytes = LoadLittleEndian<uint64_t>(entry + 8);
    if ((plane.method != kStored && plane.method != kZstdFrame) || LoadLittleEndian<uint32_t>(entry + 4) != 0) {
      return absl::DataLossError(absl::StrCat("plane ", p, " has an unknown method ", plane.method));
    }
    if (plane.stored_bytes > left) {
      return absl::DataLossError(
          absl::StrCat("plane ", p, " claims ", plane.stored_bytes, " bytes; ", left, " are left (truncated?)"));
    }
    if (plane.method == kStored && plane.stored_bytes != PlaneBytes(parsed.raw_bytes, p)) {
      return absl::DataLossError(absl::StrCat("stored plane ", p, " holds ", plane.stored_bytes, " bytes; a ",
                                              parsed.raw_bytes, "-byte chunk's plane has ",
                                              PlaneBytes(parsed.raw_bytes, p)));
    }
    left -= plane.stored_bytes;
  }
  if (left != 0) return absl::DataLossError(absl::StrCat(left, " bytes follow the last plane"));
  return parsed;
}

}  // namespace

absl::StatusOr<ChunkCodec> ParseChunkCodec(std::string_view name) {
  if (const std::optional<ChunkCodec> codec = ValueIn(kChunkCodecNames, name)) return *codec;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown codec \"", std::string(name), "\"; the codecs are \"none\" and \"planes-zstd\""));
}

std::string_view ChunkCodecName(ChunkCodec codec) { return NameIn(kChunkCodecNames, codec, "unknown"); }

uint64_t MaxEncodedBytes(uint64_t raw_bytes) {
  uint64_t bound = kCodecHeaderBytes;
  for (uint32_t p = 0; p < kCodecPlanes; ++p) bound += ZSTD_compressBound(PlaneBytes(raw_bytes, p));
  return bound;
}

std::vector<std::byte> EncodeChunk(ChunkCodec codec, std::span<const std::byte> raw) {
  (void)codec;  // kPlanesZstd is the only one; the caller does not encode for kNone
  std::vector<std::byte> planes(raw.size());
  std::array<std::byte*, kCodecPlanes> plane_at{};
  std::array<uint64_t, kCodecPlanes> plane_bytes{};
  for (uint32_t p = 0, offset = 0; p < kCodecPlanes; offset += plane_bytes[p], ++p) {
    plane_bytes[p] = PlaneBytes(raw.size(), p);
    plane_at[p] = planes.data() + offset;
  }
  Deinterleave(raw, plane_at);

  std::vector<std::byte> out(MaxEncodedBytes(raw.size()));
  std::byte* h = out.data();
  std::memcpy(h, kCodecMagic.data(), kCodecMagic.size());
  StoreLittleEndian<uint32_t>(h + 8, static_cast<uint32_t>(ChunkCodec::kPlanesZstd));
  StoreLittleEndian<uint32_t>(h + 12, kCodecVersion);
  StoreLittleEndian<uint64_t>(h + 16, raw.size());
  StoreLittleEndian<uint32_t>(h + 24, kCodecPlanes);
  StoreLittleEndian<uint32_t>(h + 28, 0);
  size_t at = kCodecHeaderBytes;
  ZSTD_CCtx* cctx = ThreadContexts().compress.get();
  for (uint32_t p = 0; p < kCodecPlanes; ++p) {
    const size_t capacity = out.size() - at;
    const size_t compressed =
        cctx == nullptr ? 0
                        : ZSTD_compressCCtx(cctx, out.data() + at, capacity, plane_at[p], plane_bytes[p], kZstdLevel);
    uint32_t method = kZstdFrame;
    uint64_t stored = compressed;
    if (cctx == nullptr || ZSTD_isError(compressed) || compressed >= kWorthCompressing * plane_bytes[p]) {
      method = kStored;
      stored = plane_bytes[p];
      if (stored > 0) std::memcpy(out.data() + at, plane_at[p], stored);
    }
    std::byte* entry = h + 32 + kPlaneEntryBytes * p;
    StoreLittleEndian<uint32_t>(entry, method);
    StoreLittleEndian<uint32_t>(entry + 4, 0);
    StoreLittleEndian<uint64_t>(entry + 8, stored);
    at += stored;
  }
  out.resize(at);
  return out;
}

absl::StatusOr<uint64_t> EncodedRawBytes(std::span<const std::byte> encoded) {
  absl::StatusOr<ParsedHeader> header = ParseHeader(encoded);
  if (!header.ok()) return header.status();
  return header->raw_bytes;
}

absl::StatusOr<uint64_t> CheckEncodedChunk(std::span<const std::byte> encoded, uint64_t max_raw_bytes) {
  absl::StatusOr<ParsedHeader> header = ParseHeader(encoded);
  if (!header.ok()) return header.status();
  if (header->raw_bytes > max_raw_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the encoded chunk claims to decode to ", header->raw_bytes,
                                                   " bytes; at most ", max_raw_bytes, " were expected"));
  }
  // What DecodeChunk checks, plane by plane, through one small window: however much a frame inflates to, this
  // holds kWindow bytes of it at a time. The streaming decoder keeps the frame's own window (what its header asks
  // for, up to kMaxWindowLog: this daemon's encoder asks for far less) in a decoder of the call's own, freed when
  // it returns.
  constexpr size_t kWindow = 128 << 10;
  constexpr int kMaxWindowLog = 24;
  std::unique_ptr<std::byte[]> window;
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> dctx{nullptr, ZSTD_freeDCtx};
  const std::byte* next = encoded.data() + kCodecHeaderBytes;
  for (uint32_t p = 0; p < kCodecPlanes; ++p) {
    const PlaneEntry& plane = header->planes[p];
    const uint64_t plane_bytes = PlaneBytes(header->raw_bytes, p);
    if (plane.method == kZstdFrame) {
      if (ZSTD_findFrameCompressedSize(next, plane.stored_bytes) != plane.stored_bytes ||
          ZSTD_getFrameContentSize(next, plane.stored_bytes) != plane_bytes) {
        return absl::DataLossError(absl::StrCat("plane ", p, " is not one zstd frame of ", plane_bytes, " bytes"));
      }
      if (dctx == nullptr) {
        dctx.reset(ZSTD_createDCtx());
        if (dctx == nullptr) return absl::ResourceExhaustedError("out of memory for a zstd decoder");
        ZSTD_DCtx_setParameter(dctx.get(), ZSTD_d_windowLogMax, kMaxWindowLog);
        window.reset(new std::byte[kWindow]);
      }
      ZSTD_DCtx_reset(dctx.get(), ZSTD_reset_session_only);
      ZSTD_inBuffer in{next, plane.stored_bytes, 0};
      uint64_t produced = 0;
      size_t left = 1;  // ZSTD_decompressStream's hint: 0 once the frame is whole
      while (left != 0) {
        ZSTD_outBuffer out{window.get(), kWindow, 0};
        left = ZSTD_decompressStream(dctx.get(), &out, &in);
        if (ZSTD_isError(left)) {
          return absl::DataLossError(absl::StrCat("plane ", p, " does not decode: ", ZSTD_getErrorName(left)));
        }
        produced += out.pos;
        if (produced > plane_bytes || (left != 0 && out.pos == 0 && in.pos == in.size)) break;
      }
      if (left != 0 || produced != plane_bytes || in.pos != in.size) {
        return absl::DataLossError(absl::StrCat("plane ", p, " does not decode to its ", plane_bytes, " bytes"));
      }
    }
    next += plane.stored_bytes;
  }
  return header->raw_bytes;
}

absl::Status DecodeChunk(std::span<const std::byte> encoded, std::span<std::byte> dst) {
  absl::StatusOr<ParsedHeader> header = ParseHeader(encoded);
  if (!header.ok()) return header.status();
  if (header->raw_bytes != dst.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the encoded chunk decodes to ", header->raw_bytes, " bytes; the destination has ", dst.size()));
  }
  // Compressed planes decode into scratch (each exactly its plane's length: zstd never writes past the capacity it
  // is given), stored planes are read where they lie, then one pass interleaves them all into dst.
  const Scratch kept(dst.size());
  std::byte* scratch = kept.get();
  std::array<const std::byte*, kCodecPlanes> plane_at{};
  const std::byte* next = encoded.data() + kCodecHeaderBytes;
  size_t scratch_at = 0;
  for (uint32_t p = 0; p < kCodecPlanes; ++p) {
    const PlaneEntry& plane = header->planes[p];
    const uint64_t plane_bytes = PlaneBytes(dst.size(), p);
    if (plane.method == kStored) {
      plane_at[p] = next;
    } else {
      // One whole frame, exactly the plane's stored bytes, that says it holds exactly the plane's length.
      if (ZSTD_findFrameCompressedSize(next, plane.stored_bytes) != plane.stored_bytes ||
          ZSTD_getFrameContentSize(next, plane.stored_bytes) != plane_bytes) {
        return absl::DataLossError(absl::StrCat("plane ", p, " is not one zstd frame of ", plane_bytes, " bytes"));
      }
      ZSTD_DCtx* dctx = ThreadContexts().decompress.get();
      if (dctx == nullptr) return absl::ResourceExhaustedError("out of memory for a zstd decoder");
      const size_t got = ZSTD_decompressDCtx(dctx, scratch + scratch_at, plane_bytes, next, plane.stored_bytes);
      if (ZSTD_isError(got) || got != plane_bytes) {
        return absl::DataLossError(absl::StrCat("plane ", p, " does not decode to its ", plane_bytes,
                                                " bytes: ", ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short"));
      }
      plane_at[p] = scratch + scratch_at;
      scratch_at += plane_bytes;
    }
    next += plane.stored_bytes;
  }
  Interleave(plane_at, dst);
  return absl::OkStatus();
}

}  // namespace cake
