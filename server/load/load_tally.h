// What one load adds to the daemon's telemetry: the counters Stats shows, its (tenant, model) series and the
// latency histograms /metrics shows, and the tier speed a single-tier load measured for the planner.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "base/clock.h"
#include "base/strategy.h"
#include "scheduler/load_cursor.h"
#include "server/core/daemon_state.h"

namespace cake {

class LoadTally {
 public:
  explicit LoadTally(DaemonState& state) : state_(state) {}

  void Started(TimePoint now, std::string_view tenant, std::string_view model);
  void Planned(Strategy strategy, TimePoint now);
  void ReadIssued(TimePoint now);
  void ReadDone(const absl::Status& status, TimePoint now);
  void ChunkLanded(uint64_t chunk_bytes, TimePoint now);
  // The split is final at `meeting`. A load whose reads all came from one tier measured it (`tier`), for the
  // planner's next loads.
  void Met(const LoadCursor& cursor, uint32_t meeting, size_t total_chunks, uint64_t chunk_bytes,
           std::optional<TierKind> single_tier, TimePoint now);

  uint64_t chunks_read() const { return chunks_read_; }
  double SecondsSinceStart(TimePoint now) const { return std::chrono::duration<double>(now - started_).count(); }

 private:
  DaemonState& state_;
  LoadMetrics::Series* series_ = nullptr;  // the load's (tenant, model), from Started
  TimePoint started_;
  std::optional<TimePoint> first_read_;
  TimePoint last_read_;
  uint64_t chunks_read_ = 0;
  bool landed_any_ = false;
};

}  // namespace cake
