// The judge: under Cake, whether a read issued now still lands before the engine computes its chunk itself. Pure
// logic on the plan's compute model and the time since the engine's last Progress, passed in, so every case runs
// on a fake clock in tests.
#pragma once

#include <cstdint>
#include <optional>

#include "scheduler/planner.h"

namespace cake {

struct ReadJudgeInput {
  bool cake = true;              // the load's strategy is Cake (the other strategies issue every read)
  uint32_t chunk = 0;            // the read in question
  uint32_t queued = 0;           // reads of the same tier issued before it and not yet done
  uint32_t planned_meeting = 0;  // where the plan told the engine to stop and wait; 0: no prediction
  uint32_t engine_through = 0;   // chunks the engine reported computed (or holds)
  double load_chunk_s = 0;       // one chunk's read time at its tier's measured speed; 0: unmeasured
  double since_progress_s = 0;   // seconds since the engine's last Progress (or the load's start)
  bool reads_in_flight = false;  // the load has a read outstanding, whose completion asks again
};

struct ReadVerdict {
  bool issue = true;
  // When a read is turned down with nothing in flight, ask again after this many seconds: the point at which the
  // engine counts as stalled (nothing else would wake the load before its next Progress).
  std::optional<double> recheck_after_s;
};

// A read that would land after the engine has computed the chunk is wasted I/O and worse: the load cannot end
// while it is in flight (it writes into the engine's pages), so it delays the engine's Release by up to a chunk's
// load time. Judged from the compute model the plan used and the engine's last Progress; an engine more than two
// chunks' time behind that model has stalled or slowed, and every read is worth issuing again. Chunks at or above
// the planned meeting are never computed by the engine (it waits there), so their reads always go out.
ReadVerdict JudgeRead(const ReadJudgeInput& input, const ComputeModel& plan_compute);

}  // namespace cake
