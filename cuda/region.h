// Memory the daemon and an engine both address: the daemon loads chunks into it, the engine reads them out.
// Backends: host shared memory (host_region.cc, library cake_regions) and device memory exported through CUDA
// IPC (cuda_backend.h, library cake_cuda).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace cake {

enum class RegionBackend { kHostShm, kCudaIpc };

// Safe to use from several threads at once on disjoint byte ranges.
class Region {
 public:
  virtual ~Region() = default;

  virtual RegionBackend backend() const = 0;
  virtual uint64_t size() const = 0;
  // Base address when plain CPU stores reach the memory (host regions), so tiers can read straight into it;
  // nullptr when bytes must go through CopyIn (device memory).
  virtual std::byte* host_data() = 0;
  // OUT_OF_RANGE when [offset, offset + bytes) does not lie inside the region.
  virtual absl::Status CopyIn(uint64_t offset, std::span<const std::byte> src) = 0;
  virtual absl::Status CopyOut(uint64_t offset, std::span<std::byte> dst) const = 0;
  // What the engine needs to open the region: the shm name, or the IPC handle's bytes.
  virtual std::string export_handle() const = 0;
};

// OUT_OF_RANGE unless [offset, offset + bytes) lies within [0, size), without overflow.
inline absl::Status CheckRange(uint64_t size, uint64_t offset, uint64_t bytes) {
  if (offset > size || bytes > size - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("bytes [", offset, ", ", offset, " + ", bytes, ") do not lie within the region's ", size));
  }
  return absl::OkStatus();
}

// A POSIX shared-memory object with an unguessable name and owner-only permissions, owned by its creator
// (the name is unlinked when the owner goes) or merely mapped by an opener. Move-only.
class SharedMemory {
 public:
  // Creates a new object of `bytes` bytes under a fresh random name "/cake-<creator's pid>-<32 hex>", mode 0600
  // (the pid lets a later daemon tell a dead creator's leftovers from a live one's: SweepOrphanedSharedMemory). Its
  // pages are reserved and mapped up front (Open maps them too), so copies never fault: this takes time in proportion
  // to the size.
  // With shared_with_uid (another user than this process's), that user may open and map it too, and nobody else:
  // FAILED_PRECONDITION where the file system cannot say so (no POSIX ACLs).
  static absl::StatusOr<SharedMemory> Create(uint64_t bytes, std::optional<uid_t> shared_with_uid = std::nullopt);
  // Maps an existing object; FAILED_PRECONDITION if it is smaller than `bytes`.
  static absl::StatusOr<SharedMemory> Open(const std::string& name, uint64_t bytes);

  SharedMemory(SharedMemory&& other) noexcept;
  SharedMemory& operator=(SharedMemory&& other) noexcept;
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  ~SharedMemory();

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  SharedMemory() = default;
  void Reset();

  std::string name_;
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
  bool owner_ = false;
};

// What SweepOrphanedSharedMemory removed.
struct SweptSharedMemory {
  uint64_t segments = 0;
  uint64_t bytes = 0;
};
// Unlinks the shared-memory objects "/cake-<pid>-<hex>" (in /dev/shm) that this user owns and whose creating
// process is gone: what a daemon (or a client) killed with SIGKILL left behind. A live creator's objects, other
// users' objects and names of any other form are left alone.
SweptSharedMemory SweepOrphanedSharedMemory(const std::string& shm_dir = "/dev/shm");

// The daemon's host-memory region backend.
absl::StatusOr<std::unique_ptr<Region>> CreateHostRegion(uint64_t bytes,
                                                         std::optional<uid_t> shared_with_uid = std::nullopt);

}  // namespace cake
