#include "server/core/unstarted_streams.h"

#include "absl/strings/str_cat.h"
#include "base/shared_pool.h"

namespace cake {

absl::StatusOr<UnstartedStreams::Slot> UnstartedStreams::Take(const std::string& holder) {
  MutexLock lock(&mu_);
  uint32_t& held = by_holder_[holder];
  const SharedPool pool{total_, per_principal_};
  switch (pool.Check(open_, held, 1)) {
    case SharedPool::Verdict::kFits:
      ++held;
      ++open_;
      return Slot(this, holder);
    case SharedPool::Verdict::kPoolFull:
      if (held == 0) by_holder_.erase(holder);
      return absl::ResourceExhaustedError(absl::StrCat("the daemon holds loader.max_unstarted_streams (", total_,
                                                       ") Load streams without a Start; send Start at once, or "
                                                       "retry shortly"));
    case SharedPool::Verdict::kHolderFull:
      if (held == 0) by_holder_.erase(holder);
      return absl::ResourceExhaustedError(
          absl::StrCat(holder, " holds loader.max_unstarted_streams_per_principal (", per_principal_,
                       ") Load streams without a Start; send Start on those, or end them"));
    case SharedPool::Verdict::kReserved:
      break;
  }
  return absl::ResourceExhaustedError(
      absl::StrCat(holder, " holds ", held, " Load streams without a Start and the daemon ", open_, " of ", total_,
                   " (loader.max_unstarted_streams): ", pool.ReserveNote("streams"), "; retry shortly"));
}

void UnstartedStreams::Give(const std::string& holder) {
  MutexLock lock(&mu_);
  auto it = by_holder_.find(holder);
  if (it == by_holder_.end()) return;
  --open_;
  if (--it->second == 0) by_holder_.erase(it);
}

uint32_t UnstartedStreams::open() const {
  MutexLock lock(&mu_);
  return open_;
}

}  // namespace cake
