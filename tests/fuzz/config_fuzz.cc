// libFuzzer target: any caked.toml an operator (or a typo) writes is a valid configuration or an INVALID_ARGUMENT
// naming the problem; the parser and the checks never crash.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "server/config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/cake-config-fuzz-" + std::to_string(getpid()) + ".toml";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  auto config = cake::LoadConfigFile(path, cake::DefaultConfig());
  if (config.ok()) {
    (void)cake::ValidateConfig(*config);
  } else if (config.status().code() != absl::StatusCode::kInvalidArgument) {
    __builtin_trap();  // every mistake in a file is the operator's to fix: INVALID_ARGUMENT
  }
  return 0;
}
