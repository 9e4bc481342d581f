// The per-request Cake loader: a cursor that reads cached chunks from the tail backward, a window of reads in
// flight, and detection of the point where it meets the engine's forward compute. Pure logic: no threads, no
// I/O, no clock, so every interleaving can be tested.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "keys/tier_kind.h"

namespace cake {

class LoadCursor {
 public:
  struct Options {
    uint32_t cached_chunks = 0;    // H: chunks [0, H) are in some tier
    uint32_t lowest_loadable = 0;  // chunks below it have no room in the region: the engine computes them
    uint32_t window = 4;           // reads in flight at once, per class of chunk
    bool follow_progress = true;   // false for I/O-only loads: load everything, whatever the engine computed
    // The tier holding each chunk, or empty for one tier. Each tier gets its own window, so chunks in different
    // tiers are read at the same time: the load gets the sum of the tiers' bandwidths, and chunks in DRAM are not
    // held up behind slower reads.
    std::vector<TierKind> chunk_tiers;
  };

  explicit LoadCursor(const Options& options);

  // The next chunk to start reading: the highest unread one whose class has room in its window; nullopt when
  // none has, or no unread chunk is still useful. Never returns a chunk the engine has already reported computed.
  // `worth(chunk, reads_in_flight_of_its_class)`, when given, may turn a candidate down (a read that would land
  // after the engine computed the chunk anyway); whoever judges so while nothing is in flight must ask again
  // later, or the load stops moving.
  std::optional<uint32_t> NextRead(const std::function<bool(uint32_t, uint32_t)>& worth = nullptr);

  // A read finished. Returns the chunks that just joined the contiguous loaded suffix [loaded_low(), H) and the
  // engine still needs (not yet computed), highest first. A failed read makes that chunk, and every chunk below
  // it, the engine's to compute.
  std::vector<uint32_t> OnReadDone(uint32_t chunk, bool ok);

  // The engine has computed chunks [0, computed_through).
  void OnProgress(uint32_t computed_through);

  // Once the split is final: the meeting chunk m. The engine computes [0, m) and uses loaded [m, H).
  std::optional<uint32_t> Meeting() const;

  uint32_t cached_chunks() const { return options_.cached_chunks; }
  uint32_t loaded_low() const { return low_; }
  uint32_t computed_through() const { return computed_; }
  uint32_t in_flight() const { return in_flight_; }
  uint32_t failed() const { return failed_; }
  // Reads issued for chunks that ended up computed anyway (wasted I/O), known once the split is final.
  uint32_t wasted_reads() const;

 private:
  enum class State : uint8_t { kUnread, kReading, kLoaded, kFailed };

  // Chunks below this are not worth reading: no room, a failed read above them, or already computed.
  uint32_t Floor() const;
  // Fixes the meeting the first time the split is final, so later progress or completions cannot move it.
  void SettleMeeting();

  // The window a chunk counts against: its tier's (one per TierKind value; kNone when no tiers were given).
  uint8_t ClassOf(uint32_t chunk) const {
    const auto tier = options_.chunk_tiers.empty() ? 0 : static_cast<size_t>(options_.chunk_tiers[chunk]);
    return static_cast<uint8_t>(tier < kTierKinds ? tier : 0);
  }

  Options options_;
  std::vector<State> state_;
  uint32_t top_unread_;  // every chunk in [top_unread_, H) has been issued
  std::vector<uint32_t> class_in_flight_;
  uint32_t low_;  // chunks [low_, H) are loaded
  uint32_t failure_floor_ = 0;
  uint32_t computed_ = 0;
  uint32_t in_flight_ = 0;
  uint32_t failed_ = 0;
  std::optional<uint32_t> meeting_;
};

}  // namespace cake
