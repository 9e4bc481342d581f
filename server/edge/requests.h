// Validation shared by the RPC handlers: request fields to checked domain values, errors to gRPC statuses.
// This is the only place absl::Status becomes grpc::Status.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "cake/v1/kv.pb.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/status.h"
#include "keys/namespace.h"
#include "server/config/config.h"

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

// Per-method receive limits. gRPC (1.51) has one receive limit for a whole server (server.max_message_bytes, which
// an inline Store's chunks need) and applies no per-method limit on a server, so a call that carries no bulk is
// checked here, after gRPC has read it: RESOURCE_EXHAUSTED naming the method and its limit. This keeps calls that
// need kilobytes from carrying (or being used to push) bulk; what gRPC buffers before a handler runs is bounded by
// the transport quota and by refusing unidentified callers before their message is read (docs/security.md).
inline constexpr uint64_t kSmallRequestBytes = 64 << 10;  // Ping, Status, Stats, region calls: ids and numbers
// A Lookup's prompt: 4 bytes per token (fixed32) up to limits.max_prompt_tokens, and room for the namespace.
uint64_t LookupRequestLimit(const DaemonConfig& config);
absl::Status CheckRequestBytes(const google::protobuf::MessageLite& request, const char* method, uint64_t limit);

}  // namespace cake
