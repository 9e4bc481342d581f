// The gRPC services: thin translation between cake.v1 messages and the daemon's modules.
#pragma once

#include <functional>

#include "cake/v1/admin.grpc.pb.h"
#include "cake/v1/kv.grpc.pb.h"
#include "server/core/callers.h"
#include "server/core/daemon_state.h"

namespace cake {

class KvServiceImpl final : public v1::KvService::CallbackService {
 public:
  explicit KvServiceImpl(DaemonState& state) : state_(state) {}

  grpc::ServerUnaryReactor* GetLimits(grpc::CallbackServerContext* context, const v1::GetLimitsRequest* request,
                                      v1::GetLimitsResponse* response) override;
  grpc::ServerUnaryReactor* RegisterRegion(grpc::CallbackServerContext* context,
                                           const v1::RegisterRegionRequest* request,
                                           v1::RegisterRegionResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseRegion(grpc::CallbackServerContext* context, const v1::ReleaseRegionRequest* request,
                                          v1::ReleaseRegionResponse* response) override;
  grpc::ServerUnaryReactor* RenewRegion(grpc::CallbackServerContext* context, const v1::RenewRegionRequest* request,
                                        v1::RenewRegionResponse* response) override;
  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* context, const v1::LookupRequest* request,
                                   v1::LookupResponse* response) override;
  grpc::ServerBidiReactor<v1::LoadRequest, v1::LoadResponse>* Load(grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Store(grpc::CallbackServerContext* context, const v1::StoreRequest* request,
                                  v1::StoreResponse* response) override;

 private:
  DaemonState& state_;
};

class AdminServiceImpl final : public v1::AdminService::CallbackService {
 public:
  explicit AdminServiceImpl(DaemonState& state) : state_(state) {}

  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* context, const v1::PingRequest* request,
                                 v1::PingResponse* response) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context, const v1::StatusRequest* request,
                                   v1::StatusResponse* response) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* context, const v1::StatsRequest* request,
                                  v1::StatsResponse* response) override;
  grpc::ServerUnaryReactor* Evict(grpc::CallbackServerContext* context, const v1::EvictRequest* request,
                                  v1::EvictResponse* response) override;
  grpc::ServerUnaryReactor* SetReadCap(grpc::CallbackServerContext* context, const v1::SetReadCapRequest* request,
                                       v1::SetReadCapResponse* response) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context, const v1::DrainRequest* request,
                                  v1::DrainResponse* response) override;
  grpc::ServerUnaryReactor* ListRegions(grpc::CallbackServerContext* context, const v1::ListRegionsRequest* request,
                                        v1::ListRegionsResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseAnyRegion(grpc::CallbackServerContext* context,
                                             const v1::ReleaseAnyRegionRequest* request,
                                             v1::ReleaseAnyRegionResponse* response) override;
  grpc::ServerUnaryReactor* ListLoads(grpc::CallbackServerContext* context, const v1::ListLoadsRequest* request,
                                      v1::ListLoadsResponse* response) override;
  grpc::ServerUnaryReactor* GetConfig(grpc::CallbackServerContext* context, const v1::GetConfigRequest* request,
                                      v1::GetConfigResponse* response) override;
  grpc::ServerUnaryReactor* Verify(grpc::CallbackServerContext* context, const v1::VerifyRequest* request,
                                   v1::VerifyResponse* response) override;

 private:
  absl::StatusOr<Tier*> NamedTier(v1::TierKind tier) const;
  grpc::ServerUnaryReactor* AskEveryTier(grpc::CallbackServerContext* context, std::function<void()> fill);
  void FillStatus(v1::StatusResponse* response);
  void FillStats(v1::StatsResponse* response);
  DaemonState& state_;
};

}  // namespace cake
