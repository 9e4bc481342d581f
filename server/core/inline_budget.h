// One budget for the chunk bytes every inline load holds in the daemon's memory: read (or being read) and not yet
// handed to gRPC. A load's window bounds its own; this bounds them all together, so many clients that read slowly
// (or not at all, until their idle timeout) cannot make the daemon hold more than loader.max_inline_bytes.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "base/mutex.h"

namespace cake {

class InlineBudget {
 public:
  // `per_holder_bytes`: what one holder (a principal) may hold of it, so one caller that reads slowly cannot make
  // every other caller's inline loads wait.
  explicit InlineBudget(uint64_t capacity_bytes, uint64_t per_holder_bytes = std::numeric_limits<uint64_t>::max())
      : capacity_(capacity_bytes), per_holder_capacity_(per_holder_bytes) {}

  // Takes `bytes` for `holder` when they fit both the whole budget and the holder's share. Otherwise keeps
  // `on_room` and calls it (once, on the thread of a later Give, with no lock held) when bytes come back; the
  // caller then tries again. Deciding and queueing are one step, so a Give between them cannot be missed.
  bool TakeOrWait(uint64_t bytes, std::function<void()> on_room, const std::string& holder = "");
  void Give(uint64_t bytes, const std::string& holder = "");

  uint64_t held() const;
  uint64_t held_by(const std::string& holder) const;
  uint64_t capacity() const { return capacity_; }

 private:
  const uint64_t capacity_;
  const uint64_t per_holder_capacity_;
  mutable Mutex mu_;
  uint64_t held_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, uint64_t> held_by_ ABSL_GUARDED_BY(mu_);
  std::deque<std::function<void()>> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cake
