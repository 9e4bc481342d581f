// HealthService's peer key: what its per-peer Watch cap counts, the same peers the ConnectionGate counts.
#include "server/edge/health_service.h"

#include <catch2/catch.hpp>

namespace cake {

TEST_CASE("health: a Watch is counted under its connection's peer, as the connection gate counts TCP peers",
          "[health]") {
  CHECK(GatePeerOfCall("ipv4:10.0.0.7:41234", nullptr) == "10.0.0.7");
  CHECK(GatePeerOfCall("ipv4:127.0.0.3:41234", nullptr) == "loopback");
  CHECK(GatePeerOfCall("ipv6:[::1]:41234", nullptr) == "loopback");
  CHECK(GatePeerOfCall("ipv6:%5B2001:db8::1%5D:41234", nullptr) == "2001:db8::/64");
  // A unix connection the listener did not record shares one key: it cannot make itself many peers.
  CHECK(GatePeerOfCall("fd:17", nullptr) == "unix peer unknown");
  CHECK(GatePeerOfCall("fd:18", nullptr) == GatePeerOfCall("fd:17", nullptr));
}

}  // namespace cake
