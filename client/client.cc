// The gRPC client engines and cakectl use: regions, Lookup, Store, StartLoad (the session is load_session.cc),
// the admin calls, and Connect (which socket: socket_discovery.cc).
#include "client/client.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "cake/v1/admin.grpc.pb.h"
#include "cake/v1/kv.grpc.pb.h"
#include "client/grpc_load_session.h"
#include "client/socket_discovery.h"
#include "client/wire.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "proto/wire_enums.h"

namespace cake {

// How long Connect waits for a daemon that is starting alongside the engine (its socket, then its answer).
constexpr auto kConnectWait = std::chrono::seconds(5);

absl::Status MappedRegion::CopyToHost(uint64_t offset, std::span<std::byte> dst) const {
  if (device_) return device_->CopyToHost(offset, dst);
  CAKE_RETURN_IF_ERROR(CheckRange(size_, offset, dst.size()));
  std::memcpy(dst.data(), shm_->data() + offset, dst.size());
  return absl::OkStatus();
}

absl::Status MappedRegion::CopyFromHost(uint64_t offset, std::span<const std::byte> src) const {
  if (device_) return device_->CopyFromHost(offset, src);
  CAKE_RETURN_IF_ERROR(CheckRange(size_, offset, src.size()));
  std::memcpy(shm_->data() + offset, src.data(), src.size());
  return absl::OkStatus();
}

namespace {

class GrpcClient final : public Client {
 public:
  GrpcClient(std::shared_ptr<grpc::Channel> channel, std::string client_id)
      : channel_(std::move(channel)),
        kv_(v1::KvService::NewStub(channel_)),
        admin_(v1::AdminService::NewStub(channel_)),
        client_id_(std::move(client_id)) {}

  ~GrpcClient() override {
    {
      MutexLock lock(&lease_mu_);
      closing_ = true;
    }
    lease_wake_.SignalAll();
    if (renewer_.joinable()) renewer_.join();
  }

  const std::string& client_id() const override { return client_id_; }

  absl::StatusOr<MappedRegion> RegisterRegion(uint64_t bytes, RegionRequest where) override {
    v1::RegisterRegionRequest request;
    request.set_client_id(client_id_);
    request.set_bytes(bytes);
    request.set_kind(where.kind == RegionRequest::Kind::kCuda   ? v1::REGION_CUDA_IPC
                     : where.kind == RegionRequest::Kind::kAuto ? v1::REGION_AUTO
                                                                : v1::REGION_HOST_SHM);
    request.set_device(where.device);
    v1::RegisterRegionResponse response;
    grpc::ClientContext context;
    CAKE_RETURN_IF_ERROR(FromGrpc(kv_->RegisterRegion(&context, request, &response)));
    // A region this process cannot map is given back rather than left held (and counted against the
    // client's quota) until the daemon stops.
    auto give_back = [&](absl::Status why) {
      v1::ReleaseRegionRequest release;
      release.set_client_id(client_id_);
      release.set_region_id(response.region_id());
      v1::ReleaseRegionResponse released;
      grpc::ClientContext release_context;
      kv_->ReleaseRegion(&release_context, release, &released);
      return why;
    };
    if (response.kind() == v1::REGION_CUDA_IPC) {
      auto mapping = CudaIpcMapping::Open(response.cuda_ipc_handle(), response.bytes(), where.device);
      if (!mapping.ok()) return give_back(mapping.status());
      KeepRenewing(response.region_id(), std::chrono::milliseconds(response.lease_ms()));
      return MappedRegion(response.region_id(), std::move(*mapping));
    }
    auto shm = SharedMemory::Open(response.shm_name(), response.bytes());
    if (!shm.ok()) return give_back(shm.status());
    KeepRenewing(response.region_id(), std::chrono::milliseconds(response.lease_ms()));
    return MappedRegion(response.region_id(), std::move(*shm));
  }

  absl::Status ReleaseRegion(const MappedRegion& region) override {
    v1::ReleaseRegionRequest request;
    request.set_client_id(client_id_);
    request.set_region_id(region.id());
    v1::ReleaseRegionResponse response;
    grpc::ClientContext context;
    {
      MutexLock lock(&lease_mu_);
      leased_.erase(region.id());
    }
    return FromGrpc(kv_->ReleaseRegion(&context, request, &response));
  }

  absl::StatusOr<LookupResult> Lookup(const NamespaceSpec& ns, const PromptRef& prompt,
                                      LookupOptions options) override {
    v1::LookupRequest request;
    ToProto(ns, request.mutable_namespace_());
    ToProto(prompt, request.mutable_prompt());
    request.set_prefetch(options.prefetch);
    v1::LookupResponse response;
    grpc::ClientContext context;
    CAKE_RETURN_IF_ERROR(FromGrpc(kv_->Lookup(&context, request, &response)));
    LookupResult result{
        response.total_chunks(), response.cached_chunks(), {}, response.chunk_bytes(), response.prefetch_chunks()};
    for (int t : response.chunk_tiers()) result.tiers.push_back(TierKindFromWire(t));
    return result;
  }

  absl::StatusOr<StoreResult> Store(const NamespaceSpec& ns, const PromptRef& prompt, uint32_t first_chunk,
                                    uint32_t count, const MappedRegion& region, uint64_t region_offset) override {
    v1::StoreRequest request;
    request.set_region_id(region.id());
    request.set_region_offset(region_offset);
    return DoStore(ns, prompt, first_chunk, count, &request);
  }

  absl::StatusOr<StoreResult> StoreInline(const NamespaceSpec& ns, const PromptRef& prompt, uint32_t first_chunk,
                                          std::span<const std::string_view> chunks) override {
    // One message per batch of at most kInlineStoreBatchBytes, and a quarter of the daemon's message limit (a
    // larger chunk goes alone): one huge message would hold that much in both processes at once.
    CAKE_ASSIGN_OR_RETURN(const DaemonLimits limits, Limits());
    const uint64_t batch_limit = std::min(kInlineStoreBatchBytes, limits.max_message_bytes / 4);
    StoreResult total{0, 0};
    size_t next = 0;
    while (next < chunks.size()) {
      v1::StoreRequest request;
      uint64_t batch_bytes = 0;
      const size_t batch_first = next;
      while (next < chunks.size() && (next == batch_first || batch_bytes + chunks[next].size() <= batch_limit)) {
        batch_bytes += chunks[next].size();
        request.add_inline_chunks(std::string(chunks[next]));
        ++next;
      }
      CAKE_ASSIGN_OR_RETURN(const StoreResult batch,
                            DoStore(ns, prompt, first_chunk + static_cast<uint32_t>(batch_first),
                                    static_cast<uint32_t>(next - batch_first), &request));
      total.stored_chunks += batch.stored_chunks;
      total.already_cached += batch.already_cached;
    }
    return total;
  }

  absl::StatusOr<std::unique_ptr<LoadSession>> StartLoad(const LoadOptions& options) override {
    v1::LoadRequest request;
    v1::LoadStart* start = request.mutable_start();
    start->set_client_id(client_id_);
    ToProto(options.ns, start->mutable_namespace_());
    ToProto(options.prompt, start->mutable_prompt());
    if (options.region != nullptr) {
      start->set_region_id(options.region->id());
      start->set_region_offset(options.region_offset);
      start->set_region_bytes(options.region_bytes);
    }
    start->set_mode(options.io_only ? v1::LoadStart::MODE_IO_ONLY : v1::LoadStart::MODE_CAKE);
    start->set_window(options.window);
    start->set_compute_first_chunk_s(options.compute_first_chunk_s);
    start->set_compute_growth_s(options.compute_growth_s);
    start->set_computed_through(options.computed_through);
    start->set_accept_loaded_batch(true);
    return OpenGrpcLoadSession(kv_.get(), options, request);
  }

  absl::Status Ping() override {
    grpc::ClientContext context;
    v1::PingResponse response;
    return FromGrpc(admin_->Ping(&context, v1::PingRequest(), &response));
  }

  absl::StatusOr<std::map<std::string, uint64_t>> Stats() override {
    grpc::ClientContext context;
    v1::StatsResponse response;
    CAKE_RETURN_IF_ERROR(FromGrpc(admin_->Stats(&context, v1::StatsRequest(), &response)));
    return std::map<std::string, uint64_t>(response.counters().begin(), response.counters().end());
  }

  absl::StatusOr<DaemonLimits> Limits() override {
    {
      MutexLock lock(&limits_mu_);
      if (limits_) return *limits_;
    }
    grpc::ClientContext context;
    v1::GetLimitsResponse r;
    const absl::Status asked = FromGrpc(kv_->GetLimits(&context, v1::GetLimitsRequest(), &r));
    DaemonLimits limits;
    if (absl::IsUnimplemented(asked)) {
      // A daemon from before GetLimits: its configuration's defaults, which DaemonLimits holds.
    } else if (!asked.ok()) {
      return asked;
    } else {
      limits.max_message_bytes = r.max_message_bytes();
      limits.load_start_timeout_ms = r.load_start_timeout_ms();
      limits.load_idle_timeout_ms = r.load_idle_timeout_ms();
      limits.default_chunk_tokens = r.default_chunk_tokens();
      limits.max_chunk_tokens = r.max_chunk_tokens();
      limits.min_chunk_bytes = r.min_chunk_bytes();
      limits.max_prompt_tokens = r.max_prompt_tokens();
      limits.region_lease_ms = r.region_lease_ms();
      limits.default_load_window = r.default_load_window();
      limits.max_load_window = r.max_load_window();
      limits.max_region_bytes = r.max_region_bytes();
    }
    MutexLock lock(&limits_mu_);
    limits_ = limits;
    return limits;
  }

  absl::StatusOr<uint64_t> Evict(TierKind tier) override {
    grpc::ClientContext context;
    v1::EvictRequest request;
    request.set_tier(ToWire(tier));
    v1::EvictResponse response;
    CAKE_RETURN_IF_ERROR(FromGrpc(admin_->Evict(&context, request, &response)));
    return response.chunks();
  }

  absl::StatusOr<double> SetReadCap(TierKind tier, double gbps) override {
    grpc::ClientContext context;
    v1::SetReadCapRequest request;
    request.set_tier(ToWire(tier));
    request.set_gbps(gbps);
    v1::SetReadCapResponse response;
    CAKE_RETURN_IF_ERROR(FromGrpc(admin_->SetReadCap(&context, request, &response)));
    return response.previous_gbps();
  }

  absl::StatusOr<DaemonStatus> Status() override {
    grpc::ClientContext context;
    v1::StatusResponse r;
    CAKE_RETURN_IF_ERROR(FromGrpc(admin_->Status(&context, v1::StatusRequest(), &r)));
    DaemonStatus out;
    out.version = r.version();
    out.pid = r.pid();
    out.uptime_s = r.uptime_s();
    out.listen_address = r.listen_address();
    for (int kind : r.region_kinds()) out.cuda_regions |= kind == v1::REGION_CUDA_IPC;
    for (const v1::TierStatus& t : r.tiers()) {
      out.tiers.push_back(
          {TierKindFromWire(t.tier()), t.used_bytes(), t.capacity_bytes(), t.chunks(), t.read_limit_gbps()});
    }
    out.active_loads = r.active_loads();
    out.regions = r.regions();
    out.region_bytes = r.region_bytes();
    out.regions_released_in_use = r.regions_released_in_use();
    out.draining = r.draining();
    out.metrics_address = r.metrics_address();
    return out;
  }

  absl::StatusOr<bool> Serving(const std::string& service) override {
    if (service.size() > 127) return absl::InvalidArgumentError("a health service name is at most 127 bytes");
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    grpc::health::v1::HealthCheckResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    CAKE_RETURN_IF_ERROR(FromGrpc(grpc::health::v1::Health::NewStub(channel_)->Check(&context, request, &response)));
    return response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  }

  std::shared_ptr<grpc::ChannelInterface> channel() const override { return channel_; }

 private:
  static constexpr uint64_t kInlineStoreBatchBytes = uint64_t{64} << 20;

  // The daemon releases a region its owner has not named for its lease (a client that died cannot hold memory
  // for ever); while this client lives, a thread names each of its regions every third of the lease.
  void KeepRenewing(const std::string& region_id, std::chrono::milliseconds lease) {
    MutexLock lock(&lease_mu_);
    leased_.insert(region_id);
    if (lease.count() > 0) renew_period_ = std::min(renew_period_, lease / 3);
    if (!renewer_.joinable()) {
      renewer_ = std::thread([this] { RenewLeases(); });
    } else {
      lease_wake_.SignalAll();  // a shorter period takes effect now
    }
  }

  void RenewLeases() {
    MutexLock lock(&lease_mu_);
    while (!closing_) {
      const auto period = renew_period_;
      if (lease_wake_.WaitFor(&lease_mu_, period, [&] {
            lease_mu_.AssertHeld();
            return closing_ || renew_period_ < period;
          })) {
        continue;
      }
      const std::vector<std::string> ids(leased_.begin(), leased_.end());
      lease_mu_.Unlock();  // renewals wait on the daemon
      for (const std::string& id : ids) {
        v1::RenewRegionRequest request;
        request.set_client_id(client_id_);
        request.set_region_id(id);
        v1::RenewRegionResponse response;
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + period);
        const grpc::Status status = kv_->RenewRegion(&context, request, &response);
        if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
          MutexLock gone(&lease_mu_);
          leased_.erase(id);  // released by another thread meanwhile, or expired: nothing left to renew
        }
      }
      lease_mu_.Lock();
    }
  }

  absl::StatusOr<StoreResult> DoStore(const NamespaceSpec& ns, const PromptRef& prompt, uint32_t first_chunk,
                                      uint32_t count, v1::StoreRequest* request) {
    request->set_client_id(client_id_);
    ToProto(ns, request->mutable_namespace_());
    ToProto(prompt, request->mutable_prompt());
    request->set_first_chunk(first_chunk);
    request->set_chunk_count(count);
    v1::StoreResponse response;
    grpc::ClientContext context;
    CAKE_RETURN_IF_ERROR(FromGrpc(kv_->Store(&context, *request, &response)));
    return StoreResult{response.stored_chunks(), response.already_cached()};
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KvService::Stub> kv_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
  std::string client_id_;
  Mutex limits_mu_;
  std::optional<DaemonLimits> limits_ ABSL_GUARDED_BY(limits_mu_);  // asked once (Limits)
  Mutex lease_mu_;
  CondVar lease_wake_;
  std::set<std::string> leased_ ABSL_GUARDED_BY(lease_mu_);  // regions of this client to renew
  std::chrono::milliseconds renew_period_ ABSL_GUARDED_BY(lease_mu_){10000};
  bool closing_ ABSL_GUARDED_BY(lease_mu_) = false;
  std::thread renewer_;  // started with the first region
};

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::FailedPreconditionError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The credentials for a TCP connection: TLS with the options' files (plaintext without a CA: the daemon accepts
// that on loopback only), and the bearer token on every call where there is one.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> TcpChannelCredentials(const ClientOptions& options) {
  if (options.tls_ca_file.empty()) {
    if (!options.token_file.empty()) {
      return absl::InvalidArgumentError("a bearer token travels only over TLS: give the daemon's CA (tls_ca_file)");
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions tls;
  CAKE_ASSIGN_OR_RETURN(tls.pem_root_certs, ReadWholeFile(options.tls_ca_file));
  if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
    CAKE_ASSIGN_OR_RETURN(tls.pem_cert_chain, ReadWholeFile(options.tls_cert_file));
    CAKE_ASSIGN_OR_RETURN(tls.pem_private_key, ReadWholeFile(options.tls_key_file));
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(tls);
  if (!options.token_file.empty()) {
    CAKE_ASSIGN_OR_RETURN(std::string token, ReadWholeFile(options.token_file));
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
    credentials = grpc::CompositeChannelCredentials(credentials, grpc::AccessTokenCredentials(token));
  }
  return credentials;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  const auto deadline = std::chrono::system_clock::now() + kConnectWait;
  if (options.socket_path.empty() && options.address.empty()) {
    CAKE_ASSIGN_OR_RETURN(options.socket_path, FindDaemonSocket(deadline));
  }
  if (options.client_id.empty()) {
    char host[256] = "host";
    gethostname(host, sizeof(host) - 1);
    options.client_id = absl::StrCat(host, "-", getpid());
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetMaxSendMessageSize(1 << 30);
  std::string target = absl::StrCat("unix:", options.socket_path);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options.address.empty()) {
    target = options.address;
    CAKE_ASSIGN_OR_RETURN(credentials, TcpChannelCredentials(options));
  }
  auto channel = grpc::CreateCustomChannel(target, credentials, args);
  if (!channel->WaitForConnected(deadline)) {
    return absl::UnavailableError(absl::StrCat("no daemon answers on ", target,
                                               " (is caked running? is the address right? does its access policy "
                                               "name this user? for TLS: do the certificates match?)"));
  }
  return std::unique_ptr<Client>(new GrpcClient(std::move(channel), std::move(options.client_id)));
}

}  // namespace cake
