// Validation shared by the RPC handlers: request fields to checked domain values, errors to gRPC statuses.
// This is the only place absl::Status becomes grpc::Status.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "cake/v1/kv.pb.h"
#include "grpcpp/support/status.h"
#include "server/config.h"
#include "storage/namespace.h"

namespace cake {

grpc::Status ToGrpcStatus(const absl::Status& status);

// The namespace of a request, validated against the daemon's limits, in `tenant` (which the daemon decided from
// the caller's principal; the request's own tenant field is not read here).
absl::StatusOr<Namespace> ParseNamespace(const v1::Namespace& proto, const DaemonConfig& config,
                                         const std::string& tenant);

// The chunk keys of a prompt: from tokens (hashed) or from the engine's own keys. INVALID_ARGUMENT for an empty
// prompt, both forms at once, a wrong key length, or more tokens than limits.max_prompt_tokens.
absl::StatusOr<std::vector<ChunkKey>> PromptKeys(const Namespace& ns, const v1::Prompt& prompt,
                                                 const DaemonConfig& config);

absl::Status CheckClientId(const std::string& client_id);

}  // namespace cake
