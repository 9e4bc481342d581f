#include "server/core/region_registry.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "base/random_id.h"
#include "base/shared_pool.h"
#include "base/status_macros.h"
#include "cuda/cuda_backend.h"

namespace cake {
namespace {

// For a refusal at a limit: how much of what is held is released regions that live loads still keep mapped, so
// the caller (or its operator) knows that releasing more will not help, and what will.
std::string ReleasedInUseNote(uint32_t regions, uint64_t bytes) {
  if (regions == 0) return "";
  return absl::StrCat("; of these, ", regions, " region(s) (", bytes,
                      " bytes) are released but still in use by live loads, and count until those loads end "
                      "(cakectl regions release ID --end-loads ends them)");
}

}  // namespace

absl::StatusOr<RegionRegistry::Registered> RegionRegistry::Register(const RegionOwner& owner, uint64_t bytes,
                                                                    Placement placement) {
  if (owner.client_id.empty())
    return absl::InvalidArgumentError("client_id is empty: name the engine that owns the region");
  const bool on_device = placement.backend == RegionBackend::kCudaIpc;
  const uint64_t limit = on_device ? limits_.max_cuda_region_bytes : limits_.max_region_bytes;
  if (bytes == 0 || bytes > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("region size ", bytes, " bytes; accepted: 1 to ", limit,
                     on_device ? " (cuda.max_region_bytes)" : " (limits.max_region_bytes)"));
  }
  {
    MutexLock lock(&mu_);
    uint32_t held = 0, held_released = 0;
    uint64_t held_released_bytes = 0;
    Pending principal;  // what the caller's principal holds, all its clients together, and is registering
    if (auto p = pending_by_principal_.find(owner.principal); p != pending_by_principal_.end()) principal = p->second;
    for (const auto& [id, e] : regions_) {
      if (e.owner.principal == owner.principal) {
        ++principal.regions;
        principal.bytes += e.region->size();
      }
      if (!(e.owner == owner)) continue;
      ++held;
      if (e.released) {
        ++held_released;
        held_released_bytes += e.region->size();
      }
    }
    if (held >= limits_.max_regions_per_client) {
      return absl::ResourceExhaustedError(absl::StrCat("client ", owner.ToString(), " already holds ", held,
                                                       " regions (limits.max_regions_per_client); release one",
                                                       ReleasedInUseNote(held_released, held_released_bytes)));
    }
    if (regions_.size() + pending_regions_ >= limits_.max_regions) {
      return absl::ResourceExhaustedError(absl::StrCat("the daemon holds ", regions_.size() + pending_regions_,
                                                       " regions for all clients (limits.max_regions); retry once "
                                                       "some are released",
                                                       ReleasedInUseNote(released_in_use_, released_in_use_bytes_)));
    }
    if (held_bytes_ + pending_bytes_ + bytes > limits_.max_total_region_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a region of ", bytes, " bytes would take all clients' regions past ", limits_.max_total_region_bytes,
          " bytes (limits.max_total_region_bytes); ", held_bytes_ + pending_bytes_, " are held",
          ReleasedInUseNote(released_in_use_, released_in_use_bytes_)));
    }
    const std::string who = owner.principal.empty() ? "this principal" : "principal " + owner.principal;
    const SharedPool region_bytes{limits_.max_total_region_bytes, limits_.max_region_bytes_per_principal};
    switch (region_bytes.Check(held_bytes_ + pending_bytes_, principal.bytes, bytes)) {
      case SharedPool::Verdict::kFits:
      case SharedPool::Verdict::kPoolFull:  // judged above, with its own message
        break;
      case SharedPool::Verdict::kHolderFull:
        return absl::ResourceExhaustedError(
            absl::StrCat("a region of ", bytes, " bytes would take ", who, "'s regions (all its clients') past ",
                         limits_.max_region_bytes_per_principal, " bytes (limits.max_region_bytes_per_principal); ",
                         principal.bytes, " are held"));
      case SharedPool::Verdict::kReserved:
        return absl::ResourceExhaustedError(
            absl::StrCat(who, " holds ", principal.bytes, " region bytes and the daemon ", held_bytes_ + pending_bytes_,
                         " of ", limits_.max_total_region_bytes,
                         " (limits.max_total_region_bytes): ", region_bytes.ReserveNote("bytes"), "; release one"));
    }
    const SharedPool region_count{limits_.max_regions};
    if (region_count.Check(regions_.size() + pending_regions_, principal.regions, 1) ==
        SharedPool::Verdict::kReserved) {
      return absl::ResourceExhaustedError(absl::StrCat(
          who, " holds ", principal.regions, " regions and the daemon ", regions_.size() + pending_regions_, " of ",
          limits_.max_regions, " (limits.max_regions): ", region_count.ReserveNote("regions"), "; release one"));
    }
    ++pending_regions_;
    pending_bytes_ += bytes;
    Pending& mine = pending_by_principal_[owner.principal];
    ++mine.regions;
    mine.bytes += bytes;
  }
  auto created =
      on_device ? CreateCudaRegion(bytes, placement.device) : CreateHostRegion(bytes, placement.shared_with_uid);
  MutexLock lock(&mu_);
  --pending_regions_;
  pending_bytes_ -= bytes;
  if (auto p = pending_by_principal_.find(owner.principal); p != pending_by_principal_.end()) {
    --p->second.regions;
    p->second.bytes -= bytes;
    if (p->second.regions == 0) pending_by_principal_.erase(p);
  }
  if (!created.ok()) return created.status();
  Registered out{"r-" + RandomHex128(), std::shared_ptr<Region>(created->release(), RegionDeleter{disposer_})};
  held_bytes_ += out.region->size();
  regions_.emplace(out.region_id, Entry{owner, out.region, {}, clock_->Now() + limits_.lease});
  return out;
}

absl::StatusOr<RegionRegistry::Entry*> RegionRegistry::FindOwned(const RegionOwner& owner,
                                                                 const std::string& region_id) {
  auto it = regions_.find(region_id);
  // Another principal's region answers as if it did not exist: its id must reveal nothing to this caller. A
  // released one is gone for its owner too, though loads that reserved their windows before go on using it.
  if (it == regions_.end() || it->second.released || it->second.owner.principal != owner.principal) {
    return absl::NotFoundError(
        absl::StrCat("region \"", region_id, "\" is not registered (never was, or was released)"));
  }
  if (it->second.owner.client_id != owner.client_id) {
    return absl::PermissionDeniedError(absl::StrCat("region \"", region_id, "\" belongs to another client"));
  }
  // Its owner named it: alive, so the lease starts again.
  it->second.lease_ends = clock_->Now() + limits_.lease;
  return &it->second;
}

void RegionRegistry::SetDisposer(Disposer dispose) {
  MutexLock lock(&disposer_->mu);
  disposer_->dispose = std::move(dispose);
}

void RegionRegistry::RegionDeleter::operator()(Region* region) const {
  std::shared_ptr<Region> owned(region);  // its own deleter: whoever drops the last copy destroys it
  // Under the slot's lock, so SetDisposer(nullptr) returns only once no hand-over to the old disposer is under way.
  MutexLock lock(&slot->mu);
  if (slot->dispose) slot->dispose([owned]() mutable { owned.reset(); });
  // Not taken (or no disposer): `owned` is the last copy and unmaps here, on leaving.
}

std::shared_ptr<Region> RegionRegistry::ReleaseEntry(absl::flat_hash_map<std::string, Entry>::iterator it) {
  Entry& e = it->second;
  if (!e.windows.empty()) {
    // Its memory stays mapped for the loads, so it stays counted: else releasing regions under live loads and
    // registering new ones would hold any amount of memory under the limits.
    if (!e.released) {
      e.released = true;
      ++released_in_use_;
      released_in_use_bytes_ += e.region->size();
    }
    return nullptr;
  }
  std::shared_ptr<Region> last_ref = std::move(e.region);
  held_bytes_ -= last_ref->size();
  regions_.erase(it);
  return last_ref;
}

absl::Status RegionRegistry::Release(const RegionOwner& owner, const std::string& region_id) {
  std::shared_ptr<Region> last_ref;  // destroyed outside the lock: unmapping can take a while
  MutexLock lock(&mu_);
  CAKE_RETURN_IF_ERROR(FindOwned(owner, region_id).status());
  last_ref = ReleaseEntry(regions_.find(region_id));
  return absl::OkStatus();
}

std::vector<RegionRegistry::Listed> RegionRegistry::List() const {
  std::vector<Listed> out;
  MutexLock lock(&mu_);
  const TimePoint now = clock_->Now();
  for (const auto& [id, e] : regions_) {
    const double lease_left_s =
        e.released ? 0.0 : std::max(0.0, std::chrono::duration<double>(e.lease_ends - now).count());
    out.push_back(Listed{e.owner, id, e.region->backend(), e.region->size(), static_cast<uint32_t>(e.windows.size()),
                         lease_left_s, e.released});
  }
  std::sort(out.begin(), out.end(), [](const Listed& a, const Listed& b) {
    return std::tie(a.owner.principal, a.owner.client_id, a.region_id) <
           std::tie(b.owner.principal, b.owner.client_id, b.region_id);
  });
  return out;
}

absl::StatusOr<RegionRegistry::ReleasedByOperator> RegionRegistry::ReleaseAny(const std::string& region_id) {
  std::shared_ptr<Region> last_ref;  // destroyed outside the lock: unmapping can take a while
  MutexLock lock(&mu_);
  auto it = regions_.find(region_id);
  if (it == regions_.end()) return absl::NotFoundError(absl::StrCat("no region ", region_id));
  const Entry& e = it->second;
  ReleasedByOperator released{e.owner, region_id, e.region->size(), static_cast<uint32_t>(e.windows.size()),
                              e.released};
  last_ref = ReleaseEntry(it);
  return released;
}

absl::StatusOr<RegionRegistry::WindowLease> RegionRegistry::ReserveWindow(const RegionOwner& owner,
                                                                          const std::string& region_id, uint64_t offset,
                                                                          uint64_t bytes) {
  MutexLock lock(&mu_);
  CAKE_ASSIGN_OR_RETURN(Entry* const entry, FindOwned(owner, region_id));
  Entry& e = *entry;
  CAKE_RETURN_IF_ERROR(CheckRange(e.region->size(), offset, bytes));
  if (bytes > 0) {
    for (const auto& [lease, w] : e.windows) {
      if (offset < w.end && w.begin < offset + bytes) {
        return absl::FailedPreconditionError(
            absl::StrCat("bytes [", offset, ", ", offset + bytes, ") of region ", region_id, " overlap the window [",
                         w.begin, ", ", w.end, ") of another live load; give each concurrent load its own window"));
      }
    }
  }
  WindowLease lease;
  lease.registry_ = this;
  lease.region_id_ = region_id;
  lease.lease_id_ = next_lease_++;
  lease.region_ = e.region;
  e.windows.emplace(lease.lease_id_, Window{offset, offset + bytes});
  return lease;
}

absl::StatusOr<std::shared_ptr<Region>> RegionRegistry::Get(const RegionOwner& owner, const std::string& region_id) {
  MutexLock lock(&mu_);
  CAKE_ASSIGN_OR_RETURN(Entry* const entry, FindOwned(owner, region_id));
  return entry->region;
}

absl::StatusOr<uint64_t> RegionRegistry::Size(const RegionOwner& owner, const std::string& region_id) {
  CAKE_ASSIGN_OR_RETURN(const std::shared_ptr<Region> region, Get(owner, region_id));
  return region->size();
}

absl::Status RegionRegistry::Renew(const RegionOwner& owner, const std::string& region_id) {
  MutexLock lock(&mu_);
  return FindOwned(owner, region_id).status();
}

std::vector<RegionRegistry::Expired> RegionRegistry::ReleaseExpired() {
  std::vector<Expired> released;
  std::vector<std::shared_ptr<Region>> last_refs;  // unmapped outside the lock
  const TimePoint now = clock_->Now();
  MutexLock lock(&mu_);
  for (auto it = regions_.begin(); it != regions_.end();) {
    Entry& e = it->second;
    // A released region has windows, so it waits here for its last one.
    if (e.lease_ends > now || !e.windows.empty()) {
      ++it;
      continue;
    }
    released.push_back(Expired{e.owner, it->first, e.region->size()});
    last_refs.push_back(ReleaseEntry(it++));
  }
  return released;
}

void RegionRegistry::CreditPause(std::chrono::nanoseconds paused) {
  if (paused <= std::chrono::nanoseconds::zero()) return;
  MutexLock lock(&mu_);
  for (auto& [id, e] : regions_) {
    e.lease_ends += std::chrono::duration_cast<TimePoint::duration>(paused);
  }
}

void RegionRegistry::EndLease(const std::string& region_id, uint64_t lease_id) {
  std::shared_ptr<Region> released_ref;  // dropped outside the lock (the lease itself holds another)
  MutexLock lock(&mu_);
  auto it = regions_.find(region_id);
  if (it == regions_.end()) return;
  Entry& e = it->second;
  e.windows.erase(lease_id);
  if (e.released) {
    if (!e.windows.empty()) return;
    // Its last load ended: the memory goes, and the room it held under the limits with it.
    --released_in_use_;
    released_in_use_bytes_ -= e.region->size();
    released_ref = ReleaseEntry(it);
    return;
  }
  // The load kept its region alive however long it ran; its owner gets a whole lease from its end.
  it->second.lease_ends = std::max(it->second.lease_ends, clock_->Now() + limits_.lease);
}

RegionRegistry::WindowLease& RegionRegistry::WindowLease::operator=(WindowLease&& o) noexcept {
  if (this != &o) {
    if (registry_ != nullptr) registry_->EndLease(region_id_, lease_id_);
    registry_ = std::exchange(o.registry_, nullptr);
    region_id_ = std::move(o.region_id_);
    lease_id_ = o.lease_id_;
    region_ = std::move(o.region_);
  }
  return *this;
}

RegionRegistry::WindowLease::~WindowLease() {
  if (registry_ != nullptr) registry_->EndLease(region_id_, lease_id_);
}

void RegionRegistry::Clear() {
  absl::flat_hash_map<std::string, Entry> doomed;
  {
    MutexLock lock(&mu_);
    doomed.swap(regions_);
    held_bytes_ = 0;
    released_in_use_ = 0;
    released_in_use_bytes_ = 0;
  }
}

size_t RegionRegistry::count() const {
  MutexLock lock(&mu_);
  return regions_.size();
}

uint64_t RegionRegistry::total_bytes() const {
  MutexLock lock(&mu_);
  return held_bytes_;
}

RegionRegistry::Totals RegionRegistry::totals() const {
  MutexLock lock(&mu_);
  return Totals{regions_.size(), held_bytes_, released_in_use_, released_in_use_bytes_};
}

}  // namespace cake
