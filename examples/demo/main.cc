// cake-demo's command line (what the demo does is in examples/demo/demo.h): the options `cake-bench demo` had,
// unchanged, so a command line that ran the demo there needs only the program's name changed.
#include <cstdio>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "examples/demo/demo.h"

int main(int argc, char** argv) {
  cake::demo::DemoOptions demo;
  CLI::App app{
      "cake-demo: compute-only, I/O-only and Cake time to first token for one cached prompt, real or "
      "simulated engine"};
  app.add_option("--socket", demo.socket_path,
                 "unix socket of a running caked (default: start a private caked from next to cake-demo)");
  app.add_option("--json", demo.json_path, "also write the results to this file as one JSON object");
  app.add_option("--engine", demo.engine, "real (the CPU transformer) or simulated (the cost model)")
      ->capture_default_str();
  app.add_option("--read-gbps", demo.read_gbps,
                 "the read cap in Gbit/s (simulated: DRAM, 16; real: the disk tier's, set so loading the prompt "
                 "takes as long as computing it)");
  app.add_option("--tokens", demo.tokens, "simulated: prompt length, a multiple of 256")->capture_default_str();
  app.add_option("--prompt-file", demo.prompt_file, "real: the prompt is this file's bytes");
  app.add_option("--real-tokens", demo.real_tokens, "real: prompt length in tokens")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 20));
  cake::engine::AddModelOptions(&app, demo.engine_model);
  app.add_option("--model", demo.model, "longalpaca-7b, longalpaca-13b, llama3.1-8b or llama3.1-70b")
      ->capture_default_str();
  app.add_option("--gpu-tflops", demo.gpu_tflops,
                 "effective prefill TFLOP/s (default: as fast as loading, i.e. balanced)");
  CLI11_PARSE(app, argc, argv);

  absl::Status status;
  if (demo.engine == "real") {
    status = cake::demo::RunRealEngineDemo(demo);
  } else if (demo.engine == "simulated") {
    status = cake::demo::RunSimulatedDemo(demo);
  } else {
    status = absl::InvalidArgumentError(absl::StrCat("--engine ", demo.engine, ": expected real or simulated"));
  }
  if (!status.ok()) {
    std::fprintf(stderr, "cake-demo: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
