// The regions the daemon has created for engines: who owns each, and which byte ranges live loads are using.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "cuda/region.h"

namespace cake {

// Where a region's memory lives: host shared memory, or device memory on one CUDA device.
struct RegionPlacement {
  RegionBackend backend = RegionBackend::kHostShm;
  int device = 0;
};

class RegionRegistry {
 public:
  struct Limits {
    uint64_t max_region_bytes;
    uint32_t max_regions_per_client;
    uint64_t max_cuda_region_bytes = uint64_t{64} << 30;
    // Over every client together: a client id is a string the client picks, so per-client limits alone bound
    // nothing.
    uint32_t max_regions = 1024;
    uint64_t max_total_region_bytes = uint64_t{512} << 30;
  };
  using Placement = RegionPlacement;
  explicit RegionRegistry(const Limits& limits) : limits_(limits) {}

  struct Registered {
    std::string region_id;
    std::shared_ptr<Region> region;
  };
  // Creates a region owned by client_id. INVALID_ARGUMENT for a size of 0 or over the limit,
  // RESOURCE_EXHAUSTED when the client holds too many, all clients together hold too many or too many bytes, or
  // memory runs out.
  absl::StatusOr<Registered> Register(const std::string& client_id, uint64_t bytes, Placement placement = {});
  // NOT_FOUND: unknown id. PERMISSION_DENIED: another client's. Loads still using it keep its memory alive
  // until they end; the name disappears at once.
  absl::Status Release(const std::string& client_id, const std::string& region_id);

  // Frees a window when the load that reserved it ends (and its last read has landed).
  class WindowLease {
   public:
    WindowLease() = default;
    WindowLease(WindowLease&& o) noexcept { *this = std::move(o); }
    WindowLease& operator=(WindowLease&& o) noexcept;
    ~WindowLease();
    std::shared_ptr<Region> region() const { return region_; }

   private:
    friend class RegionRegistry;
    RegionRegistry* registry_ = nullptr;
    std::string region_id_;
    uint64_t lease_id_ = 0;
    std::shared_ptr<Region> region_;
  };
  // Checks ownership and reserves [offset, offset + bytes) of the region for one load.
  // NOT_FOUND / PERMISSION_DENIED as above; OUT_OF_RANGE outside the region; FAILED_PRECONDITION when the
  // range overlaps a window another live load holds.
  absl::StatusOr<WindowLease> ReserveWindow(const std::string& client_id, const std::string& region_id, uint64_t offset,
                                            uint64_t bytes);
  // Ownership check only, for Store (which reads the region once and holds nothing).
  absl::StatusOr<std::shared_ptr<Region>> Get(const std::string& client_id, const std::string& region_id);
  // Size of a region (for window defaults) after the same checks.
  absl::StatusOr<uint64_t> Size(const std::string& client_id, const std::string& region_id);

  // Drops every region (daemon stop).
  void Clear();
  size_t count() const;
  uint64_t total_bytes() const;

 private:
  struct Window {
    uint64_t begin, end;
  };
  struct Entry {
    std::string client_id;
    std::shared_ptr<Region> region;
    absl::flat_hash_map<uint64_t, Window> windows;  // by lease id
  };
  absl::StatusOr<Entry*> FindOwned(const std::string& client_id, const std::string& region_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndLease(const std::string& region_id, uint64_t lease_id);

  const Limits limits_;
  mutable Mutex mu_;
  absl::flat_hash_map<std::string, Entry> regions_ ABSL_GUARDED_BY(mu_);
  uint64_t next_lease_ ABSL_GUARDED_BY(mu_) = 1;
  // Registrations admitted and still mapping their pages: counted against the limits, so concurrent ones cannot
  // pass them together.
  uint32_t pending_regions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cake
