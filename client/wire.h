// The client's conversions between its own types and the wire's, shared by the session and the client.
#pragma once

#include "absl/status/status.h"
#include "cake/v1/kv.pb.h"
#include "client/client.h"
#include "grpcpp/support/status.h"
#include "proto/wire_enums.h"

namespace cake {

inline absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

inline void ToProto(const NamespaceSpec& spec, v1::Namespace* out) {
  out->set_model_id(spec.model_id);
  out->set_num_layers(spec.num_layers);
  out->set_num_kv_heads(spec.num_kv_heads);
  out->set_head_dim(spec.head_dim);
  out->set_dtype(ToWire(spec.dtype));
  out->set_tp_rank(spec.tp_rank);
  out->set_tp_size(spec.tp_size);
  out->set_chunk_tokens(spec.chunk_tokens);
  out->set_tenant(spec.tenant);
  out->set_stored_precision(ToWire(spec.stored_precision));
}

inline void ToProto(const PromptRef& prompt, v1::Prompt* out) {
  out->mutable_tokens()->Add(prompt.tokens.begin(), prompt.tokens.end());
  for (const std::string& key : prompt.chunk_keys) out->add_chunk_keys(key);
}

}  // namespace cake
