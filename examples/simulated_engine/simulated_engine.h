// The paper's simulated engine (library cake_simulated_engine, beside the cost model in models.h that cake-demo
// --engine simulated uses too), for the benches that need compute beside the daemon's loads (cake-bench grid and
// mixed): the Cake paper's prefill cost model (docs/architecture.md) with a vLLM-style step budget of which the request
// gets a share, a Cake load that follows the daemon's plan, and the oracle split computed offline from the same model.
// It sleeps instead of computing, so a bench can model any GPU on a machine without one.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "base/status_macros.h"
#include "client/client.h"
#include "examples/harness/harness.h"
#include "examples/simulated_engine/models.h"

namespace cake::sim {

using harness::Clock;

// One request's prefill on the simulated engine: steps of util x step budget tokens, each taking what the
// request's share of the GPU needs for them; after every step it reports its progress and, under Cake, stops at
// the first chunk boundary whose chunk is loaded.
class GridEngine {
 public:
  GridEngine(const PrefillCostModel& cost, double util, uint32_t step_tokens, uint32_t chunk_tokens, uint32_t tokens,
             double time_scale)
      : cost_(cost),
        util_(util),
        step_tokens_(std::max(1u, static_cast<uint32_t>(std::lround(util * step_tokens)))),
        chunk_tokens_(chunk_tokens),
        tokens_(tokens),
        time_scale_(time_scale) {}

  // Wall seconds (scaled) to compute tokens [from, to).
  double Seconds(double from, double to) const {
    return (cost_.Flop(to) - cost_.Flop(from)) / (util_ * cost_.flops) / time_scale_;
  }
  // The engine's own per-chunk cost as the hint format, t(i) = a + b i, in scaled seconds.
  double HintFirstChunk() const { return Seconds(0, chunk_tokens_); }
  double HintGrowth() const { return Seconds(chunk_tokens_, 2.0 * chunk_tokens_) - HintFirstChunk(); }
  uint32_t chunk_tokens() const { return chunk_tokens_; }

  // Computes from token 0, step by step, as the client library's stepper says: `next_step(c)`, asked at each chunk
  // boundary, answers compute (up to a chunk), wait for chunk c until a deadline (`wait(c, deadline)`), or stop;
  // `resident(c)` says whether chunk c is loaded (a step that reaches a loaded chunk ends there); `progress(c)`
  // reports chunks [0, c) computed. Returns the token it stopped at.
  template <typename NextStep, typename Resident, typename Progress, typename Wait>
  absl::StatusOr<uint32_t> Run(Clock::time_point start, NextStep next_step, Resident resident, Progress progress,
                               Wait wait) {
    Clock::time_point gpu_free = start;
    uint32_t done = 0;
    uint32_t reported = 0;
    uint32_t compute_to = 0;  // tokens the last answer lets the engine compute before asking again
    for (;;) {
      if (done % chunk_tokens_ == 0 || done >= compute_to) {
        CAKE_ASSIGN_OR_RETURN(const FrontStep step, next_step(done / chunk_tokens_));
        if (step.action == FrontStep::Action::kStop) break;
        if (step.action == FrontStep::Action::kWait) {
          wait(done / chunk_tokens_, step.until);
          gpu_free = std::max(gpu_free, Clock::now());  // the GPU idled while it waited
          continue;
        }
        compute_to = std::min(tokens_, step.compute_through * chunk_tokens_);
        if (compute_to <= done) break;
      }
      uint32_t next = std::min(compute_to, done + step_tokens_);
      // A chunk loaded while the engine was mid-chunk is used from its start: finish the current chunk, stop.
      const uint32_t boundary = (done / chunk_tokens_ + 1) * chunk_tokens_;
      if (next > boundary && boundary < compute_to && resident(boundary / chunk_tokens_)) next = boundary;
      gpu_free += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(Seconds(done, next)));
      harness::PreciseSleepUntil(gpu_free);
      done = next;
      const uint32_t chunks = done / chunk_tokens_;
      if (chunks > reported) {
        reported = chunks;
        CAKE_RETURN_IF_ERROR(progress(chunks));
      }
    }
    return done;
  }

 private:
  PrefillCostModel cost_;
  double util_;
  uint32_t step_tokens_;
  uint32_t chunk_tokens_;
  uint32_t tokens_;
  double time_scale_;
};

struct CakeRun {
  double seconds = 0;
  uint32_t meeting_chunk = 0;
  std::string strategy;
};

// One Cake load of `tokens` tokens driven by `engine`, which sends its cost model as the hint, follows the plan
// (stops at the predicted meeting and waits there, with slack) and reports progress after every step; timed from
// Start until both the engine and the loads are done, in wall (scaled) seconds.
absl::StatusOr<CakeRun> TimedCake(Client& client, const LoadOptions& base, GridEngine& engine, uint32_t tokens,
                                  uint32_t chunk_tokens);

// Compute-only: the engine computes every token; wall (scaled) seconds.
absl::StatusOr<double> TimedComputeOnly(GridEngine& engine, uint32_t tokens);

// min over m of max(compute [0, m chunks), load [m, H)), in the modelled hardware's seconds.
double OracleSeconds(const GridEngine& engine, double time_scale, uint32_t chunks, uint32_t chunk_tokens,
                     double chunk_load_s);

}  // namespace cake::sim
