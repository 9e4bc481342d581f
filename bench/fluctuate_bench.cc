// cake-bench fluctuate: one Cake load while both resources change under it. The engine's budget for the request
// is drawn anew every step (0 to --max-budget tokens of a 512-token step), and the disk's bandwidth every
// --interval-ms (0.1 to --max-gbps Gbit/s, set through AdminService.SetReadCap). Both cursors, the engine's
// going forward and the loader's going backward, are sampled over time into a CSV and, when gnuplot is
// installed, a PNG: they meet wherever the resources let them, with no plan to follow.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "bench/bench_command.h"
#include "bench/bench_common.h"
#include "bench/benchmarks.h"
#include "examples/simulated_engine/models.h"
#include "examples/simulated_engine/simulated_storage.h"

namespace cake::bench {
namespace {

constexpr uint32_t kChunkTokens = 128;

struct Sample {
  double t_s;
  uint32_t engine_tokens;
  uint32_t loaded_from_token;
  double gbps;
  uint32_t budget;
};

}  // namespace

absl::Status RunFluctuateBench(const FluctuateOptions& options) {
  if (!options.common.socket_path.empty()) {
    return absl::InvalidArgumentError("fluctuate starts its own daemon: leave out --socket");
  }
  const sim::ModelSpec* model = sim::FindModel(options.model);
  if (model == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown --model ", options.model));
  if (options.tokens == 0 || options.tokens % kChunkTokens != 0) {
    return absl::InvalidArgumentError("--tokens must be a positive multiple of 128");
  }
  if (options.max_gbps <= 0.1 || options.time_scale <= 0 || options.interval_ms <= 0) {
    return absl::InvalidArgumentError("--max-gbps must exceed 0.1; --time-scale and --interval-ms be positive");
  }
  const uint32_t chunks = options.tokens / kChunkTokens;
  const double kv = sim::KvBytesPerToken(*model);
  const double scale_gbps = sim::SimulatedCapGbps(1, kv, options.time_scale);  // modelled Gbit/s -> daemon cap
  // Balanced on average: the whole prompt at half the budget computes as long as it loads at half the bandwidth.
  sim::PrefillCostModel cost{model->params, static_cast<double>(model->layers), static_cast<double>(model->hidden), 0};
  const double mean_load_s = options.tokens * kv * 8 / (options.max_gbps / 2 * 1e9);
  cost.flops = options.gpu_tflops > 0 ? options.gpu_tflops * 1e12
                                      : cost.Flop(options.tokens) / mean_load_s * (512.0 / (options.max_budget / 2.0));

  const NamespaceSpec ns = sim::ProxyNamespace(absl::StrCat("fluctuate-", model->name), kChunkTokens);
  const uint64_t chunk_bytes = static_cast<uint64_t>(kChunkTokens * sim::kProxyBytesPerToken);
  const uint64_t bytes = uint64_t{chunks} * chunk_bytes;
  std::mt19937 rng(options.seed);
  std::uniform_real_distribution<double> gbps_of(0.1, options.max_gbps);
  std::uniform_int_distribution<uint32_t> budget_of(0, options.max_budget);
  const double first_gbps = gbps_of(rng);

  CAKE_ASSIGN_OR_RETURN(auto target, OpenDaemon("", sim::SimulatedDiskArgs(first_gbps, kv, options.time_scale, bytes)));
  Client& client = *target.client;
  CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(bytes));
  absl::Cleanup release_region = [&] { client.ReleaseRegion(region).IgnoreError(); };
  const std::vector<uint32_t> prompt = SyntheticPrompt(options.tokens, 31);
  for (uint32_t c = 0; c < chunks; ++c) FillChunkPattern({region.data() + c * chunk_bytes, chunk_bytes}, c);
  CAKE_RETURN_IF_ERROR(client.Store(ns, TokensPrompt(prompt), 0, chunks, region, 0).status());
  std::memset(region.data(), 0, bytes);

  LoadOptions load;
  load.ns = ns;
  load.prompt = TokensPrompt(prompt);
  load.region = &region;
  std::mutex mu;
  std::vector<Sample> samples;
  std::atomic<double> current_gbps{first_gbps};
  std::atomic<uint32_t> current_budget{0};
  std::atomic<uint32_t> engine_tokens{0};
  std::atomic<bool> finished{false};

  const Clock::time_point start = Clock::now();
  CAKE_ASSIGN_OR_RETURN(auto started, client.StartLoad(load));
  LoadSession& session = *started;
  absl::Cleanup release = [&] { session.Release().IgnoreError(); };
  auto sample = [&] {
    std::lock_guard lock(mu);
    samples.push_back(Sample{SecondsSince(start) * options.time_scale, engine_tokens.load(),
                             session.LoadedLow() * kChunkTokens, current_gbps.load(), current_budget.load()});
  };
  // The disk's bandwidth changes every interval (modelled time), and both cursors are sampled every millisecond.
  std::thread weather([&] {
    const auto interval = std::chrono::duration<double>(options.interval_ms / 1e3 / options.time_scale);
    auto next = Clock::now() + std::chrono::duration_cast<Clock::duration>(interval);
    std::mt19937 weather_rng(options.seed + 1);
    while (!finished) {
      sample();
      if (Clock::now() >= next) {
        const double gbps = gbps_of(weather_rng);
        if (client.SetReadCap(TierKind::kDram, gbps * scale_gbps).ok()) current_gbps = gbps;
        next += std::chrono::duration_cast<Clock::duration>(interval);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  absl::Cleanup stop_weather = [&] {
    finished = true;
    weather.join();
  };

  // The engine: every step the request gets a fresh share of the 512-token budget; it stops at the first chunk
  // boundary whose chunk is loaded.
  Clock::time_point gpu_free = start;
  uint32_t done = 0;
  while (done < options.tokens && !(done % kChunkTokens == 0 && session.IsResident(done / kChunkTokens))) {
    const uint32_t budget = budget_of(rng);
    current_budget = budget;
    // A step costs what 512 tokens at this position cost, whatever share of it the request got.
    gpu_free += std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>((cost.Flop(done + 512.0) - cost.Flop(done)) / cost.flops / options.time_scale));
    PreciseSleepUntil(gpu_free);
    uint32_t next = std::min(options.tokens, done + budget);
    const uint32_t boundary = (done / kChunkTokens + 1) * kChunkTokens;
    if (next > boundary && boundary < options.tokens && session.IsResident(boundary / kChunkTokens)) next = boundary;
    done = next;
    engine_tokens = done;
    CAKE_RETURN_IF_ERROR(session.ReportProgress(done / kChunkTokens));
  }
  auto load_done = session.WaitDone();
  const double ttft_s = SecondsSince(start) * options.time_scale;
  if (!load_done.ok()) return load_done.status();
  sample();
  std::move(stop_weather).Invoke();
  for (uint32_t c = load_done->meeting_chunk; c < chunks; ++c) {
    CAKE_RETURN_IF_ERROR(CheckChunkPattern({region.data() + session.RegionOffset(c), chunk_bytes}, c));
  }
  std::move(release).Cancel();
  CAKE_RETURN_IF_ERROR(session.Release());

  const std::string csv = options.out_prefix + ".csv";
  {
    std::ofstream out(csv);
    out << "t_s,engine_tokens,loaded_from_token,gbps,budget\n";
    for (const Sample& s : samples) {
      out << s.t_s << "," << s.engine_tokens << "," << s.loaded_from_token << "," << s.gbps << "," << s.budget << "\n";
    }
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", csv));
  }
  const std::string png = options.out_prefix + ".png";
  const std::string script = absl::StrCat(
      "set terminal pngcairo size 900,600 noenhanced; set output '", png, "'; set datafile separator ',';",
      "set multiplot layout 2,1; set key top left; set ylabel 'token'; set xlabel 'time (s)';",
      "set title 'cake-bench fluctuate: ", model->name, ", ", options.tokens, " tokens, meeting at token ",
      load_done->meeting_chunk * kChunkTokens, ", TTFT ", absl::StrFormat("%.3f", ttft_s), " s';", "plot '", csv,
      "' every ::1 using 1:2 with lines lw 2 title 'engine (computed up to)', '", csv,
      "' every ::1 using 1:3 with lines lw 2 title 'loader (loaded from)';",
      "set title 'resources'; set ylabel 'Gbit/s'; set y2label 'tokens per step'; set y2tics; set ytics nomirror;",
      "plot '", csv, "' every ::1 using 1:4 with steps title 'disk bandwidth', '", csv,
      "' every ::1 using 1:5 axes x1y2 with dots title 'engine budget for the request';", "unset multiplot");
  const bool plotted =
      std::system(absl::StrCat("command -v gnuplot >/dev/null && gnuplot -e \"", script, "\" 2>/dev/null").c_str()) ==
      0;
  std::printf(
      "cake-bench fluctuate: %s, %u tokens; budget 0 to %u of 512 tokens per step, bandwidth 0.1 to %g "
      "Gbit/s every %g ms; time scale %g\n",
      model->name, options.tokens, options.max_budget, options.max_gbps, options.interval_ms, options.time_scale);
  std::printf("  TTFT %.3f s, met at token %u (%u loaded chunks); %zu samples in %s%s\n", ttft_s,
              load_done->meeting_chunk * kChunkTokens, load_done->loaded_chunks, samples.size(), csv.c_str(),
              plotted ? absl::StrCat(", plot in ", png).c_str() : " (no gnuplot: no plot)");
  JsonReport report;
  report.Set("ttft_s", ttft_s);
  report.Set("meet_token", load_done->meeting_chunk * kChunkTokens);
  report.Set("samples", static_cast<double>(samples.size()));
  report.Set("csv", csv);
  return report.WriteTo(options.common.json_path);
}

void AddFluctuateCommand(CLI::App& app) {
  auto options = std::make_shared<FluctuateOptions>();
  CLI::App* command = app.add_subcommand(
      "fluctuate", "one Cake load while the engine's budget and the disk's bandwidth change: both cursors over time");
  AddCommonOptions(command, options->common);
  command->add_option("--model", options->model, "KV size and cost model")->capture_default_str();
  command->add_option("--tokens", options->tokens, "prompt length, a multiple of 128")->capture_default_str();
  command->add_option("--max-budget", options->max_budget, "most tokens per step for the request")
      ->capture_default_str()
      ->check(CLI::Range(1u, 512u));
  command->add_option("--max-gbps", options->max_gbps, "highest bandwidth drawn")->capture_default_str();
  command->add_option("--interval-ms", options->interval_ms, "time between bandwidth changes")->capture_default_str();
  command->add_option("--gpu-tflops", options->gpu_tflops, "F; 0 balances compute and load on average")
      ->capture_default_str();
  command->add_option("--time-scale", options->time_scale, "divide every duration by this")->capture_default_str();
  command->add_option("--seed", options->seed, "random draws")->capture_default_str();
  command->add_option("--out", options->out_prefix, "writes PREFIX.csv and PREFIX.png")->capture_default_str();
  RunWhenParsed(command, options, RunFluctuateBench);
}

}  // namespace cake::bench
