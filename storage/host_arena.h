// The DRAM tier's memory: one anonymous mapping reserved at start-up and never given back, carved into
// page-aligned extents.
//
// Why not malloc per chunk: memory returned to the kernel and faulted in again costs a page fault per 4 KiB on
// every reuse, and on virtual machines that report freed pages to the host it costs a host fault too (seconds per
// GiB, against tens of milliseconds to copy into memory touched before: docs/benchmarks.md section 4.3 has the
// figures). Keeping one mapping
// means each page is faulted in once in the daemon's life (or up front, with Prefault), and gives a future GPU
// backend a single range to pin.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "base/mutex.h"

namespace cake {

// Owns one private anonymous mapping (reserved, not committed: pages fault in on first touch).
class HostArena {
 public:
  static absl::StatusOr<HostArena> Reserve(uint64_t bytes);
  HostArena() = default;
  ~HostArena();
  HostArena(HostArena&& other) noexcept;
  HostArena& operator=(HostArena&& other) noexcept;
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  // Writes one byte in every page of the first `bytes` so later copies there never fault. Only before the
  // arena's memory holds data.
  void Prefault(uint64_t bytes);

 private:
  HostArena(std::byte* data, uint64_t size) : data_(data), size_(size) {}
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

// First-fit allocation of page-aligned extents from a range of `capacity` bytes, with free neighbours merged.
// Thread-safe. Chunks of one model all have one size, so first fit stays unfragmented in practice.
class ExtentAllocator {
 public:
  static constexpr uint64_t kPage = 4096;
  static uint64_t Rounded(uint64_t bytes) { return (bytes == 0 ? 1 : bytes + kPage - 1) / kPage * kPage; }

  explicit ExtentAllocator(uint64_t capacity);

  // The offset of a free extent of Rounded(bytes), or nullopt when no free extent is that large.
  std::optional<uint64_t> Allocate(uint64_t bytes);
  // Returns what Allocate(bytes) gave at `offset`.
  void Free(uint64_t offset, uint64_t bytes);
  uint64_t free_bytes() const;
  uint64_t largest_free_extent() const;

 private:
  mutable Mutex mu_;
  std::map<uint64_t, uint64_t> free_ ABSL_GUARDED_BY(mu_);  // offset -> length, no two adjacent
  uint64_t free_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cake
