#include "server/daemon.h"

#include <malloc.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/socket_folder.h"
#include "base/status_macros.h"
#include "cake/v1/admin.grpc.pb.h"
#include "cuda/cuda_backend.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "grpcpp/server_builder.h"
#include "server/config/tier_factory.h"
#include "server/edge/tcp_authentication.h"
#include "spdlog/spdlog.h"

namespace cake {

namespace {

// A socket file whose daemon died still exists; binding over it needs it gone, but a live daemon's must stay.
absl::Status ClearStaleSocket(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return absl::OkStatus();
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " exists and is not a socket; choose another server.socket"));
  }
  CAKE_ASSIGN_OR_RETURN(const sockaddr_un addr, UnixSocketAddress(path));
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool live = fd >= 0 && connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  if (fd >= 0) close(fd);
  if (live) {
    return absl::AlreadyExistsError(
        absl::StrCat("another daemon is listening on ", path, "; stop it first or choose another socket"));
  }
  spdlog::warn("removing stale socket {} left by a daemon that did not stop cleanly", path);
  unlink(path.c_str());
  return absl::OkStatus();
}

// The socket's folder. One inside a folder anyone may write to (the /tmp fallback) could have been made first by
// another user, who could then swap the socket and take cakectl's connection: such a folder is created 0700 and
// must be a real folder (not a symlink), owned by this user and writable by nobody else. Elsewhere it is created
// when missing and must not be a symlink or owned by another user (root aside).
absl::Status PrepareSocketFolder(const std::filesystem::path& dir) {
  const std::filesystem::path parent = dir.parent_path();
  struct stat parent_st {};
  const bool shared_parent = ::stat(parent.c_str(), &parent_st) == 0 && (parent_st.st_mode & S_IWOTH) != 0;
  if (!shared_parent) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return absl::FailedPreconditionError(absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
  } else if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create ", dir.string(), ": ", std::strerror(errno)));
  }
  // The same rule the clients apply before trusting a socket they find there (base/socket_folder.h).
  return CheckSocketFolder(dir.string(), "remove it or choose another server.run_dir");
}

// The connection cap the descriptor limit allows. The soft limit is first raised to the hard one (the unit sets
// 65536); then the cap leaves a quarter of the descriptors (at least 64) for everything else a request may open:
// chunk files, io_uring rings, Redis connections, a region's shared memory, the metrics endpoint's connections.
uint32_t ConnectionCapWithinDescriptorLimit(uint32_t wanted) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return wanted;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  if (limit.rlim_cur == RLIM_INFINITY) return wanted;
  const uint64_t reserve = std::max<uint64_t>(64, limit.rlim_cur / 4);
  const uint64_t room = limit.rlim_cur > reserve + 1 ? limit.rlim_cur - reserve : 1;
  if (wanted <= room) return wanted;
  spdlog::warn(
      "server.max_connections is {}, but the descriptor limit is {}: serving at most {} connections at once "
      "(raise LimitNOFILE, or ulimit -n, to serve more)",
      wanted, limit.rlim_cur, room);
  return static_cast<uint32_t>(room);
}

// Whether engines may register device regions, said once in the log: a machine without a GPU or driver (or a
// daemon told not to) serves host regions only, and RegisterRegion's error repeats the reason.
void DecideCudaRegions(const DaemonConfig& config, StartupFacts& state) {
  if (!config.cuda_enabled) {
    // Not even probed: a daemon told to stay off the GPU never touches the driver.
    state.cuda_off_reason = "device regions are off in this daemon (cuda.enabled = false or --no-cuda)";
  } else if (const CudaProbe& probe = ProbeCuda(); !probe.usable) {
    state.cuda_off_reason = probe.reason;
  } else {
    for (int device : config.cuda_devices) {
      if (device < probe.device_count)
        state.cuda_devices.push_back(device);
      else
        spdlog::warn("cuda.devices names device {}, but this machine has {}; ignored", device, probe.device_count);
    }
    if (config.cuda_devices.empty()) {
      for (int device = 0; device < probe.device_count; ++device) state.cuda_devices.push_back(device);
    }
    state.cuda_usable = !state.cuda_devices.empty();
    if (!state.cuda_usable) state.cuda_off_reason = "none of cuda.devices exists on this machine";
  }
  if (state.cuda_usable) {
    spdlog::info("CUDA: device regions on device(s) {}; host regions too", absl::StrJoin(state.cuda_devices, ", "));
  } else {
    spdlog::info("CUDA: {}; serving host regions only", state.cuda_off_reason);
  }
}

// The TCP listener's credentials: TLS from the config's files, re-read every tcp.tls_reload_s (certificates
// rotate without a restart). With a client CA, a client certificate is verified when presented (and names the
// principal); a client without one must bring a bearer token, which every call's check demands. Plaintext only where
// ValidateConfig allowed it (a loopback address, explicitly). Either way a call that identifies no principal is
// refused on its headers (TcpCallGate), before gRPC reads its message.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpCredentials(const DaemonConfig& config,
                                                                        const DaemonState& state) {
  // The policy as it is when each call comes: SIGHUP may replace it.
  auto call_gate = std::make_shared<TcpCallGate>([&state] { return state.access(); });
  if (config.tls_cert_file.empty()) {
    // gRPC's "local" credentials: plaintext on the wire, as insecure ones (clients connect as before; ValidateConfig
    // kept the listener on a loopback address), but unlike those they run the call gate.
    std::shared_ptr<grpc::ServerCredentials> credentials = grpc::experimental::LocalServerCredentials(LOCAL_TCP);
    credentials->SetAuthMetadataProcessor(call_gate);
    return credentials;
  }
  // Read once now so a missing file or a key others may read stops start-up with a message, rather than fail
  // every handshake later.
  if (auto key = ReadSecretFile(config.tls_key_file, "the TLS key (tcp.tls_key_file)"); !key.ok()) return key.status();
  for (const std::string& path : {config.tls_cert_file, config.tls_client_ca_file}) {
    if (!path.empty() && ::access(path.c_str(), R_OK) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    }
  }
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      config.tls_key_file, config.tls_cert_file, config.tls_client_ca_file, config.tls_reload_s);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!config.tls_client_ca_file.empty()) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::experimental::TlsServerCredentials(options);
  credentials->SetAuthMetadataProcessor(call_gate);
  return credentials;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonConfig& config) {
  CAKE_RETURN_IF_ERROR(ValidateConfig(config));
  std::unique_ptr<Daemon> d(new Daemon());
  d->socket_path_ = config.socket_path();
  CAKE_RETURN_IF_ERROR(PrepareSocketFolder(std::filesystem::path(d->socket_path_).parent_path()));
  CAKE_RETURN_IF_ERROR(ClearStaleSocket(d->socket_path_));

  // Regions a killed predecessor (or client) left in /dev/shm: nobody can ever release them now.
  if (const SweptSharedMemory swept = SweepOrphanedSharedMemory(); swept.segments > 0) {
    spdlog::info("removed {} shared-memory segments ({} bytes) left by processes that are gone", swept.segments,
                 swept.bytes);
  }
  auto access = AccessPolicy::FromConfig(config);
  if (!access.ok()) return access.status();
  d->state_ = std::make_unique<DaemonState>(config, std::move(*access));
  // What the handlers read and nothing changes once serving starts: published whole just before it does.
  StartupFacts facts;
  DecideCudaRegions(config, facts);
  uint32_t remote_masters = 0;
  CAKE_RETURN_IF_ERROR(AddTiersFromConfig(config, facts.cuda_usable && config.cuda_pin_dram, d->state_->tiers,
                                          d->state_->dram_pinned, &remote_masters));
  if (config.remote_endpoints.empty()) {
    d->state_->StartRemoteReads(1);
  } else {
    const uint32_t read_threads = config.RemoteReadThreads(remote_masters);
    d->state_->StartRemoteReads(static_cast<int>(read_threads));
    spdlog::info("remote tier: chunks read on {} threads ({})", read_threads,
                 config.remote_read_threads != 0 ? "remote.read_threads"
                 : remote_masters == 0           ? "Redis did not answer: loader.io_threads"
                                       : absl::StrCat("one per master, at least 2, at most loader.io_threads; ",
                                                      remote_masters, remote_masters == 1 ? " master" : " masters"));
  }

  d->kv_service_ = std::make_unique<KvServiceImpl>(*d->state_);
  d->admin_service_ = std::make_unique<AdminServiceImpl>(*d->state_);
  facts.listen_address = absl::StrCat("unix:", d->socket_path_);
  // The daemon accepts on its socket itself, to learn each peer's uid (UnixListener); gRPC serves what it hands
  // over. The TCP listener, when configured, is gRPC's own.
  auto unix_listener = UnixListener::Bind(d->socket_path_, config.socket_mode);
  if (!unix_listener.ok()) return unix_listener.status();
  d->unix_listener_ = std::move(*unix_listener);
  facts.unix_connections = d->unix_listener_.get();
  const uint32_t max_connections = ConnectionCapWithinDescriptorLimit(config.max_connections);
  d->connection_gate_ =
      std::make_unique<ConnectionGate>(max_connections, std::min(config.max_connections_per_peer, max_connections));
  facts.connection_gate = d->connection_gate_.get();
  // The standard health service (grpc.health.v1.Health: grpcurl, Kubernetes gRPC probes, cakectl health), our own
  // rather than gRPC's default, whose Watch streams have no cap and never end; and server reflection. Both answer
  // without the access checks: they say whether the daemon serves and what its API is, nothing more.
  d->health_service_ = std::make_unique<HealthService>(
      HealthService::Limits{config.max_health_watches, config.max_health_watches_per_peer},
      [unix_connections = d->unix_listener_.get()](const grpc::CallbackServerContext& context) {
        return GatePeerOfCall(context.peer(), unix_connections);
      },
      std::vector<std::string>{"cake.v1.KvService", "cake.v1.AdminService"});
  facts.health = d->health_service_.get();
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // The TCP port is accepted by the daemon too (TcpListener), so that its connections pass the same gate; gRPC
  // runs the handshake (TLS) on what it is handed.
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> tcp_acceptor;
  if (!config.tcp_listen.empty()) {
    auto credentials = TcpCredentials(config, *d->state_);
    if (!credentials.ok()) return credentials.status();
    auto tcp_listener = TcpListener::Bind(config.tcp_listen);
    if (!tcp_listener.ok()) return tcp_listener.status();
    d->tcp_listener_ = std::move(*tcp_listener);
    facts.tcp_port = d->tcp_listener_->port();
    tcp_acceptor = builder.experimental().AddExternalConnectionAcceptor(
        grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, *credentials);
  }
  // What a connection may hold and for how long: calls open at once, time without a call, time to finish the
  // handshake (TLS and HTTP/2's first SETTINGS: a peer that connects and sends nothing is closed then), and
  // keepalive pings that find a peer that vanished without closing (a cable pulled, a host frozen).
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, static_cast<int>(config.max_streams_per_connection));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, static_cast<int>(config.connection_idle_timeout_ms));
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, static_cast<int>(config.handshake_timeout_ms));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 120000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  builder.RegisterService(d->kv_service_.get());
  builder.RegisterService(d->admin_service_.get());
  builder.RegisterService(d->health_service_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(NewRpcMetricsInterceptor(d->state_->rpc_metrics));
  // Every call that reaches the server on TCP has named a principal (TcpCallGate): its connection is no longer a
  // stranger.
  interceptors.push_back(NewIdentifiedConnectionMarker(d->connection_gate_.get()));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(config.max_message_bytes));
  // gRPC reads a request whole before comparing it with the limit above: only the quota bounds what a client
  // sending oversized messages (or many large ones at once) makes the transport hold. Past it, the stream is
  // reset (RESOURCE_EXHAUSTED at the client) and the daemon serves on.
  grpc::ResourceQuota transport_quota("caked-transport");
  transport_quota.Resize(config.transport_memory_bytes);
  builder.SetResourceQuota(transport_quota);
  d->server_ = builder.BuildAndStart();
  if (d->server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("could not start serving", config.tcp_listen.empty() ? "" : " on ",
                                               config.tcp_listen, " (see the gRPC error above)"));
  }
  if (!config.metrics_listen.empty()) {
    // Before serving: a port that cannot be bound fails the start, not a later scrape.
    auto metrics = MetricsEndpoint::Bind(config.metrics_listen);
    if (!metrics.ok()) return metrics.status();
    d->metrics_ = std::move(*metrics);
    facts.metrics_address = d->metrics_->address();
    spdlog::info("Prometheus metrics on http://{}/metrics", d->metrics_->address());
  }
  d->state_->PublishStartupFacts(std::move(facts));
  if (d->metrics_ != nullptr) d->metrics_->Serve(*d->state_);
  // A uid the current policy (SIGHUP may replace it) does not name is refused at accept.
  d->unix_listener_->Serve(d->server_.get(), d->connection_gate_.get(),
                           [state = d->state_.get()](uid_t uid) { return state->access()->NamesUid(uid); });
  if (d->tcp_listener_ != nullptr) {
    d->tcp_acceptor_ = std::move(tcp_acceptor);
    d->tcp_listener_->Serve(d->tcp_acceptor_.get(), d->connection_gate_.get());
  }
  spdlog::info("{}", d->state_->access()->Describe());
  if (!config.tcp_listen.empty()) {
    spdlog::info("listening on TCP {} (port {}): {}, inline bytes only", config.tcp_listen, d->state_->facts().tcp_port,
                 config.tls_cert_file.empty()        ? "plaintext, loopback only"
                 : config.tls_client_ca_file.empty() ? "TLS, callers name themselves with bearer tokens"
                                                     : "TLS, callers present a client certificate or a bearer token");
  }
  if (config.load_start_timeout_ms < 25000) {
    spdlog::warn(
        "loader.start_timeout_ms is {} ms: the Python client keeps a Load stream open ahead of its next "
        "load for up to 20 s, and one ended just as its Start arrives fails that load (the engine computes)",
        config.load_start_timeout_ms);
  }
  d->housekeeping_ = std::thread([daemon = d.get()] { daemon->Housekeep(); });
  spdlog::info("caked {} listening on {} (DRAM tier {} MiB{}, {} I/O threads, window {})", CAKE_VERSION,
               d->socket_path_, config.dram_capacity_bytes >> 20,
               config.dram_read_gbps > 0 ? absl::StrCat(", reads capped at ", config.dram_read_gbps, " Gbps") : "",
               config.io_threads, config.load_window);
  return d;
}

absl::Status Daemon::ReloadAccess(const std::vector<PrincipalConfig>& principals, bool single_user_explicit) {
  DaemonConfig next = state_->config;
  next.principals = principals;
  next.access_single_user = single_user_explicit;
  CAKE_RETURN_IF_ERROR(ValidateConfig(next));
  CAKE_ASSIGN_OR_RETURN(AccessPolicy policy, AccessPolicy::FromConfig(next));
  // A config that lost its [[access.principal]] entries (a bad edit, a template without them) would hand every
  // local user every role and tenant: only an explicit access.single_user = true may mean that.
  if (policy.single_tenant() && !state_->access()->single_tenant() && !single_user_explicit) {
    return absl::FailedPreconditionError(
        "the reloaded config names no [[access.principal]], which would let every local user do everything; the "
        "principals stay as they were (set access.single_user = true to mean single-user mode)");
  }
  auto replacement = std::make_shared<const AccessPolicy>(std::move(policy));
  spdlog::info("reloaded {}", replacement->Describe());
  state_->ReplaceAccess(replacement);
  // Loads already running were admitted under the old policy: those of a caller it no longer names end now.
  if (const size_t ended = state_->loads.CancelRevoked(*replacement); ended > 0) {
    spdlog::warn("reload: {} running loads of callers the new policy no longer lets load were ended", ended);
  }
  return absl::OkStatus();
}

absl::Status Daemon::Reload(const DaemonConfig& next) {
  CAKE_RETURN_IF_ERROR(ValidateConfig(next));
  const DaemonConfig before = state_->effective_config();
  CAKE_RETURN_IF_ERROR(ReloadAccess(next.principals, next.access_single_user));
  DaemonConfig applied = before;
  applied.principals = next.principals;
  if (next.log_level != before.log_level) {
    spdlog::set_level(spdlog::level::from_str(next.log_level));
    spdlog::info("SIGHUP: log level {} -> {}", before.log_level, next.log_level);
    applied.log_level = next.log_level;
  }
  // A cap changes only when the file's value did: one set since with cakectl set-read-cap stays otherwise.
  struct Cap {
    TierKind kind;
    double DaemonConfig::*gbps;
  };
  for (const Cap& cap :
       {Cap{TierKind::kDram, &DaemonConfig::dram_read_gbps}, Cap{TierKind::kDisk, &DaemonConfig::disk_read_gbps},
        Cap{TierKind::kRemote, &DaemonConfig::remote_read_gbps}}) {
    Tier* tier = state_->tiers.tier(cap.kind);
    if (tier == nullptr || next.*cap.gbps == before.*cap.gbps) continue;
    if (absl::Status set = tier->SetReadCapGbps(next.*cap.gbps); !set.ok()) {
      spdlog::warn(
          "SIGHUP: the {} tier's read cap stays {} Gbit/s ({}; a tier started without a cap needs a restart "
          "to get one)",
          TierKindName(cap.kind), tier->read_cap_gbps(), std::string(set.message()));
      continue;
    }
    state_->tier_speeds.Forget(cap.kind);
    spdlog::info("SIGHUP: {} tier read cap {} -> {} Gbit/s", TierKindName(cap.kind), before.*cap.gbps, next.*cap.gbps);
    applied.*cap.gbps = next.*cap.gbps;
  }
  // Everything else needs a restart: say so rather than pretend.
  DaemonConfig wanted = next;
  wanted.dram_read_gbps = applied.dram_read_gbps;
  wanted.disk_read_gbps = applied.disk_read_gbps;
  wanted.remote_read_gbps = applied.remote_read_gbps;
  if (FormatConfig(wanted) != FormatConfig(applied)) {
    spdlog::warn(
        "SIGHUP: the file changes settings that need a restart; they are not applied (cakectl config shows "
        "the running ones)");
  }
  state_->SetEffectiveConfig(std::move(applied));
  return absl::OkStatus();
}

absl::Status Daemon::CheckServing(std::chrono::milliseconds timeout) const {
  grpc::ChannelArguments args;
  // Its own connection: gRPC would otherwise share one with earlier checks, which an unlinked socket file
  // does not break.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto channel = grpc::CreateCustomChannel(state_->facts().listen_address, grpc::InsecureChannelCredentials(), args);
  auto admin = v1::AdminService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  v1::PingResponse response;
  const grpc::Status status = admin->Ping(&context, v1::PingRequest(), &response);
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat("Ping on ", state_->facts().listen_address, " got no answer within ",
                                               timeout.count(), " ms: ", status.error_message()));
  }
  return absl::OkStatus();
}

void Daemon::Housekeep() {
  // Often enough that an expired region goes within a quarter of its lease; rarely enough to cost nothing.
  const auto period = std::clamp<std::chrono::milliseconds>(state_->regions.lease() / 4, std::chrono::milliseconds(20),
                                                            std::chrono::seconds(1));
  constexpr auto kTrimPeriod = std::chrono::seconds(10);
  auto last_trim = std::chrono::steady_clock::now();
  std::unique_lock lock(housekeeping_mu_);
  auto last_round = std::chrono::steady_clock::now();
  size_t strangers_closed = 0;  // since the last line logged about them, at most every 10 s
  auto last_strangers_log = last_round - std::chrono::seconds(10);
  while (!housekeeping_wake_.wait_for(lock, period, [this] { return housekeeping_stop_; })) {
    // A round far later than its period means the daemon did not run meanwhile (stopped, or its machine paused):
    // the leases get that time back before any is judged, so owners whose renewals wait unread keep their regions.
    const auto round = std::chrono::steady_clock::now();
    if (const auto gap = round - last_round; gap > 2 * period + std::chrono::milliseconds(500)) {
      state_->regions.CreditPause(gap - period);
      spdlog::warn(
          "the daemon did not run for about {} ms (stopped, or its machine paused): region leases get "
          "that time back",
          std::chrono::duration_cast<std::chrono::milliseconds>(gap - period).count());
    }
    last_round = round;
    state_->prefetcher.Expire();
    if (tcp_listener_ != nullptr) {
      const auto identify_timeout = std::chrono::milliseconds(state_->config.tcp_identify_timeout_ms);
      strangers_closed += connection_gate_->CloseStrangers(round - identify_timeout);
      if (strangers_closed > 0 && round - last_strangers_log > std::chrono::seconds(10)) {
        spdlog::info(
            "closed {} TCP connections on which no call named a principal within tcp.identify_timeout_ms "
            "({} ms)",
            strangers_closed, identify_timeout.count());
        strangers_closed = 0;
        last_strangers_log = round;
      }
    }
    for (const RegionRegistry::Expired& gone : state_->regions.ReleaseExpired()) {
      Bump(state_->counters.regions_expired);
      spdlog::warn("a region ({} bytes) of client {} released: its lease ran out ({} ms without a call naming it)",
                   gone.bytes, gone.owner.ToString(), state_->regions.lease().count());
    }
    if (state_->draining && state_->drain_exit_when_idle && !stop_requested_ && state_->loads.active() == 0) {
      stop_requested_ = true;
      spdlog::info("drained: no load is running; stopping as asked");
      if (request_stop_) request_stop_();
    }
    // gRPC frees a large message as many small buffers scattered through the heap, which the allocator keeps
    // (an oversized request would stay resident for good); hand the free pages back now and then.
    if (const auto now = std::chrono::steady_clock::now(); now - last_trim >= kTrimPeriod) {
      malloc_trim(0);
      last_trim = now;
    }
  }
}

void Daemon::StopHousekeeping() {
  if (!housekeeping_.joinable()) return;
  {
    std::lock_guard lock(housekeeping_mu_);
    housekeeping_stop_ = true;
  }
  housekeeping_wake_.notify_all();
  housekeeping_.join();
}

void Daemon::Stop() {
  if (stopped_ || server_ == nullptr) return;  // a daemon that never started serving has nothing to stop
  stopped_ = true;
  state_->stopping = true;
  state_->prefetcher.Stop();
  StopHousekeeping();
  spdlog::info("stopping: {} live loads cancelled, {} regions released", state_->loads.active(),
               state_->regions.count());
  // Health Watch streams are told NOT_SERVING and finished now: the server's Shutdown below would otherwise wait
  // the whole grace period for them (they never end by themselves).
  health_service_->Shutdown();
  unix_listener_->Stop();  // no new connections; gRPC's shutdown below ends the ones it has
  if (tcp_listener_ != nullptr) tcp_listener_->Stop();
  state_->loads.CancelAll(absl::CancelledError("the daemon is stopping; compute the rest of the prompt"));
  // A cancelled load's read asleep under a read cap (however small) must not hold its I/O thread past the stop.
  state_->tiers.Interrupt();
  const auto grace = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(state_->config.shutdown_grace_s));
  server_->Shutdown(std::chrono::system_clock::now() + grace);
  server_->Wait();
  // Every Store has answered; what it queued for the slower tiers gets the same grace to land.
  if (const size_t left = state_->tiers.FlushWriteBack(grace); left > 0) {
    spdlog::warn("{} chunk write-backs did not finish within the grace period; those chunks stay in DRAM only", left);
  }
  // A scrape reads the state: the endpoint stops first.
  metrics_.reset();
  // Queued Store copies finish before the pool's threads join; then nothing references a region any more.
  state_.reset();
  unlink(socket_path_.c_str());
  spdlog::info("stopped");
}

Daemon::~Daemon() { Stop(); }

}  // namespace cake
