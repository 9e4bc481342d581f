// A real engine's prefill of one prompt against caked: the transformer computes chunks forward into a paged KV
// cache that lives in a daemon region, while the daemon loads cached chunks into the same pages from the tail
// backward; then the uncached suffix is computed and the first token produced from the assembled cache.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "examples/cpu_engine/transformer.h"

namespace cake::engine {

enum class PrefillMode {
  kComputeOnly,  // every chunk computed; the daemon is not asked
  kIoOnly,       // every cached chunk loaded while the engine waits
  kCake,         // compute forward, load backward, meet where the daemon's plan says (and wait there)
  kFixedSplit,   // compute [0, m), load [m, cached): a forced meeting point
};

struct PrefillResult {
  double ttft_s = 0;  // from the request's start to its first token
  uint32_t first_token = 0;
  uint32_t meeting_chunk = 0;    // [0, meeting) computed, [meeting, cached) loaded
  uint32_t computed_chunks = 0;  // every chunk the engine computed, wasted ones past the meeting included
  uint32_t loaded_chunks = 0;
  uint32_t failed_chunks = 0;  // reads that failed: the engine computed them
  std::optional<uint32_t> predicted_meeting_chunk;
  std::string strategy;                 // the daemon's plan: cake, io-only, compute-only; "none" without a load
  std::vector<double> chunk_compute_s;  // seconds per chunk index, 0 where the chunk was not computed
};

class PrefillEngine {
 public:
  // `region` holds the KV pages, page c at c x page bytes: register at least PagesBytes() for it. `client` may
  // be null for compute-only runs.
  // `stored_precision` is the namespace's (lossy: the disk and remote tiers keep its chunks quantized).
  PrefillEngine(Transformer& model, uint32_t chunk_tokens, std::vector<uint32_t> prompt, Client* client,
                const MappedRegion& region, StoredPrecision stored_precision = StoredPrecision::kExact);

  uint32_t chunk_tokens() const { return chunk_tokens_; }
  uint32_t total_chunks() const { return static_cast<uint32_t>(pages_.offsets.size()); }
  uint32_t full_chunks() const { return static_cast<uint32_t>(prompt_.size() / chunk_tokens_); }
  uint64_t page_bytes() const { return page_bytes_; }
  uint64_t PagesBytes() const { return page_bytes_ * total_chunks(); }
  const NamespaceSpec& ns() const { return ns_; }
  std::span<const uint32_t> prompt() const { return prompt_; }
  // The KV cache of the last run: every page, partial tail included (unused slots are zero).
  std::span<const std::byte> Kv() const { return {region_.data(), PagesBytes()}; }

  // The compute-cost hint the engine sends with Cake loads: chunk i costs first + growth x i seconds. A fit to
  // noisy timings can come out negative in either term; the daemon refuses negative hints, so they are clamped.
  void SetComputeHint(double first_chunk_s, double growth_s) {
    hint_first_s_ = std::max(0.0, first_chunk_s);
    hint_growth_s_ = std::max(0.0, growth_s);
  }

  // One prefill from an empty cache. `split` is the meeting point for kFixedSplit.
  absl::StatusOr<PrefillResult> Run(PrefillMode mode, uint32_t split = 0);

  // Stores pages [0, chunks) of the last run through the daemon (full chunks only).
  absl::StatusOr<StoreResult> Store(uint32_t chunks);

 private:
  void ComputeChunk(uint32_t chunk, PrefillResult& result);
  absl::StatusOr<PrefillResult> RunWithDaemon(PrefillMode mode, uint32_t split);

  Transformer& model_;
  const uint32_t chunk_tokens_;
  const std::vector<uint32_t> prompt_;
  Client* client_;
  const MappedRegion& region_;
  const NamespaceSpec ns_;
  const uint64_t page_bytes_;
  KvPages pages_;
  double hint_first_s_ = 0, hint_growth_s_ = 0;
};

// Least-squares fit of per-chunk compute times to the planner's model, t(i) = first + growth x i.
struct LinearFit {
  double first_s = 0, growth_s = 0;
  double r_squared = 0;
  double max_relative_error = 0;  // worst |fit - measured| / measured over the chunks
};
LinearFit FitChunkTimes(std::span<const double> seconds);

}  // namespace cake::engine
