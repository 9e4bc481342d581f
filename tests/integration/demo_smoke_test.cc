// cake-demo runs small on both of its engines, each against a private caked it starts from next to itself, so the
// demo scripts/demo shows does not rot between the runs of scripts/demo.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/integration/fixture.h"

using namespace cake::testing;

TEST_CASE("cake-demo with the real engine runs small, bit-exact", "[demo]") {
  const std::string tiny = " --layers 2 --hidden 128 --heads 4 --kv-heads 2 --intermediate 256 --chunk-tokens 32";
  auto demo =
      Run(std::string(CAKE_DEMO_PATH) + tiny + " --real-tokens 300 --prompt-file " + CAKE_SOURCE_DIR + "/README.md");
  INFO(demo.output);
  CHECK(demo.exit_code == 0);
  CHECK(demo.output.find("identical to full compute's in every mode: yes") != std::string::npos);
}

TEST_CASE("cake-demo with the simulated engine runs small and checks every loaded chunk", "[demo]") {
  const std::string json = "/tmp/cake-demo-smoke-" + std::to_string(getpid()) + ".json";
  auto demo = Run(std::string(CAKE_DEMO_PATH) + " --engine simulated --tokens 1024 --read-gbps 16 --json " + json);
  INFO(demo.output);
  CHECK(demo.exit_code == 0);
  CHECK(demo.output.find("verified: every loaded chunk matched its pattern byte for byte") != std::string::npos);
  std::ifstream in(json);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(json.c_str());
  CHECK(text.find("\"chunks\": 4") != std::string::npos);
  CHECK(text.find("\"cake_s\": ") != std::string::npos);
}

TEST_CASE("cake-demo refuses an engine it does not have", "[demo]") {
  auto demo = Run(std::string(CAKE_DEMO_PATH) + " --engine quantum");
  INFO(demo.output);
  CHECK(demo.exit_code == 1);
  CHECK(demo.output.find("--engine quantum: expected real or simulated") != std::string::npos);
}
