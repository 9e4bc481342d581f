// cake-bench: the benchmarks, each driving a real caked (see bench/benchmarks.h); the demo is cake-demo
// (examples/demo). Each subcommand, its flags and its run are its bench's Add...Command; the order here is the
// order --help lists them in.
#include <string>

#include "CLI/CLI.hpp"
#include "bench/benchmarks.h"

int main(int argc, char** argv) {
  CLI::App app{"cake-bench: benchmarks for caked"};
  app.set_version_flag("--version", std::string("cake-bench ") + CAKE_VERSION);
  app.require_subcommand(1);
  cake::bench::AddLookupCommand(app);
  cake::bench::AddRegionCommand(app);
  cake::bench::AddClientLoadCommand(app);
  cake::bench::AddEngineCommand(app);
  cake::bench::AddEngineCurveCommand(app);
  cake::bench::AddIoCommand(app);
  cake::bench::AddRebuildCommand(app);
  cake::bench::AddStoreCommand(app);
  cake::bench::AddGridCommand(app);
  cake::bench::AddOverheadCommand(app);
  cake::bench::AddConcurrentCommand(app);
  cake::bench::AddFluctuateCommand(app);
  cake::bench::AddAdaptiveCommand(app);
  cake::bench::AddQueueCommand(app);
  cake::bench::AddTiersCommand(app);
  cake::bench::AddCodecCommand(app);
  cake::bench::AddRemoteCommand(app);
  cake::bench::AddMixedCommand(app);
  cake::bench::AddSoakCommand(app);
  cake::bench::AddScaleCommand(app);
  cake::bench::AddFleetCommand(app);
  // The subcommand given runs in its callback, at the end of the parse; a failure exits 1 (bench/bench_command.h).
  CLI11_PARSE(app, argc, argv);
  return 0;
}
