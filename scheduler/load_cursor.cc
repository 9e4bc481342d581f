#include "scheduler/load_cursor.h"

#include <algorithm>
#include <limits>

namespace cake {

LoadCursor::LoadCursor(const Options& options)
    : options_(options),
      state_(options.cached_chunks, State::kUnread),
      top_unread_(options.cached_chunks),
      low_(options.cached_chunks) {
  options_.lowest_loadable = std::min(options_.lowest_loadable, options_.cached_chunks);
  if (options_.window == 0) options_.window = 1;
  if (options_.chunk_tiers.size() != options_.cached_chunks) options_.chunk_tiers.clear();
  uint8_t classes = 1;
  for (size_t c = 0; c < options_.chunk_tiers.size(); ++c) classes = std::max<uint8_t>(classes, ClassOf(c) + 1);
  class_in_flight_.assign(classes, 0);
  SettleMeeting();
}

uint32_t LoadCursor::Floor() const {
  uint32_t floor = std::max(options_.lowest_loadable, failure_floor_);
  if (options_.follow_progress) floor = std::max(floor, computed_);
  return floor;
}

std::optional<uint32_t> LoadCursor::NextRead(const std::function<bool(uint32_t, uint32_t)>& worth) {
  if (Meeting().has_value()) return std::nullopt;
  if (std::none_of(class_in_flight_.begin(), class_in_flight_.end(), [&](uint32_t n) { return n < options_.window; })) {
    return std::nullopt;
  }
  const uint32_t floor = Floor();
  // A class whose highest unread chunk is not worth reading has no lower one worth it either (the engine gets
  // there sooner): the class is passed over from then on.
  uint64_t classes_declined = 0;
  for (uint32_t c = top_unread_; c > floor;) {
    --c;
    const uint8_t cls = ClassOf(c);
    if (state_[c] != State::kUnread || class_in_flight_[cls] >= options_.window) continue;
    if (cls < 64 && (classes_declined >> cls & 1)) continue;
    if (worth && !worth(c, class_in_flight_[cls])) {
      if (cls < 64) classes_declined |= uint64_t{1} << cls;
      continue;
    }
    state_[c] = State::kReading;
    ++class_in_flight_[cls];
    ++in_flight_;
    while (top_unread_ > 0 && state_[top_unread_ - 1] != State::kUnread) --top_unread_;
    return c;
  }
  return std::nullopt;
}

std::vector<uint32_t> LoadCursor::OnReadDone(uint32_t chunk, bool ok) {
  std::vector<uint32_t> newly_loaded;
  if (chunk >= state_.size() || state_[chunk] != State::kReading) return newly_loaded;
  --in_flight_;
  --class_in_flight_[ClassOf(chunk)];
  if (!ok) {
    state_[chunk] = State::kFailed;
    ++failed_;
    failure_floor_ = std::max(failure_floor_, chunk + 1);
    SettleMeeting();
    return newly_loaded;
  }
  state_[chunk] = State::kLoaded;
  // Only a contiguous suffix is usable: the engine computes forward and must find everything above it loaded.
  while (low_ > failure_floor_ && low_ > 0 && state_[low_ - 1] == State::kLoaded) {
    --low_;
    if (!options_.follow_progress || low_ >= computed_) newly_loaded.push_back(low_);
  }
  SettleMeeting();
  return newly_loaded;
}

void LoadCursor::OnProgress(uint32_t computed_through) {
  computed_ = std::max(computed_, computed_through);
  SettleMeeting();
}

std::optional<uint32_t> LoadCursor::Meeting() const { return meeting_; }

void LoadCursor::SettleMeeting() {
  if (meeting_) return;
  const uint32_t h = options_.cached_chunks;
  const uint32_t floor = std::max(options_.lowest_loadable, failure_floor_);
  const bool engine_caught_up = options_.follow_progress && low_ <= computed_;
  const bool cursor_bottomed_out = low_ <= floor;
  if (!engine_caught_up && !cursor_bottomed_out) return;
  uint32_t m = low_;
  if (options_.follow_progress) m = std::max(m, std::min(computed_, h));
  meeting_ = m;
}

uint32_t LoadCursor::wasted_reads() const {
  auto m = Meeting();
  if (!m) return 0;
  uint32_t wasted = 0;
  for (uint32_t i = 0; i < *m && i < state_.size(); ++i) {
    if (state_[i] == State::kLoaded || state_[i] == State::kReading) ++wasted;
  }
  return wasted;
}

}  // namespace cake
