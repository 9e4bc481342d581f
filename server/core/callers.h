// Who is calling, as the daemon established it, and what that lets the call reach: shared by every RPC handler
// and the Load stream.
#pragma once

#include "cake/v1/kv.pb.h"
#include "grpcpp/server_context.h"
#include "server/core/daemon_state.h"

namespace cake {

// Who made this call, as the daemon established it (the unix peer's uid, a TCP client's certificate or token).
absl::StatusOr<Caller> IdentifyCaller(const grpc::CallbackServerContext& context, const DaemonState& state);

// Regions are shared memory on this machine: only callers on the unix socket can map them (FAILED_PRECONDITION).
absl::Status CheckRegionsReachable(const Caller& caller);

// The request's namespace in the tenant the caller acts in (PERMISSION_DENIED for a tenant it does not hold).
absl::StatusOr<Namespace> CallerNamespace(const Caller& caller, const v1::Namespace& proto, const DaemonConfig& config);

}  // namespace cake
