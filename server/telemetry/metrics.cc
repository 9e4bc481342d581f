#include "server/telemetry/metrics.h"

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
#include <map>
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
#include "server/core/daemon_state.h"
#include "server/core/load_metrics.h"
#include "server/edge/tcp_listener.h"
#include "server/telemetry/telemetry.h"

namespace cake {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// One scrape: the daemon's telemetry as Prometheus families, in the registry's order, each with its series in the
// order they were collected and its labels sorted by name.
class DaemonCollectable final : public prometheus::Collectable {
 public:
  explicit DaemonCollectable(const DaemonState& state) : state_(state) {}
  std::vector<MetricFamily> Collect() const override {
    const Telemetry telemetry = CollectTelemetry(state_);
    std::map<const MetricDef*, std::vector<const MetricSample*>> by_metric;
    for (const MetricSample& s : telemetry.samples()) by_metric[s.def].push_back(&s);
    std::vector<MetricFamily> families;
    for (const MetricDef* def : AllMetrics()) {
      auto found = by_metric.find(def);
      if (found == by_metric.end() || def->stats_only) continue;
      MetricFamily& family = families.emplace_back();
      family.name = absl::StrCat("cake_", FamilyName(*def), def->kind == MetricKind::kCounter ? "_total" : "");
      family.help = std::string(def->help);
      family.type = def->kind == MetricKind::kCounter ? MetricType::Counter
                    : def->kind == MetricKind::kGauge ? MetricType::Gauge
                                                      : MetricType::Histogram;
      const std::vector<std::string> label_names = LabelNames(*def);
      for (const MetricSample* s : found->second) family.metric.push_back(Series(*s, label_names));
    }
    return families;
  }

 private:
  static ClientMetric Series(const MetricSample& s, const std::vector<std::string>& label_names) {
    ClientMetric m;
    for (size_t i = 0; i < label_names.size() && i < s.label_values.size(); ++i) {
      m.label.push_back({label_names[i], s.label_values[i]});
    }
    std::sort(m.label.begin(), m.label.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    switch (s.def->kind) {
      case MetricKind::kCounter:
        m.counter.value = s.value;
        break;
      case MetricKind::kGauge:
        m.gauge.value = s.value;
        break;
      case MetricKind::kHistogram: {
        const Histogram::Snapshot& h = s.histogram;
        m.histogram.sample_count = h.count;
        m.histogram.sample_sum = h.sum;
        uint64_t cumulative = 0;
        for (size_t i = 0; i < h.upper_bounds.size(); ++i) {
          cumulative += h.counts[i];
          m.histogram.bucket.push_back({cumulative, h.upper_bounds[i]});
        }
        m.histogram.bucket.push_back({h.count, std::numeric_limits<double>::infinity()});
        break;
      }
    }
    return m;
  }

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

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Bind(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics.listen \"", listen, "\" is not host:port (e.g. \"127.0.0.1:9464\")"));
  }
  auto listening = ListenOnTcp(listen, "metrics.listen");
  if (!listening.ok()) return listening.status();
  auto impl = std::make_unique<Impl>();
  impl->listen_fd = std::move(listening->fd);
  impl->stop_fd = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl->stop_fd.valid()) return absl::UnavailableError(absl::StrCat("eventfd: ", std::strerror(errno)));
  std::string address = absl::StrCat(listen.substr(0, colon), ":", listening->port);
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(std::move(impl), std::move(address)));
}

void MetricsEndpoint::Serve(const DaemonState& state) {
  if (impl_->thread.joinable()) return;
  impl_->state = &state;
  impl_->thread = std::thread([impl = impl_.get()] { impl->Serve(); });
}

std::string RenderMetrics(const DaemonState& state) {
  return prometheus::TextSerializer().Serialize(DaemonCollectable(state).Collect());
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewRpcMetricsInterceptor(RpcMetrics& metrics) {
  return std::make_unique<RpcMetricsInterceptorFactory>(metrics);
}

}  // namespace cake
