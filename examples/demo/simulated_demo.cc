// cake-demo --engine simulated: a simulated engine that "computes" prefill chunks by sleeping what the Cake paper's
// cost model (examples/simulated_engine/models.h) says they cost, against a real caked that loads them, and compares
// time to first token of compute-only, I/O-only and Cake for one cached prompt. Every loaded chunk is checked byte
// for byte against the pattern it was stored with.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "examples/demo/demo.h"
#include "examples/harness/harness.h"
#include "examples/simulated_engine/models.h"

namespace cake::demo {
namespace {

using harness::CheckChunkPattern;
using harness::Clock;
using harness::FillChunkPattern;
using harness::JsonReport;
using harness::PreciseSleepUntil;
using harness::SecondsSince;
using harness::SyntheticPrompt;
using harness::TokensPrompt;
using harness::WaitForCounter;
using sim::FindModel;
using sim::kModels;
using sim::KvNamespace;
using sim::ModelSpec;
using sim::PrefillCostModel;

struct LoadRunResult {
  double ttft_s = 0;
  uint32_t meeting_chunk = 0;
  uint32_t engine_stop_chunk = 0;  // the engine computed [0, engine_stop_chunk)
  std::optional<uint32_t> predicted_meeting_chunk;
};

enum class LoadMode { kIoOnly, kCake };

class DemoEngine {
 public:
  DemoEngine(Client& client, NamespaceSpec ns, std::vector<uint32_t> tokens, const MappedRegion& region,
             uint64_t chunk_bytes, std::vector<double> chunk_compute_s)
      : client_(client),
        ns_(std::move(ns)),
        tokens_(std::move(tokens)),
        region_(region),
        chunk_bytes_(chunk_bytes),
        chunk_compute_s_(std::move(chunk_compute_s)) {}

  uint32_t chunks() const { return static_cast<uint32_t>(chunk_compute_s_.size()); }

  // Writes every chunk's KV pattern into the region and stores the whole prompt in the daemon.
  absl::Status StorePrompt() {
    for (uint32_t c = 0; c < chunks(); ++c) FillChunkPattern(ChunkBytes(c * chunk_bytes_), c);
    CAKE_RETURN_IF_ERROR(client_.Store(ns_, Prompt(), 0, chunks(), region_, 0).status());
    CAKE_ASSIGN_OR_RETURN(auto found, client_.Lookup(ns_, Prompt()));
    if (found.cached_chunks != chunks()) {
      return absl::FailedPreconditionError(absl::StrCat("the daemon holds ", found.cached_chunks, " of the ", chunks(),
                                                        " chunks just stored; is its DRAM tier too small?"));
    }
    return absl::OkStatus();
  }

  // The engine alone: every chunk computed, no daemon involved.
  double RunComputeOnly() const {
    const Clock::time_point start = Clock::now();
    Clock::time_point gpu_free = start;
    for (uint32_t c = 0; c < chunks(); ++c) ComputeChunk(c, gpu_free);
    return SecondsSince(start);
  }

  // I/O-only: the daemon loads every chunk while the engine waits. Cake: the engine computes forward and stops
  // at the first chunk the daemon has loaded.
  absl::StatusOr<LoadRunResult> RunLoad(LoadMode mode) {
    // Zeroed first, so the check afterwards sees only what this load wrote.
    std::memset(region_.data(), 0, region_.size());
    LoadOptions load;
    load.ns = ns_;
    load.prompt = Prompt();
    load.region = &region_;
    load.io_only = mode == LoadMode::kIoOnly;
    // The model's per-chunk cost is exactly linear in the chunk index, which is the daemon's hint format.
    load.compute_first_chunk_s = chunk_compute_s_[0];
    load.compute_growth_s = chunks() > 1 ? chunk_compute_s_[1] - chunk_compute_s_[0] : 0;

    const Clock::time_point start = Clock::now();
    CAKE_ASSIGN_OR_RETURN(auto started, client_.StartLoad(load));
    LoadSession& session = *started;
    absl::Cleanup release = [&] { session.Release().IgnoreError(); };
    uint32_t engine_stop = 0;
    if (mode == LoadMode::kCake) {
      // The client library's stepper, once per engine step: compute on, wait at the predicted meeting, or stop
      // (under I/O-only the engine computes only what has no room to load).
      Clock::time_point gpu_free = start;
      for (;;) {
        CAKE_ASSIGN_OR_RETURN(const FrontStep step, session.NextStep(engine_stop));
        if (step.action == FrontStep::Action::kStop) break;
        if (step.action == FrontStep::Action::kWait) {
          session.WaitResidentUntil(engine_stop, step.until);
          gpu_free = std::max(gpu_free, Clock::now());
          continue;
        }
        ComputeChunk(engine_stop, gpu_free);
        ++engine_stop;
        CAKE_RETURN_IF_ERROR(session.ReportProgress(engine_stop));
      }
    }
    auto done = session.WaitDone();
    const double ttft = SecondsSince(start);
    if (!done.ok()) return done.status();
    // The daemon may finish a chunk while the engine is already computing it: the engine then stops one chunk
    // past the meeting point (wasted compute), never before it.
    if (done->meeting_chunk > engine_stop) {
      return absl::InternalError(absl::StrCat("the engine stopped at chunk ", engine_stop,
                                              " but the daemon reported meeting chunk ", done->meeting_chunk,
                                              ": chunks in between were neither computed nor loaded"));
    }
    for (uint32_t c = done->meeting_chunk; c < chunks(); ++c) {
      CAKE_RETURN_IF_ERROR(CheckChunkPattern(ChunkBytes(session.RegionOffset(c)), c));
    }
    LoadRunResult result{ttft, done->meeting_chunk, engine_stop, std::nullopt};
    if (auto plan = session.WaitPlan(); plan.ok()) result.predicted_meeting_chunk = plan->predicted_meeting_chunk;
    std::move(release).Cancel();
    CAKE_RETURN_IF_ERROR(session.Release());
    return result;
  }

 private:
  PromptRef Prompt() const { return TokensPrompt(tokens_); }
  std::span<std::byte> ChunkBytes(uint64_t offset) const { return {region_.data() + offset, chunk_bytes_}; }
  // "Computes" chunk c on a simulated GPU that is busy until `gpu_free`, and advances it. Chunks are timed back
  // to back from the run's start, so a late wake-up on a busy host delays one step, not every later one, and
  // the sum matches the cost model.
  void ComputeChunk(uint32_t c, Clock::time_point& gpu_free) const {
    gpu_free += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(chunk_compute_s_[c]));
    PreciseSleepUntil(gpu_free);
  }

  Client& client_;
  const NamespaceSpec ns_;
  const std::vector<uint32_t> tokens_;
  const MappedRegion& region_;
  const uint64_t chunk_bytes_;
  const std::vector<double> chunk_compute_s_;
};

// The best any split can do under the model: min over m of max(compute [0, m), load [m, H)).
double ModelOptimumSeconds(const std::vector<double>& chunk_compute_s, double chunk_load_s) {
  const size_t h = chunk_compute_s.size();
  double compute = 0;
  double best = std::numeric_limits<double>::infinity();
  for (size_t m = 0; m <= h; ++m) {
    best = std::min(best, std::max(compute, chunk_load_s * static_cast<double>(h - m)));
    if (m < h) compute += chunk_compute_s[m];
  }
  return best;
}

}  // namespace

absl::Status RunSimulatedDemo(const DemoOptions& options) {
  const double read_gbps = options.read_gbps.value_or(16);
  const ModelSpec* model = FindModel(options.model);
  if (model == nullptr) {
    std::string known;
    for (const ModelSpec& m : kModels) absl::StrAppend(&known, known.empty() ? "" : ", ", m.name);
    return absl::InvalidArgumentError(absl::StrCat("unknown --model ", options.model, "; known: ", known));
  }
  if (read_gbps <= 0) return absl::InvalidArgumentError("--read-gbps must be positive");
  if (options.gpu_tflops && *options.gpu_tflops <= 0) {
    return absl::InvalidArgumentError("--gpu-tflops must be positive");
  }
  const NamespaceSpec ns = KvNamespace(*model);
  CAKE_ASSIGN_OR_RETURN(auto layout, Namespace::Create(ns));
  const uint32_t chunk_tokens = layout.chunk_tokens();
  if (options.tokens == 0 || options.tokens % chunk_tokens != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--tokens must be a positive multiple of ", chunk_tokens,
                                                   " (the chunk size), so every chunk is cached"));
  }
  const uint32_t chunks = options.tokens / chunk_tokens;
  const uint64_t chunk_bytes = layout.chunk_bytes();
  const uint64_t prompt_bytes = uint64_t{chunks} * chunk_bytes;
  const double read_bytes_per_s = read_gbps * 1e9 / 8;
  const double prompt_load_s = static_cast<double>(prompt_bytes) / read_bytes_per_s;

  PrefillCostModel cost{model->params, static_cast<double>(model->layers), static_cast<double>(model->hidden), 0};
  // Balanced by default: computing the whole prompt takes as long as loading it, where Cake gains the most.
  cost.flops = options.gpu_tflops ? *options.gpu_tflops * 1e12 : cost.Flop(options.tokens) / prompt_load_s;
  std::vector<double> chunk_compute_s(chunks);
  for (uint32_t c = 0; c < chunks; ++c) {
    const double begin = static_cast<double>(c) * chunk_tokens;
    chunk_compute_s[c] = cost.PrefixSeconds(begin + chunk_tokens) - cost.PrefixSeconds(begin);
  }

  CAKE_ASSIGN_OR_RETURN(auto target,
                        harness::OpenDaemon(options.socket_path,
                                            {"--dram-read-gbps", absl::StrCat(read_gbps), "--dram-capacity-mib",
                                             absl::StrCat((prompt_bytes >> 20) + 256)},
                                            kClientId));
  Client& client = *target.client;
  CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(prompt_bytes));
  absl::Cleanup release_region = [&] { client.ReleaseRegion(region).IgnoreError(); };

  DemoEngine engine(client, ns, SyntheticPrompt(options.tokens, 8), region, chunk_bytes, chunk_compute_s);
  CAKE_RETURN_IF_ERROR(engine.StorePrompt());
  // With a disk tier, every load comes from disk: wait until the write-back has put the whole prompt there, and
  // empty DRAM before each load (a load promotes what it reads into DRAM).
  CAKE_ASSIGN_OR_RETURN(auto stats, client.Stats());
  const bool from_disk = stats.contains("tier_disk_chunks");
  if (from_disk) {
    CAKE_RETURN_IF_ERROR(WaitForCounter(client, "tier_disk_chunks", chunks, std::chrono::seconds(120)));
  }
  auto run_load = [&](LoadMode mode) -> absl::StatusOr<LoadRunResult> {
    if (from_disk) {
      CAKE_RETURN_IF_ERROR(client.Evict(TierKind::kDram).status());
    }
    return engine.RunLoad(mode);
  };
  // An untimed load first: it gives the daemon's planner a measured bandwidth to predict the meeting with, as
  // an engine that has served a few requests would have given it.
  CAKE_RETURN_IF_ERROR(run_load(LoadMode::kIoOnly).status());
  const double compute_only_s = engine.RunComputeOnly();
  CAKE_ASSIGN_OR_RETURN(auto io_only, run_load(LoadMode::kIoOnly));
  CAKE_ASSIGN_OR_RETURN(auto cake, run_load(LoadMode::kCake));

  const double optimum_s = ModelOptimumSeconds(chunk_compute_s, static_cast<double>(chunk_bytes) / read_bytes_per_s);
  const double io_only_gbit_per_s = static_cast<double>(prompt_bytes) * 8 / io_only.ttft_s / 1e9;
  const double over_compute = compute_only_s / cake.ttft_s;
  const double over_io = io_only.ttft_s / cake.ttft_s;
  std::printf(
      "cake-demo: %s, %u tokens = %u chunks of %u, KV %llu MiB, loaded from %s, reads capped at %g "
      "Gbit/s\n",
      model->name, options.tokens, chunks, chunk_tokens, static_cast<unsigned long long>(prompt_bytes >> 20),
      from_disk ? "the disk tier (DRAM emptied before each load)" : "the DRAM tier", read_gbps);
  std::printf("  engine: simulated, F = %.3g FLOP/s (%s); whole prompt: compute %.3f s, load %.3f s\n", cost.flops,
              options.gpu_tflops ? "--gpu-tflops" : "balanced", cost.PrefixSeconds(options.tokens), prompt_load_s);
  std::printf("  %-13s %9s  %s\n", "mode", "TTFT s", "");
  std::printf("  %-13s %9.3f\n", "compute-only", compute_only_s);
  std::printf("  %-13s %9.3f  loaded at %.1f Gbit/s\n", "I/O-only", io_only.ttft_s, io_only_gbit_per_s);
  std::printf("  %-13s %9.3f  met at chunk %u (token %u)", "Cake", cake.ttft_s, cake.meeting_chunk,
              cake.meeting_chunk * chunk_tokens);
  if (cake.predicted_meeting_chunk) std::printf(", predicted %u", *cake.predicted_meeting_chunk);
  if (cake.engine_stop_chunk > cake.meeting_chunk) {
    std::printf(", engine computed %u chunk(s) past it", cake.engine_stop_chunk - cake.meeting_chunk);
  }
  std::printf("; model optimum %.3f s\n", optimum_s);
  std::printf("  Cake speedup: %.2fx over compute-only, %.2fx over I/O-only\n", over_compute, over_io);
  std::printf("  verified: every loaded chunk matched its pattern byte for byte\n");

  JsonReport report;
  report.Set("model", std::string(model->name));
  report.Set("tokens", options.tokens);
  report.Set("chunks", chunks);
  report.Set("read_gbps", read_gbps);
  report.Set("loaded_from", std::string(from_disk ? "disk" : "dram"));
  report.Set("flops", cost.flops);
  report.Set("compute_only_s", compute_only_s);
  report.Set("io_only_s", io_only.ttft_s);
  report.Set("cake_s", cake.ttft_s);
  report.Set("meeting_chunk", cake.meeting_chunk);
  report.Set("meeting_token", cake.meeting_chunk * chunk_tokens);
  report.Set("engine_stop_chunk", cake.engine_stop_chunk);
  report.Set("predicted_meeting_chunk", cake.predicted_meeting_chunk
                                            ? static_cast<double>(*cake.predicted_meeting_chunk)
                                            : std::numeric_limits<double>::quiet_NaN());
  report.Set("model_optimum_s", optimum_s);
  report.Set("speedup_over_compute_only", over_compute);
  report.Set("speedup_over_io_only", over_io);
  report.Set("io_only_gbit_per_s", io_only_gbit_per_s);
  return report.WriteTo(options.json_path);
}

}  // namespace cake::demo
