// DramTier: LRU eviction under the byte budget, and that a chunk being read is never evicted under its reader.
#include "storage/dram_tier.h"

#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/storage/tier_test_util.h"

namespace cake {
namespace {

using testing::TestKey;
using testing::TestValue;

constexpr size_t kChunk = 4096;

void WriteKey(DramTier& tier, uint32_t i, size_t bytes = kChunk) {
  REQUIRE(tier.Write(TestKey(i), TestValue(i, bytes)).ok());
}

bool ReadKey(DramTier& tier, uint32_t i, size_t bytes = kChunk) {
  std::vector<std::byte> out(bytes);
  return tier.Read(TestKey(i), out).ok();
}

// Holds one reader inside its copy, deterministically: the destination starts inaccessible, so the reader's
// memcpy faults; the SIGSEGV handler parks the reader until the test releases it, then opens the pages and
// lets the copy resume. While parked, the reader has registered itself with the tier exactly as a slow copy would.
class ParkedReader {
 public:
  explicit ParkedReader(size_t bytes) : bytes_(bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    mapped_ = (bytes + page - 1) / page * page;
    void* p = mmap(nullptr, mapped_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    dst_ = static_cast<std::byte*>(p);
    instance_ = this;
    struct sigaction sa {};
    sa.sa_sigaction = &ParkedReader::OnFault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    REQUIRE(sigaction(SIGSEGV, &sa, &previous_) == 0);
  }
  ~ParkedReader() {
    Release();
    if (thread_.joinable()) thread_.join();
    sigaction(SIGSEGV, &previous_, nullptr);
    instance_ = nullptr;
    munmap(dst_, mapped_);
  }

  void Start(DramTier& tier, const ChunkKey& key) {
    thread_ = std::thread([this, &tier, key] {
      status_ = tier.Read(key, std::span<std::byte>(dst_, bytes_));
      done_ = true;
    });
  }
  // True once the reader is inside its copy (and so counted as a reader by the tier).
  bool WaitParked() {
    for (int i = 0; i < 5000 && !parked_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return parked_;
  }
  void Release() { released_ = true; }
  absl::Status Finish() {
    Release();
    thread_.join();
    return status_;
  }
  std::span<const std::byte> bytes() const { return {dst_, bytes_}; }

 private:
  static void OnFault(int sig, siginfo_t* info, void* context) {
    ParkedReader* self = instance_;
    auto* addr = static_cast<std::byte*>(info->si_addr);
    if (self == nullptr || addr < self->dst_ || addr >= self->dst_ + self->mapped_) {
      // Not our fault: hand it to the previous handler (or the default) by returning into the same fault.
      if (self != nullptr) {
        sigaction(SIGSEGV, &self->previous_, nullptr);
      } else {
        signal(SIGSEGV, SIG_DFL);
      }
      return;
    }
    self->parked_ = true;
    const timespec tick{0, 1'000'000};
    while (!self->released_) nanosleep(&tick, nullptr);
    mprotect(self->dst_, self->mapped_, PROT_READ | PROT_WRITE);
  }

  static inline ParkedReader* instance_ = nullptr;
  size_t bytes_;
  size_t mapped_;
  std::byte* dst_;
  struct sigaction previous_ {};
  std::atomic<bool> parked_{false};
  std::atomic<bool> released_{false};
  std::atomic<bool> done_{false};
  absl::Status status_;
  std::thread thread_;
};

#if defined(__SANITIZE_THREAD__)
constexpr bool kCanParkReaders = false;  // TSan defers signals, and the handler would never run mid-copy
#else
constexpr bool kCanParkReaders = true;
#endif

}  // namespace

TEST_CASE("dram: least recently used is evicted first, and a read refreshes recency", "[dram]") {
  DramTier tier(3 * kChunk);
  WriteKey(tier, 1);
  WriteKey(tier, 2);
  WriteKey(tier, 3);
  CHECK(tier.evictions() == 0);
  REQUIRE(ReadKey(tier, 1));  // 2 is now the coldest

  WriteKey(tier, 4);
  CHECK(tier.evictions() == 1);
  CHECK_FALSE(tier.Contains(TestKey(2)));
  CHECK(tier.Contains(TestKey(1)));
  CHECK(tier.Contains(TestKey(3)));
  CHECK(tier.Contains(TestKey(4)));

  WriteKey(tier, 5);  // 3 is the coldest now
  CHECK(tier.evictions() == 2);
  CHECK_FALSE(tier.Contains(TestKey(3)));
  CHECK(tier.Usage().used_bytes == 3 * kChunk);
  CHECK(tier.Usage().chunks == 3);
}

TEST_CASE("dram: rewriting an existing key refreshes it without evicting", "[dram]") {
  DramTier tier(3 * kChunk);
  WriteKey(tier, 1);
  WriteKey(tier, 2);
  WriteKey(tier, 3);
  WriteKey(tier, 1);  // 2 is now the coldest
  CHECK(tier.evictions() == 0);
  WriteKey(tier, 4);
  CHECK_FALSE(tier.Contains(TestKey(2)));
  CHECK(tier.Contains(TestKey(1)));
}

TEST_CASE("dram: a large write evicts as many cold chunks as it needs", "[dram]") {
  DramTier tier(4 * kChunk);
  for (uint32_t i = 1; i <= 4; ++i) WriteKey(tier, i);
  WriteKey(tier, 9, 3 * kChunk);
  CHECK(tier.evictions() == 3);
  CHECK(tier.Contains(TestKey(4)));
  CHECK(tier.Contains(TestKey(9)));
  CHECK(tier.Usage().used_bytes == 4 * kChunk);
  // Removal frees budget: the next write needs no eviction.
  REQUIRE(tier.Remove(TestKey(9)).ok());
  WriteKey(tier, 10);
  CHECK(tier.evictions() == 3);
}

TEST_CASE("dram: a chunk being read is skipped by eviction, and a full tier of read chunks refuses writes", "[dram]") {
  if (!kCanParkReaders) {
    WARN("skipped under ThreadSanitizer");
    return;
  }
  DramTier tier(3 * kChunk);
  WriteKey(tier, 1);
  WriteKey(tier, 2);
  WriteKey(tier, 3);

  ParkedReader reader(kChunk);
  reader.Start(tier, TestKey(1));
  REQUIRE(reader.WaitParked());
  // Make chunk 1 the coldest while its reader is still inside the copy.
  REQUIRE(ReadKey(tier, 2));
  REQUIRE(ReadKey(tier, 3));

  WriteKey(tier, 4);
  CHECK(tier.Contains(TestKey(1)));
  CHECK_FALSE(tier.Contains(TestKey(2)));
  CHECK(tier.evictions() == 1);

  // Only chunk 1 would be left, and it is being read: nothing else can make room.
  absl::Status s = tier.Write(TestKey(5), TestValue(5, 3 * kChunk));
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK(tier.Contains(TestKey(1)));
  CHECK_FALSE(tier.Contains(TestKey(5)));

  REQUIRE(reader.Finish().ok());
  const auto expected = TestValue(1, kChunk);
  CHECK(std::memcmp(reader.bytes().data(), expected.data(), kChunk) == 0);

  // Once its reader is gone, chunk 1 is evictable like any other.
  REQUIRE(tier.Write(TestKey(5), TestValue(5, 3 * kChunk)).ok());
  CHECK_FALSE(tier.Contains(TestKey(1)));
}

TEST_CASE("dram: a chunk removed while being read still reads back whole", "[dram]") {
  if (!kCanParkReaders) {
    WARN("skipped under ThreadSanitizer");
    return;
  }
  DramTier tier(3 * kChunk);
  WriteKey(tier, 1);
  ParkedReader reader(kChunk);
  reader.Start(tier, TestKey(1));
  REQUIRE(reader.WaitParked());
  REQUIRE(tier.Remove(TestKey(1)).ok());
  CHECK(tier.Usage().used_bytes == 0);
  // The same key written again is a new entry: the old reader finishing must not touch its reader count.
  WriteKey(tier, 1);
  REQUIRE(reader.Finish().ok());
  const auto expected = TestValue(1, kChunk);
  CHECK(std::memcmp(reader.bytes().data(), expected.data(), kChunk) == 0);
  WriteKey(tier, 2);
  WriteKey(tier, 3);
  WriteKey(tier, 4);  // the rewritten chunk 1 is the coldest, unread entry
  CHECK_FALSE(tier.Contains(TestKey(1)));
}

TEST_CASE("dram: reads racing evictions return the right bytes or NOT_FOUND", "[dram]") {
  // Large values make each copy long, so writers evict while reads are mid-copy.
  constexpr size_t kBig = 1 << 20;
  DramTier tier(3 * kBig);
  WriteKey(tier, 1, kBig);
  const auto expected = TestValue(1, kBig);
  std::atomic<bool> stop{false};
  std::atomic<int> ok_reads{0};
  std::atomic<int> wrong_bytes{0};
  std::atomic<int> other_errors{0};
  std::thread reader([&] {
    std::vector<std::byte> out(kBig);
    while (!stop) {
      std::memset(out.data(), 0, out.size());
      absl::Status s = tier.Read(TestKey(1), out);
      if (s.ok()) {
        ok_reads++;
        if (out != expected) wrong_bytes++;
      } else if (s.code() != absl::StatusCode::kNotFound) {
        other_errors++;
      }
    }
  });
  std::thread writer([&] {
    for (uint32_t i = 0; i < 60; ++i) {
      if (i % 3 == 0) (void)tier.Write(TestKey(1), expected);  // keep A coming back after it is evicted
      absl::Status s = tier.Write(TestKey(100 + i), TestValue(100 + i, kBig));
      if (!s.ok() && s.code() != absl::StatusCode::kResourceExhausted) other_errors++;
    }
    stop = true;
  });
  writer.join();
  reader.join();
  CHECK(wrong_bytes == 0);
  CHECK(other_errors == 0);
  CHECK(tier.evictions() > 0);
  CHECK(tier.Usage().used_bytes <= 3 * kBig);
}

}  // namespace cake
