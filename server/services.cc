#include "server/services.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/mutex.h"
#include "proto/wire_enums.h"
#include "server/core/callers.h"
#include "server/edge/health_service.h"
#include "server/edge/requests.h"
#include "server/load/engine_requests.h"
#include "server/load/load_reactor.h"
#include "server/telemetry/telemetry.h"
#include "spdlog/spdlog.h"

namespace cake {
namespace {

// RegisterRegion's reply. A region whose id never reached the client (it cancelled, or its deadline passed while
// the pages were being mapped) is released when the call ends: nobody else could ever release it.
class RegisterRegionReactor final : public grpc::ServerUnaryReactor {
 public:
  RegisterRegionReactor(grpc::CallbackServerContext* context, DaemonState& state) : context_(context), state_(state) {}

  void Created(const RegionOwner& owner, const std::string& region_id) {
    MutexLock lock(&mu_);
    owner_ = owner;
    region_id_ = region_id;
  }
  void OnCancel() override {
    MutexLock lock(&mu_);
    cancelled_ = true;
  }
  void OnDone() override {
    {
      MutexLock lock(&mu_);
      if (!region_id_.empty() && (cancelled_ || context_->IsCancelled()) &&
          state_.regions.Release(owner_, region_id_).ok()) {
        Bump(state_.counters.regions_reclaimed);
        spdlog::info("a region of client {} released: it gave up on its registration before the reply reached it",
                     owner_.ToString());
      }
    }
    delete this;
  }

 private:
  grpc::CallbackServerContext* const context_;
  DaemonState& state_;
  Mutex mu_;
  RegionOwner owner_ ABSL_GUARDED_BY(mu_);
  std::string region_id_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// A pool job that answers a call: should it throw (out of memory; out of descriptors in a library that throws), the
// call is answered with the reason instead of never, and the daemon serves on. The job finishes the reactor as its
// last step, so an exception means it has not.
template <typename Job>
std::function<void()> AnsweredEvenIfItThrows(grpc::ServerUnaryReactor* reactor, Job job) {
  return [reactor, job = std::move(job)]() mutable {
    try {
      job();
    } catch (const std::exception& e) {
      spdlog::error("a call failed with an exception: {}", e.what());
      reactor->Finish(ToGrpcStatus(absl::ResourceExhaustedError(
          absl::StrCat("the daemon ran out of a resource serving this call (", e.what(), "); retry shortly"))));
    }
  };
}

// The caller, established by the daemon, holding `role`: PERMISSION_DENIED (or UNAUTHENTICATED) otherwise.
absl::StatusOr<Caller> Authorize(grpc::CallbackServerContext* context, const DaemonState& state, Role role,
                                 std::string_view what) {
  auto caller = IdentifyCaller(*context, state);
  if (!caller.ok()) return caller.status();
  if (absl::Status allowed = AccessPolicy::Require(*caller, role, what); !allowed.ok()) return allowed;
  return caller;
}

}  // namespace

grpc::ServerUnaryReactor* KvServiceImpl::RegisterRegion(grpc::CallbackServerContext* context,
                                                        const v1::RegisterRegionRequest* request,
                                                        v1::RegisterRegionResponse* response) {
  auto caller = Authorize(context, state_, Role::kEngine, "RegisterRegion");
  if (!caller.ok()) return Reply(context, caller.status());
  if (auto s = CheckRequestBytes(*request, "RegisterRegion", kSmallRequestBytes); !s.ok()) return Reply(context, s);
  if (auto s = CheckRegionsReachable(*caller); !s.ok()) return Reply(context, s);
  if (auto s = CheckClientId(request->client_id()); !s.ok()) return Reply(context, s);
  if (request->kind() != v1::REGION_AUTO && request->kind() != v1::REGION_HOST_SHM &&
      request->kind() != v1::REGION_CUDA_IPC) {
    return Reply(context, absl::InvalidArgumentError(absl::StrCat("unknown region kind ", request->kind())));
  }
  RegionRegistry::Placement placement;
  if (request->kind() == v1::REGION_CUDA_IPC || (request->kind() == v1::REGION_AUTO && state_.facts().cuda_usable)) {
    if (!state_.facts().cuda_usable) {
      return Reply(context, absl::FailedPreconditionError(
                                absl::StrCat("this daemon has no device regions (", state_.facts().cuda_off_reason,
                                             "); register a REGION_HOST_SHM or REGION_AUTO region")));
    }
    if (std::find(state_.facts().cuda_devices.begin(), state_.facts().cuda_devices.end(), request->device()) ==
        state_.facts().cuda_devices.end()) {
      return Reply(context, absl::InvalidArgumentError(
                                absl::StrCat("CUDA device ", request->device(), " is not one this daemon serves (",
                                             absl::StrJoin(state_.facts().cuda_devices, ", "), ")")));
    }
    placement.backend = RegionBackend::kCudaIpc;
    placement.device = request->device();
  }
  // Host memory is shared with the engine that asked, by its uid, and with nobody else.
  placement.shared_with_uid = caller->uid;
  const RegionOwner owner(caller->principal->name, request->client_id());
  // Creating a region maps every page of it, which takes a while for large ones: a background thread does it,
  // never one a load's reads wait for.
  auto* reactor = new RegisterRegionReactor(context, state_);
  const bool submitted = state_.region_and_store_work.TrySubmit(
      AnsweredEvenIfItThrows(reactor, [this, reactor, request, response, placement, owner] {
        auto registered = state_.regions.Register(owner, request->bytes(), placement);
        if (registered.ok()) {
          response->set_region_id(registered->region_id);
          response->set_bytes(registered->region->size());
          response->set_lease_ms(static_cast<uint32_t>(state_.regions.lease().count()));
          if (placement.backend == RegionBackend::kCudaIpc) {
            response->set_kind(v1::REGION_CUDA_IPC);
            response->set_cuda_ipc_handle(registered->region->export_handle());
          } else {
            response->set_kind(v1::REGION_HOST_SHM);
            response->set_shm_name(registered->region->export_handle());
          }
          Bump(state_.counters.regions_registered);
          // The id is the region's capability: never logged.
          spdlog::info("region of {} bytes registered for client {}", request->bytes(), owner.ToString());
          reactor->Created(owner, registered->region_id);
        }
        reactor->Finish(ToGrpcStatus(registered.status()));
      }));
  if (!submitted) {
    reactor->Finish(ToGrpcStatus(absl::ResourceExhaustedError("the daemon's I/O queue is full; retry shortly")));
  }
  return reactor;
}

grpc::ServerUnaryReactor* KvServiceImpl::ReleaseRegion(grpc::CallbackServerContext* context,
                                                       const v1::ReleaseRegionRequest* request,
                                                       v1::ReleaseRegionResponse* response) {
  auto caller = Authorize(context, state_, Role::kEngine, "ReleaseRegion");
  if (!caller.ok()) return Reply(context, caller.status());
  if (auto s = CheckRequestBytes(*request, "ReleaseRegion", kSmallRequestBytes); !s.ok()) return Reply(context, s);
  if (auto s = CheckClientId(request->client_id()); !s.ok()) return Reply(context, s);
  const RegionOwner owner(caller->principal->name, request->client_id());
  absl::Status status = state_.regions.Release(owner, request->region_id());
  if (status.ok()) {
    Bump(state_.counters.regions_released);
    spdlog::info("a region released by client {}", owner.ToString());
  }
  return Reply(context, status);
}

grpc::ServerUnaryReactor* KvServiceImpl::GetLimits(grpc::CallbackServerContext* context,
                                                   const v1::GetLimitsRequest* request,
                                                   v1::GetLimitsResponse* response) {
  auto caller = Authorize(context, state_, Role::kEngine, "GetLimits");
  if (!caller.ok()) return Reply(context, caller.status());
  if (auto s = CheckRequestBytes(*request, "GetLimits", kSmallRequestBytes); !s.ok()) return Reply(context, s);
  const DaemonConfig& config = state_.config;
  response->set_max_message_bytes(config.max_message_bytes);
  response->set_load_start_timeout_ms(config.load_start_timeout_ms);
  response->set_load_idle_timeout_ms(config.load_idle_timeout_ms);
  response->set_default_chunk_tokens(config.default_chunk_tokens);
  response->set_max_chunk_tokens(config.max_chunk_tokens);
  response->set_min_chunk_bytes(config.min_chunk_bytes);
  response->set_max_prompt_tokens(config.max_prompt_tokens);
  response->set_region_lease_ms(static_cast<uint32_t>(state_.regions.lease().count()));
  response->set_default_load_window(config.load_window);
  response->set_max_load_window(config.max_load_window);
  response->set_max_region_bytes(config.max_region_bytes);
  return Reply(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* KvServiceImpl::RenewRegion(grpc::CallbackServerContext* context,
                                                     const v1::RenewRegionRequest* request,
                                                     v1::RenewRegionResponse* response) {
  auto caller = Authorize(context, state_, Role::kEngine, "RenewRegion");
  if (!caller.ok()) return Reply(context, caller.status());
  if (auto s = CheckRequestBytes(*request, "RenewRegion", kSmallRequestBytes); !s.ok()) return Reply(context, s);
  if (auto s = CheckClientId(request->client_id()); !s.ok()) return Reply(context, s);
  absl::Status status =
      state_.regions.Renew(RegionOwner(caller->principal->name, request->client_id()), request->region_id());
  if (status.ok()) response->set_lease_ms(static_cast<uint32_t>(state_.regions.lease().count()));
  return Reply(context, status);
}

grpc::ServerUnaryReactor* KvServiceImpl::Lookup(grpc::CallbackServerContext* context, const v1::LookupRequest* request,
                                                v1::LookupResponse* response) {
  Bump(state_.counters.lookups);
  auto caller = Authorize(context, state_, Role::kEngine, "Lookup");
  if (!caller.ok()) return Reply(context, caller.status());
  if (auto s = CheckRequestBytes(*request, "Lookup", LookupRequestLimit(state_.config)); !s.ok()) {
    return Reply(context, s);
  }
  auto ns = CallerNamespace(*caller, request->namespace_(), state_.config);
  if (!ns.ok()) return Reply(context, ns.status());
  auto keys = PromptKeys(*ns, request->prompt(), state_.config);
  if (!keys.ok()) return Reply(context, keys.status());
  response->set_total_chunks(static_cast<uint32_t>(keys->size()));
  response->set_chunk_bytes(ns->chunk_bytes());
  const bool prefetch = request->prefetch() && state_.config.prefetch_enabled;
  auto prompt_keys = std::make_shared<const std::vector<ChunkKey>>(*std::move(keys));
  const LossyFormat stored_format = LossyFormat::Of(ns->spec());
  const std::string tenant = ns->spec().tenant;
  auto answer = [this, response, prefetch, prompt_keys, stored_format,
                 tenant](const TierManager::PrefixLookup& lookup) {
    const std::vector<TierKind> tiers = lookup.Prefix();
    response->set_cached_chunks(static_cast<uint32_t>(tiers.size()));
    response->mutable_chunk_tiers()->Reserve(static_cast<int>(tiers.size()));
    for (TierKind kind : tiers) response->add_chunk_tiers(ToWire(kind));
    Bump(state_.counters.lookup_chunks, response->total_chunks());
    Bump(state_.counters.lookup_cached_chunks, tiers.size());
    // Queues the copies and returns: they run on idle I/O threads, never on this one.
    if (prefetch)
      response->set_prefetch_chunks(
          state_.prefetcher.Prefetch(*prompt_keys, tiers, response->chunk_bytes(), stored_format, tenant));
  };
  auto lookup = std::make_shared<TierManager::PrefixLookup>(state_.tiers.LookupPrefixInMemory(*prompt_keys));
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (lookup->needs_network() &&
      state_.remote_calls.TrySubmit(AnsweredEvenIfItThrows(reactor, [this, reactor, lookup, answer] {
        state_.tiers.FinishLookupOverNetwork(*lookup);
        answer(*lookup);
        reactor->Finish(grpc::Status::OK);
      }))) {
    return reactor;
  }
  // Everything was in memory, or too many calls wait on the network already: the answer stops where the
  // in-memory tiers do (a shorter prefix is a correct answer; the engine computes the rest).
  if (lookup->needs_network()) Bump(state_.counters.lookups_network_skipped);
  answer(*lookup);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerBidiReactor<v1::LoadRequest, v1::LoadResponse>* KvServiceImpl::Load(grpc::CallbackServerContext* context) {
  return NewLoadStream(context, state_, Authorize(context, state_, Role::kEngine, "Load"));
}

grpc::ServerUnaryReactor* KvServiceImpl::Store(grpc::CallbackServerContext* context, const v1::StoreRequest* request,
                                               v1::StoreResponse* response) {
  Bump(state_.counters.stores);
  auto reject = [&](const absl::Status& s) {
    Bump(state_.counters.invalid_requests);
    return Reply(context, s);
  };
  auto caller = Authorize(context, state_, Role::kEngine, "Store");
  if (!caller.ok()) return reject(caller.status());
  auto checked = ParseStore(*request, *caller, state_);
  if (!checked.ok()) return reject(checked.status());
  std::shared_ptr<Region> region = std::move(checked->region);
  const uint64_t first = checked->first, count = checked->count, chunk_bytes = checked->chunk_bytes;
  const LossyFormat format = checked->format;
  // The copies run on a background thread: a gRPC thread never waits on memory traffic of this size, and a load's
  // reads never queue behind them.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const bool submitted = state_.region_and_store_work.TrySubmit(AnsweredEvenIfItThrows(
      reactor,
      [this, reactor, request, response, keys = std::move(checked->keys), first, count, chunk_bytes, region, format] {
        std::vector<std::byte> staging;
        absl::Status status;
        for (uint64_t i = 0; i < count; ++i) {
          const ChunkKey& key = keys[first + i];
          if (state_.tiers.InFastestTier(key)) {
            response->set_already_cached(response->already_cached() + 1);
            Bump(state_.counters.store_chunks_already_cached);
            continue;
          }
          std::span<const std::byte> bytes;
          if (region == nullptr) {
            const std::string& data = request->inline_chunks(static_cast<int>(i));
            bytes = std::span(reinterpret_cast<const std::byte*>(data.data()), data.size());
          } else if (std::byte* base = region->host_data(); base != nullptr) {
            bytes = std::span(base + request->region_offset() + i * chunk_bytes, chunk_bytes);
          } else {
            staging.resize(chunk_bytes);
            status = region->CopyOut(request->region_offset() + i * chunk_bytes, staging);
            if (!status.ok()) break;
            bytes = staging;
          }
          status = state_.tiers.Write(key, bytes, format);
          if (!status.ok()) {
            Bump(state_.counters.store_chunks_rejected, count - i);
            break;
          }
          response->set_stored_chunks(response->stored_chunks() + 1);
          Bump(state_.counters.store_chunks_stored);
          Bump(state_.counters.store_bytes_stored, chunk_bytes);
        }
        reactor->Finish(ToGrpcStatus(status));
      }));
  if (!submitted) {
    reactor->Finish(
        ToGrpcStatus(absl::ResourceExhaustedError("the daemon's I/O queue is full; retry the Store shortly")));
  }
  return reactor;
}

grpc::ServerUnaryReactor* AdminServiceImpl::Ping(grpc::CallbackServerContext* context, const v1::PingRequest* request,
                                                 v1::PingResponse*) {
  // Any identified caller may ask whether the daemon answers.
  if (auto caller = IdentifyCaller(*context, state_); !caller.ok()) return Reply(context, caller.status());
  return Reply(context, CheckRequestBytes(*request, "Ping", kSmallRequestBytes));
}

// Runs `fill` (which may ask every tier) and finishes the call: on a network-call thread when some tier waits on
// a network, so a frozen Redis delays this call and never a gRPC thread.
grpc::ServerUnaryReactor* AdminServiceImpl::AskEveryTier(grpc::CallbackServerContext* context,
                                                         std::function<void()> fill) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!state_.tiers.has_network_tier()) {
    fill();
    reactor->Finish(grpc::Status::OK);
  } else if (!state_.remote_calls.TrySubmit(AnsweredEvenIfItThrows(reactor, [reactor, fill = std::move(fill)] {
               fill();
               reactor->Finish(grpc::Status::OK);
             }))) {
    reactor->Finish(
        ToGrpcStatus(absl::ResourceExhaustedError("too many calls are waiting on the remote tier; retry shortly")));
  }
  return reactor;
}

grpc::ServerUnaryReactor* AdminServiceImpl::Status(grpc::CallbackServerContext* context,
                                                   const v1::StatusRequest* request, v1::StatusResponse* response) {
  if (auto caller = Authorize(context, state_, Role::kMonitor, "Status"); !caller.ok()) {
    return Reply(context, caller.status());
  }
  if (auto s = CheckRequestBytes(*request, "Status", kSmallRequestBytes); !s.ok()) return Reply(context, s);
  return AskEveryTier(context, [this, response] { FillStatus(response); });
}

void AdminServiceImpl::FillStatus(v1::StatusResponse* response) {
  response->set_version(CAKE_VERSION);
  response->set_pid(static_cast<uint32_t>(getpid()));
  response->set_uptime_s(std::chrono::duration<double>(std::chrono::steady_clock::now() - state_.started).count());
  response->set_listen_address(state_.facts().listen_address);
  if (state_.facts().cuda_usable) response->add_region_kinds(v1::REGION_CUDA_IPC);
  response->add_region_kinds(v1::REGION_HOST_SHM);
  for (const auto& entry : state_.tiers.tiers()) {
    v1::TierStatus* t = response->add_tiers();
    const TierUsage usage = entry->tier->Usage();
    t->set_tier(ToWire(entry->kind));
    t->set_used_bytes(usage.used_bytes);
    t->set_capacity_bytes(usage.capacity_bytes);
    t->set_chunks(usage.chunks);
    t->set_read_limit_gbps(entry->tier->read_cap_gbps());
  }
  response->set_active_loads(state_.loads.active());
  const RegionRegistry::Totals region_totals = state_.regions.totals();
  response->set_regions(static_cast<uint32_t>(region_totals.regions));
  response->set_region_bytes(region_totals.bytes);
  response->set_regions_released_in_use(static_cast<uint32_t>(region_totals.released_in_use));
  response->set_region_bytes_released_in_use(region_totals.released_in_use_bytes);
  response->set_draining(state_.draining);
  response->set_metrics_address(state_.facts().metrics_address);
}

grpc::ServerUnaryReactor* AdminServiceImpl::Stats(grpc::CallbackServerContext* context, const v1::StatsRequest* request,
                                                  v1::StatsResponse* response) {
  if (auto caller = Authorize(context, state_, Role::kMonitor, "Stats"); !caller.ok()) {
    return Reply(context, caller.status());
  }
  if (auto s = CheckRequestBytes(*request, "Stats", kSmallRequestBytes); !s.ok()) return Reply(context, s);
  return AskEveryTier(context, [this, response] { FillStats(response); });
}

void AdminServiceImpl::FillStats(v1::StatsResponse* response) {
  for (const auto& [key, value] : CollectTelemetry(state_).StatsCounters())
    (*response->mutable_counters())[key] = value;
}

// The tier an admin request names: INVALID_ARGUMENT for none (TIER_NONE, or a value this daemon does not know),
// NOT_FOUND for one this daemon was not started with.
absl::StatusOr<Tier*> AdminServiceImpl::NamedTier(v1::TierKind wire) const {
  if (wire != v1::TIER_DRAM && wire != v1::TIER_DISK && wire != v1::TIER_REMOTE) {
    return absl::InvalidArgumentError(
        absl::StrCat("name a tier (TIER_DRAM, TIER_DISK or TIER_REMOTE); got ", static_cast<int>(wire)));
  }
  const TierKind kind = TierKindFromWire(wire);
  Tier* tier = state_.tiers.tier(kind);
  if (tier == nullptr) return absl::NotFoundError(absl::StrCat("this daemon has no ", TierKindName(kind), " tier"));
  return tier;
}

grpc::ServerUnaryReactor* AdminServiceImpl::Evict(grpc::CallbackServerContext* context, const v1::EvictRequest* request,
                                                  v1::EvictResponse* response) {
  if (auto caller = Authorize(context, state_, Role::kAdmin, "Evict"); !caller.ok()) {
    return Reply(context, caller.status());
  }
  auto named = NamedTier(request->tier());
  if (!named.ok()) return Reply(context, named.status());
  Tier* tier = *named;
  // Removing thousands of files takes a while: an I/O thread does it.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // A networked tier's scan and deletes wait on it: not on the I/O threads that DRAM and disk reads need.
  IoPool& runner = tier->waits_on_network() ? state_.remote_calls : state_.region_and_store_work;
  DaemonState& state = state_;
  const bool submitted =
      runner.TrySubmit(AnsweredEvenIfItThrows(reactor, [&state, reactor, tier, response, name = tier->name()] {
        std::vector<std::pair<ChunkKey, uint64_t>> chunks;
        tier->ForEach([&](const ChunkKey& key, uint64_t bytes) { chunks.emplace_back(key, bytes); });
        for (const auto& [key, bytes] : chunks) {
          // A stop ends the eviction within the grace period: what is left stays stored.
          if (state.stopping) break;
          // A chunk another reader removed meanwhile is simply gone already.
          if (tier->Remove(key).ok()) {
            response->set_chunks(response->chunks() + 1);
            response->set_bytes(response->bytes() + bytes);
          }
        }
        spdlog::info("evicted {} chunks ({} bytes) from the {} tier on request", response->chunks(), response->bytes(),
                     name);
        reactor->Finish(grpc::Status::OK);
      }));
  if (!submitted) {
    reactor->Finish(ToGrpcStatus(absl::ResourceExhaustedError("the daemon's I/O queue is full; retry shortly")));
  }
  return reactor;
}

grpc::ServerUnaryReactor* AdminServiceImpl::SetReadCap(grpc::CallbackServerContext* context,
                                                       const v1::SetReadCapRequest* request,
                                                       v1::SetReadCapResponse* response) {
  if (auto caller = Authorize(context, state_, Role::kAdmin, "SetReadCap"); !caller.ok()) {
    return Reply(context, caller.status());
  }
  if (!(request->gbps() > 0) || !std::isfinite(request->gbps())) {
    return Reply(context, absl::InvalidArgumentError(
                              absl::StrCat("gbps must be a positive number of Gbit/s; got ", request->gbps())));
  }
  auto named = NamedTier(request->tier());
  if (!named.ok()) return Reply(context, named.status());
  Tier* tier = *named;
  const double previous_gbps = tier->read_cap_gbps();
  if (absl::Status set = tier->SetReadCapGbps(request->gbps()); !set.ok()) {
    if (set.code() != absl::StatusCode::kFailedPrecondition) return Reply(context, set);
    return Reply(context, absl::FailedPreconditionError(absl::StrCat(
                              "the ", std::string(tier->name()), " tier has no read cap to change; start caked with --",
                              std::string(tier->name()), "-read-gbps")));
  }
  response->set_previous_gbps(previous_gbps);
  // What loads measured under the old cap would mislead the planner for several loads (the average moves 30% per
  // load): the next load measures the tier afresh.
  for (const auto& entry : state_.tiers.tiers()) {
    if (entry->tier.get() == tier) state_.tier_speeds.Forget(entry->kind);
  }
  spdlog::info("{} tier read cap: {} -> {} Gbit/s", tier->name(), response->previous_gbps(), request->gbps());
  return Reply(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminServiceImpl::Drain(grpc::CallbackServerContext* context, const v1::DrainRequest* request,
                                                  v1::DrainResponse* response) {
  if (auto caller = Authorize(context, state_, Role::kAdmin, "Drain"); !caller.ok()) {
    return Reply(context, caller.status());
  }
  const bool draining = !request->resume();
  state_.drain_exit_when_idle = draining && request->exit_when_idle();
  state_.draining = draining;
  if (state_.facts().health != nullptr) state_.facts().health->SetServing(!draining);
  response->set_active_loads(state_.loads.active());
  response->set_draining(draining);
  spdlog::info("{}: {} loads running{}", draining ? "draining (new loads refused, health NOT_SERVING)" : "resumed",
               response->active_loads(), state_.drain_exit_when_idle ? "; the daemon stops once none is" : "");
  return Reply(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminServiceImpl::ListRegions(grpc::CallbackServerContext* context,
                                                        const v1::ListRegionsRequest*,
                                                        v1::ListRegionsResponse* response) {
  // Every owner's regions: an operator's view, so admin only.
  if (auto caller = Authorize(context, state_, Role::kAdmin, "ListRegions"); !caller.ok()) {
    return Reply(context, caller.status());
  }
  for (const RegionRegistry::Listed& r : state_.regions.List()) {
    v1::RegionSummary* out = response->add_regions();
    out->set_region_id(r.region_id);
    out->set_principal(r.owner.principal);
    out->set_client_id(r.owner.client_id);
    out->set_kind(r.backend == RegionBackend::kCudaIpc ? v1::REGION_CUDA_IPC : v1::REGION_HOST_SHM);
    out->set_bytes(r.bytes);
    out->set_windows(r.windows);
    out->set_lease_left_s(r.lease_left_s);
    out->set_released(r.released);
    out->set_loads_using(r.windows);
  }
  return Reply(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminServiceImpl::ReleaseAnyRegion(grpc::CallbackServerContext* context,
                                                             const v1::ReleaseAnyRegionRequest* request,
                                                             v1::ReleaseAnyRegionResponse* response) {
  if (auto caller = Authorize(context, state_, Role::kAdmin, "ReleaseAnyRegion"); !caller.ok()) {
    return Reply(context, caller.status());
  }
  if (request->region_id().empty() || request->region_id().size() > 256) {
    return Reply(context, absl::InvalidArgumentError("region_id must be 1 to 256 bytes (cakectl regions lists them)"));
  }
  auto released = state_.regions.ReleaseAny(request->region_id());
  if (!released.ok()) return Reply(context, released.status());
  response->set_principal(released->owner.principal);
  response->set_client_id(released->owner.client_id);
  response->set_bytes(released->bytes);
  response->set_loads_using(released->loads_using);
  response->set_already_released(released->already_released);
  if (!released->already_released) Bump(state_.counters.regions_released);
  // Outside the registry's lock: each load's end drops its window, which takes that lock.
  const size_t ended =
      request->end_loads()
          ? state_.loads.CancelUsingRegion(
                request->region_id(),
                absl::CancelledError("an operator released the region this load lands in (cakectl regions "
                                     "release --end-loads); compute the rest of the prompt"))
          : 0;
  response->set_loads_ended(static_cast<uint32_t>(ended));
  spdlog::warn("an operator released a region of {} ({} bytes{}): {} loads were using it, {} of them ended",
               released->owner.ToString(), released->bytes, released->already_released ? ", already released" : "",
               released->loads_using, ended);
  return Reply(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminServiceImpl::ListLoads(grpc::CallbackServerContext* context, const v1::ListLoadsRequest*,
                                                      v1::ListLoadsResponse* response) {
  if (auto caller = Authorize(context, state_, Role::kMonitor, "ListLoads"); !caller.ok()) {
    return Reply(context, caller.status());
  }
  for (const LoadSummary& l : state_.loads.List()) {
    v1::LoadSummary* out = response->add_loads();
    out->set_load_id(l.load_id);
    out->set_principal(l.principal);
    out->set_client_id(l.client_id);
    out->set_tenant(l.tenant);
    out->set_model(l.model);
    out->set_strategy(ToWire(l.strategy));
    out->set_phase(ToWire(l.phase));
    out->set_total_chunks(l.total_chunks);
    out->set_cached_chunks(l.cached_chunks);
    out->set_loaded_chunks(l.loaded_chunks);
    out->set_computed_through(l.computed_through);
    out->set_inline_bytes(l.inline_bytes);
    out->set_age_s(l.age_s);
  }
  return Reply(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminServiceImpl::GetConfig(grpc::CallbackServerContext* context, const v1::GetConfigRequest*,
                                                      v1::GetConfigResponse* response) {
  // Paths, limits and principals, no secrets: still an operator's business, not an engine's.
  if (auto caller = Authorize(context, state_, Role::kAdmin, "GetConfig"); !caller.ok()) {
    return Reply(context, caller.status());
  }
  DaemonConfig effective = state_.effective_config();
  // Caps set with cakectl set-read-cap since are what runs.
  if (Tier* t = state_.tiers.tier(TierKind::kDram)) effective.dram_read_gbps = t->read_cap_gbps();
  if (Tier* t = state_.tiers.tier(TierKind::kDisk)) effective.disk_read_gbps = t->read_cap_gbps();
  if (Tier* t = state_.tiers.tier(TierKind::kRemote)) effective.remote_read_gbps = t->read_cap_gbps();
  response->set_toml(FormatConfig(effective));
  return Reply(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminServiceImpl::Verify(grpc::CallbackServerContext* context,
                                                   const v1::VerifyRequest* request, v1::VerifyResponse* response) {
  if (auto caller = Authorize(context, state_, Role::kAdmin, "Verify"); !caller.ok()) {
    return Reply(context, caller.status());
  }
  auto named = NamedTier(request->tier());
  if (!named.ok()) return Reply(context, named.status());
  Tier* tier = *named;
  if (!tier->Capabilities().checksummed) {
    return Reply(context, absl::InvalidArgumentError(
                              absl::StrCat("the ", std::string(tier->name()),
                                           " tier keeps no checksums (its chunks never leave memory); verify "
                                           "a tier that does (disk or remote)")));
  }
  if (state_.verify_running.exchange(true)) {
    return Reply(context, absl::FailedPreconditionError("a verify is already running; wait for it to answer"));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  IoPool& runner = tier->waits_on_network() ? state_.remote_calls : state_.region_and_store_work;
  // The job holds the daemon's state (whose pool runs it), not this service, which is destroyed first at a stop.
  DaemonState& state = state_;
  const bool submitted = runner.TrySubmit(AnsweredEvenIfItThrows(reactor, [&state, reactor, tier, response,
                                                                           name = tier->name()] {
    // Whatever ends the job, the next Verify may run.
    struct VerifyDone {
      DaemonState& state;
      ~VerifyDone() { state.verify_running = false; }
    } done{state};
    const auto started = std::chrono::steady_clock::now();
    std::vector<ChunkKey> chunks;
    tier->ForEach([&](const ChunkKey& key, uint64_t) { chunks.push_back(key); });
    // A read checks the chunk's checksum (and decodes it, in a tier with a codec), and the tier itself removes a
    // corrupt one (Tier::Read's DATA_LOSS), so the next load that would have met it computes instead. The reads go
    // through the tier's read cap.
    for (const ChunkKey& key : chunks) {
      if (state.stopping) break;
      // The size comes from the tier's metadata, which a hostile store (Redis, files) may have forged: nothing
      // larger than a chunk may be is ever read for it (INVALID_ARGUMENT: unreadable), only what arrives is held,
      // and only for this chunk; a codec's claim of what it decodes to is checked through a small window.
      const absl::StatusOr<uint64_t> checked = tier->Check(key, state.config.max_chunk_bytes);
      const absl::Status read = checked.status();
      if (read.ok()) {
        response->set_chunks_checked(response->chunks_checked() + 1);
        response->set_bytes_checked(response->bytes_checked() + *checked);
      } else if (absl::IsDataLoss(read)) {
        response->set_chunks_checked(response->chunks_checked() + 1);
        response->set_corrupt_removed(response->corrupt_removed() + 1);
      } else if (absl::IsNotFound(read)) {
        response->set_vanished(response->vanished() + 1);
      } else {
        response->set_unreadable(response->unreadable() + 1);
      }
    }
    response->set_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    const bool bad = response->corrupt_removed() > 0 || response->unreadable() > 0;
    spdlog::log(bad ? spdlog::level::warn : spdlog::level::info,
                "verify of the {} tier: {} chunks checked, {} corrupt removed, {} unreadable in {:.1f} s", name,
                response->chunks_checked(), response->corrupt_removed(), response->unreadable(), response->seconds());
    reactor->Finish(state.stopping ? ToGrpcStatus(absl::UnavailableError("the daemon is stopping; verify ended early"))
                                   : grpc::Status::OK);
  }));
  if (!submitted) {
    state_.verify_running = false;
    reactor->Finish(ToGrpcStatus(absl::ResourceExhaustedError("the daemon's background queue is full; retry shortly")));
  }
  return reactor;
}

}  // namespace cake
