// The regions the daemon has created for engines: who owns each, and which byte ranges live loads are using.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "base/clock.h"
#include "base/mutex.h"
#include "cuda/region.h"

namespace cake {

// Where a region's memory lives: host shared memory, or device memory on one CUDA device.
struct RegionPlacement {
  RegionBackend backend = RegionBackend::kHostShm;
  int device = 0;
  // Host regions: the one other user who may map the memory (the engine that asked for it); none: the daemon's
  // own user only.
  std::optional<uid_t> shared_with_uid;
};

// Who a region belongs to: the principal the daemon established for the caller, and which of that principal's
// engines (the client's own word) registered it. Only the same pair may use or release it.
struct RegionOwner {
  RegionOwner() = default;
  RegionOwner(const char* client) : client_id(client) {}             // NOLINT: one principal (tests, single-user mode)
  RegionOwner(std::string client) : client_id(std::move(client)) {}  // NOLINT
  RegionOwner(std::string principal_name, std::string client)
      : principal(std::move(principal_name)), client_id(std::move(client)) {}
  friend bool operator==(const RegionOwner&, const RegionOwner&) = default;
  // For logs: "principal/client", or the client alone for the unnamed principal.
  std::string ToString() const { return principal.empty() ? client_id : principal + "/" + client_id; }

  std::string principal;
  std::string client_id;
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
    // How long a region outlives its owner's last call naming it (Register, Renew, ReserveWindow, Get, Size).
    std::chrono::milliseconds lease{30000};
    // One principal's regions together (all its clients'). Bytes and counts alike, the last eighth of the
    // daemon's (max_total_region_bytes, max_regions) is kept for principals that hold little (SharedPool).
    uint64_t max_region_bytes_per_principal = UINT64_MAX;
  };
  using Placement = RegionPlacement;
  explicit RegionRegistry(const Limits& limits, Clock* clock = Clock::Real()) : limits_(limits), clock_(clock) {}

  // Where a region is destroyed once nothing holds it any more: unmapping up to max_region_bytes, or a
  // device-synchronising cudaFree, takes a while, and the last reference may drop on a gRPC thread (ReleaseRegion,
  // a cancelled registration) or an I/O thread (the last load using a released region). The disposer is handed
  // the destruction and returns false when it cannot take it, which then happens on the thread that let go, as it
  // does while none is set. Set it before serving; clear it (nullptr) before whatever runs it goes.
  using Disposer = std::function<bool(std::function<void()>)>;
  void SetDisposer(Disposer dispose);

  struct Registered {
    std::string region_id;
    std::shared_ptr<Region> region;
  };
  // Creates a region owned by `owner`. INVALID_ARGUMENT for a size of 0 or over the limit,
  // RESOURCE_EXHAUSTED when the client holds too many, all clients together hold too many or too many bytes, or
  // memory runs out. Released regions that live loads still use count as held (their memory is).
  absl::StatusOr<Registered> Register(const RegionOwner& owner, uint64_t bytes, Placement placement = {});
  // NOT_FOUND: unknown id, or another principal's (whose regions' existence is none of this caller's business).
  // PERMISSION_DENIED: another client's of the same principal. The id is unusable at once; a region live loads
  // still use stays, released, in the counts against the limits and in List until the last of them ends (its
  // memory is mapped until then, so releasing it must not make room for another).
  absl::Status Release(const RegionOwner& owner, const std::string& region_id);

  // Frees a window when the load that reserved it ends (and its last read has landed); the last window of a
  // released region takes the region with it.
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
  // Checks ownership (which renews the region's lease) and reserves [offset, offset + bytes) of the region for one
  // load. NOT_FOUND / PERMISSION_DENIED as above; OUT_OF_RANGE outside the region; FAILED_PRECONDITION when the range
  // overlaps a window another live load holds.
  absl::StatusOr<WindowLease> ReserveWindow(const RegionOwner& owner, const std::string& region_id, uint64_t offset,
                                            uint64_t bytes);
  // Ownership check only, for Store (which reads the region once and holds nothing).
  absl::StatusOr<std::shared_ptr<Region>> Get(const RegionOwner& owner, const std::string& region_id);
  // Size of a region (for window defaults) after the same checks.
  absl::StatusOr<uint64_t> Size(const RegionOwner& owner, const std::string& region_id);

  // Starts the region's lease again (every other call of its owner naming it does too). NOT_FOUND /
  // PERMISSION_DENIED as above.
  absl::Status Renew(const RegionOwner& owner, const std::string& region_id);
  std::chrono::milliseconds lease() const { return limits_.lease; }

  struct Expired {
    RegionOwner owner;
    std::string region_id;
    uint64_t bytes;
  };
  // Releases every region whose lease has run out and that no live load is using (a load's window keeps its
  // region: the owner is evidently alive; the lease runs again from the load's end). Returns what it released.
  std::vector<Expired> ReleaseExpired();

  // The daemon did not run for `paused` (SIGSTOP, a debugger, a suspended VM): every lease gets that time back. A
  // lease counts the time the daemon could hear its owner; without this, a daemon stopped for longer than a lease
  // expired every region on resuming, before it read the renewals its owners had sent meanwhile.
  void CreditPause(std::chrono::nanoseconds paused);

  struct ReleasedByOperator {
    RegionOwner owner;
    std::string region_id;
    uint64_t bytes;
    // Live loads whose windows keep it: it stays counted and listed until they end (or are ended).
    uint32_t loads_using;
    bool already_released;  // by its owner or an operator, before this call
  };
  // An operator's release (cakectl regions release): whoever owns it, as with Release otherwise. NOT_FOUND for an
  // unknown id. A region already released but still in use answers again, so an operator can end its loads.
  absl::StatusOr<ReleasedByOperator> ReleaseAny(const std::string& region_id);

  // What an operator sees of one region (cakectl regions): never its memory.
  struct Listed {
    RegionOwner owner;
    std::string region_id;
    RegionBackend backend;
    uint64_t bytes;
    uint32_t windows;     // live loads' windows in it: one per load
    double lease_left_s;  // 0 for a released one
    bool released;        // by its owner or an operator; still in use by `windows` loads
  };
  std::vector<Listed> List() const;

  // Drops every region (daemon stop).
  void Clear();
  // Every region counted against the limits, released ones still in use included.
  size_t count() const;
  uint64_t total_bytes() const;
  struct Totals {
    size_t regions;
    uint64_t bytes;
    size_t released_in_use;  // of `regions`: released, kept by live loads
    uint64_t released_in_use_bytes;
  };
  Totals totals() const;

 private:
  struct Window {
    uint64_t begin, end;
  };
  struct Entry {
    RegionOwner owner;
    std::shared_ptr<Region> region;
    absl::flat_hash_map<uint64_t, Window> windows;  // by window lease id
    TimePoint lease_ends;
    // Its owner or an operator released it while loads used it: the id answers NOT_FOUND to its owner, the region
    // waits for its last window to end. A released region always has a window.
    bool released = false;
  };
  absl::StatusOr<Entry*> FindOwned(const RegionOwner& owner, const std::string& region_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Erases the region now when no load uses it (handing back its last reference, to be dropped outside the
  // lock), or marks it released.
  std::shared_ptr<Region> ReleaseEntry(absl::flat_hash_map<std::string, Entry>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndLease(const std::string& region_id, uint64_t lease_id);

  // Shared with every region's deleter, which may outlive the registry (a load's lease, a Store's reference).
  struct DisposerSlot {
    Mutex mu;
    Disposer dispose ABSL_GUARDED_BY(mu);
  };
  struct RegionDeleter {
    void operator()(Region* region) const;
    std::shared_ptr<DisposerSlot> slot;
  };

  const Limits limits_;
  Clock* const clock_;
  const std::shared_ptr<DisposerSlot> disposer_ = std::make_shared<DisposerSlot>();
  mutable Mutex mu_;
  absl::flat_hash_map<std::string, Entry> regions_ ABSL_GUARDED_BY(mu_);
  uint64_t next_lease_ ABSL_GUARDED_BY(mu_) = 1;
  // Registrations admitted and still mapping their pages: counted against the limits, so concurrent ones cannot
  // pass them together.
  uint32_t pending_regions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Registrations under way, per principal: counted against its share like the regions it holds.
  struct Pending {
    uint32_t regions = 0;
    uint64_t bytes = 0;
  };
  absl::flat_hash_map<std::string, Pending> pending_by_principal_ ABSL_GUARDED_BY(mu_);
  uint64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // released regions in use included
  uint32_t released_in_use_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t released_in_use_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cake
