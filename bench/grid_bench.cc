// cake-bench grid: the paper's evaluation grid. For every model, prompt length, compression, bandwidth and GPU
// utilisation: compute-only, I/O-only and Cake time to first token of one cached request, against a real caked,
// beside the oracle split computed offline from the same cost model.
//
// The engine is simulated (PAPER.md's cost model, a vLLM-style step budget of which the request gets a share);
// storage is the paper's "simulated backend": each chunk is delayed by its size over the bandwidth. The daemon
// serves stand-in bytes from its DRAM tier behind its read throttle, scaled so each chunk takes exactly as long as
// the modelled KV chunk would: 1 KiB per token instead of the model's KV, the throttle set to bandwidth x
// (1 KiB / KV bytes per token) x time scale. Every duration is divided by --time-scale; reported times are
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
#include "bench/bench_common.h"
#include "bench/benchmarks.h"
#include "bench/models.h"
#include "bench/simulated_storage.h"

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

// One request's prefill on the simulated engine: steps of util x step budget tokens, each taking what the
// request's share of the GPU needs for them; after every step it reports its progress and, under Cake, stops at
// the first chunk boundary whose chunk is loaded.
class GridEngine {
 public:
  GridEngine(const PrefillCostModel& cost, double util, uint32_t step_tokens, uint32_t chunk_tokens, uint32_t tokens,
             double time_scale)
      : cost_(cost),
        util_(util),
        step_tokens_(std::max(1u, static_cast<uint32_t>(std::lround(util * step_tokens)))),
        chunk_tokens_(chunk_tokens),
        tokens_(tokens),
        time_scale_(time_scale) {}

  // Wall seconds (scaled) to compute tokens [from, to).
  double Seconds(double from, double to) const {
    return (cost_.Flop(to) - cost_.Flop(from)) / (util_ * cost_.flops) / time_scale_;
  }
  // The engine's own per-chunk cost as the hint format, t(i) = a + b i, in scaled seconds.
  double HintFirstChunk() const { return Seconds(0, chunk_tokens_); }
  double HintGrowth() const { return Seconds(chunk_tokens_, 2.0 * chunk_tokens_) - HintFirstChunk(); }

  // Computes from token 0, step by step. `resident(c)` says whether chunk c is loaded; `progress(c)` reports
  // chunks [0, c) computed. At `wait_at` tokens (the plan's meeting point) it stops computing and waits for that
  // chunk until `wait_until` (`wait(c, deadline)`); if the loads have not reached it by then, it computes on.
  // Returns the token it stopped at.
  template <typename Resident, typename Progress, typename Wait>
  absl::StatusOr<uint32_t> Run(Clock::time_point start, uint32_t limit_tokens, Resident resident, Progress progress,
                               uint32_t wait_at, Clock::time_point wait_until, Wait wait) {
    Clock::time_point gpu_free = start;
    uint32_t done = 0;
    uint32_t reported = 0;
    while (done < limit_tokens) {
      if (done % chunk_tokens_ == 0 && resident(done / chunk_tokens_)) break;
      if (done == wait_at) {
        if (wait(done / chunk_tokens_, wait_until)) break;
        gpu_free = std::max(gpu_free, Clock::now());  // the GPU idled while it waited
      }
      uint32_t next = std::min(limit_tokens, done + step_tokens_);
      if (done < wait_at) next = std::min(next, wait_at);  // a step never runs past the planned meeting
      // A chunk loaded while the engine was mid-chunk is used from its start: finish the current chunk, stop.
      const uint32_t boundary = (done / chunk_tokens_ + 1) * chunk_tokens_;
      if (next > boundary && boundary < limit_tokens && resident(boundary / chunk_tokens_)) next = boundary;
      gpu_free += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(Seconds(done, next)));
      PreciseSleepUntil(gpu_free);
      done = next;
      const uint32_t chunks = done / chunk_tokens_;
      if (chunks > reported) {
        reported = chunks;
        if (absl::Status s = progress(chunks); !s.ok()) return s;
      }
    }
    return done;
  }

 private:
  PrefillCostModel cost_;
  double util_;
  uint32_t step_tokens_;
  uint32_t chunk_tokens_;
  uint32_t tokens_;
  double time_scale_;
};

struct CakeRun {
  double seconds = 0;
  uint32_t meeting_chunk = 0;
  std::string strategy;
};

absl::StatusOr<CakeRun> TimedCake(Client& client, const LoadOptions& base, GridEngine& engine, uint32_t tokens,
                                  uint32_t chunk_tokens) {
  LoadOptions load = base;
  load.io_only = false;
  load.compute_first_chunk_s = engine.HintFirstChunk();
  load.compute_growth_s = engine.HintGrowth();
  const Clock::time_point start = Clock::now();
  auto started = client.StartLoad(load);
  if (!started.ok()) return started.status();
  LoadSession& session = **started;
  absl::Cleanup release = [&] { session.Release().IgnoreError(); };
  auto plan = session.WaitPlan();
  if (!plan.ok()) return plan.status();
  CakeRun run;
  run.strategy = plan->strategy == LoadPlan::Strategy::kIoOnly        ? "io-only"
                 : plan->strategy == LoadPlan::Strategy::kComputeOnly ? "compute-only"
                                                                      : "cake";
  const uint32_t limit = plan->strategy == LoadPlan::Strategy::kIoOnly ? plan->lowest_loadable * chunk_tokens : tokens;
  // Under Cake the engine stops at the predicted meeting and waits for the loads, with a fifth of slack (plus a
  // millisecond) before it decides they fell behind and computes on.
  uint32_t wait_at = tokens + 1;
  Clock::time_point wait_until = start;
  if (plan->strategy == LoadPlan::Strategy::kCake && plan->predicted_meeting_chunk && plan->predicted_cake_s) {
    wait_at = *plan->predicted_meeting_chunk * chunk_tokens;
    wait_until = start + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(*plan->predicted_cake_s * 1.2 + 1e-3));
  }
  auto stopped = engine.Run(
      start, limit, [&](uint32_t c) { return session.IsResident(c); },
      [&](uint32_t c) { return session.ReportProgress(c); }, wait_at, wait_until,
      [&](uint32_t c, Clock::time_point deadline) { return session.WaitResidentUntil(c, deadline); });
  if (!stopped.ok()) return stopped.status();
  const double engine_s = SecondsSince(start);
  auto done = session.WaitDone();
  if (!done.ok()) return done.status();
  run.seconds = std::max(engine_s, SecondsSince(start));
  run.meeting_chunk = done->meeting_chunk;
  if (*stopped < done->meeting_chunk * chunk_tokens) {
    return absl::InternalError(absl::StrCat("the engine stopped at token ", *stopped, " below the meeting chunk ",
                                            done->meeting_chunk,
                                            ": chunks in between were neither computed nor "
                                            "loaded"));
  }
  std::move(release).Cancel();
  if (absl::Status s = session.Release(); !s.ok()) return s;
  return run;
}

// min over m of max(compute [0, m chunks), load [m, H)), in the modelled hardware's seconds.
double OracleSeconds(const GridEngine& engine, double time_scale, uint32_t chunks, uint32_t chunk_tokens,
                     double chunk_load_s) {
  double best = std::numeric_limits<double>::infinity();
  for (uint32_t m = 0; m <= chunks; ++m) {
    const double compute = engine.Seconds(0, static_cast<double>(m) * chunk_tokens) * time_scale;
    best = std::min(best, std::max(compute, chunk_load_s * (chunks - m)));
  }
  return best;
}

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
  std::vector<const ModelSpec*> models;
  for (const std::string& name : options.models) {
    const ModelSpec* model = FindModel(name);
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
  for (const ModelSpec* model : models) {
    PrefillCostModel cost{model->params, static_cast<double>(model->layers), static_cast<double>(model->hidden),
                          options.gpu_tflops * 1e12};
    for (uint32_t bits : options.bits) {
      const double kv_bytes_per_token = KvBytesPerToken(*model) * bits / 16;
      const NamespaceSpec ns =
          ProxyNamespace(absl::StrCat("grid-", model->name, "-", bits, "bit"), options.chunk_tokens);
      for (uint32_t tokens : options.tokens) {
        const uint32_t chunks = tokens / options.chunk_tokens;
        const uint64_t proxy_bytes = static_cast<uint64_t>(tokens * kProxyBytesPerToken);
        const std::vector<uint32_t> prompt = SyntheticPrompt(tokens, 11);
        std::vector<Cell> group;
        for (double bw : options.bandwidths) {
          auto target = OpenDaemon("", SimulatedDiskArgs(bw, kv_bytes_per_token, options.time_scale, proxy_bytes));
          if (!target.ok()) return target.status();
          Client& client = *target->client;
          auto region = client.RegisterRegion(proxy_bytes);
          if (!region.ok()) return region.status();
          absl::Cleanup release_region = [&] { client.ReleaseRegion(*region).IgnoreError(); };
          const uint64_t chunk_bytes = proxy_bytes / chunks;
          for (uint32_t c = 0; c < chunks; ++c) FillChunkPattern({region->data() + c * chunk_bytes, chunk_bytes}, c);
          auto stored = client.Store(ns, TokensPrompt(prompt), 0, chunks, *region, 0);
          if (!stored.ok()) return stored.status();
          LoadOptions load;
          load.ns = ns;
          load.prompt = TokensPrompt(prompt);
          load.region = &*region;
          // Untimed: teaches the daemon the tier's speed, as earlier requests would have.
          if (auto warm = TimedIoOnlyLoad(client, load, chunks, chunk_bytes); !warm.ok()) return warm.status();
          const double chunk_load_s = options.chunk_tokens * kv_bytes_per_token * 8 / (bw * 1e9);
          for (double u : options.utils) {
            GridEngine engine(cost, u, options.step_tokens, options.chunk_tokens, tokens, options.time_scale);
            Cell cell;
            cell.model = model->name;
            cell.tokens = tokens;
            cell.bits = bits;
            cell.bandwidth_gbps = bw;
            cell.util = u;
            cell.gpu_tflops = options.gpu_tflops;
            // I/O-only and Cake back to back, so both find the daemon equally warm; compute-only needs no daemon.
            auto io = TimedIoOnlyLoad(client, load, chunks, chunk_bytes);
            if (!io.ok()) return io.status();
            cell.io_s = *io * options.time_scale;
            auto cake = TimedCake(client, load, engine, tokens, options.chunk_tokens);
            if (!cake.ok()) return cake.status();
            const Clock::time_point start = Clock::now();
            auto computed = engine.Run(
                start, tokens, [](uint32_t) { return false; }, [](uint32_t) { return absl::OkStatus(); }, tokens + 1,
                start, [](uint32_t, Clock::time_point) { return false; });
            if (!computed.ok()) return computed.status();
            cell.compute_s = SecondsSince(start) * options.time_scale;
            cell.cake_s = cake->seconds * options.time_scale;
            cell.meet_token = cake->meeting_chunk * options.chunk_tokens;
            cell.strategy = cake->strategy;
            cell.oracle_s = OracleSeconds(engine, options.time_scale, chunks, options.chunk_tokens, chunk_load_s);
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
  std::printf("cake-bench grid: %zu cells, time scale %g, step budget %u tokens, I/O chunk %u tokens, F = %g TFLOP/s\n",
              cells.size(), options.time_scale, options.step_tokens, options.chunk_tokens, options.gpu_tflops);
  std::printf("%s\n", tables.c_str());
  std::printf("  worst cell: Cake / oracle = %.3f (goal <= 1.05), Cake / better baseline = %.3f (goal <= 1.02)\n",
              worst_oracle, worst_baseline);

  JsonReport report;
  report.Set("cells", static_cast<double>(cells.size()));
  report.Set("time_scale", options.time_scale);
  report.Set("step_tokens", options.step_tokens);
  report.Set("chunk_tokens", options.chunk_tokens);
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

}  // namespace cake::bench
