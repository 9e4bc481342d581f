#include "server/load/load_tally.h"

namespace cake {

void LoadTally::Started(TimePoint now, std::string_view tenant, std::string_view model) {
  started_ = now;
  series_ = &state_.load_metrics.For(tenant, model);
}

void LoadTally::Planned(Strategy strategy, TimePoint now) {
  Bump(state_.counters.loads_started);
  if (const auto i = static_cast<size_t>(strategy); i < series_->loads.size()) Bump(series_->loads[i]);
  state_.load_metrics.plan_seconds.Observe(SecondsSinceStart(now));
}

void LoadTally::ReadIssued(TimePoint now) {
  if (!first_read_) first_read_ = now;
}

void LoadTally::ReadDone(const absl::Status& status, TimePoint now) {
  last_read_ = now;
  if (status.ok()) {
    ++chunks_read_;
  } else {
    state_.counters.CountReadFailure(static_cast<int>(status.code()));
  }
}

void LoadTally::ChunkLanded(uint64_t chunk_bytes, TimePoint now) {
  if (!landed_any_) {
    landed_any_ = true;
    state_.load_metrics.first_chunk_seconds.Observe(SecondsSinceStart(now));
  }
  Bump(state_.counters.load_chunks_loaded);
  Bump(state_.counters.load_bytes_loaded, chunk_bytes);
}

void LoadTally::Met(const LoadCursor& cursor, uint32_t meeting, size_t total_chunks, uint64_t chunk_bytes,
                    std::optional<TierKind> single_tier, TimePoint now) {
  const uint32_t cached = cursor.cached_chunks();
  Bump(state_.counters.loads_finished);
  Bump(state_.counters.load_chunks_computed, meeting);
  series_->duration_seconds.Observe(SecondsSinceStart(now));
  if (cached > 0) series_->loaded_share.Observe(static_cast<double>(cached - meeting) / cached);
  Bump(series_->chunks_loaded, cached - meeting);
  Bump(series_->chunks_computed, meeting);
  Bump(series_->chunks_failed, cursor.failed());
  Bump(series_->chunks_uncached, total_chunks - cached);
  if (first_read_ && chunks_read_ > 0 && single_tier) {
    const double seconds = std::chrono::duration<double>(last_read_ - *first_read_).count();
    state_.tier_speeds.Record(*single_tier, chunks_read_ * chunk_bytes, seconds);
  }
}

}  // namespace cake
