// The contract every Tier implementation keeps, run once per implementation (DRAM, throttled DRAM, disk with
// io_uring, disk with pread, remote on a standalone Redis and on a Redis Cluster). Capacity and usage sections run
// only for tiers that own their capacity: Redis owns the remote tier's.
#include <atomic>
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "storage/codec_tier.h"
#include "storage/disk/disk_tier.h"
#include "storage/dram_tier.h"
#include "storage/remote_tier.h"
#include "storage/throttled_tier.h"
#include "storage/tier.h"
#include "testing/redis_process.h"
#include "tests/storage/tier_test_util.h"

namespace cake {
namespace {

using testing::TestKey;
using testing::TestValue;

struct DramFactory {
  static constexpr bool kOwnsCapacity = true;
  static constexpr uint64_t kStoredOverhead = 0;  // bytes a stored value takes beyond its own
  static std::unique_ptr<Tier> Make(uint64_t capacity) { return std::make_unique<DramTier>(capacity); }
};

struct ThrottledDramFactory {
  static constexpr bool kOwnsCapacity = true;
  static constexpr uint64_t kStoredOverhead = 0;
  // Fast enough that the contract runs at DRAM speed; the throttle's pacing has its own tests.
  static std::unique_ptr<Tier> Make(uint64_t capacity) {
    return std::make_unique<ThrottledTier>(std::make_unique<DramTier>(capacity), /*read_gbps=*/100);
  }
};

// Bases are built in order and destroyed in reverse: the folder exists before the tier opens on it and is
// removed only after the tier is gone.
struct TempDirHolder {
  testing::TempDir dir;
};

class DiskTierInTempDir final : private TempDirHolder, public TierDecorator {
 public:
  DiskTierInTempDir(uint64_t capacity, IoBackend backend) : TierDecorator(Open(dir.path(), capacity, backend)) {}

 private:
  static std::unique_ptr<Tier> Open(const std::filesystem::path& root, uint64_t capacity, IoBackend backend) {
    DiskTier::Options options;
    options.root = root;
    options.capacity_bytes = capacity;
    options.io_backend = backend;
    absl::StatusOr<std::unique_ptr<DiskTier>> tier = DiskTier::Open(options);
    if (!tier.ok()) throw std::runtime_error(tier.status().ToString());
    return std::move(tier).value();
  }
};

struct DiskUringFactory {
  static constexpr bool kOwnsCapacity = true;
  static constexpr uint64_t kStoredOverhead = 0;
  static std::unique_ptr<Tier> Make(uint64_t capacity) {
    // Containers with Docker's default seccomp profile refuse io_uring: say so rather than fail the contract.
    static const bool available = MakeUringEngine(1).ok();
    if (!available) WARN("io_uring is unavailable here: the io_uring contract run uses pread");
    return std::make_unique<DiskTierInTempDir>(capacity, available ? IoBackend::kUring : IoBackend::kPread);
  }
};

struct DiskPreadFactory {
  static constexpr bool kOwnsCapacity = true;
  static constexpr uint64_t kStoredOverhead = 0;
  static std::unique_ptr<Tier> Make(uint64_t capacity) {
    return std::make_unique<DiskTierInTempDir>(capacity, IoBackend::kPread);
  }
};

// One real redis-server (or cluster) for the whole run, started on first use; every tier made on it gets a key
// prefix of its own, so sections never see each other's chunks.
std::unique_ptr<Tier> MakeRemoteTier(const std::vector<std::string>& endpoints) {
  static int next_prefix = 0;
  RemoteTier::Options options;
  options.endpoints = endpoints;
  options.key_prefix = "contract-" + std::to_string(next_prefix++) + ":";
  options.part_bytes = 16 << 10;  // values of 64 KiB span several parts
  absl::StatusOr<std::unique_ptr<RemoteTier>> tier = RemoteTier::Open(options);
  if (!tier.ok()) throw std::runtime_error(tier.status().ToString());
  return std::move(tier).value();
}

struct RemoteStandaloneFactory {
  static constexpr bool kOwnsCapacity = false;
  static constexpr uint64_t kStoredOverhead = 0;
  static std::unique_ptr<Tier> Make(uint64_t) {
    static absl::StatusOr<RedisServer> server = RedisServer::Start();
    if (!server.ok()) throw std::runtime_error(server.status().ToString());
    return MakeRemoteTier({server->address()});
  }
};

struct RemoteClusterFactory {
  static constexpr bool kOwnsCapacity = false;
  static constexpr uint64_t kStoredOverhead = 0;
  static std::unique_ptr<Tier> Make(uint64_t) {
    static absl::StatusOr<RedisCluster> cluster = RedisCluster::Start(3);
    if (!cluster.ok()) throw std::runtime_error(cluster.status().ToString());
    return MakeRemoteTier({cluster->addresses().front()});
  }
};

// A codec over a tier: its values are stored encoded, under keys of their own. The contract's values are
// pseudo-random bytes, which the codec stores as they are behind its header.
template <typename Inner>
struct CodecFactory {
  static constexpr bool kOwnsCapacity = Inner::kOwnsCapacity;
  static constexpr uint64_t kStoredOverhead = kCodecHeaderBytes;
  static std::unique_ptr<Tier> Make(uint64_t capacity) {
    return std::make_unique<CodecTier>(Inner::Make(capacity), ChunkCodec::kPlanesZstd);
  }
};
using CodecDiskFactory = CodecFactory<DiskUringFactory>;
using CodecRemoteFactory = CodecFactory<RemoteStandaloneFactory>;

constexpr uint64_t kCapacity = 16 << 20;
constexpr size_t kValueBytes = 64 << 10;

}  // namespace

TEMPLATE_TEST_CASE("tier contract", "[tier]", DramFactory, ThrottledDramFactory, DiskUringFactory, DiskPreadFactory,
                   RemoteStandaloneFactory, RemoteClusterFactory, CodecDiskFactory, CodecRemoteFactory) {
  std::unique_ptr<Tier> tier = TestType::Make(kCapacity);
  const ChunkKey a = TestKey(1);
  const auto va = TestValue(1, kValueBytes);

  SECTION("a written value reads back byte for byte") {
    REQUIRE(tier->Write(a, va).ok());
    std::vector<std::byte> out(va.size());
    REQUIRE(tier->Read(a, out).ok());
    CHECK(out == va);
    CHECK_FALSE(tier->name().empty());
  }

  SECTION("ReadValue reads a value of unknown size, and refuses one above its bound without losing it") {
    REQUIRE(tier->Write(a, va).ok());
    std::vector<std::byte> out(7);  // resized to the value
    REQUIRE(tier->ReadValue(a, kValueBytes, out).ok());
    CHECK(out == va);
    CHECK(tier->ReadValue(a, kValueBytes - 1, out).code() == absl::StatusCode::kInvalidArgument);
    CHECK(tier->ReadValue(TestKey(99), kValueBytes, out).code() == absl::StatusCode::kNotFound);
    std::vector<std::byte> again(va.size());
    REQUIRE(tier->Read(a, again).ok());
    CHECK(again == va);
  }

  SECTION("reading a missing key is NOT_FOUND") {
    std::vector<std::byte> out(kValueBytes);
    CHECK(tier->Read(a, out).code() == absl::StatusCode::kNotFound);
  }

  SECTION("reading into a destination of the wrong size is INVALID_ARGUMENT and keeps the value") {
    REQUIRE(tier->Write(a, va).ok());
    std::vector<std::byte> small(va.size() - 1);
    std::vector<std::byte> large(va.size() + 1);
    CHECK(tier->Read(a, small).code() == absl::StatusCode::kInvalidArgument);
    CHECK(tier->Read(a, large).code() == absl::StatusCode::kInvalidArgument);
    std::vector<std::byte> out(va.size());
    REQUIRE(tier->Read(a, out).ok());
    CHECK(out == va);
  }

  SECTION("Contains, Remove, and removing twice") {
    CHECK_FALSE(tier->Contains(a));
    REQUIRE(tier->Write(a, va).ok());
    CHECK(tier->Contains(a));
    CHECK_FALSE(tier->Contains(TestKey(2)));
    CHECK(tier->Remove(a).ok());
    CHECK_FALSE(tier->Contains(a));
    CHECK(tier->Remove(a).code() == absl::StatusCode::kNotFound);
    std::vector<std::byte> out(va.size());
    CHECK(tier->Read(a, out).code() == absl::StatusCode::kNotFound);
  }

  SECTION("usage tracks writes and removes") {
    if (!TestType::kOwnsCapacity) return;
    TierUsage u = tier->Usage();
    CHECK(u.used_bytes == 0);
    CHECK(u.chunks == 0);
    CHECK(u.capacity_bytes == kCapacity);
    REQUIRE(tier->Write(a, va).ok());
    REQUIRE(tier->Write(TestKey(2), TestValue(2, 1000)).ok());
    u = tier->Usage();
    // What each chunk really costs (whole pages, whole files), and never less than its payload.
    CHECK(tier->Footprint(1000) >= 1000);
    CHECK(tier->Footprint(kValueBytes) >= kValueBytes);
    CHECK(u.used_bytes == tier->Footprint(kValueBytes) + tier->Footprint(1000));
    CHECK(u.chunks == 2);
    REQUIRE(tier->Remove(a).ok());
    u = tier->Usage();
    CHECK(u.used_bytes == tier->Footprint(1000));
    CHECK(u.chunks == 1);
  }

  SECTION("writing the same key twice keeps one copy") {
    REQUIRE(tier->Write(a, va).ok());
    REQUIRE(tier->Write(a, va).ok());
    if (TestType::kOwnsCapacity) {
      TierUsage u = tier->Usage();
      CHECK(u.chunks == 1);
      CHECK(u.used_bytes == tier->Footprint(kValueBytes));
    } else {
      int visits = 0;
      tier->ForEach([&](const ChunkKey&, uint64_t) { ++visits; });
      CHECK(visits == 1);
    }
    REQUIRE(tier->Remove(a).ok());
    CHECK_FALSE(tier->Contains(a));
  }

  SECTION("ForEach visits every key once, with the bytes stored for it") {
    std::map<std::string, uint64_t> expected;
    for (uint32_t i = 0; i < 10; ++i) {
      REQUIRE(tier->Write(TestKey(i), TestValue(i, 100 + i)).ok());
      expected[TestKey(i).Hex()] = 100 + i + TestType::kStoredOverhead;
    }
    std::map<std::string, uint64_t> seen;
    int visits = 0;
    tier->ForEach([&](const ChunkKey& key, uint64_t bytes) {
      seen[key.Hex()] = bytes;
      ++visits;
    });
    CHECK(visits == 10);
    CHECK(seen == expected);
  }

  SECTION("a value larger than the whole tier is RESOURCE_EXHAUSTED and stores nothing") {
    if (!TestType::kOwnsCapacity) return;
    REQUIRE(tier->Write(a, va).ok());
    const std::vector<std::byte> huge = TestValue(2, kCapacity + 1);  // bytes no codec shrinks
    CHECK(tier->Write(TestKey(2), huge).code() == absl::StatusCode::kResourceExhausted);
    CHECK_FALSE(tier->Contains(TestKey(2)));
    // A refused oversized write must not have evicted anything to make room it could never get.
    CHECK(tier->Contains(a));
  }

  SECTION("concurrent readers and writers keep every value intact") {
    constexpr int kThreads = 4;
    constexpr uint32_t kKeysPerThread = 24;
    constexpr size_t kBytes = 16 << 10;  // 4 * 24 * 16 KiB fits: nothing is evicted, so every read must hit
    std::atomic<int> bad_reads{0};
    std::atomic<int> misses{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::vector<std::byte> out(kBytes);
        for (uint32_t j = 0; j < kKeysPerThread; ++j) {
          const uint32_t mine = t * 1000 + j;
          if (!tier->Write(TestKey(mine), TestValue(mine, kBytes)).ok()) bad_reads++;
          // Read our own key back, then whatever a neighbour may have written by now.
          for (uint32_t k : {mine, ((t + 1) % kThreads) * 1000 + j}) {
            absl::Status s = tier->Read(TestKey(k), out);
            if (s.ok()) {
              if (out != TestValue(k, kBytes)) bad_reads++;
            } else if (s.code() == absl::StatusCode::kNotFound && k != mine) {
              misses++;  // the neighbour has not written it yet: fine
            } else {
              bad_reads++;
            }
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    CHECK(bad_reads == 0);
    if (TestType::kOwnsCapacity) CHECK(tier->Usage().chunks == kThreads * kKeysPerThread);
    std::vector<std::byte> out(kBytes);
    for (int t = 0; t < kThreads; ++t) {
      for (uint32_t j = 0; j < kKeysPerThread; ++j) {
        const uint32_t k = t * 1000 + j;
        REQUIRE(tier->Read(TestKey(k), out).ok());
        CHECK(out == TestValue(k, kBytes));
      }
    }
  }
}

}  // namespace cake
