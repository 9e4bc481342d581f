// The paper's simulated storage, the simulated engine's counterpart, for the benches that model a disk (grid,
// concurrent, adaptive, fluctuate, mixed; the stand-in layout serves a few more): caked serves stand-in bytes (1 KiB
// of KV per token) from its DRAM tier behind a read cap with no burst, so reads are served one after another, each
// taking its size over the cap. The cap is scaled so a stand-in chunk takes exactly as long as the modelled model's
// KV chunk would at the modelled bandwidth, divided by the bench's time scale.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "keys/namespace.h"

namespace cake::sim {

inline constexpr double kProxyBytesPerToken = 1024;

// The stand-in layout: 1 layer, 1 KV head of 256 BF16 values, `chunk_tokens` tokens a chunk.
inline NamespaceSpec ProxyNamespace(std::string model_id, uint32_t chunk_tokens) {
  NamespaceSpec ns;
  ns.model_id = std::move(model_id);
  ns.num_layers = 1;
  ns.num_kv_heads = 1;
  ns.head_dim = 256;
  ns.dtype = DType::kBf16;
  ns.chunk_tokens = chunk_tokens;
  ns.tenant = "cake-bench";
  return ns;
}

// caked's read cap, Gbit/s, for a modelled bandwidth of `gbps` and KV of `kv_bytes_per_token`.
inline double SimulatedCapGbps(double gbps, double kv_bytes_per_token, double time_scale) {
  return gbps * kProxyBytesPerToken / kv_bytes_per_token * time_scale;
}

// caked's arguments for such a disk holding `bytes` of stand-in data.
inline std::vector<std::string> SimulatedDiskArgs(double gbps, double kv_bytes_per_token, double time_scale,
                                                  uint64_t bytes) {
  return {"--dram-read-gbps",     absl::StrCat(SimulatedCapGbps(gbps, kv_bytes_per_token, time_scale)),
          "--dram-read-burst-us", "0",
          "--dram-capacity-mib",  absl::StrCat((bytes >> 20) + 64)};
}

}  // namespace cake::sim
