// One budget for the chunk bytes every inline load holds in the daemon's memory: read (or being read) and not yet
// handed to gRPC. A load's window bounds its own; this bounds them all together, so many clients that read slowly
// (or not at all, until their idle timeout) cannot make the daemon hold more than loader.max_inline_bytes.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "base/mutex.h"

namespace cake {

class InlineBudget {
 public:
  explicit InlineBudget(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  // Takes `bytes` when they fit. Otherwise keeps `on_room` and calls it (once, on the thread of a later Give,
  // with no lock held) when bytes come back; the caller then tries again. Deciding and queueing are one step, so
  // a Give between them cannot be missed.
  bool TakeOrWait(uint64_t bytes, std::function<void()> on_room);
  void Give(uint64_t bytes);

  uint64_t held() const;
  uint64_t capacity() const { return capacity_; }

 private:
  const uint64_t capacity_;
  mutable Mutex mu_;
  uint64_t held_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::function<void()>> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cake
