// cake-demo: time to first token of compute-only, I/O-only and Cake for one cached prompt, with a real engine (the
// CPU transformer of examples/cpu_engine, bit-exact against full compute) or the paper's simulated one (the Cake
// paper's cost model, sleeping), against a real caked: the one at --socket, or a private one started from next to
// cake-demo. scripts/demo runs it against a daemon with a disk tier.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "examples/cpu_engine/engine_harness.h"

namespace cake::demo {

// The demo's client id in the daemon's sessions and stats.
inline constexpr char kClientId[] = "cake-demo";

struct DemoOptions {
  std::string socket_path;  // empty: start a private caked
  std::string json_path;    // empty: no JSON file
  // "real": the CPU transformer computes and its KV cache is loaded from the disk tier; "simulated": the cost
  // model's sleeping engine (docs/architecture.md, "The cost model") against stand-in bytes.
  std::string engine = "real";
  std::optional<double> read_gbps;  // the read cap, Gbit/s; real engine default: loading takes as long as computing
  uint32_t tokens = 8192;           // the simulated engine's prompt
  std::string model = "llama3.1-8b";
  std::optional<double> gpu_tflops;  // effective prefill TFLOP/s; default: balances compute and load
  // Real engine: the prompt is this file's bytes (one token per byte), cut to `real_tokens`; synthetic without it.
  std::string prompt_file;
  uint32_t real_tokens = 3072;
  engine::ModelOptions engine_model;
};

// --engine real (real_demo.cc).
absl::Status RunRealEngineDemo(const DemoOptions& options);
// --engine simulated (simulated_demo.cc).
absl::Status RunSimulatedDemo(const DemoOptions& options);

}  // namespace cake::demo
