// The real engine's benches: the CPU transformer (examples/cpu_engine) prefills a prompt against a real caked whose
// disk tier holds the prompt's KV cache behind a read throttle (the harness they share with cake-demo --engine real
// is examples/cpu_engine/engine_harness.h).
//   cake-bench engine: per prompt length and throttle, measured TTFT of compute-only, I/O-only, Cake and every
//     forced split, the planner's predicted meeting beside the measured one, every run checked bit-exact.
//   cake-bench engine-curve: compute time per chunk against chunk index for two model sizes, with the linear fit
//     the planner assumes.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "bench/bench_command.h"
#include "bench/bench_common.h"
#include "bench/benchmarks.h"
#include "examples/cpu_engine/engine_harness.h"
#include "examples/cpu_engine/prefill_engine.h"
#include "examples/cpu_engine/transformer.h"

namespace cake::bench {
namespace {

using engine::BitExact;
using engine::ComputeTruth;
using engine::Describe;
using engine::FitFullChunks;
using engine::LinearFit;
using engine::PrefillEngine;
using engine::PrefillMode;
using engine::PrefillResult;
using engine::PromptTokens;
using engine::RunCold;
using engine::StoreAndSettle;
using engine::ToConfig;

// A plot legend's name for a model: its size and attention.
std::string ShortName(const engine::ModelOptions& m) {
  return absl::StrFormat("hidden %u, %u layers, %u/%u heads", m.shape.hidden, m.shape.layers, m.shape.heads,
                         m.shape.kv_heads);
}

struct EngineRow {
  uint32_t tokens = 0;
  double throttle_gbps = 0;
  double compute_s = 0, io_s = 0, cake_s = 0, best_forced_s = 0;
  uint32_t best_forced_token = 0;
  std::optional<uint32_t> meet_predicted;
  uint32_t meet_measured = 0;
  uint32_t engine_stopped = 0;  // chunks the Cake engine computed
  std::string strategy;
  bool bitexact = true;
};

}  // namespace

absl::Status RunEngineBench(const EngineBenchOptions& options) {
  CAKE_ASSIGN_OR_RETURN(auto config, ToConfig(options.model));
  for (double r : options.load_ratios) {
    if (!(r > 0)) return absl::InvalidArgumentError(absl::StrCat("--load-ratios: ", r, " is not positive"));
  }
  for (double g : options.throttles_gbps) {
    if (!(g > 0)) return absl::InvalidArgumentError(absl::StrCat("--throttles: ", g, " is not positive"));
  }
  StoredPrecision stored_precision = StoredPrecision::kExact;
  if (options.stored_precision == "int8") {
    stored_precision = StoredPrecision::kInt8;
  } else if (options.stored_precision == "int4") {
    stored_precision = StoredPrecision::kInt4;
  } else if (options.stored_precision != "exact") {
    return absl::InvalidArgumentError("--stored-precision is exact, int8 or int4");
  }
  // A lossy namespace's loads from disk are approximations: runs that load are then held to the first token
  // (the same as compute-only's), not to every KV byte.
  const bool lossy = stored_precision != StoredPrecision::kExact;
  auto matches = [&](const PrefillEngine& e, const PrefillResult& run, const engine::Truth& truth) {
    return lossy ? run.first_token == truth.run.first_token : BitExact(e, run, truth);
  };
  engine::SetBlasThreads(static_cast<int>(options.model.blas_threads));
  engine::Transformer model(config);
  const uint32_t chunk_tokens = options.model.chunk_tokens;
  std::printf("cake-bench engine: %s; %u BLAS thread(s)\n", Describe(config, chunk_tokens).c_str(),
              options.model.blas_threads);

  std::vector<EngineRow> rows;
  std::vector<std::string> fits;
  for (uint32_t tokens : options.tokens) {
    if (tokens < chunk_tokens) {
      return absl::InvalidArgumentError(absl::StrCat("--tokens ", tokens, " is shorter than one chunk"));
    }
    const std::vector<uint32_t> prompt = *PromptTokens("", tokens, config.vocab);
    const uint64_t pages_bytes = model.PageBytes(chunk_tokens) * ((tokens + chunk_tokens - 1) / chunk_tokens);
    CAKE_ASSIGN_OR_RETURN(
        auto daemon, engine::OpenEngineDaemon(options.common.socket_path, pages_bytes, kClientId, options.disk_codec));
    Client& client = *daemon.target.client;
    CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(pages_bytes));
    absl::Cleanup release_region = [&] { client.ReleaseRegion(region).IgnoreError(); };
    PrefillEngine engine(model, chunk_tokens, prompt, &client, region, stored_precision);
    CAKE_ASSIGN_OR_RETURN(auto truth, ComputeTruth(engine));
    const LinearFit fit = FitFullChunks(engine, truth.run);
    engine.SetComputeHint(fit.first_s, fit.growth_s);
    fits.push_back(absl::StrFormat(
        "  %u tokens: compute %.3f s; per chunk %.2f ms + %.3f ms x index (R^2 %.3f, worst chunk %.0f%% off the "
        "fit)",
        tokens, truth.run.ttft_s, fit.first_s * 1e3, fit.growth_s * 1e3, fit.r_squared, 100 * fit.max_relative_error));
    std::printf("%s\n", fits.back().c_str());
    CAKE_RETURN_IF_ERROR(StoreAndSettle(daemon, engine));

    const uint64_t stored_bytes = uint64_t{engine.full_chunks()} * engine.page_bytes();
    std::vector<double> throttles = options.throttles_gbps;
    if (throttles.empty()) {
      for (double r : options.load_ratios) throttles.push_back(stored_bytes * 8.0 / (r * truth.run.ttft_s) / 1e9);
    }
    for (double gbps : throttles) {
      CAKE_RETURN_IF_ERROR(client.SetReadCap(daemon.capped_tier(), gbps).status());
      EngineRow row;
      row.tokens = tokens;
      row.throttle_gbps = gbps;
      // Untimed: teaches the daemon the throttled tier's speed, as earlier requests would have.
      CAKE_RETURN_IF_ERROR(RunCold(daemon, engine, PrefillMode::kIoOnly).status());
      CAKE_ASSIGN_OR_RETURN(auto computed, RunCold(daemon, engine, PrefillMode::kComputeOnly));
      row.compute_s = computed.ttft_s;
      row.bitexact &= BitExact(engine, computed, truth);
      // The hint is the engine's latest measured speed, as a serving engine would know it.
      const LinearFit latest = FitFullChunks(engine, computed);
      engine.SetComputeHint(latest.first_s, latest.growth_s);
      CAKE_ASSIGN_OR_RETURN(auto io, RunCold(daemon, engine, PrefillMode::kIoOnly));
      row.io_s = io.ttft_s;
      row.bitexact &= matches(engine, io, truth);
      CAKE_ASSIGN_OR_RETURN(auto cake, RunCold(daemon, engine, PrefillMode::kCake));
      row.cake_s = cake.ttft_s;
      row.meet_measured = cake.meeting_chunk * chunk_tokens;
      if (cake.predicted_meeting_chunk) row.meet_predicted = *cake.predicted_meeting_chunk * chunk_tokens;
      row.engine_stopped = cake.computed_chunks;
      row.strategy = cake.strategy;
      row.bitexact &= matches(engine, cake, truth);
      row.best_forced_s = std::numeric_limits<double>::infinity();
      const uint32_t cached = engine.full_chunks();
      std::string sweep;
      for (uint32_t m = 0;; m = std::min(cached, m + options.sweep_step)) {
        CAKE_ASSIGN_OR_RETURN(auto forced, RunCold(daemon, engine, PrefillMode::kFixedSplit, m));
        row.bitexact &= matches(engine, forced, truth);
        absl::StrAppend(&sweep, sweep.empty() ? "" : ", ", m * chunk_tokens, ": ",
                        absl::StrFormat("%.3f", forced.ttft_s));
        if (forced.ttft_s < row.best_forced_s) {
          row.best_forced_s = forced.ttft_s;
          row.best_forced_token = m * chunk_tokens;
        }
        if (m == cached) break;
      }
      std::printf(
          "  %u tokens, %.3g Gbit/s: compute %.3f s, I/O %.3f s, Cake %.3f s (%s, met at token %u, predicted %s), "
          "best forced %.3f s (token %u), %s %s\n",
          tokens, gbps, row.compute_s, row.io_s, row.cake_s, row.strategy.c_str(), row.meet_measured,
          row.meet_predicted ? absl::StrCat(*row.meet_predicted).c_str() : "-", row.best_forced_s,
          row.best_forced_token, lossy ? "first token as compute-only's" : "bit-exact", row.bitexact ? "yes" : "NO");
      std::printf("    forced splits (meeting token: TTFT s): %s\n", sweep.c_str());
      std::fflush(stdout);
      rows.push_back(row);
    }
    CAKE_RETURN_IF_ERROR(client.ReleaseRegion(region));
    std::move(release_region).Cancel();
  }

  double worst = 0;
  bool all_exact = true;
  std::printf(
      "\n| tokens | throttle Gbit/s | compute-only s | I/O-only s | Cake s | best forced split s (at token) | Cake / "
      "best forced | meeting predicted / measured | %s |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- "
      "|\n",
      lossy ? "first token as compute-only's" : "bit-exact");
  std::vector<std::string> json_rows;
  for (const EngineRow& r : rows) {
    worst = std::max(worst, r.cake_s / r.best_forced_s);
    all_exact &= r.bitexact;
    std::printf("| %u | %.3g | %.3f | %.3f | %.3f | %.3f (%u) | %.3f | %s / %u | %s |\n", r.tokens, r.throttle_gbps,
                r.compute_s, r.io_s, r.cake_s, r.best_forced_s, r.best_forced_token, r.cake_s / r.best_forced_s,
                r.meet_predicted ? absl::StrCat(*r.meet_predicted).c_str() : "-", r.meet_measured,
                r.bitexact ? "yes" : "NO");
    JsonReport row;
    row.Set("tokens", r.tokens);
    row.Set("throttle_gbps", r.throttle_gbps);
    row.Set("ttft_compute_s", r.compute_s);
    row.Set("ttft_io_s", r.io_s);
    row.Set("ttft_cake_s", r.cake_s);
    row.Set("ttft_best_forced_s", r.best_forced_s);
    row.Set("best_forced_token", r.best_forced_token);
    row.Set("meet_predicted",
            r.meet_predicted ? static_cast<double>(*r.meet_predicted) : std::numeric_limits<double>::quiet_NaN());
    row.Set("meet_measured", r.meet_measured);
    row.Set("strategy", r.strategy);
    row.SetRaw("bitexact", r.bitexact ? "true" : "false");
    json_rows.push_back(row.ToString());
  }
  std::printf("\n  worst Cake / best forced split = %.3f (goal <= 1.10); every run %s: %s\n", worst,
              lossy ? "gave compute-only's first token" : "bit-exact", all_exact ? "yes" : "NO");
  JsonReport report;
  report.Set("model", Describe(config, chunk_tokens));
  report.Set("blas_threads", options.model.blas_threads);
  report.Set("worst_cake_over_best_forced", worst);
  report.SetRaw("all_bitexact", all_exact ? "true" : "false");
  report.SetRaw("rows", "[" + absl::StrJoin(json_rows, ",\n") + "]");
  CAKE_RETURN_IF_ERROR(report.WriteTo(options.common.json_path));
  if (!all_exact) return absl::DataLossError("a run's KV cache or first token differed from full compute's");
  return absl::OkStatus();
}

void AddEngineCommand(CLI::App& app) {
  auto options = std::make_shared<EngineBenchOptions>();
  CLI::App* command = app.add_subcommand(
      "engine", "the CPU transformer against caked: compute-only, I/O-only, Cake and every forced split, bit-exact");
  AddCommonOptions(command, options->common);
  engine::AddModelOptions(command, options->model);
  command->add_option("--tokens", options->tokens, "prompt lengths")->delimiter(',')->capture_default_str();
  command
      ->add_option("--load-ratios", options->load_ratios,
                   "read throttles, as load-everything time over compute-everything time")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--throttles", options->throttles_gbps, "read throttles in Gbit/s (replace the ratios)")
      ->delimiter(',');
  command->add_option("--sweep-step", options->sweep_step, "forced meeting points every N chunks")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100000u));
  command
      ->add_option("--disk-codec", options->disk_codec,
                   "the private daemon's disk.codec (planes-zstd: stored "
                   "encoded; the throttle then caps encoded bytes)")
      ->capture_default_str();
  command
      ->add_option("--stored-precision", options->stored_precision,
                   "the engine's namespace stored as exact, int8 or int4 on disk (lossy: runs that load are held to "
                   "compute-only's first token, not every KV byte)")
      ->capture_default_str();
  RunWhenParsed(command, options, RunEngineBench);
}

absl::Status RunEngineCurveBench(const EngineCurveOptions& options) {
  engine::SetBlasThreads(static_cast<int>(options.small.blas_threads));
  struct Curve {
    std::string name;
    std::vector<double> seconds;
    LinearFit fit;
  };
  std::vector<Curve> curves;
  for (const auto& [name, m] : {std::pair{"small", options.small}, std::pair{"large", options.large}}) {
    CAKE_ASSIGN_OR_RETURN(auto config, ToConfig(m));
    engine::Transformer model(config);
    const uint32_t chunk_tokens = options.small.chunk_tokens;
    const uint32_t chunks = options.tokens / chunk_tokens;
    if (chunks == 0) return absl::InvalidArgumentError("--tokens is shorter than one chunk");
    std::vector<uint32_t> prompt = *PromptTokens("", chunks * chunk_tokens, config.vocab);
    std::vector<std::byte> buffer(model.PageBytes(chunk_tokens) * chunks);
    engine::KvPages pages{buffer.data(), {}};
    for (uint32_t c = 0; c < chunks; ++c) pages.offsets.push_back(c * model.PageBytes(chunk_tokens));
    // One untimed pass first: the pages' first touch and the BLAS's buffers.
    for (uint32_t c = 0; c < chunks; ++c) model.PrefillChunk(prompt, c, chunk_tokens, pages);
    Curve curve{absl::StrCat(name, ": ", Describe(config, chunk_tokens)), {}, {}};
    for (uint32_t c = 0; c < chunks; ++c) {
      const Clock::time_point start = Clock::now();
      model.PrefillChunk(prompt, c, chunk_tokens, pages);
      curve.seconds.push_back(SecondsSince(start));
    }
    curve.fit = engine::FitChunkTimes(curve.seconds);
    std::printf(
        "cake-bench engine-curve: %s, %u tokens\n  per chunk %.2f ms + %.3f ms x index; R^2 %.4f; worst chunk "
        "%.1f%% off the fit; chunk 0 %.2f ms, last %.2f ms\n",
        curve.name.c_str(), chunks * chunk_tokens, curve.fit.first_s * 1e3, curve.fit.growth_s * 1e3,
        curve.fit.r_squared, 100 * curve.fit.max_relative_error, curve.seconds.front() * 1e3,
        curve.seconds.back() * 1e3);
    curves.push_back(std::move(curve));
  }
  const std::string csv = options.out_prefix + ".csv";
  {
    std::ofstream out(csv);
    out << "chunk,small_s,small_fit_s,large_s,large_fit_s\n";
    for (size_t i = 0; i < curves[0].seconds.size(); ++i) {
      out << i;
      for (const Curve& c : curves) out << "," << c.seconds[i] << "," << c.fit.first_s + c.fit.growth_s * i;
      out << "\n";
    }
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", csv));
  }
  const std::string png = options.out_prefix + ".png";
  const std::string script = absl::StrCat(
      "set terminal pngcairo size 900,500 noenhanced; set output '", png, "'; set datafile separator ',';",
      "set key top left; set xlabel 'chunk index (", options.small.chunk_tokens, " tokens each)'; set ylabel 'ms';",
      "set title 'CPU transformer: measured prefill time per chunk, and the linear fit';", "plot '", csv,
      "' every ::1 using 1:(column(2)*1000) with points pt 7 ps 0.6 title '", ShortName(options.small), "', '", csv,
      "' every ::1 using 1:(column(3)*1000) with lines lw 2 title 'fit', '", csv,
      "' every ::1 using 1:(column(4)*1000) with points pt 5 ps 0.6 title '", ShortName(options.large), "', '", csv,
      "' every ::1 using 1:(column(5)*1000) with lines lw 2 title 'fit'");
  const bool plotted =
      std::system(absl::StrCat("command -v gnuplot >/dev/null && gnuplot -e \"", script, "\" 2>/dev/null").c_str()) ==
      0;
  std::printf("  curves in %s%s\n", csv.c_str(), plotted ? absl::StrCat(", plot in ", png).c_str() : " (no gnuplot)");
  JsonReport report;
  for (const Curve& c : curves) {
    const std::string key = c.name.substr(0, c.name.find(':'));
    report.Set(key + "_model", c.name);
    report.Set(key + "_first_chunk_s", c.fit.first_s);
    report.Set(key + "_growth_s", c.fit.growth_s);
    report.Set(key + "_r_squared", c.fit.r_squared);
    report.Set(key + "_max_relative_error", c.fit.max_relative_error);
  }
  return report.WriteTo(options.common.json_path);
}

void AddEngineCurveCommand(CLI::App& app) {
  auto options = std::make_shared<EngineCurveOptions>();
  CLI::App* command = app.add_subcommand(
      "engine-curve", "the CPU transformer's measured compute time per chunk against chunk index, two model sizes");
  AddCommonOptions(command, options->common);
  engine::AddModelOptions(command, options->small);
  engine::AddModelOptions(command, options->large, "large-");
  command->add_option("--tokens", options->tokens, "prompt length")->capture_default_str();
  command->add_option("--out", options->out_prefix, "writes PREFIX.csv and PREFIX.png")->capture_default_str();
  RunWhenParsed(command, options, RunEngineCurveBench);
}

}  // namespace cake::bench
