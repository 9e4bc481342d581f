// Access through the C++ client against a real caked with principals: the test process (root or the daemon's
// own user) is the implicit operator, which may administer and monitor but is no engine; every refusal is the
// right status and changes nothing. python/tests/test_access.py calls as other users (setuid children).
#include <filesystem>

#include "tests/integration/fixture.h"

using namespace cake;
using namespace cake::testing;

TEST_CASE("with principals, the daemon's own user administers but is no engine", "[access]") {
  char dir[] = "/tmp/cake-access-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string config = WriteFile(dir, "caked.toml",
                                       "[[access.principal]]\nname = \"engine-a\"\nunix_uids = [61001]\n"
                                       "tenants = [\"a\"]\nroles = [\"engine\"]\n");
  SpawnedDaemon daemon = StartDaemon({"--config", config});
  std::filesystem::remove_all(dir);
  auto client = Connect(daemon, "operator-tool");

  CHECK(client->Ping().ok());
  auto status = client->Status();
  CHECK(status.ok());
  CHECK(client->Stats().ok());
  CHECK(client->Evict(TierKind::kDram).ok());

  const NamespaceSpec ns = SmallNamespace(16, "a");
  const std::vector<uint32_t> tokens = Tokens(64);
  auto lookup = client->Lookup(ns, PromptRef{tokens, {}});
  CHECK(lookup.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(lookup.status().message()), Catch::Contains("engine role"));
  auto region = client->RegisterRegion(1 << 16);
  CHECK(region.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(daemon.log(), Catch::Contains("1 principal(s) (engine-a)"));
}
