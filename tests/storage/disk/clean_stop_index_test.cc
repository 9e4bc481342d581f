// The clean-stop index file format: what a start reads from a folder another process may have written.
#include "storage/disk/clean_stop_index.h"

#include <xxhash.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "tests/storage/tier_test_util.h"

namespace cake {
namespace {

using testing::TestKey;

std::vector<IndexedChunk> SomeEntries(uint32_t n) {
  std::vector<IndexedChunk> entries;
  for (uint32_t i = 0; i < n; ++i) entries.push_back({TestKey(i), uint64_t{1000} * i + 7});
  return entries;
}

void Put64(std::vector<std::byte>& bytes, size_t offset, uint64_t v) { std::memcpy(bytes.data() + offset, &v, 8); }

TEST_CASE("clean-stop index round trip keeps every entry in order", "[disk]") {
  for (uint32_t n : {0u, 1u, 1000u}) {
    const auto entries = SomeEntries(n);
    const std::vector<std::byte> bytes = EncodeCleanStopIndex(entries);
    CHECK(bytes.size() == kCleanStopIndexHeaderBytes + n * kCleanStopIndexEntryBytes);
    auto parsed = ParseCleanStopIndex(bytes);
    REQUIRE(parsed.ok());
    REQUIRE(parsed->size() == n);
    for (uint32_t i = 0; i < n; ++i) {
      CHECK((*parsed)[i].key == entries[i].key);
      CHECK((*parsed)[i].payload_bytes == entries[i].payload_bytes);
    }
  }
}

TEST_CASE("clean-stop index parsing refuses every damaged or forged file", "[disk]") {
  const std::vector<std::byte> good = EncodeCleanStopIndex(SomeEntries(10));
  auto code = [](std::span<const std::byte> bytes) { return ParseCleanStopIndex(bytes).status().code(); };
  CHECK(code(std::span(good).first(10)) == absl::StatusCode::kDataLoss);
  CHECK(code(std::span(good).first(good.size() - 1)) == absl::StatusCode::kDataLoss);
  CHECK(code(std::span(good).first(good.size() - kCleanStopIndexEntryBytes)) == absl::StatusCode::kDataLoss);
  for (size_t offset :
       {size_t{0}, size_t{12}, size_t{16}, size_t{24}, size_t{33}, kCleanStopIndexHeaderBytes + 3, good.size() - 1}) {
    INFO("byte " << offset << " flipped");
    std::vector<std::byte> bad = good;
    bad[offset] ^= std::byte{1};
    CHECK(code(bad) == absl::StatusCode::kDataLoss);
  }
  SECTION("a newer format version is not corruption") {
    std::vector<IndexedChunk> none;
    std::vector<std::byte> newer = EncodeCleanStopIndex(none);
    newer[8] = std::byte{2};
    Put64(newer, 32, XXH3_64bits(newer.data(), 32));  // resealed, as a newer daemon would have written it
    CHECK(code(newer) == absl::StatusCode::kFailedPrecondition);
  }
  SECTION("a forged count that would wrap the size arithmetic") {
    std::vector<std::byte> bad = good;
    Put64(bad, 16, UINT64_MAX / kCleanStopIndexEntryBytes + 2);
    CHECK(code(bad) == absl::StatusCode::kDataLoss);
  }
  SECTION("a key listed twice, or a length past the limit, even with valid checksums") {
    auto twice = SomeEntries(3);
    twice[2].key = twice[0].key;
    CHECK(code(EncodeCleanStopIndex(twice)) == absl::StatusCode::kDataLoss);
    auto huge = SomeEntries(3);
    huge[1].payload_bytes = kMaxIndexedPayloadBytes + 1;
    CHECK(code(EncodeCleanStopIndex(huge)) == absl::StatusCode::kDataLoss);
  }
}

}  // namespace
}  // namespace cake
