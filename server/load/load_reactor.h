// The Load RPC's gRPC side: a reactor that reads the client's messages into a LoadStream and is its sink.
#pragma once

#include "cake/v1/kv.grpc.pb.h"
#include "server/core/daemon_state.h"

namespace cake {

// Creates the reactor for one Load stream; it deletes itself when the RPC ends. `caller` is who the daemon
// established the stream's client to be (an error ends the stream at once).
grpc::ServerBidiReactor<v1::LoadRequest, v1::LoadResponse>* NewLoadStream(grpc::CallbackServerContext* context,
                                                                          DaemonState& state,
                                                                          absl::StatusOr<Caller> caller);

}  // namespace cake
