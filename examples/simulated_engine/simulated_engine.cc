// The simulated engine's Cake and compute-only runs and its oracle split (see simulated_engine.h).
#include "examples/simulated_engine/simulated_engine.h"

#include <limits>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace cake::sim {

absl::StatusOr<CakeRun> TimedCake(Client& client, const LoadOptions& base, GridEngine& engine, uint32_t tokens,
                                  uint32_t chunk_tokens) {
  LoadOptions load = base;
  load.io_only = false;
  load.compute_first_chunk_s = engine.HintFirstChunk();
  load.compute_growth_s = engine.HintGrowth();
  const Clock::time_point start = Clock::now();
  CAKE_ASSIGN_OR_RETURN(auto started, client.StartLoad(load));
  LoadSession& session = *started;
  absl::Cleanup release = [&] { session.Release().IgnoreError(); };
  CAKE_ASSIGN_OR_RETURN(auto plan, session.WaitPlan());
  CakeRun run;
  run.strategy = StrategyName(plan.strategy);
  // The client library's stepper: compute on, wait at the predicted meeting until its deadline, or stop.
  auto stopped = engine.Run(
      start, [&](uint32_t c) { return session.NextStep(c); }, [&](uint32_t c) { return session.IsResident(c); },
      [&](uint32_t c) { return session.ReportProgress(c); },
      [&](uint32_t c, Clock::time_point deadline) { return session.WaitResidentUntil(c, deadline); });
  if (!stopped.ok()) return stopped.status();
  const double engine_s = harness::SecondsSince(start);
  CAKE_ASSIGN_OR_RETURN(auto done, session.WaitDone());
  run.seconds = std::max(engine_s, harness::SecondsSince(start));
  run.meeting_chunk = done.meeting_chunk;
  if (*stopped < done.meeting_chunk * chunk_tokens) {
    return absl::InternalError(absl::StrCat("the engine stopped at token ", *stopped, " below the meeting chunk ",
                                            done.meeting_chunk,
                                            ": chunks in between were neither computed nor "
                                            "loaded"));
  }
  std::move(release).Cancel();
  CAKE_RETURN_IF_ERROR(session.Release());
  return run;
}

double OracleSeconds(const GridEngine& engine, double time_scale, uint32_t chunks, uint32_t chunk_tokens,
                     double chunk_load_s) {
  double best = std::numeric_limits<double>::infinity();
  for (uint32_t m = 0; m <= chunks; ++m) {
    const double compute = engine.Seconds(0, static_cast<double>(m) * chunk_tokens) * time_scale;
    best = std::min(best, std::max(compute, chunk_load_s * (chunks - m)));
  }
  return best;
}

absl::StatusOr<double> TimedComputeOnly(GridEngine& engine, uint32_t tokens) {
  const Clock::time_point start = Clock::now();
  const uint32_t chunks = (tokens + engine.chunk_tokens() - 1) / engine.chunk_tokens();
  auto computed = engine.Run(
      start,
      [chunks](uint32_t) -> absl::StatusOr<FrontStep> {
        return FrontStep{FrontStep::Action::kCompute, {}, chunks};
      },
      [](uint32_t) { return false; }, [](uint32_t) { return absl::OkStatus(); },
      [](uint32_t, Clock::time_point) { return false; });
  if (!computed.ok()) return computed.status();
  return harness::SecondsSince(start);
}

}  // namespace cake::sim
