#include "server/load/load_plan.h"

#include "proto/wire_enums.h"

namespace cake {

LoadPlanRequest PlanRequestFor(const LoadRequest& request, std::vector<TierKind> chunk_tiers, uint32_t lowest_loadable,
                               const TierSpeeds& speeds, const ComputeModel& history) {
  LoadPlanRequest out;
  for (TierKind kind : chunk_tiers) {
    out.tier_chunk_s[static_cast<size_t>(kind)] =
        speeds.SecondsPerByte(kind) * static_cast<double>(request.chunk_bytes());
  }
  out.chunk_tiers = std::move(chunk_tiers);
  out.lowest_loadable = lowest_loadable;
  out.io_only_requested = request.io_only_requested;
  out.hint_first_chunk_s = request.hint_first_chunk_s;
  out.hint_growth_s = request.hint_growth_s;
  out.history = history;
  return out;
}

v1::LoadResponse PlanMessage(const std::string& load_id, const LoadRequest& request,
                             std::span<const TierKind> chunk_tiers, uint32_t window_first,
                             const PlanDecision& decision) {
  v1::LoadResponse response;
  v1::LoadPlan* plan = response.mutable_plan();
  plan->set_load_id(load_id);
  plan->set_total_chunks(static_cast<uint32_t>(request.keys.size()));
  plan->set_cached_chunks(static_cast<uint32_t>(chunk_tiers.size()));
  for (TierKind kind : chunk_tiers) plan->add_chunk_tiers(ToWire(kind));
  plan->set_lowest_loadable(window_first);
  plan->set_chunk_bytes(request.chunk_bytes());
  plan->set_strategy(ToWire(decision.strategy));
  if (decision.meeting_chunk) plan->set_predicted_meeting_chunk(*decision.meeting_chunk);
  if (decision.cake_s) plan->set_predicted_cake_s(*decision.cake_s);
  if (decision.compute_only_s) plan->set_predicted_compute_only_s(*decision.compute_only_s);
  if (decision.io_only_s) plan->set_predicted_io_only_s(*decision.io_only_s);
  return response;
}

v1::LoadResponse DoneMessage(const LoadCursor& cursor, uint32_t meeting) {
  v1::LoadResponse response;
  v1::LoadDone* done = response.mutable_done();
  done->set_meeting_chunk(meeting);
  done->set_loaded_chunks(cursor.cached_chunks() - meeting);
  done->set_failed_chunks(cursor.failed());
  return response;
}

v1::LoadResponse LoadedMessage(uint32_t chunk, uint64_t chunk_bytes, std::string inline_bytes, uint64_t region_offset) {
  v1::LoadResponse response;
  v1::ChunkLoaded* message = response.mutable_loaded();
  message->set_chunk(chunk);
  message->set_bytes(chunk_bytes);
  if (!inline_bytes.empty()) {
    message->set_data(std::move(inline_bytes));
  } else {
    message->set_region_offset(region_offset);
  }
  return response;
}

}  // namespace cake
