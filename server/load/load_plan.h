// What the Load stream asks the planner and tells the client about one load: the planner's request from the
// load's request and the tiers, and the stream's Plan and Done messages.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cake/v1/kv.pb.h"
#include "scheduler/load_cursor.h"
#include "scheduler/planner.h"
#include "scheduler/tier_speeds.h"
#include "server/load/engine_requests.h"

namespace cake {

// Each chunk at its own tier's measured speed, the engine's hints, and what its earlier loads were seen to cost.
LoadPlanRequest PlanRequestFor(const LoadRequest& request, std::vector<TierKind> chunk_tiers, uint32_t lowest_loadable,
                               const TierSpeeds& speeds, const ComputeModel& history);

// `window_first`: the first chunk the region window fits (clients place chunks by it, whatever the engine holds).
v1::LoadResponse PlanMessage(const std::string& load_id, const LoadRequest& request,
                             std::span<const TierKind> chunk_tiers, uint32_t window_first,
                             const PlanDecision& decision);

v1::LoadResponse DoneMessage(const LoadCursor& cursor, uint32_t meeting);

// Chunk `chunk` landed: its bytes (inline loads), or where in the region.
v1::LoadResponse LoadedMessage(uint32_t chunk, uint64_t chunk_bytes, std::string inline_bytes, uint64_t region_offset);

}  // namespace cake
