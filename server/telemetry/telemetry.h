// Every number the daemon reports, declared once. A metric's declaration (MetricDef) names it, says what it means
// and what kind it is, and places its labels; CollectTelemetry reads the daemon into samples of those metrics, and
// both AdminService.Stats (cakectl stats) and the Prometheus endpoint render the same samples, so a number has one
// value and names derived from one declaration:
//   key "tier_{tier}_reads_{result}", sample (tier=disk, result=hit)
//     Stats:      tier_disk_reads_hit
//     Prometheus: cake_tier_reads_total{result="hit",tier="disk"}
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/histogram.h"

namespace cake {

struct DaemonState;

enum class MetricKind { kCounter, kGauge, kHistogram };

struct MetricDef {
  // The Stats key, each label's value in braces where it goes; the labels are the names in braces, in order.
  std::string_view key;
  MetricKind kind;
  std::string_view help;
  // The Prometheus family, without "cake_" and "_total": by default the key without its labels ("tier_reads").
  // Named only where that would collide with another family or say nothing.
  std::string_view family = {};
  // Shown on /metrics only: labels whose values engines choose (tenant, model, method) make Stats keys nobody can
  // predict, a histogram is not one integer, and a fraction would be rounded away.
  bool metrics_only = false;
  // Shown in Stats only: a sum /metrics shows by its labels already (the loads by strategy, whose one count is the
  // per-series one; a dashboard sums it).
  bool stats_only = false;
};

// The declarations, in the order /metrics lists them.
std::span<const MetricDef* const> AllMetrics();

// "tier_{tier}_reads_{result}" -> {"tier", "result"}.
std::vector<std::string> LabelNames(const MetricDef& def);
// The key with `label_values` in its braces, in order.
std::string StatsKey(const MetricDef& def, const std::vector<std::string>& label_values);
// "tier_reads" for "tier_{tier}_reads_{result}", or `def.family` where named.
std::string FamilyName(const MetricDef& def);

struct MetricSample {
  const MetricDef* def = nullptr;
  std::vector<std::string> label_values;  // in the order of LabelNames(*def)
  double value = 0;                       // counters and gauges
  Histogram::Snapshot histogram;          // histograms
};

// The samples of one Stats call or one scrape, in the order they were taken.
class Telemetry {
 public:
  void Add(const MetricDef& def, double value, std::vector<std::string> label_values = {});
  void Add(const MetricDef& def, Histogram::Snapshot histogram, std::vector<std::string> label_values = {});
  // A sample keeps a pointer to its declaration: a temporary one would dangle.
  void Add(MetricDef&&, double, std::vector<std::string> = {}) = delete;
  void Add(MetricDef&&, Histogram::Snapshot, std::vector<std::string> = {}) = delete;
  const std::vector<MetricSample>& samples() const { return samples_; }

  // What Stats answers: each sample not metrics_only under its StatsKey, its value rounded to an integer.
  std::map<std::string, uint64_t> StatsCounters() const;

 private:
  std::vector<MetricSample> samples_;
};

// Everything the daemon reports now. Asks each tier for its usage and counters: a tier that waits on the network
// (Redis) may make it wait, so it never runs on a thread that must stay free.
Telemetry CollectTelemetry(const DaemonState& state);

}  // namespace cake
