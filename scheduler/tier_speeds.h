// What loads measured of each tier's read speed, read by the planner (the load side of a split) and the read judge
// (whether a read still beats the engine). Learned from whole loads (LoadTally), forgotten when a tier's speed is
// changed on purpose (a new read cap).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "keys/tier_kind.h"

namespace cake {

class TierSpeeds {
 public:
  // A load moved `bytes` from `kind` in `seconds` of wall time with its window of reads in flight. Samples that say
  // nothing (no bytes, no time) are ignored rather than dragging the average to 0 or infinity.
  void Record(TierKind kind, uint64_t bytes, double seconds) {
    if (bytes == 0 || seconds <= 0) return;
    std::atomic<double>& slot = slots_[Index(kind)];
    const double sample = seconds / static_cast<double>(bytes);
    const double old = slot.load(std::memory_order_relaxed);
    // A moving average: recent loads count most, one outlier does not swing the planner.
    slot.store(old == 0 ? sample : 0.7 * old + 0.3 * sample, std::memory_order_relaxed);
  }
  // Seconds per byte that loads from `kind` achieved lately, or 0 when nothing was measured yet.
  double SecondsPerByte(TierKind kind) const { return slots_[Index(kind)].load(std::memory_order_relaxed); }
  // Drops what loads from `kind` measured (its speed changed, e.g. a new read cap): 0 until the next load.
  void Forget(TierKind kind) { slots_[Index(kind)].store(0, std::memory_order_relaxed); }

 private:
  static size_t Index(TierKind kind) {
    const auto i = static_cast<size_t>(kind);
    return i < kTierKinds ? i : 0;
  }
  std::array<std::atomic<double>, kTierKinds> slots_{};
};

}  // namespace cake
