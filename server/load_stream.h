// One Load RPC: the server side of the Cake load protocol (Start / Plan / Progress / Loaded / Done / Release).
#pragma once

#include "cake/v1/kv.grpc.pb.h"
#include "server/daemon_state.h"

namespace cake {

// Creates the reactor for one Load stream; it deletes itself when the RPC ends. `caller` is who the daemon
// established the stream's client to be (an error: the stream ends with it when Start arrives).
grpc::ServerBidiReactor<v1::LoadRequest, v1::LoadResponse>* NewLoadStream(grpc::CallbackServerContext* context,
                                                                          DaemonState& state,
                                                                          absl::StatusOr<Caller> caller);

}  // namespace cake
