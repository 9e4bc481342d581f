// cake-bench: benchmarks and the demo engine, each driving a real caked (see bench/benchmarks.h).
#include <cstdio>

#include "CLI/CLI.hpp"
#include "bench/benchmarks.h"

namespace {

void AddCommonOptions(CLI::App* command, cake::bench::CommonOptions& common) {
  command->add_option("--socket", common.socket_path,
                      "unix socket of a running caked (default: start a private caked from next to cake-bench)");
  command->add_option("--json", common.json_path, "also write the results to this file as one JSON object");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cake-bench: benchmarks and the demo engine for caked"};
  app.require_subcommand(1);

  cake::bench::LookupBenchOptions lookup;
  CLI::App* lookup_command =
      app.add_subcommand("lookup", "Lookup latency of 16K- and 128K-token prompts beside a trivial unary call");
  AddCommonOptions(lookup_command, lookup.common);
  lookup_command->add_option("--iterations", lookup.iterations, "measured calls of each kind")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1000000u));

  cake::bench::RegionBenchOptions region;
  CLI::App* region_command =
      app.add_subcommand("region", "I/O-only load throughput from the DRAM tier into a region, beside memcpy");
  AddCommonOptions(region_command, region.common);
  region_command->add_option("--mib", region.mib, "bytes of prefix to load, in MiB (whole 32 MiB chunks)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{32}, uint64_t{1} << 20));
  region_command->add_option("--runs", region.runs, "measured runs of each")
      ->capture_default_str()
      ->check(CLI::Range(1u, 10000u));

  cake::bench::DemoOptions demo;
  CLI::App* demo_command = app.add_subcommand(
      "demo", "simulated engine: compute-only, I/O-only and Cake time to first token for one cached prompt");
  AddCommonOptions(demo_command, demo.common);
  demo_command->add_option("--read-gbps", demo.read_gbps, "the daemon's DRAM read cap in Gbit/s (--dram-read-gbps)")
      ->capture_default_str();
  demo_command->add_option("--tokens", demo.tokens, "prompt length, a multiple of 256")->capture_default_str();
  demo_command->add_option("--model", demo.model, "longalpaca-7b, longalpaca-13b, llama3.1-8b or llama3.1-70b")
      ->capture_default_str();
  demo_command->add_option("--gpu-tflops", demo.gpu_tflops,
                           "effective prefill TFLOP/s (default: as fast as loading, i.e. balanced)");

  CLI11_PARSE(app, argc, argv);

  absl::Status status;
  if (lookup_command->parsed()) {
    status = cake::bench::RunLookupBench(lookup);
  } else if (region_command->parsed()) {
    status = cake::bench::RunRegionBench(region);
  } else {
    status = cake::bench::RunDemo(demo);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "cake-bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
