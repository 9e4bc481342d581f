#include "server/inline_budget.h"

#include <utility>

namespace cake {

bool InlineBudget::TakeOrWait(uint64_t bytes, std::function<void()> on_room) {
  MutexLock lock(&mu_);
  // A chunk larger than the whole budget still goes when nothing else is held, so no load waits for ever.
  if (held_ + bytes <= capacity_ || held_ == 0) {
    held_ += bytes;
    return true;
  }
  waiting_.push_back(std::move(on_room));
  return false;
}

void InlineBudget::Give(uint64_t bytes) {
  if (bytes == 0) return;
  std::deque<std::function<void()>> woken;
  {
    MutexLock lock(&mu_);
    held_ -= bytes;
    // Everyone waiting tries again: the first ones in line take what fits, the others queue up anew.
    woken.swap(waiting_);
  }
  for (auto& wake : woken) wake();
}

uint64_t InlineBudget::held() const {
  MutexLock lock(&mu_);
  return held_;
}

}  // namespace cake
