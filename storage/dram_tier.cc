#include "storage/dram_tier.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace cake {

struct DramTier::Buffer {
  explicit Buffer(size_t n) : size(n) {
    // Page alignment lets these buffers become O_DIRECT targets and io_uring fixed buffers later.
    const size_t rounded = (n + 4095) / 4096 * 4096;
    data = static_cast<std::byte*>(std::aligned_alloc(4096, rounded == 0 ? 4096 : rounded));
  }
  ~Buffer() { std::free(data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  std::byte* data;
  size_t size;
};

DramTier::DramTier(uint64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}
DramTier::~DramTier() = default;

bool DramTier::Contains(const ChunkKey& key) const {
  std::lock_guard lock(mu_);
  return entries_.contains(key);
}

absl::Status DramTier::Read(const ChunkKey& key, std::span<std::byte> dst) {
  std::shared_ptr<Buffer> buffer;
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return absl::NotFoundError(absl::StrCat("chunk ", key.Hex(), " is not in DRAM"));
    Entry& e = it->second;
    if (e.buffer->size != dst.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", key.Hex(), " holds ", e.buffer->size, " bytes; the destination has ", dst.size()));
    }
    lru_.splice(lru_.begin(), lru_, e.lru_position);
    ++e.readers;
    buffer = e.buffer;
  }
  // The copy runs outside the lock so concurrent readers proceed in parallel; the reader count keeps the
  // entry out of eviction, and the shared buffer keeps the bytes alive even if it is removed meanwhile.
  if (!dst.empty()) std::memcpy(dst.data(), buffer->data, dst.size());
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.buffer == buffer) --it->second.readers;
  return absl::OkStatus();
}

bool DramTier::MakeRoom(uint64_t bytes) {
  auto victim = lru_.end();
  while (used_bytes_ + bytes > capacity_bytes_) {
    if (victim == lru_.begin()) return false;
    --victim;
    auto it = entries_.find(*victim);
    if (it->second.readers > 0) continue;
    used_bytes_ -= it->second.buffer->size;
    ++evictions_;
    RecycleLocked(std::move(it->second.buffer));
    entries_.erase(it);
    victim = lru_.erase(victim);
  }
  return true;
}

absl::Status DramTier::Write(const ChunkKey& key, std::span<const std::byte> src) {
  if (src.size() > capacity_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a chunk of ", src.size(), " bytes exceeds the DRAM tier's ", capacity_bytes_, "-byte capacity"));
  }
  // Copy before taking the lock: writers of large chunks must not stall readers.
  std::shared_ptr<Buffer> buffer = TakeBuffer(src.size());
  if (buffer->data == nullptr) return absl::ResourceExhaustedError("out of host memory for a DRAM chunk");
  if (!src.empty()) std::memcpy(buffer->data, src.data(), src.size());

  std::lock_guard lock(mu_);
  if (auto it = entries_.find(key); it != entries_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru_position);
    RecycleLocked(std::move(buffer));
    return absl::OkStatus();
  }
  if (!MakeRoom(src.size())) {
    return absl::ResourceExhaustedError(
        absl::StrCat("DRAM tier is full (", used_bytes_, " of ", capacity_bytes_,
                     " bytes) and every chunk in it is being read; retry when loads finish"));
  }
  lru_.push_front(key);
  entries_.emplace(key, Entry{std::move(buffer), lru_.begin(), 0});
  used_bytes_ += src.size();
  return absl::OkStatus();
}

absl::Status DramTier::Remove(const ChunkKey& key) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return absl::NotFoundError(absl::StrCat("chunk ", key.Hex(), " is not in DRAM"));
  used_bytes_ -= it->second.buffer->size;
  lru_.erase(it->second.lru_position);
  RecycleLocked(std::move(it->second.buffer));
  entries_.erase(it);
  return absl::OkStatus();
}

std::shared_ptr<DramTier::Buffer> DramTier::TakeBuffer(size_t bytes) {
  {
    std::lock_guard lock(mu_);
    for (auto it = spare_.begin(); it != spare_.end(); ++it) {
      if ((*it)->size == bytes) {
        std::shared_ptr<Buffer> reused = std::move(*it);
        spare_.erase(it);
        return reused;
      }
    }
  }
  return std::make_shared<Buffer>(bytes);
}

void DramTier::RecycleLocked(std::shared_ptr<Buffer> buffer) {
  // A buffer a reader still copies from stays with that reader; the oldest spare makes way for the newest.
  if (buffer.use_count() != 1 || buffer->data == nullptr) return;
  if (spare_.size() >= kMaxSpareBuffers) spare_.erase(spare_.begin());
  spare_.push_back(std::move(buffer));
}

TierUsage DramTier::Usage() const {
  std::lock_guard lock(mu_);
  return TierUsage{used_bytes_, capacity_bytes_, entries_.size()};
}

void DramTier::ForEach(const std::function<void(const ChunkKey&, uint64_t)>& fn) const {
  std::lock_guard lock(mu_);
  for (const auto& [key, entry] : entries_) fn(key, entry.buffer->size);
}

uint64_t DramTier::evictions() const {
  std::lock_guard lock(mu_);
  return evictions_;
}

}  // namespace cake
