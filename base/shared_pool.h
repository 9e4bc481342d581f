// A pool several principals draw from at once (load slots, inline bytes, region bytes and counts): what each may
// take. Each holder has a cap of its own, and the last eighth of the pool is kept for holders that hold little of
// it (under a sixty-fourth), so however much a few principals take, the next one still gets in: with the pool's
// default per-holder cap of three quarters, two principals fill at most seven eighths, and every newcomer may
// take from the rest until it holds a sixty-fourth.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

namespace cake {

struct SharedPool {
  enum class Verdict { kFits, kPoolFull, kHolderFull, kReserved };

  uint64_t capacity = 0;
  uint64_t per_holder = UINT64_MAX;

  uint64_t reserve() const { return capacity / 8; }
  // Below this a holder may still take from the reserve.
  uint64_t small() const { return std::max<uint64_t>(1, capacity / 64); }

  // Whether a holder holding `held`, while the pool has `used` taken in all, may take `amount` more.
  Verdict Check(uint64_t used, uint64_t held, uint64_t amount) const {
    if (used > capacity || amount > capacity - used) return Verdict::kPoolFull;
    if (held > per_holder || amount > per_holder - held) return Verdict::kHolderFull;
    if (used + amount > capacity - reserve() && held >= small()) return Verdict::kReserved;
    return Verdict::kFits;
  }

  // Why a holder was refused, for a message: "<what> kept for principals holding under N".
  std::string ReserveNote(const std::string& unit) const {
    return "the last " + std::to_string(reserve()) + " " + unit +
           " of the pool are kept for principals holding under " + std::to_string(small());
  }
};

}  // namespace cake
