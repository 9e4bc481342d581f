#include "examples/cpu_engine/prefill_engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace cake::engine {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

PrefillEngine::PrefillEngine(Transformer& model, uint32_t chunk_tokens, std::vector<uint32_t> prompt, Client* client,
                             const MappedRegion& region, StoredPrecision stored_precision)
    : model_(model),
      chunk_tokens_(chunk_tokens),
      prompt_(std::move(prompt)),
      client_(client),
      region_(region),
      ns_([&] {
        NamespaceSpec ns = model.Namespace(chunk_tokens);
        ns.stored_precision = stored_precision;
        return ns;
      }()),
      page_bytes_(model.PageBytes(chunk_tokens)) {
  pages_.base = region.data();
  const uint32_t chunks = static_cast<uint32_t>((prompt_.size() + chunk_tokens - 1) / chunk_tokens);
  for (uint32_t c = 0; c < chunks; ++c) pages_.offsets.push_back(uint64_t{c} * page_bytes_);
}

void PrefillEngine::ComputeChunk(uint32_t chunk, PrefillResult& result) {
  const Clock::time_point start = Clock::now();
  model_.PrefillChunk(prompt_, chunk, chunk_tokens_, pages_);
  result.chunk_compute_s[chunk] = SecondsBetween(start, Clock::now());
  ++result.computed_chunks;
}

absl::StatusOr<PrefillResult> PrefillEngine::Run(PrefillMode mode, uint32_t split) {
  if (prompt_.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (region_.size() < PagesBytes()) {
    return absl::InvalidArgumentError(absl::StrCat("the region holds ", region_.size(), " bytes; the prompt's ",
                                                   total_chunks(), " pages need ", PagesBytes()));
  }
  // Zeroed first (outside the timing), so what the run leaves is only what it computed or loaded.
  std::memset(region_.data(), 0, PagesBytes());
  if (mode != PrefillMode::kComputeOnly) {
    if (client_ == nullptr) return absl::FailedPreconditionError("loads need a client");
    return RunWithDaemon(mode, split);
  }
  PrefillResult result;
  result.strategy = "none";
  result.chunk_compute_s.assign(total_chunks(), 0);
  const Clock::time_point start = Clock::now();
  for (uint32_t c = 0; c < total_chunks(); ++c) ComputeChunk(c, result);
  result.first_token = model_.FirstToken(prompt_, chunk_tokens_, pages_);
  result.ttft_s = SecondsBetween(start, Clock::now());
  result.meeting_chunk = total_chunks();
  return result;
}

absl::StatusOr<PrefillResult> PrefillEngine::RunWithDaemon(PrefillMode mode, uint32_t split) {
  PrefillResult result;
  result.chunk_compute_s.assign(total_chunks(), 0);
  LoadOptions load;
  load.ns = ns_;
  load.prompt = PromptRef{prompt_, {}};
  load.region = &region_;
  load.region_bytes = PagesBytes();
  load.io_only = mode != PrefillMode::kCake;
  if (mode == PrefillMode::kFixedSplit) load.computed_through = std::min(split, full_chunks());
  if (mode == PrefillMode::kCake) {
    load.compute_first_chunk_s = hint_first_s_;
    load.compute_growth_s = hint_growth_s_;
  }

  const Clock::time_point start = Clock::now();
  CAKE_ASSIGN_OR_RETURN(auto started, client_->StartLoad(load));
  LoadSession& session = *started;
  absl::Cleanup release = [&] { session.Release().IgnoreError(); };
  // A stream that ended early carries the daemon's reason in its final status.
  auto ended = [&](const absl::Status& waited) {
    std::move(release).Cancel();
    absl::Status final = session.Release();
    return final.ok() ? waited : final;
  };
  auto plan = session.WaitPlan();
  if (!plan.ok()) return ended(plan.status());
  result.strategy = StrategyName(plan->strategy);
  result.predicted_meeting_chunk = plan->predicted_meeting_chunk;
  const uint32_t cached = plan->cached_chunks;

  // The front: chunks the engine computes while the daemon loads from the tail.
  uint32_t computed = 0;
  if (mode == PrefillMode::kCake) {
    // The client library's rule says when to compute on, wait at the predicted meeting, or stop.
    for (;;) {
      auto step = session.NextStep(computed);
      if (!step.ok()) return ended(step.status());
      if (step->action == FrontStep::Action::kStop) break;
      if (step->action == FrontStep::Action::kWait) {
        session.WaitResidentUntil(computed, step->until);
        continue;
      }
      ComputeChunk(computed, result);
      ++computed;
      CAKE_RETURN_IF_ERROR(session.ReportProgress(computed));
    }
  } else {
    const uint32_t front = mode == PrefillMode::kFixedSplit ? std::min(split, cached) : 0;
    for (; computed < std::max(front, std::min(plan->lowest_loadable, cached)); ++computed) {
      ComputeChunk(computed, result);
    }
  }
  auto done = session.WaitDone();
  if (!done.ok()) return ended(done.status());
  result.meeting_chunk = done->meeting_chunk;
  result.loaded_chunks = done->loaded_chunks;
  result.failed_chunks = done->failed_chunks;
  // Failed reads move the meeting up: the engine computes up to it.
  for (; computed < done->meeting_chunk; ++computed) ComputeChunk(computed, result);
  // Loaded chunks the engine did not compute itself must sit in their pages; a daemon that placed one elsewhere
  // in the region is copied from (an engine with a page table would point at it instead).
  for (uint32_t c = std::max(computed, done->meeting_chunk); c < cached; ++c) {
    const uint64_t at = session.RegionOffset(c);
    if (at != pages_.offsets[c]) std::memmove(region_.data() + pages_.offsets[c], region_.data() + at, page_bytes_);
  }
  std::move(release).Cancel();
  CAKE_RETURN_IF_ERROR(session.Release());
  // The uncached suffix needs every earlier page, loaded ones included.
  for (uint32_t c = std::max(computed, cached); c < total_chunks(); ++c) ComputeChunk(c, result);
  result.first_token = model_.FirstToken(prompt_, chunk_tokens_, pages_);
  result.ttft_s = SecondsBetween(start, Clock::now());
  return result;
}

absl::StatusOr<StoreResult> PrefillEngine::Store(uint32_t chunks) {
  if (client_ == nullptr) return absl::FailedPreconditionError("storing needs a client");
  if (chunks > full_chunks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("only the ", full_chunks(), " full chunks can be stored, not ", chunks));
  }
  return client_->Store(ns_, PromptRef{prompt_, {}}, 0, chunks, region_, 0);
}

LinearFit FitChunkTimes(std::span<const double> seconds) {
  LinearFit fit;
  const size_t n = seconds.size();
  if (n == 0) return fit;
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < n; ++i) {
    sx += static_cast<double>(i);
    sy += seconds[i];
    sxx += static_cast<double>(i) * i;
    sxy += static_cast<double>(i) * seconds[i];
  }
  const double denominator = n * sxx - sx * sx;
  fit.growth_s = denominator > 0 ? (n * sxy - sx * sy) / denominator : 0;
  fit.first_s = (sy - fit.growth_s * sx) / n;
  const double mean = sy / n;
  double residual = 0, total = 0;
  for (size_t i = 0; i < n; ++i) {
    const double predicted = fit.first_s + fit.growth_s * i;
    residual += (seconds[i] - predicted) * (seconds[i] - predicted);
    total += (seconds[i] - mean) * (seconds[i] - mean);
    if (seconds[i] > 0) {
      fit.max_relative_error = std::max(fit.max_relative_error, std::abs(predicted - seconds[i]) / seconds[i]);
    }
  }
  fit.r_squared = total > 0 ? 1 - residual / total : 1;
  return fit;
}

}  // namespace cake::engine
