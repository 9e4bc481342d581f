#include "scheduler/planner.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

namespace cake {
namespace {

// A hint counts as this many observed spans: enough to plan the first load, little enough that a few real
// Progress reports outweigh a wrong one.
constexpr double kHintWeight = 2;

}  // namespace

void ComputeModel::Add(double n, double s, double y, double weight) {
  nn_ += weight * n * n;
  ns_ += weight * n * s;
  ss_ += weight * s * s;
  ny_ += weight * n * y;
  sy_ += weight * s * y;
  weight_ += weight;
  solved_ = false;
}

void ComputeModel::Seed(double first_chunk_s, double growth_s) {
  if (!(first_chunk_s > 0) || !(growth_s >= 0)) return;
  // Two one-chunk pseudo-spans, one at the start and one further out, pin both coefficients.
  for (double chunk : {0.0, 16.0}) Add(1, chunk, first_chunk_s + growth_s * chunk, kHintWeight / 2);
}

void ComputeModel::Observe(uint32_t from, uint32_t to, double seconds) {
  if (to <= from || !(seconds >= 0) || !std::isfinite(seconds)) return;
  const double n = to - from;
  const double s = (static_cast<double>(from) + static_cast<double>(to) - 1) * n / 2;
  // Weighted 1/n: a span of n chunks counts as n one-chunk observations of its mean, not n^2 of them.
  Add(n, s, seconds, 1 / n);
}

void ComputeModel::Merge(const ComputeModel& other) {
  nn_ += other.nn_;
  ns_ += other.ns_;
  ss_ += other.ss_;
  ny_ += other.ny_;
  sy_ += other.sy_;
  weight_ += other.weight_;
  solved_ = false;
}

void ComputeModel::Scale(double factor) {
  nn_ *= factor;
  ns_ *= factor;
  ss_ *= factor;
  ny_ *= factor;
  sy_ *= factor;
  weight_ *= factor;
  solved_ = false;
}

void ComputeModel::Solve() const {
  if (solved_) return;
  solved_ = true;
  a_ = b_ = 0;
  if (nn_ <= 0) return;
  const double det = nn_ * ss_ - ns_ * ns_;
  // Spans all at one place cannot tell a constant cost from a growing one: take the average cost per chunk.
  if (det > 1e-9 * nn_ * ss_) {
    a_ = (ny_ * ss_ - sy_ * ns_) / det;
    b_ = (nn_ * sy_ - ns_ * ny_) / det;
  }
  if (det <= 1e-9 * nn_ * ss_ || a_ < 0 || b_ < 0) {
    // A fit with a negative term is noise around a flat cost: fall back to one that is non-negative.
    b_ = std::max(0.0, b_);
    a_ = std::max(0.0, (ny_ - b_ * ns_) / nn_);
    if (a_ == 0 && b_ == 0) a_ = ny_ / nn_;
  }
}

double ComputeModel::first_chunk_s() const {
  Solve();
  return a_;
}

double ComputeModel::growth_s() const {
  Solve();
  return b_;
}

double ComputeModel::RangeSeconds(uint32_t from, uint32_t to) const {
  if (to <= from) return 0;
  Solve();
  const double n = to - from;
  const double s = (static_cast<double>(from) + static_cast<double>(to) - 1) * n / 2;
  return a_ * n + b_ * s;
}

std::vector<double> LoadSuffixSeconds(std::span<const TierKind> chunk_tiers, const TierChunkSeconds& tier_chunk_s,
                                      uint32_t lowest_loadable) {
  const uint32_t h = static_cast<uint32_t>(chunk_tiers.size());
  const uint32_t low = std::min(lowest_loadable, h);
  std::vector<double> suffix(h + 1, 0.0);
  std::array<uint32_t, kTierKinds> count{};
  double slowest = 0;
  for (uint32_t m = h; m > low;) {
    --m;
    const auto tier = static_cast<size_t>(chunk_tiers[m]);
    if (tier < kTierKinds) slowest = std::max(slowest, ++count[tier] * tier_chunk_s[tier]);
    suffix[m] = slowest;
  }
  for (uint32_t m = 0; m < low; ++m) suffix[m] = suffix[low];
  return suffix;
}

uint32_t PredictMeetingChunk(uint32_t cached_chunks, uint32_t lowest_loadable, const SplitCosts& costs) {
  const uint32_t h = cached_chunks;
  lowest_loadable = std::min(lowest_loadable, h);
  // Walk m upward: compute time grows and load time shrinks, so the best m is where they cross.
  double compute = 0;
  for (uint32_t i = 0; i < lowest_loadable; ++i) compute += costs.compute_first_chunk_s + costs.compute_growth_s * i;
  uint32_t best = lowest_loadable;
  double best_cost = std::numeric_limits<double>::infinity();
  for (uint32_t m = lowest_loadable; m <= h; ++m) {
    const double load = costs.load_suffix_s.size() > m ? costs.load_suffix_s[m] : costs.load_chunk_s * (h - m);
    const double cost = std::max(compute, load);
    if (cost < best_cost) {
      best_cost = cost;
      best = m;
    }
    compute += costs.compute_first_chunk_s + costs.compute_growth_s * m;
  }
  return best;
}

PlanDecision Decide(const PlanInput& input, const ComputeModel& compute) {
  PlanDecision d;
  const uint32_t h = input.cached_chunks;
  const uint32_t low = std::min(input.lowest_loadable, h);
  if (input.io_only_requested) {
    d.strategy = Strategy::kIoOnly;
    d.meeting_chunk = low;
    return d;
  }
  if (h == low) {
    // Nothing can be loaded: the engine computes everything whatever the plan says.
    d.strategy = Strategy::kComputeOnly;
    d.meeting_chunk = h;
    return d;
  }
  if (!compute.known() || !(input.load_chunk_s > 0)) return d;  // Cake adapts to whatever the speeds turn out to be

  // Loading [m, H): from the per-tier suffix when the chunks sit in tiers of different speeds.
  auto load = [&](uint32_t from, uint32_t to) {
    if (to == h && input.load_suffix_s.size() > from) return input.load_suffix_s[from];
    return (to - from) * input.load_chunk_s;
  };
  const double compute_only = compute.RangeSeconds(0, h);
  // I/O-only still computes what has no room in the region, while the loads run.
  const double io_only = std::max(compute.RangeSeconds(0, low), load(low, h));
  // The best split: the engine computes [0, m) and then waits for the loads of [m, H) (docs/protocol.md: it
  // stops at the predicted meeting chunk rather than racing past it, unless the loads fall behind).
  const SplitCosts costs{compute.first_chunk_s(), compute.growth_s(), input.load_chunk_s, input.load_suffix_s};
  const uint32_t k = PredictMeetingChunk(h, low, costs);
  const double cake = std::max(compute.RangeSeconds(0, k), load(k, h));
  d.meeting_chunk = k;
  d.cake_s = cake;
  d.compute_only_s = compute_only;
  d.io_only_s = io_only;
  if (cake < std::min(compute_only, io_only)) return d;
  if (io_only <= compute_only) {
    d.strategy = Strategy::kIoOnly;
    d.meeting_chunk = low;
  } else {
    d.strategy = Strategy::kComputeOnly;
    d.meeting_chunk = h;
  }
  return d;
}

LoadCosts EstimateLoadCosts(std::span<const TierKind> chunk_tiers, const TierChunkSeconds& tier_chunk_s,
                            uint32_t lowest_loadable) {
  LoadCosts costs;
  const uint32_t h = static_cast<uint32_t>(chunk_tiers.size());
  if (h <= lowest_loadable) return costs;
  std::array<uint32_t, kTierKinds> per_tier{};
  int tiers = 0;
  for (uint32_t c = lowest_loadable; c < h; ++c) {
    const auto tier = static_cast<size_t>(chunk_tiers[c]);
    if (tier >= kTierKinds) return costs;  // no tier this planner knows: unknown cost, the plan adapts
    tiers += per_tier[tier]++ == 0;
  }
  costs.single_tier = tiers == 1;
  double slowest = 0;
  for (size_t tier = 0; tier < kTierKinds; ++tier) {
    if (per_tier[tier] == 0) continue;
    if (!(tier_chunk_s[tier] > 0) && tier != static_cast<size_t>(TierKind::kDram)) return costs;  // unknown
    slowest = std::max(slowest, tier_chunk_s[tier] * per_tier[tier]);
  }
  costs.load_chunk_s = slowest / (h - lowest_loadable);
  if (costs.load_chunk_s > 0 && !costs.single_tier) {
    costs.load_suffix_s = LoadSuffixSeconds(chunk_tiers, tier_chunk_s, lowest_loadable);
  }
  return costs;
}

LoadPlanResult PlanLoad(const LoadPlanRequest& request) {
  LoadPlanResult result;
  result.compute.Seed(request.hint_first_chunk_s, request.hint_growth_s);
  if (!result.compute.known()) result.compute = request.history;
  LoadCosts costs = EstimateLoadCosts(request.chunk_tiers, request.tier_chunk_s, request.lowest_loadable);
  result.single_tier = costs.single_tier;
  PlanInput input;
  input.cached_chunks = static_cast<uint32_t>(request.chunk_tiers.size());
  input.lowest_loadable = request.lowest_loadable;
  input.load_chunk_s = costs.load_chunk_s;
  input.load_suffix_s = std::move(costs.load_suffix_s);
  input.io_only_requested = request.io_only_requested;
  result.decision = Decide(input, result.compute);
  return result;
}

}  // namespace cake
