// A test engine that registers a region, starts a load and dies with the stream open: the daemon must notice
// and free what the load held. Run by the integration suite as its own process (gRPC does not survive fork).
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "client/client.h"

int main(int argc, char** argv) {
  if (argc != 4) return 64;
  const std::string socket = argv[1];
  const uint32_t chunk_tokens = static_cast<uint32_t>(std::atoi(argv[2]));
  const uint32_t chunks = static_cast<uint32_t>(std::atoi(argv[3]));
  auto client = cake::Client::Connect({socket, "engine-vanishing"});
  if (!client.ok()) return 2;
  cake::NamespaceSpec ns;
  ns.model_id = "test/small";
  ns.num_layers = 2;
  ns.num_kv_heads = 2;
  ns.head_dim = 64;
  ns.dtype = cake::DType::kBf16;
  ns.chunk_tokens = chunk_tokens;
  ns.tenant = "tenant-a";
  auto region = (*client)->RegisterRegion(uint64_t{chunks} * chunk_tokens * 1024);
  if (!region.ok()) return 3;
  std::vector<uint32_t> tokens(size_t{chunks} * chunk_tokens);
  // Same generator as tests/integration/fixture.h Tokens(n, 1).
  uint32_t x = 2654435761u + 1;
  for (auto& v : tokens) {
    x = x * 1664525u + 1013904223u;
    v = x % 128000;
  }
  cake::LoadOptions options{ns, {tokens, {}}, &*region};
  options.io_only = true;
  auto session = (*client)->StartLoad(options);
  if (!session.ok()) return 4;
  auto plan = (*session)->WaitPlan();
  if (!plan.ok() || plan->cached_chunks != chunks) return 5;
  _exit(0);  // no Release, no clean close
}
