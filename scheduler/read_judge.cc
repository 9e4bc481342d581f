#include "scheduler/read_judge.h"

#include <algorithm>

namespace cake {
namespace {

ReadVerdict TurnDown(std::optional<double> recheck_after_s = std::nullopt) {
  ReadVerdict verdict;
  verdict.issue = false;
  verdict.recheck_after_s = recheck_after_s;
  return verdict;
}

}  // namespace

ReadVerdict JudgeRead(const ReadJudgeInput& in, const ComputeModel& plan_compute) {
  if (!in.cake || !plan_compute.known()) return {};
  if (in.chunk >= in.planned_meeting) return {};
  if (!(in.load_chunk_s > 0)) return {};  // an unmeasured tier: nothing to judge by, and the read teaches its speed
  if (in.chunk < in.engine_through) return TurnDown();  // computed already (a cursor normally skips these)
  const double stalled_after_s = 2 * plan_compute.RangeSeconds(in.engine_through, in.engine_through + 1);
  if (in.since_progress_s > stalled_after_s) return {};
  const double engine_done_s = plan_compute.RangeSeconds(in.engine_through, in.chunk + 1);
  const double read_done_s = in.since_progress_s + (in.queued + 1) * in.load_chunk_s;
  if (read_done_s <= engine_done_s) return {};
  if (in.reads_in_flight) return TurnDown();  // its completion asks again
  return TurnDown(std::max(stalled_after_s - in.since_progress_s, 0.0) + 1e-3);
}

}  // namespace cake
