#include "storage/dram_tier.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "storage/host_arena.h"

namespace cake {

struct DramTier::Memory {
  explicit Memory(HostArena a) : arena(std::move(a)), allocator(arena.size()) {}
  HostArena arena;
  ExtentAllocator allocator;
};

struct DramTier::Extent {
  Extent(std::shared_ptr<Memory> m, uint64_t o, size_t size)
      : memory(std::move(m)), offset(o), bytes(memory->arena.data() + o, size) {}
  ~Extent() { memory->allocator.Free(offset, bytes.size()); }
  Extent(const Extent&) = delete;
  Extent& operator=(const Extent&) = delete;

  std::byte* data() const { return memory->arena.data() + offset; }
  size_t size() const { return bytes.size(); }

  std::shared_ptr<Memory> memory;
  uint64_t offset;
  std::span<const std::byte> bytes;
};

DramTier::DramTier(uint64_t capacity_bytes, bool prefault) : capacity_bytes_(capacity_bytes) {
  // Half again the capacity for lent extents of evicted chunks (TierManager lends at most half the capacity to
  // its write-back queue): they never crowd out the chunks within the budget. Untouched pages cost nothing.
  absl::StatusOr<HostArena> arena = HostArena::Reserve(capacity_bytes + capacity_bytes / 2);
  if (!arena.ok()) {
    status_ = arena.status();
    return;
  }
  // First fit fills the arena from the front: the budget's worth of it is what holds chunks.
  if (prefault) arena->Prefault(capacity_bytes);
  memory_ = std::make_shared<Memory>(std::move(*arena));
}

DramTier::~DramTier() = default;

bool DramTier::Contains(const ChunkKey& key) const {
  MutexLock lock(&mu_);
  return index_.Contains(key);
}

absl::Status DramTier::Read(const ChunkKey& key, std::span<std::byte> dst) {
  std::shared_ptr<Extent> extent;
  LruIndex<Entry>::ReadPin pin;
  {
    MutexLock lock(&mu_);
    Entry* e = index_.Find(key);
    if (e == nullptr) return absl::NotFoundError(absl::StrCat("chunk ", key.Hex(), " is not in DRAM"));
    if (e->extent->size() != dst.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", key.Hex(), " holds ", e->extent->size(), " bytes; the destination has ", dst.size()));
    }
    extent = e->extent;
    pin = *index_.PinForRead(key);
  }
  // The copy runs outside the lock so concurrent readers proceed in parallel; the pin keeps the entry out of
  // eviction, and the shared extent keeps the bytes in place even if it is removed meanwhile.
  if (!dst.empty()) std::memcpy(dst.data(), extent->data(), dst.size());
  return absl::OkStatus();
}

absl::Status DramTier::ReadValue(const ChunkKey& key, uint64_t max_bytes, std::vector<std::byte>& out) {
  // A lent extent stays in place while held, removed or not: the copy runs outside the lock.
  const std::shared_ptr<const std::span<const std::byte>> lent = Lend(key);
  if (lent == nullptr) return absl::NotFoundError(absl::StrCat("chunk ", key.Hex(), " is not in DRAM"));
  if (lent->size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", key.Hex(), " holds ", lent->size(), " bytes; at most ", max_bytes, " were expected"));
  }
  out.assign(lent->begin(), lent->end());
  return absl::OkStatus();
}

std::shared_ptr<const std::span<const std::byte>> DramTier::Lend(const ChunkKey& key) {
  MutexLock lock(&mu_);
  Entry* e = index_.Find(key);
  if (e == nullptr) return nullptr;
  const std::shared_ptr<Extent>& extent = e->extent;
  return std::shared_ptr<const std::span<const std::byte>>(extent, &extent->bytes);
}

// What a chunk of `bytes` really costs the tier: the arena hands out whole pages, so the budget counts them (150k
// two-byte chunks would otherwise read as 300 KB used while holding 600 MB).
uint64_t DramTier::PageFootprint(uint64_t bytes) { return ExtentAllocator::Rounded(bytes); }

std::shared_ptr<DramTier::Extent> DramTier::AllocateLocked(uint64_t bytes) {
  std::shared_ptr<Extent> extent;
  index_.EvictUntil(
      // Both run inside EvictUntil, on this thread, under the lock this function requires.
      [&] {
        mu_.AssertHeld();
        if (used_bytes_ + PageFootprint(bytes) > capacity_bytes_) return false;
        std::optional<uint64_t> offset = memory_->allocator.Allocate(bytes);
        if (!offset) return false;
        extent = std::make_shared<Extent>(memory_, *offset, bytes);
        return true;
      },
      // The extent returns to the arena as the entry goes, or when its last borrower lets go.
      [&](const ChunkKey&, const Entry& e) {
        mu_.AssertHeld();
        used_bytes_ -= PageFootprint(e.extent->size());
        ++evictions_;
      });
  return extent;
}

absl::Status DramTier::Write(const ChunkKey& key, std::span<const std::byte> src) {
  if (!status_.ok()) return status_;
  if (PageFootprint(src.size()) > capacity_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a chunk of ", src.size(), " bytes exceeds the DRAM tier's ", capacity_bytes_, "-byte capacity"));
  }
  std::shared_ptr<Extent> extent;
  {
    MutexLock lock(&mu_);
    if (index_.Touch(key) != nullptr) return absl::OkStatus();
    extent = AllocateLocked(src.size());
    if (extent == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("DRAM tier is full (", used_bytes_, " of ", capacity_bytes_,
                       " bytes) and every chunk in it is being read or written back; retry when loads finish"));
    }
    used_bytes_ += PageFootprint(src.size());  // reserved while the copy runs
  }
  // Copy outside the lock: writers of large chunks must not stall readers.
  if (!src.empty()) std::memcpy(extent->data(), src.data(), src.size());

  MutexLock lock(&mu_);
  if (!index_.Insert(key, Entry{std::move(extent)})) {
    used_bytes_ -= PageFootprint(src.size());  // a concurrent write of the same key got there first
  }
  return absl::OkStatus();
}

absl::Status DramTier::Remove(const ChunkKey& key) {
  MutexLock lock(&mu_);
  Entry* e = index_.Find(key);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("chunk ", key.Hex(), " is not in DRAM"));
  used_bytes_ -= PageFootprint(e->extent->size());
  index_.Erase(key);
  return absl::OkStatus();
}

TierUsage DramTier::Usage() const {
  MutexLock lock(&mu_);
  return TierUsage{used_bytes_, capacity_bytes_, index_.size()};
}

void DramTier::ForEach(const std::function<void(const ChunkKey&, uint64_t)>& fn) const {
  MutexLock lock(&mu_);
  index_.ForEach([&](const ChunkKey& key, const Entry& entry) { fn(key, entry.extent->size()); });
}

TierStats DramTier::Stats() const {
  TierStats stats;
  stats.evictions = evictions();
  return stats;
}

uint64_t DramTier::evictions() const {
  MutexLock lock(&mu_);
  return evictions_;
}

std::span<std::byte> DramTier::arena_bytes() const {
  if (memory_ == nullptr) return {};
  return {memory_->arena.data(), memory_->arena.size()};
}

}  // namespace cake
