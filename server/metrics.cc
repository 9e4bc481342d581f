#include "server/metrics.h"

#include <exception>
#include <limits>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/support/server_interceptor.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"
#include "server/daemon_state.h"
#include "server/load_metrics.h"

namespace cake {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

constexpr const char* kCodeNames[RpcMetrics::kCodes] = {
    "OK",        "CANCELLED",         "UNKNOWN",       "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",  "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL",     "UNAVAILABLE",   "DATA_LOSS",        "UNAUTHENTICATED"};

// The families of one scrape, each with its series in a stable order.
class Families {
 public:
  MetricFamily& Family(std::string name, std::string help, MetricType type) {
    families_.push_back(MetricFamily{std::move(name), std::move(help), type, {}});
    return families_.back();
  }
  static void Add(MetricFamily& family, Labels labels, double value) {
    ClientMetric m;
    m.label = std::move(labels);
    if (family.type == MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    family.metric.push_back(std::move(m));
  }
  static void Add(MetricFamily& family, Labels labels, const Histogram::Snapshot& s) {
    ClientMetric m;
    m.label = std::move(labels);
    m.histogram.sample_count = s.count;
    m.histogram.sample_sum = s.sum;
    uint64_t cumulative = 0;
    for (size_t i = 0; i < s.upper_bounds.size(); ++i) {
      cumulative += s.counts[i];
      m.histogram.bucket.push_back({cumulative, s.upper_bounds[i]});
    }
    m.histogram.bucket.push_back({s.count, std::numeric_limits<double>::infinity()});
    family.metric.push_back(std::move(m));
  }
  void Single(std::string name, std::string help, MetricType type, double value, Labels labels = {}) {
    Add(Family(std::move(name), std::move(help), type), std::move(labels), value);
  }
  std::vector<MetricFamily> Take() { return std::move(families_); }

 private:
  std::vector<MetricFamily> families_;
};

double Load(const std::atomic<uint64_t>& counter) {
  return static_cast<double>(counter.load(std::memory_order_relaxed));
}

void CollectTiers(const DaemonState& state, Families& out) {
  auto& reads = out.Family("cake_tier_reads_total", "Chunk reads by loads, by result (miss: gone since the lookup)",
                           MetricType::Counter);
  auto& read_bytes = out.Family("cake_tier_read_bytes_total", "Bytes loads read from the tier", MetricType::Counter);
  auto& writes = out.Family("cake_tier_writes_total", "Chunk writes (stores, write-backs, promotions) by result",
                            MetricType::Counter);
  auto& written = out.Family("cake_tier_written_bytes_total", "Bytes written into the tier", MetricType::Counter);
  auto& evictions = out.Family("cake_tier_evictions_total", "Chunks dropped to make room", MetricType::Counter);
  auto& corrupt = out.Family("cake_tier_corrupt_removed_total", "Chunks a read found corrupt and removed",
                             MetricType::Counter);
  auto& used = out.Family("cake_tier_used_bytes", "Bytes the stored chunks cost the tier", MetricType::Gauge);
  auto& capacity = out.Family("cake_tier_capacity_bytes", "The tier's configured capacity", MetricType::Gauge);
  auto& chunks = out.Family("cake_tier_chunks", "Chunks stored in the tier", MetricType::Gauge);
  auto& bandwidth = out.Family("cake_tier_load_bandwidth_bytes_per_second",
                               "What recent single-tier loads achieved from the tier (0: none measured yet); the "
                               "planner's estimate",
                               MetricType::Gauge);
  auto& read_cap = out.Family("cake_tier_read_limit_gbps", "The tier's read cap in Gbit/s (0: not throttled)",
                              MetricType::Gauge);
  auto& latency = out.Family("cake_tier_read_seconds", "Time one chunk read took, throttling included",
                             MetricType::Histogram);
  auto& own = out.Family("cake_tier_events_total", "Events only some tiers count (a remote tier's reconnects and "
                         "redirects), by event", MetricType::Counter);
  for (const auto& entry : state.tiers.tiers()) {
    const std::string tier = TierKindName(entry->kind);
    const TierManager::IoMeter& io = entry->io;
    Families::Add(reads, {{"result", "hit"}, {"tier", tier}}, Load(io.read_hits));
    Families::Add(reads, {{"result", "miss"}, {"tier", tier}}, Load(io.read_misses));
    Families::Add(reads, {{"result", "error"}, {"tier", tier}}, Load(io.read_errors));
    Families::Add(read_bytes, {{"tier", tier}}, Load(io.read_bytes));
    Families::Add(writes, {{"result", "ok"}, {"tier", tier}}, Load(io.writes_ok));
    Families::Add(writes, {{"result", "error"}, {"tier", tier}}, Load(io.writes_failed));
    Families::Add(written, {{"tier", tier}}, Load(io.written_bytes));
    const TierStats stats = entry->tier->Stats();
    Families::Add(evictions, {{"tier", tier}}, static_cast<double>(stats.evictions));
    Families::Add(corrupt, {{"tier", tier}}, static_cast<double>(stats.corrupt_removed));
    for (const auto& [name, value] : stats.own) {
      Families::Add(own, {{"event", std::string(name)}, {"tier", tier}}, static_cast<double>(value));
    }
    const TierUsage usage = entry->tier->Usage();
    Families::Add(used, {{"tier", tier}}, static_cast<double>(usage.used_bytes));
    Families::Add(capacity, {{"tier", tier}}, static_cast<double>(usage.capacity_bytes));
    Families::Add(chunks, {{"tier", tier}}, static_cast<double>(usage.chunks));
    const double seconds_per_byte = entry->seconds_per_byte.load(std::memory_order_relaxed);
    Families::Add(bandwidth, {{"tier", tier}}, seconds_per_byte > 0 ? 1.0 / seconds_per_byte : 0.0);
    Families::Add(read_cap, {{"tier", tier}}, entry->tier->read_cap_gbps());
    Families::Add(latency, {{"tier", tier}}, io.read_seconds.Read());
  }
}

void CollectLoads(const DaemonState& state, Families& out) {
  auto& loads = out.Family("cake_loads_total", "Loads planned, by the strategy the planner chose",
                           MetricType::Counter);
  auto& chunks = out.Family("cake_load_chunks_total",
                            "Chunks of finished loads by where they came from: loaded, computed (cached but below the "
                            "meeting point), failed (read failed, computed), uncached (beyond the cached prefix)",
                            MetricType::Counter);
  auto& duration = out.Family("cake_load_duration_seconds",
                              "Start to the meeting point: the daemon's part of time to first token",
                              MetricType::Histogram);
  auto& share = out.Family("cake_load_loaded_share",
                           "Loaded chunks over cached chunks per load: where the meeting point fell (1: all loaded)",
                           MetricType::Histogram);
  state.load_metrics.ForEach([&](const std::string& tenant, const std::string& model, const LoadMetrics::Series& s) {
    auto labels = [&](const char* name, const char* value) {
      return Labels{{name, value}, {"model", model}, {"tenant", tenant}};
    };
    Families::Add(loads, labels("strategy", "cake"), Load(s.loads_cake));
    Families::Add(loads, labels("strategy", "io_only"), Load(s.loads_io_only));
    Families::Add(loads, labels("strategy", "compute_only"), Load(s.loads_compute_only));
    Families::Add(chunks, labels("source", "loaded"), Load(s.chunks_loaded));
    Families::Add(chunks, labels("source", "computed"), Load(s.chunks_computed));
    Families::Add(chunks, labels("source", "failed"), Load(s.chunks_failed));
    Families::Add(chunks, labels("source", "uncached"), Load(s.chunks_uncached));
    Families::Add(duration, {{"model", model}, {"tenant", tenant}}, s.duration_seconds.Read());
    Families::Add(share, {{"model", model}, {"tenant", tenant}}, s.loaded_share.Read());
  });
  Families::Add(out.Family("cake_load_plan_seconds", "Start received to the Plan sent, the prefix lookup included",
                           MetricType::Histogram),
                {}, state.load_metrics.plan_seconds.Read());
  Families::Add(out.Family("cake_load_first_chunk_seconds", "Start received to the first chunk landed",
                           MetricType::Histogram),
                {}, state.load_metrics.first_chunk_seconds.Read());
}

void CollectDaemon(const DaemonState& state, Families& out) {
  out.Single("cake_build_info", "Always 1; the version label names the caked that answers", MetricType::Gauge, 1,
             {{"version", CAKE_VERSION}});
  out.Single("cake_draining", "1 while drained (new loads refused, health NOT_SERVING)", MetricType::Gauge,
             state.draining ? 1 : 0);
  out.Single("cake_loads_active", "Loads running now", MetricType::Gauge, state.loads.active());
  out.Single("cake_regions", "Registered regions", MetricType::Gauge, static_cast<double>(state.regions.count()));
  out.Single("cake_region_bytes", "Bytes of registered regions", MetricType::Gauge,
             static_cast<double>(state.regions.total_bytes()));
  out.Single("cake_inline_bytes_held", "Bytes of inline chunk payloads waiting to be sent", MetricType::Gauge,
             static_cast<double>(state.inline_budget.held()));
  auto& queue = out.Family("cake_io_queue_depth", "Reads queued for an I/O thread, by pool (network: remote tier)",
                           MetricType::Gauge);
  Families::Add(queue, {{"pool", "local"}}, static_cast<double>(state.pool.queued()));
  Families::Add(queue, {{"pool", "network"}}, static_cast<double>(state.network_reads.queued()));
  const TierManager::WriteBackStats wb = state.tiers.write_back_stats();
  out.Single("cake_write_back_queued_bytes", "Bytes waiting to be written back to slower tiers", MetricType::Gauge,
             static_cast<double>(wb.queued_bytes));
  auto& write_back = out.Family("cake_write_back_total", "Write-backs and promotions between tiers, by outcome",
                                MetricType::Counter);
  Families::Add(write_back, {{"outcome", "written"}}, static_cast<double>(wb.written));
  Families::Add(write_back, {{"outcome", "failed"}}, static_cast<double>(wb.failed));
  Families::Add(write_back, {{"outcome", "inline"}}, static_cast<double>(wb.inline_writes));
  Families::Add(write_back, {{"outcome", "promoted"}}, static_cast<double>(wb.promotions));
  Families::Add(write_back, {{"outcome", "promotion_dropped"}}, static_cast<double>(wb.promotions_dropped));
  Families::Add(write_back, {{"outcome", "promoted_to_disk"}}, static_cast<double>(wb.promotions_to_disk));
  // Every counter cakectl stats shows, under the same name.
  for (const auto& [name, value] : state.counters.Snapshot()) {
    out.Single(absl::StrCat("cake_", name, "_total"), absl::StrCat("cakectl stats: ", name), MetricType::Counter,
               static_cast<double>(value));
  }
  auto& rpcs = out.Family("cake_rpc_responses_total", "RPCs answered, by method and gRPC status code",
                          MetricType::Counter);
  state.rpc_metrics.ForEach([&](const std::string& method, int code, uint64_t count) {
    Families::Add(rpcs, {{"code", kCodeNames[code]}, {"method", method}}, static_cast<double>(count));
  });
}

class DaemonCollectable final : public prometheus::Collectable {
 public:
  explicit DaemonCollectable(const DaemonState& state) : state_(state) {}
  std::vector<MetricFamily> Collect() const override {
    Families out;
    CollectDaemon(state_, out);
    CollectTiers(state_, out);
    CollectLoads(state_, out);
    return out.Take();
  }

 private:
  const DaemonState& state_;
};

class RpcMetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcMetricsInterceptor(RpcMetrics& metrics, const char* method) : metrics_(metrics), method_(method) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      metrics_.Count(method_, static_cast<int>(methods->GetSendStatus().error_code()));
    }
    methods->Proceed();
  }

 private:
  RpcMetrics& metrics_;
  std::string_view method_;
};

class RpcMetricsInterceptorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcMetricsInterceptorFactory(RpcMetrics& metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    // "/cake.v1.KvService/Lookup" → "cake.v1.KvService/Lookup"; the name lives as long as the server.
    const char* method = info->method();
    if (method == nullptr) method = "unknown";
    if (*method == '/') ++method;
    return new RpcMetricsInterceptor(metrics_, method);
  }

 private:
  RpcMetrics& metrics_;
};

}  // namespace

struct MetricsEndpoint::Impl {
  std::shared_ptr<DaemonCollectable> collectable;
  std::unique_ptr<prometheus::Exposer> exposer;
};

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<Impl> impl, std::string address)
    : impl_(std::move(impl)), address_(std::move(address)) {}

MetricsEndpoint::~MetricsEndpoint() {
  if (impl_ != nullptr && impl_->exposer != nullptr) impl_->exposer->RemoveCollectable(impl_->collectable);
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const std::string& listen,
                                                                        const DaemonState& state) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics.listen \"", listen, "\" is not host:port (e.g. \"127.0.0.1:9464\")"));
  }
  auto impl = std::make_unique<Impl>();
  impl->collectable = std::make_shared<DaemonCollectable>(state);
  try {
    // Two threads: a scraper or two at a time. A peer that opens a connection and sends nothing is dropped after
    // the request timeout instead of holding a thread; civetweb bounds the request's size itself.
    impl->exposer = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", listen, "num_threads", "2", "request_timeout_ms", "10000", "enable_keep_alive", "no"});
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("metrics.listen \"", listen, "\": cannot listen (", e.what(), ")"));
  }
  impl->exposer->RegisterCollectable(impl->collectable);
  const std::vector<int> ports = impl->exposer->GetListeningPorts();
  if (ports.empty()) return absl::UnavailableError(absl::StrCat("metrics.listen \"", listen, "\": no port bound"));
  std::string address = absl::StrCat(listen.substr(0, colon), ":", ports.front());
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(std::move(impl), std::move(address)));
}

std::string RenderMetrics(const DaemonState& state) {
  return prometheus::TextSerializer().Serialize(DaemonCollectable(state).Collect());
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewRpcMetricsInterceptor(RpcMetrics& metrics) {
  return std::make_unique<RpcMetricsInterceptorFactory>(metrics);
}

}  // namespace cake
