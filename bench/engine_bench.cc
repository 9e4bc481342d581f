// The real engine's benches and demo: the CPU transformer (examples/cpu_engine) prefills a prompt against a real caked
// whose disk tier holds the prompt's KV cache behind a read throttle.
//   cake-bench engine: per prompt length and throttle, measured TTFT of compute-only, I/O-only, Cake and every
//     forced split, the planner's predicted meeting beside the measured one, every run checked bit-exact.
//   cake-bench engine-curve: compute time per chunk against chunk index for two model sizes, with the linear fit
//     the planner assumes.
//   cake-bench demo (--engine real): compute-only, I/O-only and Cake on one prompt, with their first tokens.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/bench_common.h"
#include "bench/benchmarks.h"
#include "examples/cpu_engine/prefill_engine.h"
#include "examples/cpu_engine/transformer.h"

namespace cake::bench {
namespace {

using engine::LinearFit;
using engine::PrefillEngine;
using engine::PrefillMode;
using engine::PrefillResult;

absl::StatusOr<engine::TransformerConfig> ToConfig(const EngineModelOptions& m) {
  engine::TransformerConfig c = m.shape;
  c.storage = m.bf16 ? engine::Storage::kBf16 : engine::Storage::kFp32;
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  if (m.chunk_tokens == 0) return absl::InvalidArgumentError("--chunk-tokens must be positive");
  return c;
}

std::string Describe(const engine::TransformerConfig& c, uint32_t chunk_tokens) {
  return absl::StrFormat("%u layers, hidden %u, %u heads / %u KV heads, MLP %u, vocab %u, %s, %u-token chunks",
                         c.layers, c.hidden, c.heads, c.kv_heads, c.intermediate, c.vocab,
                         c.storage == engine::Storage::kFp32 ? "fp32" : "bf16", chunk_tokens);
}

// A plot legend's name for a model: its size and attention.
std::string ShortName(const EngineModelOptions& m) {
  return absl::StrFormat("hidden %u, %u layers, %u/%u heads", m.shape.hidden, m.shape.layers, m.shape.heads,
                         m.shape.kv_heads);
}

// A byte-level prompt: each byte of `file` is a token (repeated if the file is short); synthetic without a file.
absl::StatusOr<std::vector<uint32_t>> PromptTokens(const std::string& file, uint32_t count, uint32_t vocab) {
  if (file.empty()) {
    std::vector<uint32_t> tokens = SyntheticPrompt(count, 5);
    for (uint32_t& t : tokens) t %= vocab;
    return tokens;
  }
  const std::string text = ReadWholeFile(file);
  if (text.empty()) return absl::NotFoundError(absl::StrCat("--prompt-file ", file, " is empty or unreadable"));
  std::vector<uint32_t> tokens(count);
  for (uint32_t i = 0; i < count; ++i) tokens[i] = static_cast<unsigned char>(text[i % text.size()]) % vocab;
  return tokens;
}

std::string TokenText(uint32_t token) {
  if (token < 128 && std::isprint(static_cast<int>(token))) return absl::StrFormat("%u ('%c')", token, token);
  return absl::StrCat(token);
}

// The daemon the engine talks to: the one at --socket, or a private one with a disk tier in a scratch folder.
struct EngineDaemon {
  std::optional<ScratchDir> scratch;  // declared first: it goes after the daemon that writes into it
  DaemonTarget target;
  bool from_disk = false;  // whether loads come from a disk tier (else from DRAM behind its cap)
  std::string capped_tier() const { return from_disk ? "disk" : "dram"; }
};

absl::StatusOr<EngineDaemon> OpenEngineDaemon(const std::string& socket_path, uint64_t pages_bytes) {
  EngineDaemon d;
  std::vector<std::string> args;
  if (socket_path.empty()) {
    auto scratch = ScratchDir::Create("cake-engine");
    if (!scratch.ok()) return scratch.status();
    d.scratch.emplace(std::move(*scratch));
    // A read cap to change later, once the engine's compute speed says which throttle makes both sides matter.
    args = {"--disk-root",         (d.scratch->path() / "disk").string(),      "--disk-read-gbps", "100",
            "--dram-capacity-mib", absl::StrCat(3 * (pages_bytes >> 20) + 256)};
  }
  auto target = OpenDaemon(socket_path, args);
  if (!target.ok()) return target.status();
  d.target = std::move(*target);
  auto stats = d.target.client->Stats();
  if (!stats.ok()) return stats.status();
  d.from_disk = stats->contains("tier_disk_chunks");
  return d;
}

// One run with every load coming from the slow tier: DRAM is emptied first, since a load promotes what it reads.
absl::StatusOr<PrefillResult> RunCold(EngineDaemon& daemon, PrefillEngine& engine, PrefillMode mode,
                                      uint32_t split = 0) {
  if (daemon.from_disk && mode != PrefillMode::kComputeOnly) {
    if (auto evicted = daemon.target.client->Evict("dram"); !evicted.ok()) return evicted.status();
  }
  return engine.Run(mode, split);
}

struct Truth {
  std::vector<std::byte> kv;
  PrefillResult run;
};

// Full compute, after one untimed pass (the pages' first touch, the BLAS's buffers): the reference every other
// run is compared with, and the measured per-chunk compute curve.
absl::StatusOr<Truth> ComputeTruth(PrefillEngine& engine) {
  if (auto warm = engine.Run(PrefillMode::kComputeOnly); !warm.ok()) return warm.status();
  auto run = engine.Run(PrefillMode::kComputeOnly);
  if (!run.ok()) return run.status();
  return Truth{std::vector<std::byte>(engine.Kv().begin(), engine.Kv().end()), *run};
}

bool BitExact(const PrefillEngine& engine, const PrefillResult& run, const Truth& truth) {
  const auto kv = engine.Kv();
  return run.first_token == truth.run.first_token && kv.size() == truth.kv.size() &&
         std::memcmp(kv.data(), truth.kv.data(), kv.size()) == 0;
}

// The fit over full chunks (a partial tail chunk is cheaper by its missing tokens, not by the model).
LinearFit FitFullChunks(const PrefillEngine& engine, const PrefillResult& run) {
  return engine::FitChunkTimes(std::span(run.chunk_compute_s).first(engine.full_chunks()));
}

// Stores every full chunk and, with a disk tier, waits until the write-back has put them all on disk.
absl::Status StoreAndSettle(EngineDaemon& daemon, PrefillEngine& engine) {
  Client& client = *daemon.target.client;
  uint64_t on_disk = 0;
  if (daemon.from_disk) {
    auto stats = client.Stats();
    if (!stats.ok()) return stats.status();
    on_disk = (*stats)["tier_disk_chunks"];
  }
  auto stored = engine.Store(engine.full_chunks());
  if (!stored.ok()) return stored.status();
  if (daemon.from_disk) {
    return WaitForCounter(client, "tier_disk_chunks", on_disk + stored->stored_chunks, std::chrono::seconds(60));
  }
  return absl::OkStatus();
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
  auto config = ToConfig(options.model);
  if (!config.ok()) return config.status();
  for (double r : options.load_ratios) {
    if (!(r > 0)) return absl::InvalidArgumentError(absl::StrCat("--load-ratios: ", r, " is not positive"));
  }
  for (double g : options.throttles_gbps) {
    if (!(g > 0)) return absl::InvalidArgumentError(absl::StrCat("--throttles: ", g, " is not positive"));
  }
  engine::SetBlasThreads(static_cast<int>(options.model.blas_threads));
  engine::Transformer model(*config);
  const uint32_t chunk_tokens = options.model.chunk_tokens;
  std::printf("cake-bench engine: %s; %u BLAS thread(s)\n", Describe(*config, chunk_tokens).c_str(),
              options.model.blas_threads);

  std::vector<EngineRow> rows;
  std::vector<std::string> fits;
  for (uint32_t tokens : options.tokens) {
    if (tokens < chunk_tokens) {
      return absl::InvalidArgumentError(absl::StrCat("--tokens ", tokens, " is shorter than one chunk"));
    }
    const std::vector<uint32_t> prompt = *PromptTokens("", tokens, config->vocab);
    const uint64_t pages_bytes = model.PageBytes(chunk_tokens) * ((tokens + chunk_tokens - 1) / chunk_tokens);
    auto daemon = OpenEngineDaemon(options.common.socket_path, pages_bytes);
    if (!daemon.ok()) return daemon.status();
    Client& client = *daemon->target.client;
    auto region = client.RegisterRegion(pages_bytes);
    if (!region.ok()) return region.status();
    absl::Cleanup release_region = [&] { client.ReleaseRegion(*region).IgnoreError(); };
    PrefillEngine engine(model, chunk_tokens, prompt, &client, *region);
    auto truth = ComputeTruth(engine);
    if (!truth.ok()) return truth.status();
    const LinearFit fit = FitFullChunks(engine, truth->run);
    engine.SetComputeHint(fit.first_s, fit.growth_s);
    fits.push_back(absl::StrFormat(
        "  %u tokens: compute %.3f s; per chunk %.2f ms + %.3f ms x index (R^2 %.3f, worst chunk %.0f%% off the "
        "fit)",
        tokens, truth->run.ttft_s, fit.first_s * 1e3, fit.growth_s * 1e3, fit.r_squared,
        100 * fit.max_relative_error));
    std::printf("%s\n", fits.back().c_str());
    if (absl::Status s = StoreAndSettle(*daemon, engine); !s.ok()) return s;

    const uint64_t stored_bytes = uint64_t{engine.full_chunks()} * engine.page_bytes();
    std::vector<double> throttles = options.throttles_gbps;
    if (throttles.empty()) {
      for (double r : options.load_ratios) throttles.push_back(stored_bytes * 8.0 / (r * truth->run.ttft_s) / 1e9);
    }
    for (double gbps : throttles) {
      if (auto capped = client.SetReadCap(daemon->capped_tier(), gbps); !capped.ok()) return capped.status();
      EngineRow row;
      row.tokens = tokens;
      row.throttle_gbps = gbps;
      // Untimed: teaches the daemon the throttled tier's speed, as earlier requests would have.
      if (auto warm = RunCold(*daemon, engine, PrefillMode::kIoOnly); !warm.ok()) return warm.status();
      auto computed = RunCold(*daemon, engine, PrefillMode::kComputeOnly);
      if (!computed.ok()) return computed.status();
      row.compute_s = computed->ttft_s;
      row.bitexact &= BitExact(engine, *computed, *truth);
      // The hint is the engine's latest measured speed, as a serving engine would know it.
      const LinearFit latest = FitFullChunks(engine, *computed);
      engine.SetComputeHint(latest.first_s, latest.growth_s);
      auto io = RunCold(*daemon, engine, PrefillMode::kIoOnly);
      if (!io.ok()) return io.status();
      row.io_s = io->ttft_s;
      row.bitexact &= BitExact(engine, *io, *truth);
      auto cake = RunCold(*daemon, engine, PrefillMode::kCake);
      if (!cake.ok()) return cake.status();
      row.cake_s = cake->ttft_s;
      row.meet_measured = cake->meeting_chunk * chunk_tokens;
      if (cake->predicted_meeting_chunk) row.meet_predicted = *cake->predicted_meeting_chunk * chunk_tokens;
      row.engine_stopped = cake->computed_chunks;
      row.strategy = cake->strategy;
      row.bitexact &= BitExact(engine, *cake, *truth);
      row.best_forced_s = std::numeric_limits<double>::infinity();
      const uint32_t cached = engine.full_chunks();
      std::string sweep;
      for (uint32_t m = 0;; m = std::min(cached, m + options.sweep_step)) {
        auto forced = RunCold(*daemon, engine, PrefillMode::kFixedSplit, m);
        if (!forced.ok()) return forced.status();
        row.bitexact &= BitExact(engine, *forced, *truth);
        absl::StrAppend(&sweep, sweep.empty() ? "" : ", ", m * chunk_tokens, ": ",
                        absl::StrFormat("%.3f", forced->ttft_s));
        if (forced->ttft_s < row.best_forced_s) {
          row.best_forced_s = forced->ttft_s;
          row.best_forced_token = m * chunk_tokens;
        }
        if (m == cached) break;
      }
      std::printf(
          "  %u tokens, %.3g Gbit/s: compute %.3f s, I/O %.3f s, Cake %.3f s (%s, met at token %u, predicted %s), "
          "best forced %.3f s (token %u), bit-exact %s\n",
          tokens, gbps, row.compute_s, row.io_s, row.cake_s, row.strategy.c_str(), row.meet_measured,
          row.meet_predicted ? absl::StrCat(*row.meet_predicted).c_str() : "-", row.best_forced_s,
          row.best_forced_token, row.bitexact ? "yes" : "NO");
      std::printf("    forced splits (meeting token: TTFT s): %s\n", sweep.c_str());
      std::fflush(stdout);
      rows.push_back(row);
    }
    if (absl::Status s = client.ReleaseRegion(*region); !s.ok()) return s;
    std::move(release_region).Cancel();
  }

  double worst = 0;
  bool all_exact = true;
  std::printf(
      "\n| tokens | throttle Gbit/s | compute-only s | I/O-only s | Cake s | best forced split s (at token) | Cake / "
      "best forced | meeting predicted / measured | bit-exact |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- "
      "|\n");
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
    row.Set("meet_predicted", r.meet_predicted ? static_cast<double>(*r.meet_predicted)
                                               : std::numeric_limits<double>::quiet_NaN());
    row.Set("meet_measured", r.meet_measured);
    row.Set("strategy", r.strategy);
    row.SetRaw("bitexact", r.bitexact ? "true" : "false");
    json_rows.push_back(row.ToString());
  }
  std::printf("\n  worst Cake / best forced split = %.3f (goal <= 1.10); every run bit-exact: %s\n", worst,
              all_exact ? "yes" : "NO");
  JsonReport report;
  report.Set("model", Describe(*config, chunk_tokens));
  report.Set("blas_threads", options.model.blas_threads);
  report.Set("worst_cake_over_best_forced", worst);
  report.SetRaw("all_bitexact", all_exact ? "true" : "false");
  report.SetRaw("rows", "[" + absl::StrJoin(json_rows, ",\n") + "]");
  if (absl::Status s = report.WriteTo(options.common.json_path); !s.ok()) return s;
  if (!all_exact) return absl::DataLossError("a run's KV cache or first token differed from full compute's");
  return absl::OkStatus();
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
    auto config = ToConfig(m);
    if (!config.ok()) return config.status();
    engine::Transformer model(*config);
    const uint32_t chunk_tokens = options.small.chunk_tokens;
    const uint32_t chunks = options.tokens / chunk_tokens;
    if (chunks == 0) return absl::InvalidArgumentError("--tokens is shorter than one chunk");
    std::vector<uint32_t> prompt = *PromptTokens("", chunks * chunk_tokens, config->vocab);
    std::vector<std::byte> buffer(model.PageBytes(chunk_tokens) * chunks);
    engine::KvPages pages{buffer.data(), {}};
    for (uint32_t c = 0; c < chunks; ++c) pages.offsets.push_back(c * model.PageBytes(chunk_tokens));
    // One untimed pass first: the pages' first touch and the BLAS's buffers.
    for (uint32_t c = 0; c < chunks; ++c) model.PrefillChunk(prompt, c, chunk_tokens, pages);
    Curve curve{absl::StrCat(name, ": ", Describe(*config, chunk_tokens)), {}, {}};
    for (uint32_t c = 0; c < chunks; ++c) {
      const Clock::time_point start = Clock::now();
      model.PrefillChunk(prompt, c, chunk_tokens, pages);
      curve.seconds.push_back(SecondsSince(start));
    }
    curve.fit = engine::FitChunkTimes(curve.seconds);
    std::printf("cake-bench engine-curve: %s, %u tokens\n  per chunk %.2f ms + %.3f ms x index; R^2 %.4f; worst chunk "
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

absl::Status RunRealEngineDemo(const DemoOptions& options) {
  auto config = ToConfig(options.engine_model);
  if (!config.ok()) return config.status();
  if (options.read_gbps && !(*options.read_gbps > 0)) return absl::InvalidArgumentError("--read-gbps must be positive");
  engine::SetBlasThreads(static_cast<int>(options.engine_model.blas_threads));
  engine::Transformer model(*config);
  const uint32_t chunk_tokens = options.engine_model.chunk_tokens;
  auto prompt = PromptTokens(options.prompt_file, options.real_tokens, config->vocab);
  if (!prompt.ok()) return prompt.status();
  const uint64_t pages_bytes = model.PageBytes(chunk_tokens) * ((prompt->size() + chunk_tokens - 1) / chunk_tokens);
  auto daemon = OpenEngineDaemon(options.common.socket_path, pages_bytes);
  if (!daemon.ok()) return daemon.status();
  Client& client = *daemon->target.client;
  auto region = client.RegisterRegion(pages_bytes);
  if (!region.ok()) return region.status();
  absl::Cleanup release_region = [&] { client.ReleaseRegion(*region).IgnoreError(); };
  PrefillEngine engine(model, chunk_tokens, *prompt, &client, *region);

  std::printf("cake-bench demo: a real transformer on the CPU (%s), %zu-token prompt%s\n",
              Describe(*config, chunk_tokens).c_str(), prompt->size(),
              options.prompt_file.empty() ? "" : absl::StrCat(" from ", options.prompt_file).c_str());
  // The first request computes everything and stores its KV cache; the daemon writes it back to disk.
  auto truth = ComputeTruth(engine);
  if (!truth.ok()) return truth.status();
  const LinearFit fit = FitFullChunks(engine, truth->run);
  engine.SetComputeHint(fit.first_s, fit.growth_s);
  if (absl::Status s = StoreAndSettle(*daemon, engine); !s.ok()) return s;
  const uint64_t stored_bytes = uint64_t{engine.full_chunks()} * engine.page_bytes();
  const double gbps = options.read_gbps.value_or(stored_bytes * 8.0 / truth->run.ttft_s / 1e9);
  if (auto capped = client.SetReadCap(daemon->capped_tier(), gbps); !capped.ok()) return capped.status();
  std::printf("  KV cache %.1f MiB in %u chunks, loaded from %s with reads capped at %.3g Gbit/s%s\n",
              stored_bytes / 1048576.0, engine.full_chunks(),
              daemon->from_disk ? "the disk tier (DRAM emptied before each load)" : "the DRAM tier", gbps,
              options.read_gbps ? "" : " (loading the prompt takes as long as computing it)");
  std::printf("  compute per chunk: %.1f ms + %.2f ms x chunk index (R^2 %.3f), sent to the daemon as the hint\n",
              fit.first_s * 1e3, fit.growth_s * 1e3, fit.r_squared);

  // An untimed load first: it gives the planner the throttled tier's measured speed.
  if (auto warm = RunCold(*daemon, engine, PrefillMode::kIoOnly); !warm.ok()) return warm.status();
  auto computed = RunCold(*daemon, engine, PrefillMode::kComputeOnly);
  if (!computed.ok()) return computed.status();
  const bool computed_exact = BitExact(engine, *computed, *truth);
  auto io = RunCold(*daemon, engine, PrefillMode::kIoOnly);
  if (!io.ok()) return io.status();
  const bool io_exact = BitExact(engine, *io, *truth);
  auto cake = RunCold(*daemon, engine, PrefillMode::kCake);
  if (!cake.ok()) return cake.status();
  const bool cake_exact = BitExact(engine, *cake, *truth);

  std::printf("  %-13s %9s  %-15s %s\n", "mode", "TTFT s", "first token", "");
  std::printf("  %-13s %9.3f  %-15s computed %u chunks\n", "compute-only", computed->ttft_s,
              TokenText(computed->first_token).c_str(), computed->computed_chunks);
  std::printf("  %-13s %9.3f  %-15s loaded %u chunks\n", "I/O-only", io->ttft_s, TokenText(io->first_token).c_str(),
              io->loaded_chunks);
  std::printf("  %-13s %9.3f  %-15s met at chunk %u (token %u), predicted %s; computed %u, loaded %u\n", "Cake",
              cake->ttft_s, TokenText(cake->first_token).c_str(), cake->meeting_chunk,
              cake->meeting_chunk * chunk_tokens,
              cake->predicted_meeting_chunk ? absl::StrCat(*cake->predicted_meeting_chunk).c_str() : "-",
              cake->computed_chunks, cake->loaded_chunks);
  std::printf("  Cake speedup: %.2fx over compute-only, %.2fx over I/O-only\n", computed->ttft_s / cake->ttft_s,
              io->ttft_s / cake->ttft_s);
  const bool exact = computed_exact && io_exact && cake_exact;
  std::printf("  KV cache and first token identical to full compute's in every mode: %s\n", exact ? "yes" : "NO");

  JsonReport report;
  report.Set("engine", std::string("real"));
  report.Set("model", Describe(*config, chunk_tokens));
  report.Set("tokens", static_cast<double>(prompt->size()));
  report.Set("read_gbps", gbps);
  report.Set("loaded_from", std::string(daemon->from_disk ? "disk" : "dram"));
  report.Set("compute_only_s", computed->ttft_s);
  report.Set("io_only_s", io->ttft_s);
  report.Set("cake_s", cake->ttft_s);
  report.Set("meeting_chunk", cake->meeting_chunk);
  report.Set("meeting_token", cake->meeting_chunk * chunk_tokens);
  report.Set("first_token", cake->first_token);
  report.SetRaw("bitexact", exact ? "true" : "false");
  if (absl::Status s = report.WriteTo(options.common.json_path); !s.ok()) return s;
  if (!exact) return absl::DataLossError("a mode's KV cache or first token differed from full compute's");
  return absl::OkStatus();
}

}  // namespace cake::bench
