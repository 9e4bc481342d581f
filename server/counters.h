// The daemon's counters, read by AdminService.Stats and cakectl. Lock-free: bumped on every hot path.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

namespace cake {

#define CAKE_COUNTERS(X)                                                                                              \
  X(lookups)                                                                                                          \
  X(lookup_chunks)                                                                                                    \
  X(lookup_cached_chunks)                                                                                             \
  X(loads_started) X(loads_finished) X(loads_cancelled) X(load_chunks_loaded) X(load_bytes_loaded)                    \
      X(load_chunk_read_failures) X(load_chunks_computed) X(loads_not_promoted) X(loads_cake) X(loads_io_only)        \
          X(loads_compute_only) X(stores) X(store_chunks_stored) X(store_chunks_already_cached) X(store_bytes_stored) \
              X(store_chunks_rejected) X(regions_registered) X(regions_released) X(invalid_requests)   \
                  X(loads_idle_ended) X(regions_reclaimed) X(regions_expired) X(inline_reads_waited) X(lookups_network_skipped)

struct Counters {
#define CAKE_DECLARE_COUNTER(name) std::atomic<uint64_t> name{0};
  CAKE_COUNTERS(CAKE_DECLARE_COUNTER)
#undef CAKE_DECLARE_COUNTER

  std::map<std::string, uint64_t> Snapshot() const {
    std::map<std::string, uint64_t> out;
#define CAKE_SNAPSHOT_COUNTER(name) out[#name] = name.load(std::memory_order_relaxed);
    CAKE_COUNTERS(CAKE_SNAPSHOT_COUNTER)
#undef CAKE_SNAPSHOT_COUNTER
    return out;
  }
};

inline void Bump(std::atomic<uint64_t>& counter, uint64_t by = 1) { counter.fetch_add(by, std::memory_order_relaxed); }

}  // namespace cake
