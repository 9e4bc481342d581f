// A running caked: its state, its gRPC server on the unix socket, and an orderly stop.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/statusor.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "server/config/config.h"
#include "server/core/daemon_state.h"
#include "server/edge/connection_gate.h"
#include "server/edge/health_service.h"
#include "server/edge/tcp_listener.h"
#include "server/edge/unix_listener.h"
#include "server/services.h"
#include "server/telemetry/metrics.h"

namespace cake {

class Daemon {
 public:
  // Builds the tiers, binds the socket (replacing a stale one a crash left behind, refusing a live one) and
  // starts serving.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonConfig& config);
  ~Daemon();

  // Stops accepting, cancels live loads, waits up to the grace period for the rest, releases every region and
  // removes the socket. Idempotent.
  void Stop();

  // Whether a client can reach the daemon now: a fresh connection to its own socket gets a Ping answered
  // within `timeout`. The systemd watchdog is fed only after this passes, so a daemon whose socket is gone or
  // whose gRPC server is wedged is restarted instead of being kept alive by a timer.
  absl::Status CheckServing(std::chrono::milliseconds timeout) const;

  // Replaces who may do what with `principals` (the config file's [access], read again on SIGHUP; token files are
  // read again too). Every later call is checked against the new policy; running loads of a caller it no longer
  // lets load are ended (PERMISSION_DENIED), other calls already running finish. A configuration that does not
  // validate keeps the old policy and is the error, as is one that names no principal while the old did, unless
  // `single_user_explicit` (access.single_user) says single-user mode is meant.
  absl::Status ReloadAccess(const std::vector<PrincipalConfig>& principals, bool single_user_explicit = false);

  // SIGHUP: applies what `next` (the file and flags, read again) changes among what may change while serving:
  // [access] (ReloadAccess), server.log_level, and the read caps of tiers started with one. Any other change is
  // logged as needing a restart and not applied. A `next` that does not validate changes nothing and is the error.
  absl::Status Reload(const DaemonConfig& next);

  // What a drained daemon calls once it is idle (Drain with exit_when_idle): caked's main raises SIGTERM to
  // itself, so the stop is the same as any other. Unset: the daemon stays up, idle.
  void SetStopRequest(std::function<void()> request_stop) { request_stop_ = std::move(request_stop); }

  DaemonState& state() { return *state_; }
  const std::string& socket_path() const { return socket_path_; }

 private:
  Daemon() = default;
  // Periodic work no request triggers: releasing regions whose lease ran out, handing freed heap back.
  void Housekeep();
  void StopHousekeeping();

  std::string socket_path_;
  std::unique_ptr<DaemonState> state_;
  std::unique_ptr<KvServiceImpl> kv_service_;
  std::unique_ptr<AdminServiceImpl> admin_service_;
  std::unique_ptr<HealthService> health_service_;
  std::unique_ptr<ConnectionGate> connection_gate_;
  std::unique_ptr<UnixListener> unix_listener_;  // before server_: stops handing it connections first
  std::unique_ptr<TcpListener> tcp_listener_;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> tcp_acceptor_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsEndpoint> metrics_;  // after state_: stops answering scrapes before the state goes
  bool stopped_ = false;
  std::function<void()> request_stop_;
  bool stop_requested_ = false;  // housekeeping thread only
  std::mutex housekeeping_mu_;
  std::condition_variable housekeeping_wake_;
  bool housekeeping_stop_ = false;  // guarded by housekeeping_mu_
  std::thread housekeeping_;
};

}  // namespace cake
