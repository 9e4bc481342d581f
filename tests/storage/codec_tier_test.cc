// The codec decorator (storage/codec_tier.h) over a real disk tier and a real Redis: chunks are stored encoded under
// keys of their own, a reader with another codec (or none) never takes them for raw bytes, and a stored value that
// passes the tier's checksum but does not decode is a miss that removes it.
#include "storage/codec_tier.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "storage/disk/disk_tier.h"
#include "storage/dram_tier.h"
#include "storage/remote_codec.h"
#include "storage/remote_tier.h"
#include "testing/redis_process.h"
#include "tests/storage/codec_test_util.h"
#include "tests/storage/tier_test_util.h"

namespace cake {
namespace {

using testing::TestBf16Value;
using testing::TestKey;
using testing::TestValue;

uint64_t Own(const TierStats& stats, std::string_view name) {
  for (const auto& [event, value] : stats.own) {
    if (event == name) return value;
  }
  throw std::runtime_error("no counter " + std::string(name));
}

// A disk tier whose raw DiskTier stays reachable beside the codec over it, as a forger or an older daemon sees it.
struct CodecOverDisk {
  testing::TempDir dir;
  DiskTier* disk = nullptr;
  std::unique_ptr<CodecTier> codec;

  CodecOverDisk() {
    DiskTier::Options options;
    options.root = dir.path();
    options.capacity_bytes = 64 << 20;
    auto opened = DiskTier::Open(options);
    if (!opened.ok()) throw std::runtime_error(opened.status().ToString());
    disk = opened->get();
    codec = std::make_unique<CodecTier>(std::move(opened).value(), ChunkCodec::kPlanesZstd);
  }
};

constexpr size_t kChunk = 1 << 20;

}  // namespace

TEST_CASE("codec tier: a chunk is stored encoded and smaller under its codec's key and reads back bit-exact") {
  CodecOverDisk t;
  const ChunkKey key = TestKey(1);
  const auto kv = TestBf16Value(1, kChunk);
  REQUIRE(t.codec->Write(key, kv).ok());

  CHECK(t.codec->Contains(key));
  CHECK_FALSE(t.disk->Contains(key));  // not under the raw key: a daemon without the codec does not find it
  const ChunkKey stored = CodecTier::StoredKey(key, ChunkCodec::kPlanesZstd);
  REQUIRE(t.disk->Contains(stored));
  CHECK(CodecTier::StoredKey(stored, ChunkCodec::kPlanesZstd) == key);
  uint64_t stored_bytes = 0;
  t.disk->ForEach([&](const ChunkKey&, uint64_t bytes) { stored_bytes = bytes; });
  CHECK(stored_bytes < kChunk * 4 / 5);

  std::vector<std::byte> out(kChunk);
  REQUIRE(t.codec->Read(key, out).ok());
  CHECK(out == kv);
  std::vector<std::byte> whole;
  REQUIRE(t.codec->ReadValue(key, kChunk, whole).ok());
  CHECK(whole == kv);

  const TierStats stats = t.codec->Stats();
  CHECK(Own(stats, "codec_chunks_encoded") == 1);
  CHECK(Own(stats, "codec_raw_bytes_encoded") == kChunk);
  CHECK(Own(stats, "codec_stored_bytes_encoded") == stored_bytes);
  CHECK(Own(stats, "codec_chunks_decoded") == 2);
  CHECK(Own(stats, "codec_raw_bytes_decoded") == 2 * kChunk);
  CHECK(t.codec->Lend(key) == nullptr);
  CHECK_FALSE(t.codec->Capabilities().lends);
  CHECK(t.codec->Capabilities().checksummed);
}

TEST_CASE("codec tier: a raw chunk stored before the codec was turned on is a miss: never decoded") {
  CodecOverDisk t;
  const ChunkKey key = TestKey(2);
  REQUIRE(t.disk->Write(key, TestValue(2, kChunk)).ok());
  CHECK_FALSE(t.codec->Contains(key));
  std::vector<std::byte> out(kChunk);
  CHECK(t.codec->Read(key, out).code() == absl::StatusCode::kNotFound);
  CHECK(t.disk->Contains(key));  // left alone: it ages out
}

TEST_CASE("codec tier: a checksummed value that does not decode is DATA_LOSS and removed") {
  CodecOverDisk t;
  const ChunkKey key = TestKey(3);
  const ChunkKey stored = CodecTier::StoredKey(key, ChunkCodec::kPlanesZstd);
  std::vector<std::byte> encoded = EncodeChunk(ChunkCodec::kPlanesZstd, TestBf16Value(3, kChunk));

  SECTION("a truncated encoding") { encoded.resize(encoded.size() / 2); }
  SECTION("a plane length past the end") {
    encoded[32 + 8 + 7] = std::byte{0x40};  // plane 0's length, top byte
  }
  SECTION("not an encoding at all") { encoded = TestValue(3, kChunk / 2); }

  // The disk tier checksums what it is given: a forger that writes files (or Redis values) gets past it.
  REQUIRE(t.disk->Write(stored, encoded).ok());
  std::vector<std::byte> out(kChunk, std::byte{0x5a});
  const absl::Status read = t.codec->Read(key, out);
  CHECK(read.code() == absl::StatusCode::kDataLoss);
  CHECK_FALSE(t.disk->Contains(stored));
  CHECK(t.codec->Stats().corrupt_removed == 1);
  CHECK(Own(t.codec->Stats(), "codec_undecodable_removed") == 1);
}

TEST_CASE("codec tier: another codec version is a miss that leaves the value alone") {
  CodecOverDisk t;
  const ChunkKey key = TestKey(4);
  const ChunkKey stored = CodecTier::StoredKey(key, ChunkCodec::kPlanesZstd);
  std::vector<std::byte> encoded = EncodeChunk(ChunkCodec::kPlanesZstd, TestBf16Value(4, kChunk));
  encoded[12] = std::byte{2};  // version 2
  REQUIRE(t.disk->Write(stored, encoded).ok());
  std::vector<std::byte> out(kChunk);
  CHECK(t.codec->Read(key, out).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(t.disk->Contains(stored));
  CHECK(Own(t.codec->Stats(), "codec_other_codec_skipped") == 1);
}

TEST_CASE(
    "codec tier: a stored value larger than any encoding of the chunk is refused before it is read, and removed") {
  CodecOverDisk t;
  const ChunkKey key = TestKey(5);
  const ChunkKey stored = CodecTier::StoredKey(key, ChunkCodec::kPlanesZstd);
  REQUIRE(t.disk->Write(stored, TestValue(5, 4 << 20)).ok());
  std::vector<std::byte> out(kChunk);
  CHECK(t.codec->Read(key, out).code() == absl::StatusCode::kInvalidArgument);
  CHECK(t.disk->Contains(stored));  // the caller asked with the wrong size, as far as the tier can tell
}

TEST_CASE("codec tier: over Redis a forged value is removed and a good one reads back bit-exact") {
  static absl::StatusOr<RedisServer> server = RedisServer::Start();
  REQUIRE(server.ok());
  RemoteTier::Options options;
  options.endpoints = {server->address()};
  options.key_prefix = "codec-test:";
  options.part_bytes = 256 << 10;  // the encoded chunk spans parts
  auto remote = RemoteTier::Open(options);
  REQUIRE(remote.ok());
  RemoteTier* raw = remote->get();
  CodecTier codec(std::move(remote).value(), ChunkCodec::kPlanesZstd);

  const auto kv = TestBf16Value(6, kChunk);
  REQUIRE(codec.Write(TestKey(6), kv).ok());
  std::vector<std::byte> out(kChunk);
  REQUIRE(codec.Read(TestKey(6), out).ok());
  CHECK(out == kv);
  CHECK_FALSE(raw->Contains(TestKey(6)));

  const ChunkKey forged = CodecTier::StoredKey(TestKey(7), ChunkCodec::kPlanesZstd);
  REQUIRE(raw->Write(forged, TestValue(7, 300000)).ok());
  CHECK(codec.Read(TestKey(7), out).code() == absl::StatusCode::kDataLoss);
  CHECK_FALSE(raw->Contains(forged));
  REQUIRE(codec.Remove(TestKey(6)).ok());
  CHECK_FALSE(codec.Contains(TestKey(6)));
}

}  // namespace cake

namespace cake {

TEST_CASE(
    "codec tier: a hostile Redis's 1 GiB claims (a header with no parts, valid 33 KB encodings of zeros) cost a "
    "check no lasting memory and the forgery is removed") {
  static absl::StatusOr<RedisServer> server = RedisServer::Start();
  REQUIRE(server.ok());
  RemoteTier::Options options;
  options.endpoints = {server->address()};
  options.key_prefix = "codec-bomb:";
  options.max_chunk_bytes = uint64_t{1} << 30;
  auto remote = RemoteTier::Open(options);
  REQUIRE(remote.ok());
  RemoteTier* raw = remote->get();
  CodecTier codec(std::move(remote).value(), ChunkCodec::kPlanesZstd);
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  const std::vector<std::byte> zeros = testing::EncodedZeros(kGiB);
  for (int i = 0; i < 3; ++i)
    REQUIRE(raw->Write(CodecTier::StoredKey(TestKey(40 + i), ChunkCodec::kPlanesZstd), zeros).ok());
  // A header sealed with a valid checksum that claims a 1 GiB payload, and no parts behind it.
  const ChunkKey forged = CodecTier::StoredKey(TestKey(50), ChunkCodec::kPlanesZstd);
  RemoteHeader header;
  header.key = forged;
  header.payload_length = kGiB;
  header.part_bytes = options.part_bytes;
  header.parts = static_cast<uint32_t>(RemotePartCount(kGiB, options.part_bytes));
  REQUIRE(server->Command({"SET", "codec-bomb:{" + forged.Hex() + "}:h", EncodeRemoteHeader(header)}).ok());
  REQUIRE(raw->Contains(forged));

  testing::ResetPeakRss();
  const uint64_t rss_before = testing::RssMib();
  const uint64_t peak_before = testing::PeakRssMib();
  // Five rounds, as five Verifies would run them. At 4054af8 each left a 1 GiB decode scratch on its thread, and the
  // forged header was zero-filled to 1 GiB before its parts were found missing.
  for (int round = 0; round < 5; ++round) {
    for (int i = 0; i < 3; ++i) CHECK(codec.Check(TestKey(40 + i), kGiB).value() == kGiB);
    if (round == 0) {
      CHECK(codec.Check(TestKey(50), kGiB).status().code() == absl::StatusCode::kDataLoss);
    } else {
      CHECK(codec.Check(TestKey(50), kGiB).status().code() == absl::StatusCode::kNotFound);
    }
  }
  const uint64_t peak_after = testing::PeakRssMib(), rss_after = testing::RssMib();
  std::cout << "5 checks of three 1 GiB zero encodings (" << zeros.size() << " bytes each) and a forged 1 GiB "
            << "header: peak RSS " << peak_before << " -> " << peak_after << " MiB, RSS " << rss_before << " -> "
            << rss_after << " MiB\n";
  // Not under AddressSanitizer: its allocator keeps freed blocks in quarantine, so RSS says nothing there.
#if !defined(__SANITIZE_ADDRESS__)
  CHECK(peak_after < peak_before + 32);
  CHECK(rss_after < rss_before + 16);
#endif
  CHECK_FALSE(raw->Contains(forged));
  CHECK(server->Command({"EXISTS", "codec-bomb:{" + forged.Hex() + "}:h"}).value() == "0");
}

TEST_CASE("codec tier: a thread keeps no buffer past the ceiling once a large chunk is read") {
  CodecTier codec(std::make_unique<DramTier>(uint64_t{512} << 20, false), ChunkCodec::kPlanesZstd);
  const size_t large = kThreadBufferCeiling + (32 << 20);
  {
    const std::vector<std::byte> value(large, std::byte{0});
    REQUIRE(codec.Write(TestKey(60), value).ok());
  }
  const uint64_t rss_before = testing::RssMib();
  // What the reading thread saw, checked on this one (Catch2's assertions are not thread-safe).
  absl::Status read;
  bool zeros = false;
  uint64_t rss_after = 0;
  std::thread reader([&] {
    std::vector<std::byte> out(large);
    read = codec.Read(TestKey(60), out);
    zeros = out == std::vector<std::byte>(large, std::byte{0});
    std::vector<std::byte>().swap(out);
    rss_after = testing::RssMib();  // while the thread lives: what it keeps
  });
  reader.join();
  REQUIRE(read.ok());
  CHECK(zeros);
  // At 4054af8 the thread's decode scratch (the chunk's size) stayed for as long as the thread.
#if !defined(__SANITIZE_ADDRESS__)  // its quarantine keeps freed blocks: RSS says nothing there
  CHECK(rss_after < rss_before + 16);
#endif
}

}  // namespace cake
