// cake-bench grid: the paper's evaluation grid. For every model, prompt length, compression, bandwidth and GPU
// utilisation: compute-only, I/O-only and Cake time to first token of one cached request, against a real caked,
// beside the oracle split computed offline from the same cost model.
//
// The engine is simulated (the Cake paper's cost model, docs/architecture.md; a vLLM-style step budget of which the
// request gets a share); storage is the paper's "simulated backend": each chunk is delayed by its size over the
// bandwidth. The daemon serves stand-in bytes from its DRAM tier behind its read throttle, scaled so each chunk takes
// exactly as long as the modelled KV chunk would: 1 KiB per token instead of the model's KV, the throttle set to
// bandwidth x (1 KiB / KV bytes per token) x time scale. Every duration is divided by --time-scale; reported times are
// multiplied back, so they read as the modelled hardware's seconds.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "bench/bench_command.h"
#include "bench/bench_common.h"
#include "bench/benchmarks.h"
#include "examples/simulated_engine/models.h"
#include "examples/simulated_engine/simulated_engine.h"
#include "examples/simulated_engine/simulated_storage.h"

namespace cake::bench {
namespace {

struct Cell {
  std::string model;
  uint32_t tokens = 0;
  uint32_t bits = 16;
  double bandwidth_gbps = 0;
  double util = 0;
  double gpu_tflops = 0;
  double compute_s = 0, io_s = 0, cake_s = 0, oracle_s = 0;
  uint32_t meet_token = 0;
  std::string strategy;
};

std::string SpeedupTable(const std::vector<Cell>& cells, const std::vector<double>& bandwidths,
                         const std::vector<double>& utils) {
  std::string out = "| bandwidth \\ util |";
  for (double u : utils) absl::StrAppend(&out, " ", absl::StrFormat("%g%%", 100 * u), " |");
  out += "\n| --- |";
  for (size_t i = 0; i < utils.size(); ++i) out += " --- |";
  out += "\n";
  for (double bw : bandwidths) {
    absl::StrAppend(&out, "| ", absl::StrFormat("%g Gbps", bw), " |");
    for (double u : utils) {
      auto it = std::find_if(cells.begin(), cells.end(),
                             [&](const Cell& c) { return c.bandwidth_gbps == bw && c.util == u; });
      if (it == cells.end()) {
        out += " |";
        continue;
      }
      absl::StrAppend(&out, " ", absl::StrFormat("%.2fx / %.2fx", it->io_s / it->cake_s, it->compute_s / it->cake_s),
                      " |");
    }
    out += "\n";
  }
  return out;
}

}  // namespace

absl::Status RunGridBench(const GridOptions& options) {
  if (!options.common.socket_path.empty()) {
    return absl::InvalidArgumentError("grid starts its own daemons (one per bandwidth): leave out --socket");
  }
  if (options.time_scale <= 0) return absl::InvalidArgumentError("--time-scale must be positive");
  if (options.gpu_tflops <= 0) return absl::InvalidArgumentError("--gpu-tflops must be positive");
  for (double u : options.utils) {
    if (!(u > 0 && u <= 1)) return absl::InvalidArgumentError(absl::StrCat("--utils: ", u, " is not in (0, 1]"));
  }
  for (double bw : options.bandwidths) {
    if (!(bw > 0)) return absl::InvalidArgumentError(absl::StrCat("--bandwidths: ", bw, " is not positive"));
  }
  for (uint32_t bits : options.bits) {
    if (bits == 0 || bits > 16) return absl::InvalidArgumentError(absl::StrCat("--bits: ", bits, " is not 1 to 16"));
  }
  std::vector<const sim::ModelSpec*> models;
  for (const std::string& name : options.models) {
    const sim::ModelSpec* model = sim::FindModel(name);
    if (model == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown model ", name));
    models.push_back(model);
  }
  for (uint32_t tokens : options.tokens) {
    if (tokens == 0 || tokens % options.chunk_tokens != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tokens ", tokens, " is not a positive multiple of the chunk (", options.chunk_tokens, ")"));
    }
  }

  std::vector<Cell> cells;
  std::string tables;
  for (const sim::ModelSpec* model : models) {
    sim::PrefillCostModel cost{model->params, static_cast<double>(model->layers), static_cast<double>(model->hidden),
                               options.gpu_tflops * 1e12};
    for (uint32_t bits : options.bits) {
      const double kv_bytes_per_token = sim::KvBytesPerToken(*model) * bits / 16;
      const NamespaceSpec ns =
          sim::ProxyNamespace(absl::StrCat("grid-", model->name, "-", bits, "bit"), options.chunk_tokens);
      for (uint32_t tokens : options.tokens) {
        const uint32_t chunks = tokens / options.chunk_tokens;
        const uint64_t proxy_bytes = static_cast<uint64_t>(tokens * sim::kProxyBytesPerToken);
        const std::vector<uint32_t> prompt = SyntheticPrompt(tokens, 11);
        std::vector<Cell> group;
        for (double bw : options.bandwidths) {
          CAKE_ASSIGN_OR_RETURN(auto target, OpenDaemon("", sim::SimulatedDiskArgs(bw, kv_bytes_per_token,
                                                                                   options.time_scale, proxy_bytes)));
          Client& client = *target.client;
          CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(proxy_bytes));
          absl::Cleanup release_region = [&] { client.ReleaseRegion(region).IgnoreError(); };
          const uint64_t chunk_bytes = proxy_bytes / chunks;
          for (uint32_t c = 0; c < chunks; ++c) FillChunkPattern({region.data() + c * chunk_bytes, chunk_bytes}, c);
          CAKE_RETURN_IF_ERROR(client.Store(ns, TokensPrompt(prompt), 0, chunks, region, 0).status());
          LoadOptions load;
          load.ns = ns;
          load.prompt = TokensPrompt(prompt);
          load.region = &region;
          // Untimed: teaches the daemon the tier's speed, as earlier requests would have.
          CAKE_RETURN_IF_ERROR(TimedIoOnlyLoad(client, load, chunks, chunk_bytes).status());
          const double chunk_load_s = options.chunk_tokens * kv_bytes_per_token * 8 / (bw * 1e9);
          for (double u : options.utils) {
            sim::GridEngine engine(cost, u, options.step_tokens, options.chunk_tokens, tokens, options.time_scale);
            Cell cell;
            cell.model = model->name;
            cell.tokens = tokens;
            cell.bits = bits;
            cell.bandwidth_gbps = bw;
            cell.util = u;
            cell.gpu_tflops = options.gpu_tflops;
            // I/O-only and Cake back to back, so both find the daemon equally warm; compute-only needs no daemon.
            std::vector<double> io_runs, cake_runs;
            std::vector<sim::CakeRun> cakes;
            for (uint32_t r = 0; r < options.repeats; ++r) {
              CAKE_ASSIGN_OR_RETURN(auto io, TimedIoOnlyLoad(client, load, chunks, chunk_bytes));
              io_runs.push_back(io * options.time_scale);
              CAKE_ASSIGN_OR_RETURN(auto cake, sim::TimedCake(client, load, engine, tokens, options.chunk_tokens));
              cakes.push_back(cake);
            }
            std::sort(cakes.begin(), cakes.end(),
                      [](const sim::CakeRun& a, const sim::CakeRun& b) { return a.seconds < b.seconds; });
            const sim::CakeRun& cake = cakes[cakes.size() / 2];
            cell.io_s = Median(io_runs);
            CAKE_ASSIGN_OR_RETURN(auto computed, sim::TimedComputeOnly(engine, tokens));
            cell.compute_s = computed * options.time_scale;
            cell.cake_s = cake.seconds * options.time_scale;
            cell.meet_token = cake.meeting_chunk * options.chunk_tokens;
            cell.strategy = cake.strategy;
            cell.oracle_s = sim::OracleSeconds(engine, options.time_scale, chunks, options.chunk_tokens, chunk_load_s);
            std::printf(
                "  %s %u tokens %u-bit, %g Gbps, util %g: compute %.3f s, io %.3f s, cake %.3f s (%s, meets at "
                "token %u), oracle %.3f s\n",
                cell.model.c_str(), tokens, bits, bw, u, cell.compute_s, cell.io_s, cell.cake_s, cell.strategy.c_str(),
                cell.meet_token, cell.oracle_s);
            std::fflush(stdout);
            group.push_back(cell);
          }
        }
        absl::StrAppend(&tables, "\n", model->name, ", ", tokens, " tokens, ", bits,
                        "-bit KV: Cake's speedup over I/O-only / over compute-only\n\n",
                        SpeedupTable(group, options.bandwidths, options.utils));
        cells.insert(cells.end(), group.begin(), group.end());
      }
    }
  }

  // The goals: Cake within 5% of the oracle, never more than 2% above the better baseline.
  double worst_oracle = 0, worst_baseline = 0;
  for (const Cell& c : cells) {
    worst_oracle = std::max(worst_oracle, c.cake_s / c.oracle_s);
    worst_baseline = std::max(worst_baseline, c.cake_s / std::min(c.compute_s, c.io_s));
  }
  std::printf(
      "cake-bench grid: %zu cells, time scale %g, step budget %u tokens, I/O chunk %u tokens, F = %g TFLOP/s, median "
      "of %u I/O-only and Cake runs per cell\n",
      cells.size(), options.time_scale, options.step_tokens, options.chunk_tokens, options.gpu_tflops, options.repeats);
  std::printf("%s\n", tables.c_str());
  std::printf("  worst cell: Cake / oracle = %.3f (goal <= 1.05), Cake / better baseline = %.3f (goal <= 1.02)\n",
              worst_oracle, worst_baseline);

  JsonReport report;
  report.Set("cells", static_cast<double>(cells.size()));
  report.Set("time_scale", options.time_scale);
  report.Set("step_tokens", options.step_tokens);
  report.Set("chunk_tokens", options.chunk_tokens);
  report.Set("repeats", options.repeats);
  report.Set("worst_cake_over_oracle", worst_oracle);
  report.Set("worst_cake_over_best_baseline", worst_baseline);
  std::vector<std::string> rows;
  for (const Cell& c : cells) {
    JsonReport row;
    row.Set("model", c.model);
    row.Set("tokens", c.tokens);
    row.Set("bits", c.bits);
    row.Set("bandwidth_gbps", c.bandwidth_gbps);
    row.Set("util", c.util);
    row.Set("gpu_tflops", c.gpu_tflops);
    row.Set("ttft_compute_s", c.compute_s);
    row.Set("ttft_io_s", c.io_s);
    row.Set("ttft_cake_s", c.cake_s);
    row.Set("ttft_oracle_s", c.oracle_s);
    row.Set("meet_token", c.meet_token);
    row.Set("strategy", c.strategy);
    rows.push_back(row.ToString());
  }
  report.SetRaw("rows", "[" + absl::StrJoin(rows, ",\n") + "]");
  return report.WriteTo(options.common.json_path);
}

void AddGridCommand(CLI::App& app) {
  auto options = std::make_shared<GridOptions>();
  CLI::App* command = app.add_subcommand(
      "grid", "the paper's grid: compute-only, I/O-only, Cake and the oracle per bandwidth and utilisation");
  AddCommonOptions(command, options->common);
  command->add_option("--model", options->models, "longalpaca-7b, longalpaca-13b, llama3.1-8b, llama3.1-70b")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--tokens", options->tokens, "prompt lengths, multiples of the I/O chunk")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--bits", options->bits, "KV bits per value (16, 8, 3: compression)")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--bandwidths", options->bandwidths, "storage bandwidths, Gbit/s")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--utils", options->utils, "shares of the step budget the request gets")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--gpu-tflops", options->gpu_tflops, "effective prefill TFLOP/s of the GPU (F)")
      ->capture_default_str();
  command->add_option("--time-scale", options->time_scale, "divide every duration by this")->capture_default_str();
  command->add_option("--chunk-tokens", options->chunk_tokens, "I/O chunk, tokens")
      ->capture_default_str()
      ->check(CLI::Range(16u, 4096u));
  command->add_option("--step-tokens", options->step_tokens, "engine step budget, tokens")
      ->capture_default_str()
      ->check(CLI::Range(16u, 65536u));
  command->add_option("--repeats", options->repeats, "I/O-only and Cake runs per cell, the median reported")
      ->capture_default_str()
      ->check(CLI::Range(1u, 99u));
  RunWhenParsed(command, options, RunGridBench);
}

}  // namespace cake::bench
