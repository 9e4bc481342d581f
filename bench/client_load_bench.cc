// cake-bench client-load: timed I/O-only loads, by the C++ client, of a prompt another client stored, into a
// host region of its own. The Python client's bench (python3 -m cake_bench.client_load) runs it between its own
// loads of the same prompt on the same daemon, so both clients are measured in one run against the same limit.
#include <cstdio>
#include <fstream>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "bench/bench_command.h"
#include "bench/bench_common.h"
#include "bench/benchmarks.h"

namespace cake::bench {

absl::Status RunClientLoadBench(const ClientLoadBenchOptions& options) {
  if (options.common.socket_path.empty()) return absl::InvalidArgumentError("--socket is required");
  std::ifstream in(options.tokens_file, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read --tokens-file ", options.tokens_file));
  std::vector<uint32_t> tokens;
  for (uint32_t t; in.read(reinterpret_cast<char*>(&t), sizeof(t));) tokens.push_back(t);  // little-endian host
  NamespaceSpec ns;
  ns.model_id = options.model_id;
  ns.num_layers = options.layers;
  ns.num_kv_heads = options.kv_heads;
  ns.head_dim = options.head_dim;
  ns.dtype = DType::kFp32;
  ns.chunk_tokens = options.chunk_tokens;
  CAKE_ASSIGN_OR_RETURN(auto layout, Namespace::Create(ns));
  const uint32_t chunks = static_cast<uint32_t>(tokens.size() / ns.chunk_tokens);
  if (chunks == 0) return absl::InvalidArgumentError("the prompt holds no full chunk");
  CAKE_ASSIGN_OR_RETURN(auto target, OpenDaemon(options.common.socket_path, {}));
  Client& client = *target.client;
  CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(uint64_t{chunks} * layout.chunk_bytes()));
  absl::Cleanup release_region = [&] { client.ReleaseRegion(region).IgnoreError(); };

  std::vector<double> seconds;
  for (uint32_t run = 0; run <= options.runs; ++run) {  // run 0 warms the channel up
    LoadOptions load;
    load.ns = ns;
    load.prompt = TokensPrompt(tokens);
    load.region = &region;
    load.io_only = true;
    const Clock::time_point start = Clock::now();
    CAKE_ASSIGN_OR_RETURN(auto session, client.StartLoad(load));
    auto done = session->WaitDone();
    const double elapsed = SecondsSince(start);
    if (!done.ok()) return done.status();
    if (done->loaded_chunks != chunks) {
      return absl::InternalError(absl::StrCat("loaded ", done->loaded_chunks, " of ", chunks, " cached chunks"));
    }
    CAKE_RETURN_IF_ERROR(session->Release());
    if (run > 0) seconds.push_back(elapsed);
  }
  std::printf("cake-bench client-load: %u chunks of %llu bytes, %u runs, median %.6f s\n", chunks,
              static_cast<unsigned long long>(layout.chunk_bytes()), options.runs, Median(seconds));
  JsonReport report;
  report.SetRaw("seconds", absl::StrCat("[", absl::StrJoin(seconds, ","), "]"));
  report.Set("chunks", chunks);
  report.Set("chunk_bytes", static_cast<double>(layout.chunk_bytes()));
  return report.WriteTo(options.common.json_path);
}

void AddClientLoadCommand(CLI::App& app) {
  auto options = std::make_shared<ClientLoadBenchOptions>();
  CLI::App* command = app.add_subcommand(
      "client-load",
      "timed I/O-only loads by the C++ client of a stored fp32 prompt (for python3 -m cake_bench.client_load)");
  AddCommonOptions(command, options->common);
  command->add_option("--tokens-file", options->tokens_file, "the prompt, u32 little-endian")->required();
  command->add_option("--model-id", options->model_id, "the namespace's model id")->required();
  command->add_option("--layers", options->layers, "namespace layers")->required();
  command->add_option("--kv-heads", options->kv_heads, "namespace KV heads")->required();
  command->add_option("--head-dim", options->head_dim, "namespace head dimension")->required();
  command->add_option("--chunk-tokens", options->chunk_tokens, "tokens per chunk")->required();
  command->add_option("--runs", options->runs, "measured loads (after one warm-up)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 10000u));
  RunWhenParsed(command, options, RunClientLoadBench);
}

}  // namespace cake::bench
