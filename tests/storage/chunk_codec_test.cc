// The chunk codec (storage/chunk_codec.h): what it encodes decodes bit for bit, KV-shaped bytes get smaller, and
// every forged, truncated or inconsistent encoding is refused without a byte written outside the destination.
#include "storage/chunk_codec.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <limits>
#include <vector>

#include "tests/storage/codec_test_util.h"
#include "tests/storage/tier_test_util.h"

namespace cake {
namespace {

using testing::TestBf16Value;
using testing::TestValue;

template <typename T>
void PutLe(std::vector<std::byte>& bytes, size_t at, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) bytes[at + i] = static_cast<std::byte>((value >> (8 * i)) & 0xff);
}

template <typename T>
T GetLe(const std::vector<std::byte>& bytes, size_t at) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(static_cast<uint8_t>(bytes[at + i])) << (8 * i);
  return value;
}

// Where plane p's entry lies in the codec header (chunk_codec.h's table).
size_t PlaneMethodAt(uint32_t p) { return 32 + 16 * p; }
size_t PlaneLengthAt(uint32_t p) { return 32 + 16 * p + 8; }

// A destination with guard bytes on both sides: a decode that writes outside it shows up in the guards.
class GuardedDestination {
 public:
  explicit GuardedDestination(size_t bytes) : storage_(bytes + 2 * kGuard, std::byte{0xA5}) {}
  std::span<std::byte> span() { return std::span(storage_).subspan(kGuard, storage_.size() - 2 * kGuard); }
  bool guards_intact() const {
    for (size_t i = 0; i < kGuard; ++i) {
      if (storage_[i] != std::byte{0xA5} || storage_[storage_.size() - 1 - i] != std::byte{0xA5}) return false;
    }
    return true;
  }

 private:
  static constexpr size_t kGuard = 4096;
  std::vector<std::byte> storage_;
};

}  // namespace

TEST_CASE("chunk codec: what it encodes decodes bit for bit at every size") {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{4}, size_t{5}, size_t{7}, size_t{4097},
                       size_t{65536}, size_t{(1 << 20) + 3}}) {
    for (const auto& raw : {TestValue(9, bytes), TestBf16Value(9, bytes)}) {
      const std::vector<std::byte> encoded = EncodeChunk(ChunkCodec::kPlanesZstd, raw);
      CHECK(encoded.size() <= MaxEncodedBytes(bytes));
      REQUIRE(EncodedRawBytes(encoded).value() == bytes);
      GuardedDestination out(bytes);
      REQUIRE(DecodeChunk(encoded, out.span()).ok());
      CHECK(std::equal(raw.begin(), raw.end(), out.span().begin(), out.span().end()));
      CHECK(out.guards_intact());
    }
  }
}

TEST_CASE("chunk codec: bf16-shaped KV gets smaller and bytes that do not compress cost only the header") {
  const size_t bytes = 4 << 20;
  const auto kv = TestBf16Value(3, bytes);
  const std::vector<std::byte> encoded = EncodeChunk(ChunkCodec::kPlanesZstd, kv);
  // Gaussian bf16: the exponent planes (1 and 3) compress, the mantissa planes are stored.
  CHECK(static_cast<double>(bytes) / static_cast<double>(encoded.size()) > 1.25);
  CHECK(GetLe<uint32_t>(encoded, PlaneMethodAt(0)) == 0);
  CHECK(GetLe<uint32_t>(encoded, PlaneMethodAt(1)) == 1);
  CHECK(GetLe<uint32_t>(encoded, PlaneMethodAt(3)) == 1);

  const auto noise = TestValue(3, bytes);
  const std::vector<std::byte> stored = EncodeChunk(ChunkCodec::kPlanesZstd, noise);
  CHECK(stored.size() == bytes + kCodecHeaderBytes);
}

TEST_CASE("chunk codec: names parse and unknown ones are refused by name") {
  CHECK(ParseChunkCodec("none").value() == ChunkCodec::kNone);
  CHECK(ParseChunkCodec("planes-zstd").value() == ChunkCodec::kPlanesZstd);
  const auto bad = ParseChunkCodec("lz4");
  REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(bad.status().message().find("planes-zstd") != std::string_view::npos);
  CHECK(ChunkCodecName(ChunkCodec::kPlanesZstd) == "planes-zstd");
}

TEST_CASE("chunk codec: a destination of the wrong size is INVALID_ARGUMENT and left untouched") {
  const auto raw = TestBf16Value(4, 10000);
  const auto encoded = EncodeChunk(ChunkCodec::kPlanesZstd, raw);
  for (size_t bytes : {size_t{9999}, size_t{10001}, size_t{0}}) {
    GuardedDestination out(bytes);
    std::vector<std::byte> before(out.span().begin(), out.span().end());
    CHECK(DecodeChunk(encoded, out.span()).code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::equal(before.begin(), before.end(), out.span().begin(), out.span().end()));
    CHECK(out.guards_intact());
  }
}

TEST_CASE("chunk codec: another codec or version is FAILED_PRECONDITION: a miss and not corrupt") {
  const auto encoded = EncodeChunk(ChunkCodec::kPlanesZstd, TestBf16Value(5, 8192));
  for (size_t at : {size_t{8}, size_t{12}}) {
    auto forged = encoded;
    PutLe<uint32_t>(forged, at, 2);
    GuardedDestination out(8192);
    CHECK(DecodeChunk(forged, out.span()).code() == absl::StatusCode::kFailedPrecondition);
    CHECK(EncodedRawBytes(forged).status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(out.guards_intact());
  }
}

TEST_CASE("chunk codec: every truncation of an encoded chunk is DATA_LOSS") {
  const size_t bytes = 50000;
  const auto encoded = EncodeChunk(ChunkCodec::kPlanesZstd, TestBf16Value(6, bytes));
  REQUIRE(encoded.size() > kCodecHeaderBytes + 100);
  for (size_t keep = 0; keep < encoded.size(); keep += (keep < kCodecHeaderBytes + 64 ? 1 : 997)) {
    GuardedDestination out(bytes);
    const absl::Status status = DecodeChunk(std::span(encoded).first(keep), out.span());
    INFO("kept " << keep << " of " << encoded.size() << " bytes: " << status);
    CHECK(status.code() == absl::StatusCode::kDataLoss);
    CHECK(out.guards_intact());
  }
  auto longer = encoded;
  longer.push_back(std::byte{0});
  GuardedDestination out(bytes);
  CHECK(DecodeChunk(longer, out.span()).code() == absl::StatusCode::kDataLoss);
}

TEST_CASE("chunk codec: forged headers are DATA_LOSS and no decode writes outside its destination") {
  const size_t bytes = 40000;
  const auto raw = TestBf16Value(7, bytes);
  const auto encoded = EncodeChunk(ChunkCodec::kPlanesZstd, raw);
  REQUIRE(GetLe<uint32_t>(encoded, PlaneMethodAt(1)) == 1);  // plane 1 is a zstd frame, plane 0 stored

  struct Forgery {
    const char* what;
    std::function<void(std::vector<std::byte>&)> forge;
    size_t destination;
  };
  const uint64_t plane1 = GetLe<uint64_t>(encoded, PlaneLengthAt(1));
  const std::vector<Forgery> forgeries = {
      {"bad magic", [](auto& e) { e[0] = std::byte{'X'}; }, bytes},
      {"plane count 8", [](auto& e) { PutLe<uint32_t>(e, 24, 8); }, bytes},
      {"reserved field set", [](auto& e) { PutLe<uint32_t>(e, 28, 1); }, bytes},
      {"unknown plane method", [](auto& e) { PutLe<uint32_t>(e, PlaneMethodAt(2), 7); }, bytes},
      {"plane length past the end", [](auto& e) { PutLe<uint64_t>(e, PlaneLengthAt(0), 1u << 30); }, bytes},
      {"plane length that would wrap a sum",
       [](auto& e) { PutLe<uint64_t>(e, PlaneLengthAt(1), std::numeric_limits<uint64_t>::max()); }, bytes},
      {"lengths shifted between planes",
       [plane1](auto& e) {
         PutLe<uint64_t>(e, PlaneLengthAt(1), plane1 - 10);
         PutLe<uint64_t>(e, PlaneLengthAt(2), GetLe<uint64_t>(e, PlaneLengthAt(2)) + 10);
       },
       bytes},
      // A raw length 4 bytes longer, with a destination that large: each plane now needs one byte more than its
      // frame holds, and the stored planes' lengths no longer match.
      {"raw length larger than the planes", [](auto& e) { PutLe<uint64_t>(e, 16, bytes + 4); }, bytes + 4},
      {"raw length far larger", [](auto& e) { PutLe<uint64_t>(e, 16, uint64_t{1} << 40); }, bytes},
      // A stored plane relabelled as a zstd frame: raw float bytes are not a frame.
      {"stored plane called a zstd frame", [](auto& e) { PutLe<uint32_t>(e, PlaneMethodAt(0), 1); }, bytes},
      // A zstd plane relabelled as stored: its length is not a plane's.
      {"zstd plane called stored", [](auto& e) { PutLe<uint32_t>(e, PlaneMethodAt(1), 0); }, bytes},
  };
  for (const Forgery& forgery : forgeries) {
    auto forged = encoded;
    forgery.forge(forged);
    GuardedDestination out(forgery.destination);
    const absl::Status status = DecodeChunk(forged, out.span());
    INFO(forgery.what << ": " << status);
    CHECK((status.code() == absl::StatusCode::kDataLoss || status.code() == absl::StatusCode::kInvalidArgument));
    CHECK_FALSE(status.ok());
    CHECK(out.guards_intact());
  }
}

TEST_CASE("chunk codec: a zstd frame that decodes to more than its plane is DATA_LOSS") {
  // A plane encoded from a larger chunk spliced into a smaller chunk's encoding, lengths made consistent: the frame
  // says (and would write) more than the plane's room.
  const size_t small = 40000;
  const auto big_encoded = EncodeChunk(ChunkCodec::kPlanesZstd, TestBf16Value(8, 2 * small));
  const auto small_encoded = EncodeChunk(ChunkCodec::kPlanesZstd, TestBf16Value(8, small));
  REQUIRE(GetLe<uint32_t>(big_encoded, PlaneMethodAt(1)) == 1);
  REQUIRE(GetLe<uint32_t>(small_encoded, PlaneMethodAt(1)) == 1);
  auto plane_at = [](const std::vector<std::byte>& e, uint32_t p) {
    size_t at = kCodecHeaderBytes;
    for (uint32_t q = 0; q < p; ++q) at += GetLe<uint64_t>(e, PlaneLengthAt(q));
    return std::span(e).subspan(at, GetLe<uint64_t>(e, PlaneLengthAt(p)));
  };
  std::vector<std::byte> spliced(small_encoded.begin(), small_encoded.begin() + kCodecHeaderBytes);
  for (uint32_t p = 0; p < kCodecPlanes; ++p) {
    const auto plane = p == 1 ? plane_at(big_encoded, 1) : plane_at(small_encoded, p);
    PutLe<uint64_t>(spliced, PlaneLengthAt(p), plane.size());
    spliced.insert(spliced.end(), plane.begin(), plane.end());
  }
  GuardedDestination out(small);
  CHECK(DecodeChunk(spliced, out.span()).code() == absl::StatusCode::kDataLoss);
  CHECK(out.guards_intact());
}

}  // namespace cake

namespace cake {

TEST_CASE("chunk codec: a check judges as a decode does through a small window, whatever the header claims") {
  // Three kinds of value, each judged alike by DecodeChunk (into a destination of its length) and CheckEncodedChunk.
  const auto good = EncodeChunk(ChunkCodec::kPlanesZstd, TestBf16Value(3, 100003));
  REQUIRE(CheckEncodedChunk(good, 1 << 20).value() == 100003);
  auto truncated = good;
  truncated.resize(truncated.size() - 1);
  CHECK(CheckEncodedChunk(truncated, 1 << 20).status().code() == absl::StatusCode::kDataLoss);
  CHECK(CheckEncodedChunk(good, 100002).status().code() == absl::StatusCode::kInvalidArgument);

  // 1 GiB of zeros in about 33 KB, as a hostile Redis or a planted file can hold it. At 4054af8 Verify decoded it
  // into a buffer of 1 GiB, and its thread kept a 1 GiB scratch for good.
  const std::vector<std::byte> bomb = testing::EncodedZeros(uint64_t{1} << 30);
  INFO("encoded " << bomb.size() << " bytes");
  CHECK(bomb.size() < (64 << 10));
  testing::ResetPeakRss();
  const uint64_t peak_before = testing::PeakRssMib();
  CHECK(CheckEncodedChunk(bomb, uint64_t{1} << 30).value() == uint64_t{1} << 30);
  CHECK(CheckEncodedChunk(bomb, (uint64_t{1} << 30) - 1).status().code() == absl::StatusCode::kInvalidArgument);
#if !defined(__SANITIZE_ADDRESS__)  // its quarantine and shadow memory: RSS says nothing there
  CHECK(testing::PeakRssMib() < peak_before + 16);
#endif
  // A plane whose frame says one length and inflates to another (the last plane's frame spliced from a larger
  // encoding) is DATA_LOSS for both.
  const std::vector<std::byte> small = testing::EncodedZeros(4 << 20);
  const std::vector<std::byte> larger = testing::EncodedZeros(8 << 20);
  std::vector<std::byte> spliced(small.begin(),
                                 small.end() - static_cast<ptrdiff_t>(GetLe<uint64_t>(small, PlaneLengthAt(3))));
  const uint64_t last = GetLe<uint64_t>(larger, PlaneLengthAt(3));
  spliced.insert(spliced.end(), larger.end() - static_cast<ptrdiff_t>(last), larger.end());
  PutLe<uint64_t>(spliced, PlaneLengthAt(3), last);
  CHECK(CheckEncodedChunk(spliced, 8 << 20).status().code() == absl::StatusCode::kDataLoss);
  std::vector<std::byte> dst(4 << 20);
  CHECK(DecodeChunk(spliced, dst).code() == absl::StatusCode::kDataLoss);
  CHECK(CheckEncodedChunk(small, 4 << 20).value() == (4 << 20));
  CHECK(DecodeChunk(small, dst).ok());
}

}  // namespace cake
