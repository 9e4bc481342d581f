// The telemetry registry: every metric declared once, Stats and /metrics rendered from the same samples.
#include "server/telemetry/telemetry.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "server/config/config.h"
#include "server/core/daemon_state.h"
#include "server/edge/access.h"
#include "server/telemetry/metrics.h"
#include "storage/dram_tier.h"

namespace cake {
namespace {

bool IsName(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return false;
  }
  return true;
}

std::string PrometheusName(const MetricDef& def) {
  return "cake_" + FamilyName(def) + (def.kind == MetricKind::kCounter ? "_total" : "");
}

// The series line a sample should have on /metrics, without its value: name{label="value",...} (labels sorted).
std::string SeriesOf(const MetricSample& s) {
  std::map<std::string, std::string> labels;
  const std::vector<std::string> names = LabelNames(*s.def);
  for (size_t i = 0; i < names.size(); ++i) labels[names[i]] = s.label_values.at(i);
  std::string line = PrometheusName(*s.def);
  if (!labels.empty()) {
    line += "{";
    for (const auto& [name, value] : labels) line += name + "=\"" + value + "\",";
    line.back() = '}';
  }
  return line;
}

// {series: value} of a scrape's text.
std::map<std::string, double> ParseScrape(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    out[line.substr(0, space)] = std::strtod(line.c_str() + space + 1, nullptr);
  }
  return out;
}

}  // namespace

TEST_CASE("telemetry: each metric is declared once, with a family of its own and well-formed labels", "[telemetry]") {
  std::set<std::string> families, plain_keys;
  for (const MetricDef* def : AllMetrics()) {
    INFO(def->key);
    CHECK(!def->help.empty());
    CHECK(IsName(FamilyName(*def)));
    CHECK(families.insert(PrometheusName(*def)).second);  // two declarations never share a family
    const std::vector<std::string> labels = LabelNames(*def);
    CHECK(std::set<std::string>(labels.begin(), labels.end()).size() == labels.size());
    for (const std::string& label : labels) CHECK(IsName(label));
    if (labels.empty()) CHECK(plain_keys.insert(std::string(def->key)).second);
  }
  CHECK(families.contains("cake_lookups_total"));  // the plain counters are in the registry too
  CHECK(families.contains("cake_tier_reads_total"));
}

TEST_CASE("telemetry: a key names the Stats key and the Prometheus family and labels", "[telemetry]") {
  const MetricDef reads{"tier_{tier}_reads_{result}", MetricKind::kCounter, "reads"};
  CHECK(LabelNames(reads) == std::vector<std::string>{"tier", "result"});
  CHECK(StatsKey(reads, {"disk", "hit"}) == "tier_disk_reads_hit");
  CHECK(FamilyName(reads) == "tier_reads");
  const MetricDef events{"tier_{tier}_{event}", MetricKind::kCounter, "events", "tier_events"};
  CHECK(StatsKey(events, {"remote", "connects"}) == "tier_remote_connects");
  CHECK(FamilyName(events) == "tier_events");
  // Samples point at their declarations, which live as long as the program (here: the test).
  const MetricDef gauge{"gauge", MetricKind::kGauge, "g"};
  const MetricDef hidden{"hidden_{tenant}", MetricKind::kCounter, "h", {}, true};
  const MetricDef latency{"latency", MetricKind::kHistogram, "l"};
  Telemetry t;
  t.Add(reads, 7, {"dram", "miss"});
  t.Add(gauge, 2.6);
  t.Add(hidden, 1, {"someone"});
  t.Add(latency, Histogram::Snapshot{});
  CHECK(t.StatsCounters() == std::map<std::string, uint64_t>{{"tier_dram_reads_miss", 7}, {"gauge", 3}});
}

TEST_CASE("telemetry: Stats and /metrics show every number of a daemon's state under names from one key",
          "[telemetry]") {
  DaemonConfig config;
  config.io_threads = 1;
  AccessPolicy policy = *AccessPolicy::FromConfig(config);
  DaemonState state(config, policy);
  state.tiers.AddTier(TierKind::kDram, std::make_unique<DramTier>(1 << 20));
  Bump(state.counters.lookups, 3);
  state.counters.CountReadFailure(static_cast<int>(absl::StatusCode::kDataLoss));

  const Telemetry telemetry = CollectTelemetry(state);
  const std::map<std::string, uint64_t> stats = telemetry.StatsCounters();
  const std::map<std::string, double> scraped = ParseScrape(RenderMetrics(state));
  size_t in_stats = 0;
  for (const MetricSample& s : telemetry.samples()) {
    if (s.def->kind == MetricKind::kHistogram) {
      CHECK(scraped.contains(PrometheusName(*s.def) + "_count" + SeriesOf(s).substr(PrometheusName(*s.def).size())));
      continue;
    }
    INFO(SeriesOf(s));
    if (s.def->stats_only) {
      CHECK(!scraped.contains(SeriesOf(s)));
      ++in_stats;
      CHECK(stats.at(StatsKey(*s.def, s.label_values)) == static_cast<uint64_t>(s.value + 0.5));
      continue;
    }
    REQUIRE(scraped.contains(SeriesOf(s)));
    CHECK(scraped.at(SeriesOf(s)) == Approx(s.value));
    const std::string key = StatsKey(*s.def, s.label_values);
    if (s.def->metrics_only) {
      CHECK(!stats.contains(key));
    } else {
      ++in_stats;
      CHECK(stats.at(key) == static_cast<uint64_t>(s.value + 0.5));
    }
  }
  CHECK(stats.size() == in_stats);  // Stats shows nothing the registry does not declare
  CHECK(stats.at("lookups") == 3);
  CHECK(scraped.at("cake_lookups_total") == 3);
  CHECK(stats.at("load_chunk_read_failures_data_loss") == 1);
  CHECK(scraped.at("cake_load_chunk_read_failures_by_code_total{code=\"data_loss\"}") == 1);
  CHECK(stats.at("tier_dram_capacity_bytes") == (1u << 20));
  CHECK(scraped.at("cake_tier_capacity_bytes{tier=\"dram\"}") == (1u << 20));
  CHECK(scraped.contains("cake_build_info{version=\"" CAKE_VERSION "\"}"));
}

}  // namespace cake
