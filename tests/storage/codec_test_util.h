// What the codec tests share: a valid planes-zstd encoding of a chunk of zeros of any size, made without ever
// holding the chunk (what a hostile store can plant: 33 KB that decode to 1 GiB), and the test process's peak RSS.
#pragma once

#include <zstd.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "storage/chunk_codec.h"

namespace cake::testing {

// The planes-zstd encoding of `raw_bytes` zero bytes: EncodeChunk's header (taken from a small encoding), each
// plane one zstd frame of its length, compressed from a small buffer of zeros fed again and again.
inline std::vector<std::byte> EncodedZeros(uint64_t raw_bytes) {
  std::vector<std::byte> out = EncodeChunk(ChunkCodec::kPlanesZstd, std::vector<std::byte>(4096));
  out.resize(kCodecHeaderBytes);
  auto put = [&](size_t at, uint64_t value, size_t width) {
    for (size_t i = 0; i < width; ++i) out[at + i] = static_cast<std::byte>((value >> (8 * i)) & 0xff);
  };
  put(16, raw_bytes, 8);
  const std::vector<char> zeros(1 << 20, 0);
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  for (uint32_t p = 0; p < kCodecPlanes; ++p) {
    const uint64_t plane = raw_bytes / kCodecPlanes + (p < raw_bytes % kCodecPlanes ? 1 : 0);
    ZSTD_CCtx_reset(cctx, ZSTD_reset_session_only);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, 1);
    ZSTD_CCtx_setPledgedSrcSize(cctx, plane);
    const size_t start = out.size();
    std::vector<char> buffer(ZSTD_CStreamOutSize());
    for (uint64_t fed = 0;;) {
      const uint64_t now = std::min<uint64_t>(zeros.size(), plane - fed);
      fed += now;
      const ZSTD_EndDirective mode = fed == plane ? ZSTD_e_end : ZSTD_e_continue;
      ZSTD_inBuffer in{zeros.data(), now, 0};
      size_t left = 0;
      do {
        ZSTD_outBuffer o{buffer.data(), buffer.size(), 0};
        left = ZSTD_compressStream2(cctx, &o, &in, mode);
        const auto* bytes = reinterpret_cast<const std::byte*>(buffer.data());
        out.insert(out.end(), bytes, bytes + o.pos);
      } while (mode == ZSTD_e_end ? left != 0 : in.pos != in.size);
      if (mode == ZSTD_e_end) break;
    }
    put(32 + 16 * p, 1, 4);  // zstd frame
    put(32 + 16 * p + 4, 0, 4);
    put(32 + 16 * p + 8, out.size() - start, 8);
  }
  ZSTD_freeCCtx(cctx);
  return out;
}

// A field of this process's /proc status in MiB ("VmHWM:": its peak since ResetPeakRss; "VmRSS:": resident now).
inline uint64_t StatusMib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(field.size())) / 1024;
  }
  return 0;
}
inline uint64_t PeakRssMib() { return StatusMib("VmHWM:"); }
inline uint64_t RssMib() { return StatusMib("VmRSS:"); }
inline void ResetPeakRss() { std::ofstream("/proc/self/clear_refs") << "5"; }

}  // namespace cake::testing
