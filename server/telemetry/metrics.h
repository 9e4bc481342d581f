// The Prometheus endpoint ([metrics] listen): GET /metrics in the text exposition format, built from the daemon's
// own counters at each scrape, serialised by prometheus-cpp's text serializer and served by a small poll loop of the
// daemon's own (civetweb's thread per connection let 50 idle connections starve scrapes); only
// server/telemetry/metrics.cc includes prometheus-cpp.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace grpc::experimental {
class ServerInterceptorFactoryInterface;
}

namespace cake {

struct DaemonState;
class RpcMetrics;

class MetricsEndpoint {
 public:
  // Listens on `listen` ("host:port"; port 0 picks a free one); scrapes wait in the backlog until Serve.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Bind(const std::string& listen);
  // Answers scrapes from `state` until destroyed; `state` must outlive it. Once.
  void Serve(const DaemonState& state);
  ~MetricsEndpoint();

  // "host:port" with the port really bound.
  const std::string& address() const { return address_; }

 private:
  struct Impl;
  explicit MetricsEndpoint(std::unique_ptr<Impl> impl, std::string address);
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

// The text a scrape returns, without the HTTP around it (tests, cakectl-less debugging).
std::string RenderMetrics(const DaemonState& state);

// Counts every RPC's final status by method into `metrics`, which must outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewRpcMetricsInterceptor(RpcMetrics& metrics);

}  // namespace cake
