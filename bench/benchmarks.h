// The cake-bench subcommands. Each drives a real caked (the one at --socket, or a private one it starts), prints
// a readable summary and, with --json, writes its figures as one JSON object.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace cake::bench {

struct CommonOptions {
  std::string socket_path;  // empty: start a private caked
  std::string json_path;    // empty: no JSON file
};

// Lookup latency for 16K- and 128K-token prompts beside a trivial unary call on the same channel.
struct LookupBenchOptions {
  CommonOptions common;
  uint32_t iterations = 1000;
};
absl::Status RunLookupBench(const LookupBenchOptions& options);

// Throughput of I/O-only loads from the DRAM tier into a host region, beside memcpy of the same bytes.
struct RegionBenchOptions {
  CommonOptions common;
  uint64_t mib = 256;
  uint32_t runs = 10;
};
absl::Status RunRegionBench(const RegionBenchOptions& options);

// The simulated engine of scripts/demo: compute-only, I/O-only and Cake time to first token for one prompt.
struct DemoOptions {
  CommonOptions common;
  double read_gbps = 16;                // the daemon's DRAM read cap, Gbit/s
  uint32_t tokens = 8192;
  std::string model = "llama3.1-8b";
  std::optional<double> gpu_tflops;     // effective prefill TFLOP/s; default: balances compute and load
};
absl::Status RunDemo(const DemoOptions& options);

}  // namespace cake::bench
