// The Load stream's client end (GrpcLoadSession), made by Client::StartLoad; an internal header of cake_client.
#pragma once

#include <memory>

#include "cake/v1/kv.grpc.pb.h"
#include "client/client.h"

namespace cake {

// Opens the stream with `start` as its first message; the session validates every message the daemon sends.
std::unique_ptr<LoadSession> OpenGrpcLoadSession(v1::KvService::Stub* stub, const LoadOptions& options,
                                                 const v1::LoadRequest& start);

}  // namespace cake
