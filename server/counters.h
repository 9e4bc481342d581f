// The daemon's counters, read by AdminService.Stats and cakectl. Lock-free: bumped on every hot path.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <string>

namespace cake {

// One counter a line, kept as written: clang-format reflows a long macro differently on every pass.
// clang-format off
#define CAKE_COUNTERS(X) \
  X(lookups) \
  X(lookup_chunks) \
  X(lookup_cached_chunks) \
  X(loads_started) \
  X(loads_finished) \
  X(loads_cancelled) \
  X(load_chunks_loaded) \
  X(load_bytes_loaded) \
  X(load_chunk_read_failures) \
  X(load_chunks_computed) \
  X(loads_not_promoted) \
  X(loads_cake) \
  X(loads_io_only) \
  X(loads_compute_only) \
  X(stores) \
  X(store_chunks_stored) \
  X(store_chunks_already_cached) \
  X(store_bytes_stored) \
  X(store_chunks_rejected) \
  X(regions_registered) \
  X(regions_released) \
  X(invalid_requests) \
  X(loads_idle_ended) \
  X(regions_reclaimed) \
  X(regions_expired) \
  X(inline_reads_waited) \
  X(lookups_network_skipped)
// clang-format on

// The status codes a failed read can end with, in absl::StatusCode's order (OK, 0, never counted).
inline constexpr size_t kStatusCodes = 17;
inline constexpr const char* kStatusCodeNames[kStatusCodes] = {
    "ok",        "cancelled",      "unknown",           "invalid_argument",   "deadline_exceeded",
    "not_found", "already_exists", "permission_denied", "resource_exhausted", "failed_precondition",
    "aborted",   "out_of_range",   "unimplemented",     "internal",           "unavailable",
    "data_loss", "unauthenticated"};

struct Counters {
#define CAKE_DECLARE_COUNTER(name) std::atomic<uint64_t> name{0};
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

  std::map<std::string, uint64_t> Snapshot() const {
    std::map<std::string, uint64_t> out;
#define CAKE_SNAPSHOT_COUNTER(name) out[#name] = name.load(std::memory_order_relaxed);
    CAKE_COUNTERS(CAKE_SNAPSHOT_COUNTER)
#undef CAKE_SNAPSHOT_COUNTER
    // Stats shows each code that occurred as load_chunk_read_failures_<code>; /metrics as a code label.
    for (size_t code = 1; code < kStatusCodes; ++code) {
      const uint64_t n = load_chunk_read_failures_by_code[code].load(std::memory_order_relaxed);
      if (n > 0) out[std::string("load_chunk_read_failures_") + kStatusCodeNames[code]] = n;
    }
    return out;
  }
  // The plain counters alone (CAKE_COUNTERS), for /metrics, which shows the by-code ones with a label.
  std::map<std::string, uint64_t> PlainSnapshot() const {
    std::map<std::string, uint64_t> out;
#define CAKE_SNAPSHOT_COUNTER(name) out[#name] = name.load(std::memory_order_relaxed);
    CAKE_COUNTERS(CAKE_SNAPSHOT_COUNTER)
#undef CAKE_SNAPSHOT_COUNTER
    return out;
  }
};

inline void Bump(std::atomic<uint64_t>& counter, uint64_t by = 1) { counter.fetch_add(by, std::memory_order_relaxed); }

}  // namespace cake
