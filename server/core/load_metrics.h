// What loads and RPCs did, for the metrics endpoint: per (tenant, model) series of loads, and responses by method
// and status code. Bumped on hot paths (lock-free once a series exists), read whole at a scrape.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "base/histogram.h"
#include "base/mutex.h"
#include "base/strategy.h"

namespace cake {

class LoadMetrics {
 public:
  // One (tenant, model): what its loads chose and where their meeting points fell.
  struct Series {
    // Loads by the strategy their plan chose, indexed by Strategy: the daemon's one count of them (Stats shows
    // the sum over series as loads_cake, loads_io_only, loads_compute_only).
    std::array<std::atomic<uint64_t>, std::size(kStrategies)> loads{};
    std::atomic<uint64_t> chunks_loaded{0};
    std::atomic<uint64_t> chunks_computed{0};  // cached chunks the engine computed (below the meeting point)
    std::atomic<uint64_t> chunks_failed{0};    // reads that failed, computed by the engine instead
    std::atomic<uint64_t> chunks_uncached{0};  // beyond the cached prefix: always computed
    Histogram duration_seconds{Histogram::LatencyBounds()};  // Start to the meeting point
    Histogram loaded_share{Histogram::ShareBounds()};        // loaded / cached chunks (loads with a cached prefix)
  };

  // Engines name their models and tenants, so series are capped: past `max_series` (tenant, model) pairs, new ones
  // share the series labelled tenant="other", model="other", and a scrape stays bounded whatever engines send.
  explicit LoadMetrics(size_t max_series) : max_series_(max_series) {}

  // The series of (tenant, model), created on first use; the reference stays valid for the daemon's life.
  Series& For(std::string_view tenant, std::string_view model);
  void ForEach(const std::function<void(const std::string& tenant, const std::string& model, const Series&)>& fn) const;

  Histogram plan_seconds{Histogram::LatencyBounds()};         // Start received to the Plan sent (lookup included)
  Histogram first_chunk_seconds{Histogram::LatencyBounds()};  // Start received to the first chunk landed

 private:
  const size_t max_series_;
  mutable Mutex mu_;
  std::map<std::pair<std::string, std::string>, std::unique_ptr<Series>> series_ ABSL_GUARDED_BY(mu_);
  Series overflow_;
};

// Responses by RPC method and gRPC status code, counted by a server interceptor (server/rpc_metrics.cc).
class RpcMetrics {
 public:
  static constexpr size_t kCodes = 17;  // grpc::StatusCode OK (0) to UNAUTHENTICATED (16)
  // Methods are the server's own (a fixed set); the cap only guards against a surprise.
  void Count(std::string_view method, int code);
  void ForEach(const std::function<void(const std::string& method, int code, uint64_t count)>& fn) const;

 private:
  static constexpr size_t kMaxMethods = 64;
  using PerCode = std::array<std::atomic<uint64_t>, kCodes>;
  mutable Mutex mu_;
  std::map<std::string, std::unique_ptr<PerCode>, std::less<>> methods_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cake
