// A fixed-bucket histogram that hot paths observe into without a lock, read whole by the metrics endpoint.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace cake {

class Histogram {
 public:
  // Upper bounds of the buckets, ascending; a last bucket without a bound catches everything above them.
  explicit Histogram(std::span<const double> upper_bounds)
      : bounds_(upper_bounds.begin(), upper_bounds.end()),
        buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {}

  void Observe(double value) {
    size_t i = 0;
    while (i < bounds_.size() && value > bounds_[i]) ++i;  // a dozen bounds: a scan beats a binary search
    buckets_[i].fetch_add(1, std::memory_order_relaxed);
    sum_.fetch_add(value, std::memory_order_relaxed);
  }

  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> counts;  // per bucket, not cumulative; one more than upper_bounds (the overflow bucket)
    uint64_t count = 0;
    double sum = 0;
  };
  // Buckets are read one by one while others observe: a snapshot may be one observation off between its count and
  // its sum, never more.
  Snapshot Read() const {
    Snapshot s;
    s.upper_bounds = bounds_;
    s.counts.resize(bounds_.size() + 1);
    for (size_t i = 0; i <= bounds_.size(); ++i) {
      s.counts[i] = buckets_[i].load(std::memory_order_relaxed);
      s.count += s.counts[i];
    }
    s.sum = sum_.load(std::memory_order_relaxed);
    return s;
  }

  // Seconds, 50 µs to 10 s: a DRAM chunk read at the low end, a frozen Redis at the high end.
  static std::span<const double> LatencyBounds() {
    static constexpr double kBounds[] = {50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
                                         50e-3, 100e-3, 250e-3, 500e-3, 1.0,  2.5,    5.0,  10.0};
    return kBounds;
  }
  // Shares in tenths, 0 to 1.
  static std::span<const double> ShareBounds() {
    static constexpr double kBounds[] = {0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
    return kBounds;
  }

 private:
  const std::vector<double> bounds_;
  const std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<double> sum_{0};
};

}  // namespace cake
