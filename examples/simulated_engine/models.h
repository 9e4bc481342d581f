// The models of the paper's evaluation: what the Cake paper's prefill cost model (docs/architecture.md, "The cost
// model") and the KV layout need, for every simulated engine (cake-demo --engine simulated, the benches' GridEngine)
// and the benches' KV sizes.
#pragma once

#include <array>
#include <string>
#include <string_view>

#include "keys/namespace.h"

namespace cake::sim {

struct ModelSpec {
  const char* name;
  double params;      // P in the cost model
  uint32_t layers;    // L
  uint32_t hidden;    // d
  uint32_t kv_heads;  // GQA: fewer KV heads than attention heads
  uint32_t head_dim;
};

// KV sizes per token (BF16) as the paper lists them: 512 KiB, 800 KiB, 128 KiB, 320 KiB.
inline constexpr std::array<ModelSpec, 4> kModels = {{
    {"longalpaca-7b", 6.7e9, 32, 4096, 32, 128},
    {"longalpaca-13b", 13.0e9, 40, 5120, 40, 128},
    {"llama3.1-8b", 8.0e9, 32, 4096, 8, 128},
    {"llama3.1-70b", 70.6e9, 80, 8192, 8, 128},
}};

inline const ModelSpec* FindModel(std::string_view name) {
  for (const ModelSpec& m : kModels) {
    if (std::string_view(m.name) == name) return &m;
  }
  return nullptr;
}

// The paper's cost model: a prefix of k tokens costs (2 P k + 2 L d k^2) / F seconds to compute.
struct PrefillCostModel {
  double params = 0;
  double layers = 0;
  double hidden = 0;
  double flops = 0;  // effective FLOP/s during chunked prefill

  double Flop(double tokens) const { return 2 * params * tokens + 2 * layers * hidden * tokens * tokens; }
  double PrefixSeconds(double tokens) const { return Flop(tokens) / flops; }
};

// KV bytes per token in BF16: keys and values of every layer and KV head.
inline double KvBytesPerToken(const ModelSpec& model) {
  return 2.0 * model.layers * model.kv_heads * model.head_dim * 2;
}

// The model's KV layout as a namespace: BF16, one tensor-parallel rank, the default 256-token chunks.
inline NamespaceSpec KvNamespace(const ModelSpec& model) {
  NamespaceSpec ns;
  ns.model_id = model.name;
  ns.num_layers = model.layers;
  ns.num_kv_heads = model.kv_heads;
  ns.head_dim = model.head_dim;
  ns.dtype = DType::kBf16;
  ns.tenant = "cake-bench";
  return ns;
}

}  // namespace cake::sim
