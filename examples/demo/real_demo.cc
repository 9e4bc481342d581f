// cake-demo --engine real (the default): the CPU transformer of examples/cpu_engine prefills one prompt against a
// real caked whose disk tier holds the prompt's KV cache behind a read cap set so loading takes as long as
// computing, three ways (compute-only, I/O-only, Cake), and shows each mode's time to first token and the token
// itself; every mode's KV cache and first token must equal full compute's, byte for byte, or the demo fails.
#include <cctype>
#include <cstdio>
#include <string>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "examples/cpu_engine/engine_harness.h"
#include "examples/cpu_engine/prefill_engine.h"
#include "examples/cpu_engine/transformer.h"
#include "examples/demo/demo.h"
#include "examples/harness/harness.h"

namespace cake::demo {
namespace {

using engine::BitExact;
using engine::ComputeTruth;
using engine::Describe;
using engine::FitFullChunks;
using engine::LinearFit;
using engine::PrefillEngine;
using engine::PrefillMode;
using engine::PromptTokens;
using engine::RunCold;
using engine::StoreAndSettle;
using engine::ToConfig;
using harness::JsonReport;

// A token as the demo prints it: with its character when it is printable ASCII (the prompt is a file's bytes).
std::string TokenText(uint32_t token) {
  if (token < 128 && std::isprint(static_cast<int>(token))) return absl::StrFormat("%u ('%c')", token, token);
  return absl::StrCat(token);
}

}  // namespace

absl::Status RunRealEngineDemo(const DemoOptions& options) {
  CAKE_ASSIGN_OR_RETURN(auto config, ToConfig(options.engine_model));
  if (options.read_gbps && !(*options.read_gbps > 0)) return absl::InvalidArgumentError("--read-gbps must be positive");
  engine::SetBlasThreads(static_cast<int>(options.engine_model.blas_threads));
  engine::Transformer model(config);
  const uint32_t chunk_tokens = options.engine_model.chunk_tokens;
  CAKE_ASSIGN_OR_RETURN(auto prompt, PromptTokens(options.prompt_file, options.real_tokens, config.vocab));
  const uint64_t pages_bytes = model.PageBytes(chunk_tokens) * ((prompt.size() + chunk_tokens - 1) / chunk_tokens);
  CAKE_ASSIGN_OR_RETURN(auto daemon, engine::OpenEngineDaemon(options.socket_path, pages_bytes, kClientId));
  Client& client = *daemon.target.client;
  CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(pages_bytes));
  absl::Cleanup release_region = [&] { client.ReleaseRegion(region).IgnoreError(); };
  PrefillEngine engine(model, chunk_tokens, prompt, &client, region);

  std::printf("cake-demo: a real transformer on the CPU (%s), %zu-token prompt%s\n",
              Describe(config, chunk_tokens).c_str(), prompt.size(),
              options.prompt_file.empty() ? "" : absl::StrCat(" from ", options.prompt_file).c_str());
  // The first request computes everything and stores its KV cache; the daemon writes it back to disk.
  CAKE_ASSIGN_OR_RETURN(auto truth, ComputeTruth(engine));
  const LinearFit fit = FitFullChunks(engine, truth.run);
  engine.SetComputeHint(fit.first_s, fit.growth_s);
  CAKE_RETURN_IF_ERROR(StoreAndSettle(daemon, engine));
  const uint64_t stored_bytes = uint64_t{engine.full_chunks()} * engine.page_bytes();
  const double gbps = options.read_gbps.value_or(stored_bytes * 8.0 / truth.run.ttft_s / 1e9);
  CAKE_RETURN_IF_ERROR(client.SetReadCap(daemon.capped_tier(), gbps).status());
  std::printf("  KV cache %.1f MiB in %u chunks, loaded from %s with reads capped at %.3g Gbit/s%s\n",
              stored_bytes / 1048576.0, engine.full_chunks(),
              daemon.from_disk ? "the disk tier (DRAM emptied before each load)" : "the DRAM tier", gbps,
              options.read_gbps ? "" : " (loading the prompt takes as long as computing it)");
  std::printf("  compute per chunk: %.1f ms + %.2f ms x chunk index (R^2 %.3f), sent to the daemon as the hint\n",
              fit.first_s * 1e3, fit.growth_s * 1e3, fit.r_squared);

  // An untimed load first: it gives the planner the throttled tier's measured speed.
  CAKE_RETURN_IF_ERROR(RunCold(daemon, engine, PrefillMode::kIoOnly).status());
  CAKE_ASSIGN_OR_RETURN(auto computed, RunCold(daemon, engine, PrefillMode::kComputeOnly));
  const bool computed_exact = BitExact(engine, computed, truth);
  CAKE_ASSIGN_OR_RETURN(auto io, RunCold(daemon, engine, PrefillMode::kIoOnly));
  const bool io_exact = BitExact(engine, io, truth);
  CAKE_ASSIGN_OR_RETURN(auto cake, RunCold(daemon, engine, PrefillMode::kCake));
  const bool cake_exact = BitExact(engine, cake, truth);

  std::printf("  %-13s %9s  %-15s %s\n", "mode", "TTFT s", "first token", "");
  std::printf("  %-13s %9.3f  %-15s computed %u chunks\n", "compute-only", computed.ttft_s,
              TokenText(computed.first_token).c_str(), computed.computed_chunks);
  std::printf("  %-13s %9.3f  %-15s loaded %u chunks\n", "I/O-only", io.ttft_s, TokenText(io.first_token).c_str(),
              io.loaded_chunks);
  std::printf("  %-13s %9.3f  %-15s met at chunk %u (token %u), predicted %s; computed %u, loaded %u\n", "Cake",
              cake.ttft_s, TokenText(cake.first_token).c_str(), cake.meeting_chunk, cake.meeting_chunk * chunk_tokens,
              cake.predicted_meeting_chunk ? absl::StrCat(*cake.predicted_meeting_chunk).c_str() : "-",
              cake.computed_chunks, cake.loaded_chunks);
  std::printf("  Cake speedup: %.2fx over compute-only, %.2fx over I/O-only\n", computed.ttft_s / cake.ttft_s,
              io.ttft_s / cake.ttft_s);
  const bool exact = computed_exact && io_exact && cake_exact;
  std::printf("  KV cache and first token identical to full compute's in every mode: %s\n", exact ? "yes" : "NO");

  JsonReport report;
  report.Set("engine", std::string("real"));
  report.Set("model", Describe(config, chunk_tokens));
  report.Set("tokens", static_cast<double>(prompt.size()));
  report.Set("read_gbps", gbps);
  report.Set("loaded_from", std::string(daemon.from_disk ? "disk" : "dram"));
  report.Set("compute_only_s", computed.ttft_s);
  report.Set("io_only_s", io.ttft_s);
  report.Set("cake_s", cake.ttft_s);
  report.Set("meeting_chunk", cake.meeting_chunk);
  report.Set("meeting_token", cake.meeting_chunk * chunk_tokens);
  report.Set("first_token", cake.first_token);
  report.SetRaw("bitexact", exact ? "true" : "false");
  CAKE_RETURN_IF_ERROR(report.WriteTo(options.json_path));
  if (!exact) return absl::DataLossError("a mode's KV cache or first token differed from full compute's");
  return absl::OkStatus();
}

}  // namespace cake::demo
