#include "server/telemetry/telemetry.h"

#include <array>
#include <cmath>
#include <iterator>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/core/counters.h"
#include "server/core/daemon_state.h"
#include "server/core/load_metrics.h"
#include "server/edge/connection_gate.h"
#include "server/edge/health_service.h"
#include "server/edge/unix_listener.h"

namespace cake {
namespace {

using enum MetricKind;

#define CAKE_COUNTER_DEF(name, help) MetricDef{#name, kCounter, help},
constexpr MetricDef kCounterMetrics[] = {CAKE_COUNTERS(CAKE_COUNTER_DEF)};
#undef CAKE_COUNTER_DEF

constexpr MetricDef kReadFailuresByCode{
    "load_chunk_read_failures_{code}", kCounter,
    "Of load_chunk_read_failures, by the read's status code (data_loss: a corrupt chunk, removed; not_found: evicted "
    "since the lookup; unavailable: the medium or Redis failed)",
    "load_chunk_read_failures_by_code"};

constexpr MetricDef kBuildInfo{
    "build_info_{version}", kGauge, "Always 1; the version label names the caked that answers", {}, true};
constexpr MetricDef kDraining{"draining", kGauge, "1 while drained (new loads refused, health NOT_SERVING)"};
constexpr MetricDef kLoadsActive{"loads_active", kGauge, "Loads running now"};
constexpr MetricDef kRegions{"regions", kGauge, "Registered regions (released ones live loads still use included)"};
constexpr MetricDef kRegionBytes{"region_bytes", kGauge,
                                 "Bytes of registered regions (released ones live loads still use included)"};
constexpr MetricDef kRegionBytesReleasedInUse{
    "region_bytes_released_in_use", kGauge,
    "Of region_bytes: regions released while live loads use them, counted until those loads end"};
constexpr MetricDef kInlineBytesHeld{"inline_bytes_held", kGauge,
                                     "Bytes of inline chunk payloads read and not yet handed to gRPC"};
constexpr MetricDef kConnectionsOpen{"connections_open", kGauge, "Connections served now (unix and TCP)"};
constexpr MetricDef kConnections{
    "connections_{outcome}", kCounter,
    "Connections accepted, by outcome (refused: past server.max_connections or server.max_connections_per_peer, "
    "closed at accept; refused_unnamed_uid: from a uid no principal names, closed at accept; stranger_evicted: a TCP "
    "connection on which no call had named a principal, closed to make room for a newer one; stranger_timed_out: "
    "one closed for naming none within tcp.identify_timeout_ms)"};
constexpr MetricDef kLoadStreamsUnstarted{"load_streams_unstarted", kGauge,
                                          "Load streams open without a Start (loader.max_unstarted_streams)"};
constexpr MetricDef kHealthWatchesOpen{"health_watches_open", kGauge, "Health Watch streams open now"};
constexpr MetricDef kHealthWatchesRefused{
    "health_watches_refused", kCounter,
    "Health Watch streams refused past server.max_health_watches or server.max_health_watches_per_peer"};
constexpr MetricDef kIoQueueDepth{"io_queue_depth_{pool}", kGauge,
                                  "Reads queued for an I/O thread, by pool (network: the remote tier)"};
constexpr MetricDef kWriteBackQueuedBytes{"write_back_queued_bytes", kGauge,
                                          "Bytes waiting to be written back to slower tiers"};
constexpr MetricDef kWriteBack{
    "write_back_{outcome}", kCounter,
    "Copies between tiers, by outcome (written, failed: a write-back that reached a slower tier or was refused; "
    "inline: one a Store did itself, the queue full; promoted, promotion_dropped: copies into DRAM of chunks read "
    "from a slower tier, or skipped, the promotion queue full; promoted_to_disk: remote hits copied onto the disk)"};

constexpr MetricDef kTierReads{"tier_{tier}_reads_{result}", kCounter,
                               "Chunk reads by loads, by result (miss: gone since the lookup)"};
constexpr MetricDef kTierReadBytes{"tier_{tier}_read_bytes", kCounter, "Bytes loads read from the tier"};
constexpr MetricDef kTierReadSeconds{"tier_{tier}_read_seconds", kHistogram,
                                     "Time one chunk read took, throttling included"};
constexpr MetricDef kTierWrites{"tier_{tier}_writes_{result}", kCounter,
                                "Chunk writes (stores, write-backs, promotions) by result"};
constexpr MetricDef kTierWrittenBytes{"tier_{tier}_written_bytes", kCounter, "Bytes written into the tier"};
constexpr MetricDef kTierEvictions{"tier_{tier}_evictions", kCounter, "Chunks dropped to make room"};
constexpr MetricDef kTierCorruptRemoved{"tier_{tier}_corrupt_removed", kCounter,
                                        "Chunks a read found corrupt and removed"};
constexpr MetricDef kTierUsedBytes{"tier_{tier}_used_bytes", kGauge, "Bytes the stored chunks cost the tier"};
constexpr MetricDef kTierCapacityBytes{"tier_{tier}_capacity_bytes", kGauge, "The tier's configured capacity"};
constexpr MetricDef kTierChunks{"tier_{tier}_chunks", kGauge, "Chunks stored in the tier"};
constexpr MetricDef kTierBandwidth{
    "tier_{tier}_load_bandwidth_bytes_per_second", kGauge,
    "What recent single-tier loads achieved from the tier (0: none measured yet); the planner's estimate"};
constexpr MetricDef kTierReadLimit{"tier_{tier}_read_limit_gbps",
                                   kGauge,
                                   "The tier's read cap in Gbit/s (0: not throttled; cakectl status shows it)",
                                   {},
                                   true};
constexpr MetricDef kTierEvents{
    "tier_{tier}_{event}", kCounter,
    "Events only some tiers count (a remote tier's errors, connects and redirects), by event", "tier_events"};

constexpr MetricDef kLoads{
    "loads_{strategy}_{tenant}_{model}", kCounter, "Loads planned, by the strategy the planner chose", {}, true};
constexpr MetricDef kLoadsByStrategy{
    "loads_{strategy}",  kCounter, "Loads planned, by the strategy the planner chose, over every tenant and model",
    "loads_by_strategy", false,    true};
constexpr MetricDef kLoadChunks{
    "load_chunks_{source}_{tenant}_{model}",
    kCounter,
    "Chunks of finished loads by where they came from: loaded, computed (cached but below "
    "the meeting point), failed (read failed, computed), uncached (beyond the cached prefix)",
    {},
    true};
constexpr MetricDef kLoadDuration{"load_duration_seconds_{tenant}_{model}", kHistogram,
                                  "Start to the meeting point: the daemon's part of time to first token"};
constexpr MetricDef kLoadedShare{
    "load_loaded_share_{tenant}_{model}", kHistogram,
    "Loaded chunks over cached chunks per load: where the meeting point fell (1: all loaded)"};
constexpr MetricDef kLoadPlanSeconds{"load_plan_seconds", kHistogram,
                                     "Start received to the Plan sent, the prefix lookup included"};
constexpr MetricDef kLoadFirstChunkSeconds{"load_first_chunk_seconds", kHistogram,
                                           "Start received to the first chunk landed"};
constexpr MetricDef kPrefetchHeldBytes{
    "prefetch_held_bytes", kGauge, "Chunk bytes prefetches hold: queued, being copied, or copied and not yet loaded"};
constexpr MetricDef kPrefetchToLoad{
    "prefetch_to_load_seconds", kHistogram,
    "From a chunk's prefetch (copied, or queued while copying) to the load that used it"};
constexpr MetricDef kRpcResponses{
    "rpc_responses_{method}_{code}", kCounter, "RPCs answered, by method and gRPC status code", {}, true};

constexpr const MetricDef* kNamedMetrics[] = {&kReadFailuresByCode,
                                              &kBuildInfo,
                                              &kDraining,
                                              &kLoadsActive,
                                              &kRegions,
                                              &kRegionBytes,
                                              &kRegionBytesReleasedInUse,
                                              &kInlineBytesHeld,
                                              &kConnectionsOpen,
                                              &kLoadStreamsUnstarted,
                                              &kConnections,
                                              &kHealthWatchesOpen,
                                              &kHealthWatchesRefused,
                                              &kIoQueueDepth,
                                              &kWriteBackQueuedBytes,
                                              &kWriteBack,
                                              &kTierReads,
                                              &kTierReadBytes,
                                              &kTierReadSeconds,
                                              &kTierWrites,
                                              &kTierWrittenBytes,
                                              &kTierEvictions,
                                              &kTierCorruptRemoved,
                                              &kTierUsedBytes,
                                              &kTierCapacityBytes,
                                              &kTierChunks,
                                              &kTierBandwidth,
                                              &kTierReadLimit,
                                              &kTierEvents,
                                              &kLoads,
                                              &kLoadsByStrategy,
                                              &kLoadChunks,
                                              &kLoadDuration,
                                              &kLoadedShare,
                                              &kLoadPlanSeconds,
                                              &kLoadFirstChunkSeconds,
                                              &kPrefetchHeldBytes,
                                              &kPrefetchToLoad,
                                              &kRpcResponses};

const std::vector<const MetricDef*>& Registry() {
  static const std::vector<const MetricDef*> all = [] {
    std::vector<const MetricDef*> out;
    for (const MetricDef& def : kCounterMetrics) out.push_back(&def);
    for (const MetricDef* def : kNamedMetrics) out.push_back(def);
    return out;
  }();
  return all;
}

double Read(const std::atomic<uint64_t>& counter) {
  return static_cast<double>(counter.load(std::memory_order_relaxed));
}

void CollectDaemon(const DaemonState& state, Telemetry& out) {
  size_t i = 0;
#define CAKE_COLLECT_COUNTER(name, help) out.Add(kCounterMetrics[i++], Read(state.counters.name));
  CAKE_COUNTERS(CAKE_COLLECT_COUNTER)
#undef CAKE_COLLECT_COUNTER
  for (size_t code = 1; code < kStatusCodes; ++code) {
    const double n = Read(state.counters.load_chunk_read_failures_by_code[code]);
    if (n > 0) out.Add(kReadFailuresByCode, n, {kStatusCodeNames[code]});
  }
  out.Add(kBuildInfo, 1, {CAKE_VERSION});
  out.Add(kDraining, state.draining ? 1 : 0);
  out.Add(kLoadsActive, static_cast<double>(state.loads.active()));
  const RegionRegistry::Totals regions = state.regions.totals();
  out.Add(kRegions, static_cast<double>(regions.regions));
  out.Add(kRegionBytes, static_cast<double>(regions.bytes));
  out.Add(kRegionBytesReleasedInUse, static_cast<double>(regions.released_in_use_bytes));
  out.Add(kInlineBytesHeld, static_cast<double>(state.inline_budget.held()));
  out.Add(kLoadStreamsUnstarted, static_cast<double>(state.unstarted_streams.open()));
  if (ConnectionGate* gate = state.facts().connection_gate; gate != nullptr) {
    out.Add(kConnectionsOpen, static_cast<double>(gate->open()));
    out.Add(kConnections, static_cast<double>(gate->admitted()), {"admitted"});
    out.Add(kConnections, static_cast<double>(gate->refused()), {"refused"});
    out.Add(kConnections, static_cast<double>(gate->strangers_evicted()), {"stranger_evicted"});
    out.Add(kConnections, static_cast<double>(gate->strangers_timed_out()), {"stranger_timed_out"});
  }
  if (state.facts().unix_connections != nullptr) {
    out.Add(kConnections, static_cast<double>(state.facts().unix_connections->refused_unnamed()),
            {"refused_unnamed_uid"});
  }
  if (state.facts().health != nullptr) {
    out.Add(kHealthWatchesOpen, static_cast<double>(state.facts().health->watches_open()));
    out.Add(kHealthWatchesRefused, static_cast<double>(state.facts().health->watches_refused()));
  }
  out.Add(kIoQueueDepth, static_cast<double>(state.local_reads.queued()), {"local"});
  out.Add(kIoQueueDepth, static_cast<double>(state.remote_reads_queued()), {"network"});
  const TierManager::WriteBackStats wb = state.tiers.write_back_stats();
  out.Add(kWriteBackQueuedBytes, static_cast<double>(wb.queued_bytes));
  out.Add(kWriteBack, static_cast<double>(wb.written), {"written"});
  out.Add(kWriteBack, static_cast<double>(wb.failed), {"failed"});
  out.Add(kWriteBack, static_cast<double>(wb.inline_writes), {"inline"});
  out.Add(kWriteBack, static_cast<double>(wb.promotions), {"promoted"});
  out.Add(kWriteBack, static_cast<double>(wb.promotions_dropped), {"promotion_dropped"});
  out.Add(kWriteBack, static_cast<double>(wb.promotions_to_disk), {"promoted_to_disk"});
  state.rpc_metrics.ForEach([&](const std::string& method, int code, uint64_t count) {
    // gRPC's codes are absl's, in the same order; the label spells them as gRPC does ("INVALID_ARGUMENT").
    const size_t index = code >= 0 && static_cast<size_t>(code) < kStatusCodes ? static_cast<size_t>(code) : 2;
    out.Add(kRpcResponses, static_cast<double>(count), {method, absl::AsciiStrToUpper(kStatusCodeNames[index])});
  });
}

void CollectTiers(const DaemonState& state, Telemetry& out) {
  for (const auto& entry : state.tiers.tiers()) {
    const std::string tier = TierKindName(entry->kind);
    const TierManager::IoMeter& io = entry->io;
    out.Add(kTierReads, Read(io.read_hits), {tier, "hit"});
    out.Add(kTierReads, Read(io.read_misses), {tier, "miss"});
    out.Add(kTierReads, Read(io.read_errors), {tier, "error"});
    out.Add(kTierReadBytes, Read(io.read_bytes), {tier});
    out.Add(kTierReadSeconds, io.read_seconds.Read(), {tier});
    out.Add(kTierWrites, Read(io.writes_ok), {tier, "ok"});
    out.Add(kTierWrites, Read(io.writes_failed), {tier, "error"});
    out.Add(kTierWrittenBytes, Read(io.written_bytes), {tier});
    const TierStats stats = entry->tier->Stats();
    out.Add(kTierEvictions, static_cast<double>(stats.evictions), {tier});
    out.Add(kTierCorruptRemoved, static_cast<double>(stats.corrupt_removed), {tier});
    for (const auto& [event, value] : stats.own)
      out.Add(kTierEvents, static_cast<double>(value), {tier, std::string(event)});
    const TierUsage usage = entry->tier->Usage();
    out.Add(kTierUsedBytes, static_cast<double>(usage.used_bytes), {tier});
    out.Add(kTierCapacityBytes, static_cast<double>(usage.capacity_bytes), {tier});
    out.Add(kTierChunks, static_cast<double>(usage.chunks), {tier});
    const double seconds_per_byte = state.tier_speeds.SecondsPerByte(entry->kind);
    out.Add(kTierBandwidth, seconds_per_byte > 0 ? 1.0 / seconds_per_byte : 0.0, {tier});
    out.Add(kTierReadLimit, entry->tier->read_cap_gbps(), {tier});
  }
}

void CollectLoads(const DaemonState& state, Telemetry& out) {
  std::array<double, std::size(kStrategies)> by_strategy{};
  state.load_metrics.ForEach([&](const std::string& tenant, const std::string& model, const LoadMetrics::Series& s) {
    for (const auto& [strategy, name] : kStrategies) {
      const double loads = Read(s.loads[static_cast<size_t>(strategy)]);
      out.Add(kLoads, loads, {name, tenant, model});
      by_strategy[static_cast<size_t>(strategy)] += loads;
    }
    out.Add(kLoadChunks, Read(s.chunks_loaded), {"loaded", tenant, model});
    out.Add(kLoadChunks, Read(s.chunks_computed), {"computed", tenant, model});
    out.Add(kLoadChunks, Read(s.chunks_failed), {"failed", tenant, model});
    out.Add(kLoadChunks, Read(s.chunks_uncached), {"uncached", tenant, model});
    out.Add(kLoadDuration, s.duration_seconds.Read(), {tenant, model});
    out.Add(kLoadedShare, s.loaded_share.Read(), {tenant, model});
  });
  for (const auto& [strategy, name] : kStrategies) {
    out.Add(kLoadsByStrategy, by_strategy[static_cast<size_t>(strategy)], {name});
  }
  out.Add(kPrefetchHeldBytes, static_cast<double>(state.prefetcher.held_bytes()));
  out.Add(kPrefetchToLoad, state.prefetcher.prefetch_to_load_seconds.Read());
  out.Add(kLoadPlanSeconds, state.load_metrics.plan_seconds.Read());
  out.Add(kLoadFirstChunkSeconds, state.load_metrics.first_chunk_seconds.Read());
}

}  // namespace

std::span<const MetricDef* const> AllMetrics() { return Registry(); }

std::vector<std::string> LabelNames(const MetricDef& def) {
  std::vector<std::string> names;
  size_t at = 0;
  while ((at = def.key.find('{', at)) != std::string_view::npos) {
    const size_t end = def.key.find('}', at);
    names.emplace_back(def.key.substr(at + 1, end - at - 1));
    at = end;
  }
  return names;
}

std::string StatsKey(const MetricDef& def, const std::vector<std::string>& label_values) {
  std::string key;
  size_t label = 0;
  for (size_t i = 0; i < def.key.size(); ++i) {
    if (def.key[i] != '{') {
      key += def.key[i];
      continue;
    }
    if (label < label_values.size()) key += label_values[label];
    ++label;
    i = def.key.find('}', i);
  }
  return key;
}

std::string FamilyName(const MetricDef& def) {
  if (!def.family.empty()) return std::string(def.family);
  // The key without its labels, and without the underscores that joined them.
  const std::string unlabelled = StatsKey(def, {});
  std::string name;
  for (const absl::string_view part : absl::StrSplit(unlabelled, '_', absl::SkipEmpty())) {
    absl::StrAppend(&name, name.empty() ? "" : "_", std::string(part));
  }
  return name;
}

void Telemetry::Add(const MetricDef& def, double value, std::vector<std::string> label_values) {
  samples_.push_back(MetricSample{&def, std::move(label_values), value, {}});
}

void Telemetry::Add(const MetricDef& def, Histogram::Snapshot histogram, std::vector<std::string> label_values) {
  samples_.push_back(MetricSample{&def, std::move(label_values), 0, std::move(histogram)});
}

std::map<std::string, uint64_t> Telemetry::StatsCounters() const {
  std::map<std::string, uint64_t> out;
  for (const MetricSample& s : samples_) {
    if (s.def->metrics_only || s.def->kind == kHistogram) continue;
    out[StatsKey(*s.def, s.label_values)] = s.value > 0 ? static_cast<uint64_t>(std::llround(s.value)) : 0;
  }
  return out;
}

Telemetry CollectTelemetry(const DaemonState& state) {
  Telemetry out;
  CollectDaemon(state, out);
  CollectTiers(state, out);
  CollectLoads(state, out);
  return out;
}

}  // namespace cake
