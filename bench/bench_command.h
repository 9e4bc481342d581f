// How a bench becomes a cake-bench subcommand: each bench file's Add<Name>Command (declared in
// bench/benchmarks.h) adds its subcommand and flags with these, and bench/main.cc only adds the commands and parses.
#pragma once

#include <cstdio>
#include <memory>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "bench/benchmarks.h"

namespace cake::bench {

// --socket and --json, for the benches that can use a running caked.
inline void AddCommonOptions(CLI::App* command, CommonOptions& common) {
  command->add_option("--socket", common.socket_path,
                      "unix socket of a running caked (default: start a private caked from next to cake-bench)");
  command->add_option("--json", common.json_path, "also write the results to this file as one JSON object");
}

// Runs `bench` on the parsed `options` once the command line is parsed, if `command` is the subcommand given
// (the options live as long as the command's callback). A failure is printed as "cake-bench: <status>" and
// cake-bench exits 1: CLI11_PARSE returns a CLI::RuntimeError's exit code and prints nothing for it.
template <typename Options>
void RunWhenParsed(CLI::App* command, std::shared_ptr<Options> options, absl::Status (*bench)(const Options&)) {
  command->callback([options = std::move(options), bench] {
    if (const absl::Status status = bench(*options); !status.ok()) {
      std::fprintf(stderr, "cake-bench: %s\n", status.ToString().c_str());
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace cake::bench
