// Running the CPU engine against caked, shared by cake-bench engine and cake-demo (see engine_harness.h).
#include "examples/cpu_engine/engine_harness.h"

#include <cstring>
#include <span>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace cake::engine {

void AddModelOptions(CLI::App* command, ModelOptions& m, const std::string& prefix) {
  command->add_option("--" + prefix + "layers", m.shape.layers, "transformer layers")->capture_default_str();
  command->add_option("--" + prefix + "hidden", m.shape.hidden, "hidden size")->capture_default_str();
  command->add_option("--" + prefix + "heads", m.shape.heads, "attention heads")->capture_default_str();
  command->add_option("--" + prefix + "kv-heads", m.shape.kv_heads, "KV heads (grouped-query attention)")
      ->capture_default_str();
  command->add_option("--" + prefix + "intermediate", m.shape.intermediate, "MLP size")->capture_default_str();
  if (prefix.empty()) {
    command->add_option("--vocab", m.shape.vocab, "vocabulary")->capture_default_str();
    command->add_option("--seed", m.shape.seed, "weights' seed")->capture_default_str();
    command->add_flag("--bf16", m.bf16, "KV cache and weights in bf16 (fp32 otherwise)");
    command->add_option("--chunk-tokens", m.chunk_tokens, "tokens per chunk (KV page)")
        ->capture_default_str()
        ->check(CLI::Range(1u, 65536u));
    command->add_option("--blas-threads", m.blas_threads, "the engine's compute threads (OpenBLAS)")
        ->capture_default_str()
        ->check(CLI::Range(1u, 256u));
  }
}

absl::StatusOr<TransformerConfig> ToConfig(const ModelOptions& m) {
  TransformerConfig c = m.shape;
  c.storage = m.bf16 ? Storage::kBf16 : Storage::kFp32;
  CAKE_RETURN_IF_ERROR(c.Validate());
  if (m.chunk_tokens == 0) return absl::InvalidArgumentError("--chunk-tokens must be positive");
  return c;
}

std::string Describe(const TransformerConfig& c, uint32_t chunk_tokens) {
  return absl::StrFormat("%u layers, hidden %u, %u heads / %u KV heads, MLP %u, vocab %u, %s, %u-token chunks",
                         c.layers, c.hidden, c.heads, c.kv_heads, c.intermediate, c.vocab,
                         c.storage == Storage::kFp32 ? "fp32" : "bf16", chunk_tokens);
}

absl::StatusOr<std::vector<uint32_t>> PromptTokens(const std::string& file, uint32_t count, uint32_t vocab) {
  if (file.empty()) {
    std::vector<uint32_t> tokens = harness::SyntheticPrompt(count, 5);
    for (uint32_t& t : tokens) t %= vocab;
    return tokens;
  }
  const std::string text = harness::ReadWholeFile(file);
  if (text.empty()) return absl::NotFoundError(absl::StrCat("--prompt-file ", file, " is empty or unreadable"));
  std::vector<uint32_t> tokens(count);
  for (uint32_t i = 0; i < count; ++i) tokens[i] = static_cast<unsigned char>(text[i % text.size()]) % vocab;
  return tokens;
}

absl::StatusOr<EngineDaemon> OpenEngineDaemon(const std::string& socket_path, uint64_t pages_bytes,
                                              const std::string& client_id, const std::string& disk_codec) {
  EngineDaemon d;
  std::vector<std::string> args;
  if (socket_path.empty()) {
    CAKE_ASSIGN_OR_RETURN(auto scratch, harness::ScratchDir::Create("cake-engine"));
    d.scratch.emplace(std::move(scratch));
    // A read cap to change later, once the engine's compute speed says which throttle makes both sides matter.
    args = {"--disk-root",         (d.scratch->path() / "disk").string(),       "--disk-read-gbps", "100",
            "--dram-capacity-mib", absl::StrCat(3 * (pages_bytes >> 20) + 256), "--disk-codec",     disk_codec};
  }
  CAKE_ASSIGN_OR_RETURN(auto target, harness::OpenDaemon(socket_path, args, client_id));
  d.target = std::move(target);
  CAKE_ASSIGN_OR_RETURN(auto stats, d.target.client->Stats());
  d.from_disk = stats.contains("tier_disk_chunks");
  return d;
}

absl::StatusOr<PrefillResult> RunCold(EngineDaemon& daemon, PrefillEngine& engine, PrefillMode mode, uint32_t split) {
  if (daemon.from_disk && mode != PrefillMode::kComputeOnly) {
    CAKE_RETURN_IF_ERROR(daemon.target.client->Evict(TierKind::kDram).status());
  }
  return engine.Run(mode, split);
}

absl::StatusOr<Truth> ComputeTruth(PrefillEngine& engine) {
  CAKE_RETURN_IF_ERROR(engine.Run(PrefillMode::kComputeOnly).status());
  CAKE_ASSIGN_OR_RETURN(auto run, engine.Run(PrefillMode::kComputeOnly));
  return Truth{std::vector<std::byte>(engine.Kv().begin(), engine.Kv().end()), run};
}

bool BitExact(const PrefillEngine& engine, const PrefillResult& run, const Truth& truth) {
  const auto kv = engine.Kv();
  return run.first_token == truth.run.first_token && kv.size() == truth.kv.size() &&
         std::memcmp(kv.data(), truth.kv.data(), kv.size()) == 0;
}

LinearFit FitFullChunks(const PrefillEngine& engine, const PrefillResult& run) {
  return FitChunkTimes(std::span(run.chunk_compute_s).first(engine.full_chunks()));
}

absl::Status StoreAndSettle(EngineDaemon& daemon, PrefillEngine& engine) {
  Client& client = *daemon.target.client;
  uint64_t on_disk = 0;
  if (daemon.from_disk) {
    CAKE_ASSIGN_OR_RETURN(auto stats, client.Stats());
    on_disk = stats["tier_disk_chunks"];
  }
  CAKE_ASSIGN_OR_RETURN(auto stored, engine.Store(engine.full_chunks()));
  if (daemon.from_disk) {
    return harness::WaitForCounter(client, "tier_disk_chunks", on_disk + stored.stored_chunks,
                                   std::chrono::seconds(60));
  }
  return absl::OkStatus();
}

}  // namespace cake::engine
