// A small `cake-bench grid` against real daemons: a few cells at a strong time scale. The bench's goals (Cake
// within 5% of the oracle, never 2% above the better baseline) are checked by the bench itself at full scale;
// here the margins are wide enough to hold on a loaded two-core machine, and the point is that the grid runs,
// reports every field, and that Cake is never far behind the better baseline in any cell.
#include <filesystem>
#include <regex>

#include "tests/integration/fixture.h"

using namespace cake::testing;

namespace {

std::vector<double> Fields(const std::string& json, const std::string& name) {
  std::vector<double> values;
  const std::regex pattern("\"" + name + "\": ([-0-9.e+]+)");
  for (auto it = std::sregex_iterator(json.begin(), json.end(), pattern); it != std::sregex_iterator(); ++it) {
    values.push_back(std::stod((*it)[1].str()));
  }
  return values;
}

}  // namespace

TEST_CASE("cake-bench grid runs a few cells and Cake is never far behind the better baseline", "[grid]") {
  const std::string json = "/tmp/cake-grid-smoke-" + std::to_string(getpid()) + ".json";
  auto result = Run(std::string(CAKE_BENCH_PATH) +
                    " grid --tokens 2048 --bandwidths 7,56 --utils 0.25,1 --time-scale 2 --repeats 3 --json " + json);
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  std::ifstream in(json);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(json.c_str());
  const auto compute = Fields(text, "ttft_compute_s");
  const auto io = Fields(text, "ttft_io_s");
  const auto cake = Fields(text, "ttft_cake_s");
  const auto oracle = Fields(text, "ttft_oracle_s");
  REQUIRE(compute.size() == 4);
  REQUIRE(io.size() == 4);
  REQUIRE(cake.size() == 4);
  REQUIRE(oracle.size() == 4);
  for (size_t i = 0; i < cake.size(); ++i) {
    INFO("cell " << i << ": compute " << compute[i] << " io " << io[i] << " cake " << cake[i] << " oracle "
                 << oracle[i]);
    CHECK(oracle[i] > 0);
    CHECK(oracle[i] <= std::min(compute[i], io[i]) * 1.05);  // the oracle is a lower bound, up to timing noise
    // A smoke check, not a figure (section 5 of docs/benchmarks.md has those): 50% and 30 ms of room for a busy
    // or instrumented build (ASan) on cells that last tens of milliseconds, on the median of 3 runs per cell as
    // the bench reports it (with 30% and 20 ms it failed twice: one run alone, 0.129 s against 0.074, beside a
    // parallel clang build; once beside pip installs). A Cake that did not overlap at all would take the sum,
    // about twice the better baseline in the balanced cells, which this still catches.
    CHECK(cake[i] <= std::min(compute[i], io[i]) * 1.5 + 0.03);
  }
  CHECK(result.output.find("Cake's speedup over I/O-only / over compute-only") != std::string::npos);
}

TEST_CASE("cake-bench concurrent, adaptive, fluctuate, tiers and overhead run small and report", "[grid][bench]") {
  const std::string bench(CAKE_BENCH_PATH);
  auto concurrent = Run(bench + " concurrent --requests 4 --max-tokens 2048 --time-scale 4");
  INFO(concurrent.output);
  CHECK(concurrent.exit_code == 0);
  CHECK(concurrent.output.find("srf") != std::string::npos);

  auto adaptive = Run(bench + " adaptive --cached-tokens 2048 --short-requests 4 --time-scale 4");
  INFO(adaptive.output);
  CHECK(adaptive.exit_code == 0);
  CHECK(adaptive.output.find("adaptive (uncached first)") != std::string::npos);

  const std::string prefix = "/tmp/cake-fluctuate-smoke-" + std::to_string(getpid());
  auto fluctuate = Run(bench + " fluctuate --tokens 2048 --time-scale 2 --out " + prefix);
  INFO(fluctuate.output);
  CHECK(fluctuate.exit_code == 0);
  std::ifstream csv(prefix + ".csv");
  std::string header;
  CHECK(std::getline(csv, header));
  CHECK(header == "t_s,engine_tokens,loaded_from_token,gbps,budget");
  std::remove((prefix + ".csv").c_str());
  std::remove((prefix + ".png").c_str());

  const std::string tiers_dir = "/tmp/cake-tiers-smoke-" + std::to_string(getpid());
  auto tiers = Run(bench + " tiers --mib 8 --runs 1 --dir " + tiers_dir);
  INFO(tiers.output);
  CHECK(tiers.exit_code == 0);
  CHECK(tiers.output.find("half in each") != std::string::npos);
  std::filesystem::remove_all(tiers_dir);

  // The queue bench's prefetch runs reads from DRAM what its runs without read from disk (no timing checked).
  const std::string queue_dir = "/tmp/cake-queue-smoke-" + std::to_string(getpid());
  const std::string queue_json = queue_dir + ".json";
  auto queue = Run(bench + " queue --requests 4 --prompt-mib 2 --arrival-ms 20 --decode-ms 60 --rounds 1 --dir " +
                   queue_dir + " --json " + queue_json);
  INFO(queue.output);
  CHECK(queue.exit_code == 0);
  CHECK(queue.output.find("with prefetch:") != std::string::npos);
  std::ifstream queue_in(queue_json);
  const std::string queue_text((std::istreambuf_iterator<char>(queue_in)), std::istreambuf_iterator<char>());
  CHECK(queue_text.find("\"chunks_planned_from_dram_without\": 0") != std::string::npos);
  CHECK(queue_text.find("\"prefetch_chunks_used\": 0\n") == std::string::npos);  // some were used
  std::filesystem::remove_all(queue_dir);
  std::remove(queue_json.c_str());

  auto overhead = Run(bench + " overhead --loads 2 --chunks 64");
  INFO(overhead.output);
  CHECK(overhead.exit_code == 0);
  CHECK(overhead.output.find("daemon CPU per chunk") != std::string::npos);
}

TEST_CASE("cake-bench remote and mixed run small against a real redis-server and report", "[grid][bench][remote]") {
  const std::string bench = CAKE_BENCH_PATH;
  const std::string json = "/tmp/cake-remote-smoke-" + std::to_string(getpid()) + ".json";
  auto remote = Run(bench + " remote --mib 16 --chunk-mib 4 --part-kib 1024 --runs 1 --json " + json);
  INFO(remote.output);
  REQUIRE(remote.exit_code == 0);
  std::ifstream in(json);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto remote_gbps = Fields(text, "remote_gbps");
  const auto benchmark_gbps = Fields(text, "redis_benchmark_gbps");
  REQUIRE(remote_gbps.size() == 1);
  REQUIRE(benchmark_gbps.size() == 1);
  CHECK(remote_gbps[0] > 0);
  CHECK(benchmark_gbps[0] > 0);
  std::remove(json.c_str());

  // Cake over three tiers at once beats the one tier holding the whole prefix; a wide margin for a loaded machine.
  const std::string dir = "/tmp/cake-mixed-smoke-" + std::to_string(getpid());
  auto mixed = Run(bench + " mixed --tokens 4096 --remote-gbps 7 --time-scale 2 --json " + json + " --dir " + dir);
  INFO(mixed.output);
  REQUIRE(mixed.exit_code == 0);
  std::ifstream mixed_in(json);
  const std::string mixed_text((std::istreambuf_iterator<char>(mixed_in)), std::istreambuf_iterator<char>());
  const auto ratio = Fields(mixed_text, "mixed_over_remote_oracle");
  REQUIRE(ratio.size() == 1);
  CHECK(ratio[0] < 0.9);
  std::remove(json.c_str());
  std::filesystem::remove_all(dir);
}

TEST_CASE("cake-bench codec runs small on a disk and a real redis-server: bit-exact loads, a smaller store",
          "[grid][bench][codec]") {
  const std::string bench = CAKE_BENCH_PATH;
  const std::string dir = "/tmp/cake-codec-smoke-" + std::to_string(getpid());
  const std::string json = dir + ".json";
  std::filesystem::create_directories(dir);
  auto codec = Run(bench + " codec --mib 23 --runs 1 --dir " + dir + " --json " + json);
  INFO(codec.output);
  REQUIRE(codec.exit_code == 0);  // every loaded byte was checked against what was stored
  std::ifstream in(json);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* field : {"ratio", "disk_stored_ratio", "remote_stored_ratio"}) {
    INFO(field);
    const auto values = Fields(text, field);
    REQUIRE(values.size() == 1);
    CHECK(values[0] > 1.2);  // synthetic bf16 KV: about 1.43
  }
  for (const char* field : {"disk_codec_gbps", "remote_codec_gbps", "disk_daemon_decode_gbps"}) {
    INFO(field);
    const auto values = Fields(text, field);
    REQUIRE(values.size() == 1);
    CHECK(values[0] > 0);
  }
  std::remove(json.c_str());

  // The lossy precisions: every chunk loaded from disk is byte for byte what the codec gives (the bench checks).
  auto lossy = Run(bench + " codec --lossy --mib 23 --runs 1 --dir " + dir + " --json " + json);
  INFO(lossy.output);
  REQUIRE(lossy.exit_code == 0);
  std::ifstream lossy_in(json);
  const std::string lossy_text((std::istreambuf_iterator<char>(lossy_in)), std::istreambuf_iterator<char>());
  for (const char* field : {"lossy_exact_gbps", "lossy_int8_gbps", "lossy_int4_gbps"}) {
    INFO(field);
    const auto values = Fields(lossy_text, field);
    REQUIRE(values.size() == 1);
    CHECK(values[0] > 0);
  }
  std::remove(json.c_str());
  std::filesystem::remove_all(dir);
}

TEST_CASE("cake-bench engine and engine-curve run small, bit-exact", "[grid][bench][engine]") {
  const std::string bench(CAKE_BENCH_PATH);
  const std::string tiny = " --layers 2 --hidden 128 --heads 4 --kv-heads 2 --intermediate 256 --chunk-tokens 32";
  const std::string json = "/tmp/cake-engine-smoke-" + std::to_string(getpid()) + ".json";
  auto engine = Run(bench + " engine" + tiny + " --tokens 256 --load-ratios 1 --sweep-step 2 --json " + json);
  INFO(engine.output);
  REQUIRE(engine.exit_code == 0);
  std::ifstream in(json);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(json.c_str());
  for (const char* field : {"ttft_compute_s", "ttft_io_s", "ttft_cake_s", "ttft_best_forced_s", "throttle_gbps"}) {
    CAPTURE(field);
    const auto values = Fields(text, field);
    REQUIRE(values.size() == 1);
    CHECK(values[0] > 0);
  }
  CHECK(text.find("\"bitexact\": true") != std::string::npos);
  CHECK(text.find("\"all_bitexact\": true") != std::string::npos);
  // The best forced split is the best of a sweep that includes both baselines' splits (up to timing noise).
  CHECK(Fields(text, "ttft_best_forced_s")[0] <=
        std::min(Fields(text, "ttft_compute_s")[0], Fields(text, "ttft_io_s")[0]) * 1.3);

  const std::string prefix = "/tmp/cake-curve-smoke-" + std::to_string(getpid());
  auto curve = Run(bench + " engine-curve" + tiny +
                   " --large-layers 2 --large-hidden 256 --large-heads 4 --large-kv-heads 2 --large-intermediate 512"
                   " --tokens 256 --out " +
                   prefix);
  INFO(curve.output);
  CHECK(curve.exit_code == 0);
  CHECK(std::filesystem::exists(prefix + ".csv"));
  std::filesystem::remove(prefix + ".csv");
  std::filesystem::remove(prefix + ".png");
  CHECK(curve.output.find("R^2") != std::string::npos);
}
