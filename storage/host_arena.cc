#include "storage/host_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace cake {

absl::StatusOr<HostArena> HostArena::Reserve(uint64_t bytes) {
  const uint64_t size = ExtentAllocator::Rounded(bytes);
  // NORESERVE: a 4 GiB tier costs nothing until it is filled (or prefaulted).
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot reserve ", size >> 20, " MiB of address space for the DRAM tier: ", std::strerror(errno)));
  }
  // Transparent huge pages, where the kernel offers them on request, cut the number of faults by 512.
  madvise(p, size, MADV_HUGEPAGE);
  return HostArena(static_cast<std::byte*>(p), size);
}

HostArena::~HostArena() {
  if (data_ != nullptr) munmap(data_, size_);
}

HostArena::HostArena(HostArena&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

HostArena& HostArena::operator=(HostArena&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void HostArena::Prefault(uint64_t bytes) {
  // A write, not MADV_POPULATE_WRITE: on the VMs measured, populated pages still cost a host fault on their first
  // write from user space; a written page does not.
  for (uint64_t offset = 0; offset < std::min(bytes, size_); offset += ExtentAllocator::kPage) {
    *static_cast<volatile std::byte*>(data_ + offset) = std::byte{0};
  }
}

ExtentAllocator::ExtentAllocator(uint64_t capacity) {
  const uint64_t usable = capacity / kPage * kPage;
  if (usable > 0) free_.emplace(0, usable);
  free_bytes_ = usable;
}

std::optional<uint64_t> ExtentAllocator::Allocate(uint64_t bytes) {
  const uint64_t need = Rounded(bytes);
  MutexLock lock(&mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const uint64_t offset = it->first;
    const uint64_t rest = it->second - need;
    free_.erase(it);
    if (rest > 0) free_.emplace(offset + need, rest);
    free_bytes_ -= need;
    return offset;
  }
  return std::nullopt;
}

void ExtentAllocator::Free(uint64_t offset, uint64_t bytes) {
  uint64_t length = Rounded(bytes);
  MutexLock lock(&mu_);
  free_bytes_ += length;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + length == next->first) {
    length += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += length;
      return;
    }
  }
  free_.emplace(offset, length);
}

uint64_t ExtentAllocator::free_bytes() const {
  MutexLock lock(&mu_);
  return free_bytes_;
}

uint64_t ExtentAllocator::largest_free_extent() const {
  MutexLock lock(&mu_);
  uint64_t largest = 0;
  for (const auto& [offset, length] : free_) largest = std::max(largest, length);
  return largest;
}

}  // namespace cake
