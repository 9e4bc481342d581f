#include "server/core/load_tracker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/shared_pool.h"

namespace cake {

absl::StatusOr<uint64_t> LoadTracker::TryAdd(const LoadCaps& caps, LoadOwner owner, CancelFn cancel,
                                             std::function<std::optional<LoadSummary>()> describe) {
  MutexLock lock(&mu_);
  if (loads_.size() >= caps.total) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the daemon is running limits.max_concurrent_loads (", caps.total, ") loads; retry shortly"));
  }
  uint32_t& principal_loads = per_principal_[owner.fairness_key];
  const SharedPool slots{caps.total, caps.per_principal};
  const SharedPool::Verdict verdict = slots.Check(loads_.size(), principal_loads, 1);
  if (verdict != SharedPool::Verdict::kFits) {
    if (principal_loads == 0) per_principal_.erase(owner.fairness_key);
    if (verdict == SharedPool::Verdict::kReserved) {
      return absl::ResourceExhaustedError(absl::StrCat(
          owner.fairness_key, " is running ", principal_loads, " loads and the daemon ", loads_.size(), " of ",
          caps.total, " (limits.max_concurrent_loads): ", slots.ReserveNote("slots"), " loads; retry shortly"));
    }
    return absl::ResourceExhaustedError(absl::StrCat(owner.fairness_key,
                                                     " is running limits.max_concurrent_loads_per_principal (",
                                                     caps.per_principal, ") loads; end one, or retry shortly"));
  }
  auto client_key = std::make_pair(owner.fairness_key, owner.client_id);
  uint32_t& client_loads = per_client_[client_key];
  if (client_loads >= caps.per_client) {
    if (client_loads == 0) per_client_.erase(client_key);
    if (principal_loads == 0) per_principal_.erase(owner.fairness_key);
    return absl::ResourceExhaustedError(absl::StrCat("client \"", owner.client_id,
                                                     "\" is running limits.max_concurrent_loads_per_client (",
                                                     caps.per_client, ") loads; end one, or retry shortly"));
  }
  ++principal_loads;
  ++client_loads;
  const uint64_t ticket = next_++;
  loads_.emplace(ticket, Live{std::move(owner), std::move(cancel), std::move(describe)});
  return ticket;
}

void LoadTracker::Remove(uint64_t ticket) {
  MutexLock lock(&mu_);
  auto it = loads_.find(ticket);
  if (it == loads_.end()) return;
  const LoadOwner& owner = it->second.owner;
  if (auto p = per_principal_.find(owner.fairness_key); p != per_principal_.end() && --p->second == 0) {
    per_principal_.erase(p);
  }
  if (auto c = per_client_.find(std::make_pair(owner.fairness_key, owner.client_id));
      c != per_client_.end() && --c->second == 0) {
    per_client_.erase(c);
  }
  loads_.erase(it);
}

size_t LoadTracker::CancelIf(const std::function<std::optional<absl::Status>(const LoadOwner&)>& verdict) {
  std::vector<std::pair<CancelFn, absl::Status>> cancels;
  {
    MutexLock lock(&mu_);
    for (auto& [ticket, live] : loads_) {
      if (std::optional<absl::Status> why = verdict(live.owner)) cancels.emplace_back(live.cancel, std::move(*why));
    }
  }
  // Outside the lock: a cancelled load leaves the tracker on its way out.
  for (auto& [cancel, why] : cancels) cancel(why);
  return cancels.size();
}

void LoadTracker::CancelAll(const absl::Status& why) {
  CancelIf([&](const LoadOwner&) -> std::optional<absl::Status> { return why; });
}

size_t LoadTracker::CancelUsingRegion(const std::string& region_id, const absl::Status& why) {
  return CancelIf([&](const LoadOwner& owner) -> std::optional<absl::Status> {
    if (owner.region_id != region_id) return std::nullopt;
    return why;
  });
}

size_t LoadTracker::CancelRevoked(const AccessPolicy& policy) {
  return CancelIf([&](const LoadOwner& owner) -> std::optional<absl::Status> {
    absl::StatusOr<Caller> now = policy.Identify(owner.peer);
    const std::string who = owner.principal.empty() ? "this caller" : owner.principal;
    if (!now.ok() || now->principal->name != owner.principal || !now->principal->Has(Role::kEngine)) {
      return absl::PermissionDeniedError(absl::StrCat("the daemon's access policy was reloaded and no longer lets ",
                                                      who, " load; the load is ended: compute the rest of the prompt"));
    }
    const Principal& principal = *now->principal;
    if (!owner.tenant.empty() && !principal.any_tenant &&
        std::find(principal.tenants.begin(), principal.tenants.end(), owner.tenant) == principal.tenants.end()) {
      return absl::PermissionDeniedError(absl::StrCat("the daemon's access policy was reloaded and no longer gives ",
                                                      who, " the tenant \"", owner.tenant,
                                                      "\"; the load is ended: compute the rest of the prompt"));
    }
    return std::nullopt;
  });
}

uint32_t LoadTracker::active() const {
  MutexLock lock(&mu_);
  return static_cast<uint32_t>(loads_.size());
}

std::vector<LoadSummary> LoadTracker::List() const {
  std::vector<std::function<std::optional<LoadSummary>()>> describes;
  {
    MutexLock lock(&mu_);
    for (const auto& [ticket, live] : loads_) {
      if (live.describe) describes.push_back(live.describe);
    }
  }
  // Outside the lock: a load takes its own lock to describe itself, and holds it when it calls TryAdd or Remove.
  std::vector<LoadSummary> out;
  for (const auto& describe : describes) {
    if (std::optional<LoadSummary> summary = describe()) out.push_back(std::move(*summary));
  }
  std::sort(out.begin(), out.end(), [](const LoadSummary& a, const LoadSummary& b) { return a.age_s > b.age_s; });
  return out;
}

}  // namespace cake
