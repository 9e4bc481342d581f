#include "server/metrics.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <limits>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/unique_fd.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/support/server_interceptor.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"
#include "server/daemon_state.h"
#include "server/load_metrics.h"
#include "server/tcp_listener.h"

namespace cake {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

constexpr const char* kCodeNames[RpcMetrics::kCodes] = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};

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
  auto& corrupt =
      out.Family("cake_tier_corrupt_removed_total", "Chunks a read found corrupt and removed", MetricType::Counter);
  auto& used = out.Family("cake_tier_used_bytes", "Bytes the stored chunks cost the tier", MetricType::Gauge);
  auto& capacity = out.Family("cake_tier_capacity_bytes", "The tier's configured capacity", MetricType::Gauge);
  auto& chunks = out.Family("cake_tier_chunks", "Chunks stored in the tier", MetricType::Gauge);
  auto& bandwidth = out.Family("cake_tier_load_bandwidth_bytes_per_second",
                               "What recent single-tier loads achieved from the tier (0: none measured yet); the "
                               "planner's estimate",
                               MetricType::Gauge);
  auto& read_cap =
      out.Family("cake_tier_read_limit_gbps", "The tier's read cap in Gbit/s (0: not throttled)", MetricType::Gauge);
  auto& latency =
      out.Family("cake_tier_read_seconds", "Time one chunk read took, throttling included", MetricType::Histogram);
  auto& own = out.Family("cake_tier_events_total",
                         "Events only some tiers count (a remote tier's reconnects and "
                         "redirects), by event",
                         MetricType::Counter);
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
  auto& loads = out.Family("cake_loads_total", "Loads planned, by the strategy the planner chose", MetricType::Counter);
  auto& chunks = out.Family("cake_load_chunks_total",
                            "Chunks of finished loads by where they came from: loaded, computed (cached but below the "
                            "meeting point), failed (read failed, computed), uncached (beyond the cached prefix)",
                            MetricType::Counter);
  auto& duration =
      out.Family("cake_load_duration_seconds", "Start to the meeting point: the daemon's part of time to first token",
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
  Families::Add(
      out.Family("cake_load_first_chunk_seconds", "Start received to the first chunk landed", MetricType::Histogram),
      {}, state.load_metrics.first_chunk_seconds.Read());
}

void CollectDaemon(const DaemonState& state, Families& out) {
  out.Single("cake_build_info", "Always 1; the version label names the caked that answers", MetricType::Gauge, 1,
             {{"version", CAKE_VERSION}});
  out.Single("cake_draining", "1 while drained (new loads refused, health NOT_SERVING)", MetricType::Gauge,
             state.draining ? 1 : 0);
  out.Single("cake_loads_active", "Loads running now", MetricType::Gauge, state.loads.active());
  const RegionRegistry::Totals regions = state.regions.totals();
  out.Single("cake_regions", "Registered regions (released ones live loads still use included)", MetricType::Gauge,
             static_cast<double>(regions.regions));
  out.Single("cake_region_bytes", "Bytes of registered regions (released ones live loads still use included)",
             MetricType::Gauge, static_cast<double>(regions.bytes));
  out.Single("cake_region_bytes_released_in_use",
             "Of cake_region_bytes: regions released while live loads use them, counted until those loads end",
             MetricType::Gauge, static_cast<double>(regions.released_in_use_bytes));
  out.Single("cake_inline_bytes_held", "Bytes of inline chunk payloads waiting to be sent", MetricType::Gauge,
             static_cast<double>(state.inline_budget.held()));
  if (ConnectionGate* gate = state.connection_gate; gate != nullptr) {
    out.Single("cake_connections_open", "Connections served now (unix and TCP)", MetricType::Gauge, gate->open());
    auto& connections = out.Family("cake_connections_total",
                                   "Connections accepted, by outcome (refused: past server.max_connections or "
                                   "server.max_connections_per_peer, closed at accept; unnamed_uid: from a uid no "
                                   "principal names, closed at accept)",
                                   MetricType::Counter);
    Families::Add(connections, {{"outcome", "admitted"}}, static_cast<double>(gate->admitted()));
    Families::Add(connections, {{"outcome", "refused"}}, static_cast<double>(gate->refused()));
    if (state.unix_connections != nullptr) {
      Families::Add(connections, {{"outcome", "unnamed_uid"}},
                    static_cast<double>(state.unix_connections->refused_unnamed()));
    }
  }
  if (state.health != nullptr) {
    out.Single("cake_health_watches_open", "Health Watch streams open now", MetricType::Gauge,
               state.health->watches_open());
    out.Single("cake_health_watches_refused_total",
               "Health Watch streams refused past server.max_health_watches or server.max_health_watches_per_peer",
               MetricType::Counter, static_cast<double>(state.health->watches_refused()));
  }
  auto& queue = out.Family("cake_io_queue_depth", "Reads queued for an I/O thread, by pool (network: remote tier)",
                           MetricType::Gauge);
  Families::Add(queue, {{"pool", "local"}}, static_cast<double>(state.pool.queued()));
  Families::Add(queue, {{"pool", "network"}}, static_cast<double>(state.network_reads.queued()));
  const TierManager::WriteBackStats wb = state.tiers.write_back_stats();
  out.Single("cake_write_back_queued_bytes", "Bytes waiting to be written back to slower tiers", MetricType::Gauge,
             static_cast<double>(wb.queued_bytes));
  auto& write_back =
      out.Family("cake_write_back_total", "Write-backs and promotions between tiers, by outcome", MetricType::Counter);
  Families::Add(write_back, {{"outcome", "written"}}, static_cast<double>(wb.written));
  Families::Add(write_back, {{"outcome", "failed"}}, static_cast<double>(wb.failed));
  Families::Add(write_back, {{"outcome", "inline"}}, static_cast<double>(wb.inline_writes));
  Families::Add(write_back, {{"outcome", "promoted"}}, static_cast<double>(wb.promotions));
  Families::Add(write_back, {{"outcome", "promotion_dropped"}}, static_cast<double>(wb.promotions_dropped));
  Families::Add(write_back, {{"outcome", "promoted_to_disk"}}, static_cast<double>(wb.promotions_to_disk));
  // Every counter cakectl stats shows, under the same name.
  for (const auto& [name, value] : state.counters.PlainSnapshot()) {
    out.Single(absl::StrCat("cake_", name, "_total"), absl::StrCat("cakectl stats: ", name), MetricType::Counter,
               static_cast<double>(value));
  }
  auto& read_failures = out.Family("cake_load_chunk_read_failures_by_code_total",
                                   "Of cake_load_chunk_read_failures_total, by the read's status code (data_loss: a "
                                   "corrupt chunk, removed; not_found: evicted since the lookup; unavailable: the "
                                   "medium or Redis failed)",
                                   MetricType::Counter);
  for (size_t code = 1; code < kStatusCodes; ++code) {
    const uint64_t n = state.counters.load_chunk_read_failures_by_code[code].load(std::memory_order_relaxed);
    if (n > 0) Families::Add(read_failures, {{"code", kStatusCodeNames[code]}}, static_cast<double>(n));
  }
  auto& rpcs =
      out.Family("cake_rpc_responses_total", "RPCs answered, by method and gRPC status code", MetricType::Counter);
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

// Whether "package.Service/Method" is a method of a service linked into this daemon (its own, health,
// reflection): every one has its descriptor in the generated pool.
bool IsServedMethod(std::string_view method) {
  const size_t slash = method.find('/');
  if (slash == std::string_view::npos || method.size() > 256) return false;
  std::string full_name(method);
  full_name[slash] = '.';
  return google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(full_name) != nullptr;
}

class RpcMetricsInterceptorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcMetricsInterceptorFactory(RpcMetrics& metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    // "/cake.v1.KvService/Lookup" → "cake.v1.KvService/Lookup"; the name lives as long as the server.
    const char* method = info->method();
    if (method == nullptr) method = "";
    if (*method == '/') ++method;
    // The path is the caller's word: a name no service of this daemon has (anyone can send thousands before
    // being identified) is counted as "unimplemented", so invented names never take the label slots.
    return new RpcMetricsInterceptor(metrics_, IsServedMethod(method) ? method : "unimplemented");
  }

 private:
  RpcMetrics& metrics_;
};

}  // namespace

// The endpoint: one thread, one poll loop over every open connection, so a connection that sends nothing (or
// slowly) holds no thread and delays no scrape. Each connection has kConnectionDeadline from accept to answer
// and be gone; at kMaxConnections the oldest is closed to admit the newest, so idle connections can never shut
// a scraper out (a scrape takes milliseconds; an idle connection is by then the oldest).
struct MetricsEndpoint::Impl {
  static constexpr size_t kMaxConnections = 64;
  static constexpr size_t kMaxRequestBytes = 8192;  // a scrape's request line and headers
  static constexpr auto kConnectionDeadline = std::chrono::seconds(5);

  struct Connection {
    UniqueFd fd;
    std::chrono::steady_clock::time_point deadline;
    std::string request;
    std::string reply;  // non-empty: the request was read, the reply is being sent
    size_t sent = 0;
  };

  const DaemonState* state = nullptr;
  UniqueFd listen_fd;
  UniqueFd stop_fd;
  std::thread thread;

  void Serve() {
    std::deque<Connection> connections;  // oldest first
    std::vector<pollfd> fds;
    while (true) {
      fds.assign({{listen_fd.get(), POLLIN, 0}, {stop_fd.get(), POLLIN, 0}});
      auto now = std::chrono::steady_clock::now();
      auto next_deadline = now + std::chrono::hours(1);
      for (const Connection& c : connections) {
        fds.push_back({c.fd.get(), static_cast<short>(c.reply.empty() ? POLLIN : POLLOUT), 0});
        next_deadline = std::min(next_deadline, c.deadline);
      }
      const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_deadline - now).count() + 1;
      if (::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(wait, 0))) < 0 && errno != EINTR) {
        ::poll(nullptr, 0, 50);
        continue;
      }
      if (fds[1].revents != 0) return;
      for (size_t i = 0; i < connections.size(); ++i) {
        if (fds[i + 2].revents != 0) Advance(connections[i]);
      }
      now = std::chrono::steady_clock::now();
      std::erase_if(connections, [&](const Connection& c) { return !c.fd.valid() || c.deadline <= now; });
      if (fds[0].revents & POLLIN) {
        // Everything waiting, a bounded number per round so the open connections are served too.
        for (int accepted = 0; accepted < 16; ++accepted) {
          UniqueFd fd(::accept4(listen_fd.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
          if (!fd.valid()) break;  // none left, or out of descriptors: the backlog keeps it
          if (connections.size() >= kMaxConnections) connections.pop_front();
          connections.push_back(Connection{std::move(fd), now + kConnectionDeadline, {}, {}, 0});
        }
      }
    }
  }

  // Reads the request, or sends the reply; closes the connection (resets its fd) when it is done with.
  void Advance(Connection& c) {
    if (c.reply.empty()) {
      char buffer[2048];
      const ssize_t n = ::recv(c.fd.get(), buffer, sizeof(buffer), 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        c.fd = UniqueFd();
        return;
      }
      if (n < 0) return;
      c.request.append(buffer, static_cast<size_t>(n));
      if (c.request.find("\r\n\r\n") == std::string::npos) {
        if (c.request.size() > kMaxRequestBytes) c.reply = Reply("431 Request Header Fields Too Large", "");
        return;
      }
      c.reply = Answer(c.request.substr(0, c.request.find("\r\n")));
      c.request.clear();
      c.request.shrink_to_fit();
    }
    const ssize_t n = ::send(c.fd.get(), c.reply.data() + c.sent, c.reply.size() - c.sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n < 0) {
      c.fd = UniqueFd();
      return;
    }
    c.sent += static_cast<size_t>(n);
    if (c.sent == c.reply.size()) c.fd = UniqueFd();  // Connection: close
  }

  std::string Answer(std::string_view request_line) const {
    // "GET /metrics HTTP/1.1" (a query string is allowed and ignored).
    const size_t space = request_line.find(' ');
    const std::string_view method = request_line.substr(0, space);
    std::string_view target = space == std::string_view::npos ? "" : request_line.substr(space + 1);
    target = target.substr(0, target.find(' '));
    target = target.substr(0, target.find('?'));
    if (method != "GET" && method != "HEAD") return Reply("405 Method Not Allowed", "only GET\n");
    if (target != "/metrics") return Reply("404 Not Found", "the metrics are at /metrics\n");
    std::string body = RenderMetrics(*state);
    return Reply("200 OK", method == "HEAD" ? std::string() : std::move(body));
  }

  static std::string Reply(const char* status, std::string body) {
    return absl::StrCat("HTTP/1.1 ", status,
                        "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: ", body.size(),
                        "\r\nConnection: close\r\n\r\n", body);
  }
};

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<Impl> impl, std::string address)
    : impl_(std::move(impl)), address_(std::move(address)) {}

MetricsEndpoint::~MetricsEndpoint() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(impl_->stop_fd.get(), &one, sizeof(one));
  if (impl_->thread.joinable()) impl_->thread.join();
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const std::string& listen,
                                                                        const DaemonState& state) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics.listen \"", listen, "\" is not host:port (e.g. \"127.0.0.1:9464\")"));
  }
  auto listening = ListenOnTcp(listen, "metrics.listen");
  if (!listening.ok()) return listening.status();
  auto impl = std::make_unique<Impl>();
  impl->state = &state;
  impl->listen_fd = std::move(listening->fd);
  impl->stop_fd = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl->stop_fd.valid()) return absl::UnavailableError(absl::StrCat("eventfd: ", std::strerror(errno)));
  std::string address = absl::StrCat(listen.substr(0, colon), ":", listening->port);
  impl->thread = std::thread([impl = impl.get()] { impl->Serve(); });
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(std::move(impl), std::move(address)));
}

std::string RenderMetrics(const DaemonState& state) {
  return prometheus::TextSerializer().Serialize(DaemonCollectable(state).Collect());
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewRpcMetricsInterceptor(RpcMetrics& metrics) {
  return std::make_unique<RpcMetricsInterceptorFactory>(metrics);
}

}  // namespace cake
