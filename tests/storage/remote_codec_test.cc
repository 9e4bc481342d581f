// The remote value format without a Redis: headers round-trip, corrupt or inconsistent ones are refused, and the
// key names of a chunk share one hash tag and parse back to the chunk.
#include "storage/remote_codec.h"

#include <xxhash.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "storage/chunk_file.h"
#include "storage/redis/redis_cluster_client.h"
#include "tests/storage/tier_test_util.h"

namespace cake {
namespace {

using testing::TestKey;
using testing::TestValue;

template <typename T>
void PutLe(std::string& bytes, size_t offset, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) bytes[offset + i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

// The header checksum recomputed, as a writer that meant these bytes would have.
void Reseal(std::string& bytes) { PutLe<uint64_t>(bytes, 56, XXH3_64bits(bytes.data(), 56)); }

}  // namespace

TEST_CASE("remote codec: a header round-trips", "[remote][codec]") {
  const ChunkKey key = TestKey(3);
  const uint64_t bytes = GENERATE(uint64_t{0}, uint64_t{1}, uint64_t{4096}, uint64_t{10 * 4096 + 123});
  CAPTURE(bytes);
  const auto payload = TestValue(3, bytes);
  const RemoteHeader header = MakeRemoteHeader(key, payload, 4096);
  CHECK(header.key == key);
  CHECK(header.payload_length == bytes);
  CHECK(header.part_bytes == 4096);
  CHECK(header.parts == (bytes + 4095) / 4096);
  CHECK(header.payload_checksum == PayloadChecksum(payload));

  const std::string encoded = EncodeRemoteHeader(header);
  REQUIRE(encoded.size() == kRemoteHeaderBytes);
  CHECK(encoded.substr(0, 8) == "CAKERMT1");
  auto parsed = ParseRemoteHeader(encoded, key);
  REQUIRE(parsed.ok());
  CHECK(parsed->key == key);
  CHECK(parsed->parts == header.parts);
  CHECK(parsed->payload_length == header.payload_length);
  CHECK(parsed->part_bytes == header.part_bytes);
  CHECK(parsed->payload_checksum == header.payload_checksum);
}

TEST_CASE("remote codec: parts are the payload cut into part_bytes, the last one short", "[remote][codec]") {
  CHECK(RemotePartCount(0, 4096) == 0);
  CHECK(RemotePartCount(1, 4096) == 1);
  CHECK(RemotePartCount(4096, 4096) == 1);
  CHECK(RemotePartCount(4097, 4096) == 2);
  CHECK(RemotePartCount(uint64_t{64} << 20, uint64_t{4} << 20) == 16);
  CHECK(RemotePartCount(UINT64_MAX, 4096) == UINT64_MAX / 4096 + 1);  // no wrap
}

TEST_CASE("remote codec: a corrupt or inconsistent header is DATA_LOSS", "[remote][codec]") {
  const ChunkKey key = TestKey(9);
  const std::string good = EncodeRemoteHeader(MakeRemoteHeader(key, TestValue(9, 20000), 4096));
  REQUIRE(ParseRemoteHeader(good, key).ok());
  auto refused = [&](const std::string& bytes, const ChunkKey& expected, std::string_view why) {
    auto parsed = ParseRemoteHeader(bytes, expected);
    REQUIRE_FALSE(parsed.ok());
    CHECK(parsed.status().code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(parsed.status().message()).find(why) != std::string::npos);
  };

  SECTION("the wrong size") {
    refused("", key, "is 0 bytes");
    refused(good.substr(0, 63), key, "is 63 bytes");
    refused(good + "x", key, "is 65 bytes");
    refused("hello", key, "is 5 bytes");
  }
  SECTION("a bad magic") {
    std::string bytes = good;
    bytes[0] = 'X';
    Reseal(bytes);
    refused(bytes, key, "bad magic");
  }
  SECTION("any one bit flipped after the magic") {
    for (size_t byte = 8; byte < kRemoteHeaderBytes; ++byte) {
      CAPTURE(byte);
      std::string bytes = good;
      bytes[byte] ^= 0x10;
      refused(bytes, key, "checksum mismatch");
    }
  }
  SECTION("another chunk's header") { refused(good, TestKey(10), "another chunk key"); }
  SECTION("absurd sizes, sealed with a valid checksum") {
    RemoteHeader header = MakeRemoteHeader(key, TestValue(9, 20000), 4096);
    std::string why = "part layout does not match its length";
    SECTION("parts of 0 bytes") {
      header.part_bytes = 0;
      header.parts = 0;
      why = "part size 0 is outside";
    }
    SECTION("one-byte parts: a million GETs for a megabyte, were it believed") {
      header.payload_length = 1 << 20;
      header.part_bytes = 1;
      header.parts = 1 << 20;
      why = "part size 1 is outside";
    }
    SECTION("parts larger than any Redis value") {
      header.part_bytes = uint64_t{1} << 30;
      header.parts = 1;
      why = "is outside";
    }
    SECTION("a length near 2^64 does not wrap the part count") {
      header.payload_length = UINT64_MAX - 10;
      header.parts = 0;
    }
    SECTION("fewer parts than the length needs") { header.parts = 4; }
    SECTION("more parts than the length needs") { header.parts = 6; }
    SECTION("a terabyte payload (more parts than a header can count)") { header.payload_length = uint64_t{1} << 40; }
    SECTION("no parts for a payload") { header.parts = 0; }
    refused(EncodeRemoteHeader(header), key, why);
  }
}

TEST_CASE("remote codec: an unknown format version is FAILED_PRECONDITION, not corrupt", "[remote][codec]") {
  const ChunkKey key = TestKey(4);
  std::string bytes = EncodeRemoteHeader(MakeRemoteHeader(key, TestValue(4, 100), 4096));
  PutLe<uint32_t>(bytes, 8, 2);
  Reseal(bytes);
  auto parsed = ParseRemoteHeader(bytes, key);
  REQUIRE_FALSE(parsed.ok());
  CHECK(parsed.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(parsed.status().message()) == "remote chunk format version 2 is not known here");
}

TEST_CASE("remote codec: a chunk's key names share its hash tag and parse back to it", "[remote][codec]") {
  const ChunkKey key = TestKey(21);
  const RemoteChunkNames names("cake:", key);
  CHECK(names.header() == "cake:{" + key.Hex() + "}:h");
  CHECK(names.part(0) == "cake:{" + key.Hex() + "}:0");
  CHECK(names.part(12) == "cake:{" + key.Hex() + "}:12");
  // One slot for the whole chunk: one node holds it, one pipeline reads it.
  CHECK(RedisKeySlot(names.header()) == RedisKeySlot(names.part(0)));
  CHECK(RedisKeySlot(names.header()) == RedisKeySlot(names.part(12)));
  CHECK(RedisKeySlot(names.header()) == RedisKeySlot(key.Hex()));

  auto parsed = ChunkKeyFromRemoteName("cake:", names.header());
  REQUIRE(parsed.ok());
  CHECK(*parsed == key);
  CHECK(ChunkKeyFromRemoteName("cake:", "cake:{nothex}:h").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ChunkKeyFromRemoteName("cake:", "cake:{" + key.Hex().substr(1) + "}:h").status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ChunkKeyFromRemoteName("cake:", "cake:no-tag:h").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ChunkKeyFromRemoteName("cake:", "cake:{" + key.Hex() + ":h").status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("remote codec: the SCAN pattern escapes glob characters of the prefix", "[remote][codec]") {
  CHECK(RemoteHeaderPattern("cake:") == "cake:{*}:h");
  CHECK(RemoteHeaderPattern("a*b?[c]\\:") == "a\\*b\\?\\[c\\]\\\\:{*}:h");
}

}  // namespace cake

namespace cake {

TEST_CASE("payload checksum: added in pieces of any size, in order, it equals the checksum of the whole",
          "[remote][checksum]") {
  const auto payload = testing::TestValue(11, 3 * 1024 * 1024 + 17);
  const size_t piece = GENERATE(1, 63, 4096, 65536 + 5, 3 * 1024 * 1024 + 17);
  IncrementalPayloadChecksum checksum;
  for (size_t at = 0; at < payload.size(); at += piece) {
    checksum.Add(std::span(payload).subspan(at, std::min(piece, payload.size() - at)));
  }
  CHECK(checksum.Digest() == PayloadChecksum(payload));
  IncrementalPayloadChecksum empty;
  CHECK(empty.Digest() == PayloadChecksum({}));
}

}  // namespace cake
