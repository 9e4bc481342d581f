// The daemon's counters: bumped lock-free on every hot path, reported through server/telemetry (Stats and /metrics
// under the name and help written here).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace cake {

// One counter a line, kept as written: clang-format reflows a long macro differently on every pass.
// clang-format off
#define CAKE_COUNTERS(X) \
  X(lookups, "Lookup calls") \
  X(lookup_chunks, "Full chunks Lookups asked about") \
  X(lookup_cached_chunks, "Chunks Lookups found cached") \
  X(loads_started, "Load streams admitted") \
  X(loads_finished, "Load streams that reached Done") \
  X(loads_cancelled, "Load streams cancelled before the end") \
  X(load_chunks_loaded, "Chunks reported loaded to engines") \
  X(load_bytes_loaded, "Bytes of the chunks reported loaded to engines") \
  X(load_chunk_read_failures, "Reads that failed; the engine computed those chunks") \
  X(load_chunks_computed, "Cached chunks left to engines by meeting points (the sum of m)") \
  X(loads_not_promoted, "Loads larger than half the DRAM tier, whose chunks stayed where they were") \
  X(stores, "Store calls") \
  X(store_chunks_stored, "Chunks stores added") \
  X(store_chunks_already_cached, "Chunks stores found cached already") \
  X(store_bytes_stored, "Bytes stores added") \
  X(store_chunks_rejected, "Chunks stores could not keep (no room, a failed write)") \
  X(regions_registered, "Regions registered") \
  X(regions_released, "Regions released") \
  X(invalid_requests, "Load and Store requests refused as invalid") \
  X(loads_idle_ended, "Loads ended because their client was silent for loader.idle_timeout_ms") \
  X(regions_reclaimed, "Regions released because the client gave up on its registration before the reply") \
  X(regions_expired, "Regions released because their owner did not renew them within limits.region_lease_ms") \
  X(inline_reads_waited, "Times an inline load's read waited for room under loader.max_inline_bytes") \
  X(lookups_network_skipped, "Lookups and Starts answered without the remote tier because too many calls wait on it") \
  X(prefetches, "Lookups that asked for a prefetch") \
  X(prefetch_chunks_queued, "Chunks prefetches queued for copying into DRAM") \
  X(prefetch_chunks_over_budget, "Chunks prefetches left out because prefetch.max_bytes was held") \
  X(prefetch_chunks_copied, "Chunks prefetches copied into DRAM") \
  X(prefetch_bytes_copied, "Bytes prefetches copied into DRAM") \
  X(prefetch_chunks_used, "Prefetched chunks a later load used (copied, or being copied, when it started)") \
  X(prefetch_chunks_dropped, "Queued prefetch chunks dropped because a load started first and read them itself") \
  X(prefetch_chunks_wasted, "Prefetched chunks no load used within prefetch.ttl_ms (or never copied by then)") \
  X(prefetch_chunks_failed, "Prefetch copies that failed (the read failed, or no idle thread took it)")
// clang-format on

// The status codes a failed read can end with, in absl::StatusCode's order (OK, 0, never counted).
inline constexpr size_t kStatusCodes = 17;
inline constexpr const char* kStatusCodeNames[kStatusCodes] = {
    "ok",        "cancelled",      "unknown",           "invalid_argument",   "deadline_exceeded",
    "not_found", "already_exists", "permission_denied", "resource_exhausted", "failed_precondition",
    "aborted",   "out_of_range",   "unimplemented",     "internal",           "unavailable",
    "data_loss", "unauthenticated"};

struct Counters {
#define CAKE_DECLARE_COUNTER(name, help) std::atomic<uint64_t> name{0};
  CAKE_COUNTERS(CAKE_DECLARE_COUNTER)
#undef CAKE_DECLARE_COUNTER
  // Of load_chunk_read_failures, by the read's status code: DATA_LOSS is a corrupt chunk (removed), NOT_FOUND one
  // evicted since the lookup, UNAVAILABLE a medium or a Redis that failed, RESOURCE_EXHAUSTED a full queue.
  std::array<std::atomic<uint64_t>, kStatusCodes> load_chunk_read_failures_by_code{};

  void CountReadFailure(int code) {
    load_chunk_read_failures.fetch_add(1, std::memory_order_relaxed);
    if (code > 0 && static_cast<size_t>(code) < kStatusCodes) {
      load_chunk_read_failures_by_code[static_cast<size_t>(code)].fetch_add(1, std::memory_order_relaxed);
    }
  }
};

inline void Bump(std::atomic<uint64_t>& counter, uint64_t by = 1) { counter.fetch_add(by, std::memory_order_relaxed); }

}  // namespace cake
