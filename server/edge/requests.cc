#include "server/edge/requests.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "proto/wire_enums.h"

namespace cake {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbers.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::StatusOr<Namespace> ParseNamespace(const v1::Namespace& p, const DaemonConfig& config,
                                         const std::string& tenant) {
  NamespaceSpec spec;
  spec.model_id = p.model_id();
  spec.num_layers = p.num_layers();
  spec.num_kv_heads = p.num_kv_heads();
  spec.head_dim = p.head_dim();
  if (p.dtype() == v1::DTYPE_UNSPECIFIED) {
    return absl::InvalidArgumentError("namespace.dtype is unspecified; give FP32, FP16, BF16, FP8 or INT8");
  }
  spec.dtype = DTypeFromWire(p.dtype());
  spec.tp_rank = p.tp_rank();
  spec.tp_size = p.tp_size() == 0 ? 1 : p.tp_size();
  spec.chunk_tokens = p.chunk_tokens() == 0 ? config.default_chunk_tokens : p.chunk_tokens();
  if (tenant.size() > 256) return absl::InvalidArgumentError("namespace.tenant is longer than 256 bytes");
  spec.tenant = tenant;
  if (p.stored_precision() < 0 || p.stored_precision() > v1::STORED_PRECISION_INT4) {
    return absl::InvalidArgumentError(
        absl::StrCat("namespace.stored_precision is ", p.stored_precision(), "; accepted: EXACT, INT8, INT4"));
  }
  spec.stored_precision = StoredPrecisionFromWire(p.stored_precision());
  NamespaceLimits limits{config.max_chunk_bytes, config.max_chunk_tokens};
  CAKE_ASSIGN_OR_RETURN(Namespace ns, Namespace::Create(std::move(spec), limits, config.key_secret));
  // Every tier spends at least a page (DRAM extents, disk blocks) and an index entry per chunk: tiny chunks would
  // make the budgets, which count chunk bytes, say a fraction of what is used.
  if (ns.chunk_bytes() < config.min_chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a chunk of this namespace is ", ns.chunk_bytes(),
                                                   " bytes, below limits.min_chunk_bytes (", config.min_chunk_bytes,
                                                   "): use more tokens per chunk"));
  }
  return ns;
}

absl::StatusOr<std::vector<ChunkKey>> PromptKeys(const Namespace& ns, const v1::Prompt& prompt,
                                                 const DaemonConfig& config) {
  const bool has_tokens = prompt.tokens_size() > 0;
  const bool has_keys = prompt.chunk_keys_size() > 0;
  if (has_tokens && has_keys) {
    return absl::InvalidArgumentError("the prompt has both tokens and chunk_keys; send one of the two");
  }
  if (!has_tokens && !has_keys) {
    return absl::InvalidArgumentError("the prompt is empty: send its tokens or its chunk_keys");
  }
  if (has_tokens) {
    if (static_cast<uint64_t>(prompt.tokens_size()) > config.max_prompt_tokens) {
      return absl::InvalidArgumentError(absl::StrCat("the prompt has ", prompt.tokens_size(),
                                                     " tokens; this daemon accepts at most ", config.max_prompt_tokens,
                                                     " (limits.max_prompt_tokens)"));
    }
    return ns.KeysForTokens(std::span<const uint32_t>(prompt.tokens().data(), prompt.tokens_size()));
  }
  const uint64_t max_keys = config.max_prompt_tokens / ns.chunk_tokens();
  if (static_cast<uint64_t>(prompt.chunk_keys_size()) > max_keys) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", prompt.chunk_keys_size(),
                                                   " chunk keys; this daemon accepts at most ", max_keys,
                                                   " (limits.max_prompt_tokens / chunk_tokens)"));
  }
  std::vector<std::string_view> engine_keys(prompt.chunk_keys().begin(), prompt.chunk_keys().end());
  return ns.KeysForEngineKeys(engine_keys);
}

absl::Status CheckClientId(const std::string& client_id) {
  if (client_id.empty()) return absl::InvalidArgumentError("client_id is empty: every engine names itself");
  if (client_id.size() > 256) return absl::InvalidArgumentError("client_id is longer than 256 bytes");
  return absl::OkStatus();
}

uint64_t LookupRequestLimit(const DaemonConfig& config) { return 4 * config.max_prompt_tokens + (uint64_t{1} << 20); }

absl::Status CheckRequestBytes(const google::protobuf::MessageLite& request, const char* method, uint64_t limit) {
  const size_t bytes = request.ByteSizeLong();
  if (bytes <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("a ", method, " request is ", bytes, " bytes; ", method,
                                                   " takes at most ", limit, " (only Store carries bulk)"));
}

}  // namespace cake
