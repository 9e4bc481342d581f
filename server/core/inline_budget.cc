#include "server/core/inline_budget.h"

#include <algorithm>
#include <utility>

#include "base/shared_pool.h"

namespace cake {

bool InlineBudget::TakeOrWait(uint64_t bytes, std::function<void()> on_room, const std::string& holder) {
  MutexLock lock(&mu_);
  auto mine = held_by_.find(holder);
  const uint64_t holder_held = mine == held_by_.end() ? 0 : mine->second;
  // A chunk larger than the whole budget (or the holder's share) still goes when nothing else is held (by the
  // holder), so no load waits for ever.
  const bool fits_all = held_ + bytes <= capacity_ || held_ == 0;
  const bool fits_share = holder_held + bytes <= per_holder_capacity_ || holder_held == 0;
  // The last eighth waits for holders that hold little: a few slow readers cannot leave the next caller nothing.
  const bool fits_reserve =
      SharedPool{capacity_, per_holder_capacity_}.Check(held_, holder_held, bytes) != SharedPool::Verdict::kReserved ||
      holder_held == 0;
  if (fits_all && fits_share && fits_reserve) {
    held_ += bytes;
    held_by_[holder] = holder_held + bytes;
    return true;
  }
  waiting_.push_back(std::move(on_room));
  return false;
}

void InlineBudget::Give(uint64_t bytes, const std::string& holder) {
  if (bytes == 0) return;
  std::deque<std::function<void()>> woken;
  {
    MutexLock lock(&mu_);
    held_ -= bytes;
    if (auto mine = held_by_.find(holder); mine != held_by_.end()) {
      mine->second -= std::min(mine->second, bytes);
      if (mine->second == 0) held_by_.erase(mine);
    }
    // Everyone waiting tries again: the first ones in line take what fits, the others queue up anew.
    woken.swap(waiting_);
  }
  for (auto& wake : woken) wake();
}

uint64_t InlineBudget::held() const {
  MutexLock lock(&mu_);
  return held_;
}

uint64_t InlineBudget::held_by(const std::string& holder) const {
  MutexLock lock(&mu_);
  auto mine = held_by_.find(holder);
  return mine == held_by_.end() ? 0 : mine->second;
}

}  // namespace cake
