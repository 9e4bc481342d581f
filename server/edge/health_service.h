// caked's own grpc.health.v1.Health (gRPC's default one has no cap on Watch streams and never ends them). Check
// answers anyone who reaches a listener (Kubernetes gRPC probes, grpcurl, cakectl health); Watch streams are
// counted per peer and in all, refused past either cap, and all finished when the daemon stops, so that a stop
// never waits on them.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "base/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace cake {

class UnixListener;

// The peer a call's connection is counted under, as the ConnectionGate counts connections: "uid N" on the unix
// socket (the uid `unix_connections` recorded at accept), the address without its port on TCP.
std::string GatePeerOfCall(std::string_view grpc_peer, const UnixListener* unix_connections);

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  struct Limits {
    uint32_t max_watches = 256;         // server.max_health_watches
    uint32_t max_watches_per_peer = 8;  // server.max_health_watches_per_peer
  };
  using PeerOfCall = std::function<std::string(const grpc::CallbackServerContext&)>;

  // The names Check and Watch know: "" (the whole daemon) and `services`; all start SERVING.
  HealthService(Limits limits, PeerOfCall peer_of_call, std::vector<std::string> services);

  // Every known name SERVING, or NOT_SERVING (drain); every Watch of one is told.
  void SetServing(bool serving);
  // The daemon stops: every name NOT_SERVING from now on (SetServing changes nothing more), every Watch is told
  // so and finished with UNAVAILABLE, and a later Watch is refused the same way. Idempotent.
  void Shutdown();

  uint32_t watches_open() const;
  uint64_t watches_refused() const { return watches_refused_.load(std::memory_order_relaxed); }

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context, const grpc::health::v1::HealthCheckRequest* request) override;

 private:
  class WatchReactor;
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  ServingStatus StatusLocked(const std::string& service) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets every known name to `status` and tells every watch; `shut_down` ends them too.
  void Publish(ServingStatus status, bool shut_down);
  // A watch's OnDone: it no longer counts against the caps.
  void Forget(WatchReactor* watch);

  const Limits limits_;
  const PeerOfCall peer_of_call_;
  mutable Mutex mu_;
  absl::flat_hash_map<std::string, ServingStatus> statuses_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 1;  // bumped on every change: a watch keeps the newest it was told
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<WatchReactor*> watches_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> watches_per_peer_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> watches_refused_{0};
};

}  // namespace cake
