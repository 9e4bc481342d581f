#include "client/client.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/mutex.h"
#include "base/socket_folder.h"
#include "base/status_macros.h"
#include "cake/v1/admin.grpc.pb.h"
#include "cake/v1/kv.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace cake {

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

FrontStep NextFrontStep(const LoadPlan& plan, std::chrono::steady_clock::time_point started, uint32_t next_chunk,
                        uint32_t loaded_low, std::optional<uint32_t> done_meeting,
                        std::chrono::steady_clock::time_point now) {
  using Action = FrontStep::Action;
  const uint32_t limit = plan.strategy == Strategy::kIoOnly ? plan.lowest_loadable : plan.cached_chunks;
  if (next_chunk >= limit) return {Action::kStop, {}, 0};
  if (done_meeting) {
    if (next_chunk >= *done_meeting) return {Action::kStop, {}, 0};
    return {Action::kCompute, {}, std::min(*done_meeting, limit)};
  }
  if (next_chunk >= loaded_low && next_chunk < plan.cached_chunks) return {Action::kStop, {}, 0};
  if (plan.strategy == Strategy::kCake && plan.predicted_meeting_chunk && plan.predicted_cake_s) {
    const uint32_t meeting = *plan.predicted_meeting_chunk;
    constexpr double kSlackFraction = 0.2, kSlackSeconds = 1e-3;  // cake/load.py's WAIT_SLACK_FRACTION, WAIT_SLACK_S
    const auto until =
        started + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(*plan.predicted_cake_s * (1 + kSlackFraction) + kSlackSeconds));
    if (next_chunk < meeting) return {Action::kCompute, {}, std::min(meeting, limit)};
    if (now < until) return {Action::kWait, until};
  }
  return {Action::kCompute, {}, limit};
}

namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

void ToProto(const NamespaceSpec& spec, v1::Namespace* out) {
  out->set_model_id(spec.model_id);
  out->set_num_layers(spec.num_layers);
  out->set_num_kv_heads(spec.num_kv_heads);
  out->set_head_dim(spec.head_dim);
  out->set_dtype(static_cast<v1::DType>(spec.dtype));
  out->set_tp_rank(spec.tp_rank);
  out->set_tp_size(spec.tp_size);
  out->set_chunk_tokens(spec.chunk_tokens);
  out->set_tenant(spec.tenant);
  out->set_stored_precision(static_cast<v1::StoredPrecision>(spec.stored_precision));
}

void ToProto(const PromptRef& prompt, v1::Prompt* out) {
  out->mutable_tokens()->Add(prompt.tokens.begin(), prompt.tokens.end());
  for (const std::string& key : prompt.chunk_keys) out->add_chunk_keys(key);
}

class GrpcLoadSession final : public LoadSession {
 public:
  // Opens the stream with `start` as its first message. The stream's headers go out with it (corked): one message
  // on the wire instead of two, and the daemon starts reading chunks that much sooner; the reader thread starts
  // after the write, off the request's path.
  GrpcLoadSession(v1::KvService::Stub* stub, const LoadOptions& options, const v1::LoadRequest& start)
      : region_(options.region), inline_(options.region == nullptr) {
    context_.set_initial_metadata_corked(true);
    stream_ = stub->Load(&context_);
    // A failed write means the stream already ended; WaitPlan then reports it and Release gives the status.
    Send(start);
    reader_ = std::thread([this] { ReadLoop(); });
  }

  ~GrpcLoadSession() override {
    if (!finished_) {
      context_.TryCancel();
      if (reader_.joinable()) reader_.join();
      stream_->Finish();
    }
    if (reader_.joinable()) reader_.join();
  }

  bool Send(const v1::LoadRequest& request) {
    MutexLock lock(&write_mu_);
    return stream_->Write(request);
  }

  absl::StatusOr<LoadPlan> WaitPlan() override {
    MutexLock lock(&mu_);
    cv_.Wait(&mu_, [&] {
      mu_.AssertHeld();
      return plan_.has_value() || ended_;
    });
    if (plan_) return *plan_;
    return Ended();
  }

  absl::Status ReportProgress(uint32_t computed_through) override {
    v1::LoadRequest request;
    request.mutable_progress()->set_computed_through(computed_through);
    if (!Send(request)) return absl::UnavailableError("the Load stream is closed");
    return absl::OkStatus();
  }

  absl::StatusOr<FrontStep> NextStep(uint32_t next_chunk) override {
    CAKE_ASSIGN_OR_RETURN(const LoadPlan plan, WaitPlan());
    std::optional<uint32_t> meeting;
    uint32_t loaded_low = 0;
    bool ended = false;
    {
      MutexLock lock(&mu_);
      if (done_) meeting = done_->meeting_chunk;
      loaded_low = loaded_low_;
      ended = ended_;
    }
    FrontStep step = NextFrontStep(plan, started_, next_chunk, loaded_low, meeting, std::chrono::steady_clock::now());
    // A stream that ended without Done lands nothing more: waiting for it would only spin until the deadline.
    if (ended && step.action == FrontStep::Action::kWait) {
      step = {FrontStep::Action::kCompute,
              {},
              plan.strategy == Strategy::kIoOnly ? plan.lowest_loadable : plan.cached_chunks};
    }
    return step;
  }

  bool IsResident(uint32_t chunk) const override {
    MutexLock lock(&mu_);
    return plan_.has_value() && chunk >= loaded_low_ && chunk < plan_->cached_chunks;
  }

  uint32_t LoadedLow() const override {
    MutexLock lock(&mu_);
    return plan_ ? std::min(loaded_low_, plan_->cached_chunks) : 0;
  }

  uint64_t RegionOffset(uint32_t chunk) const override {
    MutexLock lock(&mu_);
    auto it = region_offsets_.find(chunk);
    return it == region_offsets_.end() ? 0 : it->second;
  }

  std::string_view InlineChunk(uint32_t chunk) const override {
    MutexLock lock(&mu_);
    auto it = inline_chunks_.find(chunk);
    return it == inline_chunks_.end() ? std::string_view() : std::string_view(it->second);
  }

  absl::StatusOr<LoadDone> WaitDone() override {
    MutexLock lock(&mu_);
    cv_.Wait(&mu_, [&] {
      mu_.AssertHeld();
      return done_.has_value() || ended_;
    });
    if (done_) return *done_;
    return Ended();
  }

  bool WaitResident(uint32_t chunk) override {
    return WaitResidentUntil(chunk, std::chrono::steady_clock::time_point::max());
  }

  bool WaitResidentUntil(uint32_t chunk, std::chrono::steady_clock::time_point deadline) override {
    MutexLock lock(&mu_);
    auto settled = [&] {
      mu_.AssertHeld();
      return done_.has_value() || ended_ || (plan_ && chunk >= loaded_low_ && chunk < plan_->cached_chunks);
    };
    if (deadline == std::chrono::steady_clock::time_point::max()) {
      cv_.Wait(&mu_, settled);
    } else {
      cv_.WaitUntil(&mu_, deadline, settled);
    }
    return plan_ && chunk >= loaded_low_ && chunk < plan_->cached_chunks;
  }

  absl::Status Release() override {
    if (finished_) return final_status_;
    v1::LoadRequest request;
    request.mutable_release();
    Send(request);
    {
      MutexLock lock(&write_mu_);
      stream_->WritesDone();
    }
    if (reader_.joinable()) reader_.join();
    finished_ = true;
    final_status_ = FromGrpc(stream_->Finish());
    MutexLock lock(&mu_);
    if (!broken_.ok()) final_status_ = broken_;
    return final_status_;
  }

 private:
  void ReadLoop() {
    v1::LoadResponse response;
    while (stream_->Read(&response)) {
      MutexLock lock(&mu_);
      if (absl::Status taken = TakeLocked(response); !taken.ok()) {
        // The daemon broke the protocol: nothing more from it is believed. The load ends (the engine computes
        // what was not loaded) and Release reports why.
        broken_ = absl::DataLossError(absl::StrCat("the daemon broke the Load protocol: ", taken.message()));
        context_.TryCancel();
        break;
      }
      cv_.SignalAll();
    }
    MutexLock lock(&mu_);
    ended_ = true;
    cv_.SignalAll();
  }

  // Checks one message against the plan and what came before (the checks cake/load.py makes), then records it.
  absl::Status TakeLocked(v1::LoadResponse& response) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    switch (response.msg_case()) {
      case v1::LoadResponse::kPlan: {
        if (plan_) return absl::DataLossError("a second Plan");
        const v1::LoadPlan& p = response.plan();
        if (!(p.lowest_loadable() <= p.cached_chunks() && p.cached_chunks() <= p.total_chunks()) ||
            p.chunk_tiers_size() != static_cast<int>(p.cached_chunks()) ||
            (p.cached_chunks() > 0 && p.chunk_bytes() == 0)) {
          return absl::DataLossError(absl::StrCat("a Plan of ", p.cached_chunks(), " cached chunks of ",
                                                  p.total_chunks(), ", lowest loadable ", p.lowest_loadable()));
        }
        LoadPlan plan;
        plan.load_id = p.load_id();
        plan.total_chunks = p.total_chunks();
        plan.cached_chunks = p.cached_chunks();
        plan.lowest_loadable = p.lowest_loadable();
        plan.chunk_bytes = p.chunk_bytes();
        if (p.has_predicted_meeting_chunk()) plan.predicted_meeting_chunk = p.predicted_meeting_chunk();
        plan.strategy = static_cast<Strategy>(p.strategy());
        if (p.has_predicted_cake_s()) plan.predicted_cake_s = p.predicted_cake_s();
        if (p.has_predicted_compute_only_s()) plan.predicted_compute_only_s = p.predicted_compute_only_s();
        if (p.has_predicted_io_only_s()) plan.predicted_io_only_s = p.predicted_io_only_s();
        for (int t : p.chunk_tiers()) plan.tiers.push_back(static_cast<TierKind>(t));
        loaded_low_ = plan.cached_chunks;
        plan_ = std::move(plan);
        return absl::OkStatus();
      }
      case v1::LoadResponse::kLoaded:
        return TakeLoadedLocked(*response.mutable_loaded());
      case v1::LoadResponse::kLoadedBatch:
        if (inline_) return absl::DataLossError("a batch of landed chunks on an inline load");
        for (v1::ChunkLoaded& chunk : *response.mutable_loaded_batch()->mutable_chunks()) {
          CAKE_RETURN_IF_ERROR(TakeLoadedLocked(chunk));
        }
        return absl::OkStatus();
      case v1::LoadResponse::kDone: {
        const v1::LoadDone& d = response.done();
        if (!plan_ || done_) return absl::DataLossError("Done before a Plan, or twice");
        // [meeting, H) must all have been reported loaded: the engine is about to use them.
        if (d.meeting_chunk() > plan_->cached_chunks || d.meeting_chunk() < loaded_low_) {
          return absl::DataLossError(
              absl::StrCat("Done at chunk ", d.meeting_chunk(), " with chunks loaded only from ", loaded_low_));
        }
        done_ = LoadDone{d.meeting_chunk(), d.loaded_chunks(), d.failed_chunks()};
        return absl::OkStatus();
      }
      case v1::LoadResponse::MSG_NOT_SET:
        break;
    }
    return absl::DataLossError("a LoadResponse with no message set");
  }

  absl::Status TakeLoadedLocked(v1::ChunkLoaded& loaded) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint32_t chunk = loaded.chunk();
    if (!plan_ || done_) return absl::DataLossError(absl::StrCat("chunk ", chunk, " before the Plan or after Done"));
    // Chunks land highest first, each extending the contiguous loaded suffix down by one.
    if (chunk < plan_->lowest_loadable || chunk >= plan_->cached_chunks || chunk >= loaded_low_) {
      return absl::DataLossError(absl::StrCat("chunk ", chunk, " outside [", plan_->lowest_loadable, ", ",
                                              std::min(loaded_low_, plan_->cached_chunks), ") or twice"));
    }
    if (inline_) {
      if (loaded.data().size() != plan_->chunk_bytes) {
        return absl::DataLossError(
            absl::StrCat("inline chunk ", chunk, " of ", loaded.data().size(), " bytes, not ", plan_->chunk_bytes));
      }
      inline_chunks_[chunk] = std::move(*loaded.mutable_data());
    } else {
      if (loaded.bytes() != plan_->chunk_bytes || loaded.region_offset() > region_->size() ||
          region_->size() - loaded.region_offset() < loaded.bytes()) {
        return absl::DataLossError(absl::StrCat("chunk ", chunk, " at ", loaded.region_offset(), " (+", loaded.bytes(),
                                                " bytes) is outside the ", region_->size(), "-byte region"));
      }
      region_offsets_[chunk] = loaded.region_offset();
    }
    loaded_low_ = chunk;
    return absl::OkStatus();
  }

  // The stream ended before what the caller waited for: finish it to learn why.
  absl::Status Ended() {
    return absl::UnavailableError("the Load stream ended early; Release() returns the daemon's status");
  }

  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::LoadRequest, v1::LoadResponse>> stream_;
  const MappedRegion* region_;
  const bool inline_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  Mutex write_mu_;  // one write at a time: the engine's Progress and Release
  mutable Mutex mu_;
  CondVar cv_;
  std::optional<LoadPlan> plan_ ABSL_GUARDED_BY(mu_);
  std::optional<LoadDone> done_ ABSL_GUARDED_BY(mu_);
  uint32_t loaded_low_ ABSL_GUARDED_BY(mu_) = UINT32_MAX;
  std::map<uint32_t, std::string> inline_chunks_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, uint64_t> region_offsets_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);  // set when the daemon broke the protocol: what Release returns
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ = false;
  absl::Status final_status_;
  std::thread reader_;
};

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
    for (int t : response.chunk_tiers()) result.tiers.push_back(static_cast<TierKind>(t));
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
    return std::make_unique<GrpcLoadSession>(kv_.get(), options, request);
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
    request.set_tier(static_cast<v1::TierKind>(tier));
    v1::EvictResponse response;
    CAKE_RETURN_IF_ERROR(FromGrpc(admin_->Evict(&context, request, &response)));
    return response.chunks();
  }

  absl::StatusOr<double> SetReadCap(TierKind tier, double gbps) override {
    grpc::ClientContext context;
    v1::SetReadCapRequest request;
    request.set_tier(static_cast<v1::TierKind>(tier));
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
          {static_cast<TierKind>(t.tier()), t.used_bytes(), t.capacity_bytes(), t.chunks(), t.read_limit_gbps()});
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
    // grpc.health.v1.HealthCheckRequest{service} by hand: one length-delimited field (tag 1). Its stubs are not
    // among Debian's packages, and the message is this small.
    std::string request_bytes;
    if (!service.empty()) request_bytes = std::string("\x0a") + static_cast<char>(service.size()) + service;
    grpc::Slice slice(request_bytes);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    std::promise<grpc::Status> done;
    grpc::GenericStub(channel_).UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                                          &response, [&done](grpc::Status s) { done.set_value(std::move(s)); });
    const grpc::Status status = done.get_future().get();
    if (!status.ok()) return FromGrpc(status);
    std::vector<grpc::Slice> slices;
    if (!response.Dump(&slices).ok()) return absl::InternalError("unreadable health response");
    std::string bytes;
    for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    return bytes == std::string("\x08\x01", 2);  // HealthCheckResponse{status: SERVING}
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

constexpr char kSystemSocket[] = "/run/cake/caked.sock";
constexpr auto kConnectWait = std::chrono::seconds(5);

constexpr std::string_view kOwnSocketRemedy =
    "not used, since whoever controls it could pose as your daemon and receive your prompts: have it removed (by "
    "its owner or root) before starting your caked, or point CAKE_SOCKET or --socket at your daemon's socket";
constexpr std::string_view kSystemSocketRemedy =
    "not used: ask the administrator to check caked.service, or point CAKE_SOCKET or --socket at your daemon's socket";

// This user's own daemon's socket: OK to use, NOT_FOUND (no daemon of this user there), or FAILED_PRECONDITION
// (refused by the folder rule, or not a socket). The rule is the daemon's own (base/socket_folder.h): a folder the
// daemon would refuse to serve in is one another user could have made.
absl::Status JudgeOwnSocket(const std::string& path) {
  CAKE_RETURN_IF_ERROR(CheckSocketFolder(std::filesystem::path(path).parent_path().string(), kOwnSocketRemedy));
  absl::Status file = CheckSocketFile(path, kOwnSocketRemedy);
  return absl::IsNotFound(file) ? absl::NotFoundError("no socket there") : file;
}

// The system daemon's socket: only that it is a socket. Its folder (/run/cake) belongs to the unit's user, not to
// this one, and only root can create entries in /run, so no other user can have put it there.
absl::Status JudgeSystemSocket(const std::string& path) {
  absl::Status file = CheckSocketFile(path, kSystemSocketRemedy);
  return absl::IsNotFound(file) ? absl::NotFoundError("no socket there") : file;
}

}  // namespace

DaemonSocketCandidates DefaultSocketCandidates() {
  DaemonSocketCandidates candidates;
  candidates.system = kSystemSocket;
  if (geteuid() == 0) return candidates;  // root's daemon is the system one
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && *xdg != '\0') {
    candidates.own = absl::StrCat(xdg, "/cake/caked.sock");
  } else {
    candidates.own = absl::StrCat("/tmp/cake-", geteuid(), "/caked.sock");
  }
  return candidates;
}

absl::StatusOr<DaemonSocketChoice> ChooseDaemonSocket(const DaemonSocketCandidates& candidates) {
  std::vector<std::string> reasons;  // every candidate not used, and why
  DaemonSocketChoice choice;
  // Whether a candidate is usable; records why not.
  auto usable = [&](const std::string& path, const absl::Status& verdict) {
    if (verdict.ok()) return true;
    std::string reason = absl::StrCat(path, ": ", verdict.message());
    if (!absl::IsNotFound(verdict)) choice.skipped.push_back(reason);
    reasons.push_back(std::move(reason));
    return false;
  };
  // This user's own daemon first (it wins over the system one), the system daemon when the own one is absent or
  // fails the rule.
  if (!candidates.own.empty() && usable(candidates.own, JudgeOwnSocket(candidates.own))) {
    choice.path = candidates.own;
    return choice;
  }
  if (!candidates.system.empty() && usable(candidates.system, JudgeSystemSocket(candidates.system))) {
    choice.path = candidates.system;
    return choice;
  }
  if (reasons.empty()) return absl::UnavailableError("no daemon answers: no socket to look for");
  if (!choice.skipped.empty()) {
    // Waiting will not help: someone has to remove or fix what was refused.
    return absl::FailedPreconditionError(absl::StrCat("no usable daemon socket. ", absl::StrJoin(reasons, ". "), "."));
  }
  return absl::UnavailableError(absl::StrCat("no daemon answers: ", absl::StrJoin(reasons, "; "),
                                             " (is caked running? or point CAKE_SOCKET or --socket at its socket)"));
}

std::string DefaultSocketPath() {
  // An explicit socket is the user's choice and is taken as given, unchecked, as ClientOptions::socket_path is.
  if (const char* explicit_path = std::getenv("CAKE_SOCKET"); explicit_path != nullptr && *explicit_path != '\0') {
    return explicit_path;
  }
  const DaemonSocketCandidates candidates = DefaultSocketCandidates();
  absl::StatusOr<DaemonSocketChoice> choice = ChooseDaemonSocket(candidates);
  if (choice.ok()) return choice->path;
  // Nothing there at all: where this user's daemon would listen, as before. A refused path is never handed out.
  if (absl::IsUnavailable(choice.status()) && !candidates.own.empty()) return candidates.own;
  return candidates.system;
}

namespace {

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

// The socket when the options name none. $CAKE_SOCKET is the user's choice and taken as given. Otherwise the
// candidates by the folder rule; while no socket exists at all (a daemon starting alongside this engine), looks again
// until `deadline`, the same wait Connect gives a daemon that has not yet started listening.
absl::StatusOr<std::string> FindDaemonSocket(std::chrono::system_clock::time_point deadline) {
  if (const char* explicit_path = std::getenv("CAKE_SOCKET"); explicit_path != nullptr && *explicit_path != '\0') {
    return std::string(explicit_path);
  }
  for (;;) {
    absl::StatusOr<DaemonSocketChoice> choice = ChooseDaemonSocket(DefaultSocketCandidates());
    if (choice.ok()) return std::move(choice->path);
    if (!absl::IsUnavailable(choice.status()) || std::chrono::system_clock::now() >= deadline) return choice.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
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
