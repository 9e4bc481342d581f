// The load planner: what one chunk costs the engine to compute (learned online from its Progress reports) and
// the daemon to load, and from those the split of a request between the two, including the decision that
// sharing is not worth it. Pure logic, no clock: callers pass times in, so every case is testable.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "base/strategy.h"
#include "keys/tier_kind.h"

namespace cake {

// The engine's prefill cost of chunk i, t(i) = first_chunk_s + growth_s * i (attention over a longer prefix
// makes later chunks dearer; the Cake paper's cost model, docs/architecture.md "The cost model", is exactly this at
// chunk granularity). Fit by least squares
// over observed spans of chunks, each "chunks [from, to) took s seconds"; a hint from the engine enters as one
// observation worth a few real ones, so the first real spans refine it rather than replace it.
class ComputeModel {
 public:
  // The engine's own estimate (LoadStart's compute hints).
  void Seed(double first_chunk_s, double growth_s);
  // The engine computed chunks [from, to) in `seconds`.
  void Observe(uint32_t from, uint32_t to, double seconds);
  // Folds another model's observations in (what earlier loads of the same model taught the daemon).
  void Merge(const ComputeModel& other);
  // Weighs everything observed so far by `factor` (older observations fade against newer ones).
  void Scale(double factor);

  bool known() const { return weight_ > 0; }
  double first_chunk_s() const;
  double growth_s() const;
  // Seconds to compute chunks [from, to).
  double RangeSeconds(uint32_t from, uint32_t to) const;

 private:
  void Add(double n, double s, double y, double weight);
  void Solve() const;

  // Normal equations of min sum w (y - a n - b s)^2 over spans with n chunks whose indexes sum to s.
  double nn_ = 0, ns_ = 0, ss_ = 0, ny_ = 0, sy_ = 0;
  double weight_ = 0;
  mutable bool solved_ = false;
  mutable double a_ = 0, b_ = 0;
};

struct PlanInput {
  uint32_t cached_chunks = 0;    // H
  uint32_t lowest_loadable = 0;  // chunks below it must be computed whatever the plan
  double load_chunk_s = 0;       // seconds per chunk at the load's measured speed; 0: unknown
  bool io_only_requested = false;
  // Optional, H + 1 entries: seconds to load [m, H) for each m when the chunks sit in tiers of different speeds
  // (read at once, so the slowest tier's share decides; LoadSuffixSeconds). Empty: load_chunk_s per chunk.
  std::vector<double> load_suffix_s;
};

struct PlanDecision {
  Strategy strategy = Strategy::kCake;
  // The chunk where compute and loading are predicted to meet, when both costs are known.
  std::optional<uint32_t> meeting_chunk;
  // Predicted time to first token of each choice, seconds (absent when a cost is unknown).
  std::optional<double> cake_s, compute_only_s, io_only_s;
};

// Chooses how to serve a request. Cake when both costs are known and the best split, min over m of
// max(compute [0, m), load [m, H)), is predicted faster than the better baseline; otherwise that baseline:
// I/O-only when loading everything is at least as fast, compute-only when computing everything is. The split
// assumes the engine stops at the predicted meeting chunk and waits for the loads (an engine that races on until
// a chunk is resident can lose up to one chunk). With a cost unknown, Cake: it adapts at run time whatever the
// speeds turn out to be.
PlanDecision Decide(const PlanInput& input, const ComputeModel& compute);

// Cost of computing chunk i on the engine, t(i) = first_chunk_s + growth_s * i (attention over a longer
// prefix makes later chunks dearer), and of loading one chunk. Predicts the meeting chunk m that minimises
// max(compute [0, m), load [m, H)).
struct SplitCosts {
  double compute_first_chunk_s = 0;
  double compute_growth_s = 0;
  double load_chunk_s = 0;
  // Optional, H + 1 entries: seconds to load [m, H) for each m, for chunks in tiers of different speeds read at
  // once (the slowest tier's share decides). Empty: every chunk costs load_chunk_s.
  std::vector<double> load_suffix_s;
};
uint32_t PredictMeetingChunk(uint32_t cached_chunks, uint32_t lowest_loadable, const SplitCosts& costs);

// Seconds one chunk takes to read from each tier, indexed by TierKind; 0: not measured yet.
using TierChunkSeconds = std::array<double, kTierKinds>;

// What a load's chunks cost to read, from the tiers they sit in: the planner's load inputs.
struct LoadCosts {
  double load_chunk_s = 0;            // PlanInput::load_chunk_s; 0 when a tier that holds some of them is unmeasured
  std::vector<double> load_suffix_s;  // PlanInput::load_suffix_s, when the chunks sit in tiers of different speeds
  bool single_tier = false;           // one tier holds every chunk to load: only such a load measures its tier
};

// Costs of loading cached chunks [lowest_loadable, H), H = chunk_tiers.size(). Tiers are read in parallel, so the
// load takes as long as its slowest tier's share, spread over the chunks. An unmeasured DRAM tier (a copy in
// memory) counts as free; any other unmeasured tier makes the cost unknown.
LoadCosts EstimateLoadCosts(std::span<const TierKind> chunk_tiers, const TierChunkSeconds& tier_chunk_s,
                            uint32_t lowest_loadable);

// Seconds to load [m, H) for every m in [lowest_loadable, H] (entries below are those of lowest_loadable): max over
// tiers of (its chunks in [m, H)) x (its chunk time), the tiers read in parallel.
std::vector<double> LoadSuffixSeconds(std::span<const TierKind> chunk_tiers, const TierChunkSeconds& tier_chunk_s,
                                      uint32_t lowest_loadable);

// Everything the planner weighs for one load.
struct LoadPlanRequest {
  std::vector<TierKind> chunk_tiers;  // the tier of each cached chunk: H = its size
  TierChunkSeconds tier_chunk_s{};    // the tiers' measured speeds
  uint32_t lowest_loadable = 0;       // chunks below it are the engine's whatever the plan: no room, or it has them
  bool io_only_requested = false;
  double hint_first_chunk_s = 0;  // the engine's own estimate of its costs (both 0: none)
  double hint_growth_s = 0;
  ComputeModel history;  // what earlier loads of this namespace's engine were seen to cost
};

struct LoadPlanResult {
  PlanDecision decision;
  ComputeModel compute;      // what the plan assumed the engine costs: the hint when sent (the engine knows how busy
                             // it is now), else the history; the read judge holds reads to it
  bool single_tier = false;  // LoadCosts::single_tier
};

// Plans one load: its compute model, its load costs (each chunk at its own tier's speed) and the decision.
LoadPlanResult PlanLoad(const LoadPlanRequest& request);

}  // namespace cake
