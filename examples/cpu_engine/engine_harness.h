// The CPU engine against a real caked, as cake-bench engine and cake-demo --engine real both run it (library
// cake_engine_harness): the model's options and their flags, a daemon with a disk tier in a scratch folder, cold
// runs (DRAM emptied first, so loads come from the slow tier), full compute as the bit-exact reference, and the
// fit of the measured per-chunk compute times that the engine sends as its hint.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/cpu_engine/prefill_engine.h"
#include "examples/cpu_engine/transformer.h"
#include "examples/harness/harness.h"

namespace CLI {
class App;
}  // namespace CLI

namespace cake::engine {

// The CPU transformer's shape and how it computes.
struct ModelOptions {
  TransformerConfig shape;  // layers, hidden, heads, KV heads, MLP, vocabulary, seed
  bool bf16 = false;        // KV cache and weights' values in bf16 (fp32 otherwise)
  uint32_t chunk_tokens = 128;
  uint32_t blas_threads = 1;  // the engine's compute threads; the rest of the cores are the daemon's
};

// The model's flags on `command`: --layers, --hidden, ... With a prefix ("large-" gives --large-layers), only the
// shape's, for a second model beside the first.
void AddModelOptions(CLI::App* command, ModelOptions& m, const std::string& prefix = "");

absl::StatusOr<TransformerConfig> ToConfig(const ModelOptions& m);
// One line for the model: its shape, storage and chunk size.
std::string Describe(const TransformerConfig& c, uint32_t chunk_tokens);

// A byte-level prompt: each byte of `file` is a token (repeated if the file is short); synthetic without a file.
absl::StatusOr<std::vector<uint32_t>> PromptTokens(const std::string& file, uint32_t count, uint32_t vocab);

// The daemon the engine talks to: the one at --socket, or a private one with a disk tier in a scratch folder.
struct EngineDaemon {
  std::optional<harness::ScratchDir> scratch;  // declared first: it goes after the daemon that writes into it
  harness::DaemonTarget target;
  bool from_disk = false;  // whether loads come from a disk tier (else from DRAM behind its cap)
  TierKind capped_tier() const { return from_disk ? TierKind::kDisk : TierKind::kDram; }
};
// `pages_bytes` sizes the private daemon's DRAM tier; `client_id` names the program to the daemon; `disk_codec` is
// the private daemon's disk.codec.
absl::StatusOr<EngineDaemon> OpenEngineDaemon(const std::string& socket_path, uint64_t pages_bytes,
                                              const std::string& client_id, const std::string& disk_codec = "none");

// One run with every load coming from the slow tier: DRAM is emptied first, since a load promotes what it reads.
absl::StatusOr<PrefillResult> RunCold(EngineDaemon& daemon, PrefillEngine& engine, PrefillMode mode,
                                      uint32_t split = 0);

struct Truth {
  std::vector<std::byte> kv;
  PrefillResult run;
};
// Full compute, after one untimed pass (the pages' first touch, the BLAS's buffers): the reference every other
// run is compared with, and the measured per-chunk compute curve.
absl::StatusOr<Truth> ComputeTruth(PrefillEngine& engine);

// Whether `run` produced full compute's first token and left full compute's KV cache, byte for byte.
bool BitExact(const PrefillEngine& engine, const PrefillResult& run, const Truth& truth);

// The fit over full chunks (a partial tail chunk is cheaper by its missing tokens, not by the model).
LinearFit FitFullChunks(const PrefillEngine& engine, const PrefillResult& run);

// Stores every full chunk and, with a disk tier, waits until the write-back has put them all on disk.
absl::Status StoreAndSettle(EngineDaemon& daemon, PrefillEngine& engine);

}  // namespace cake::engine
