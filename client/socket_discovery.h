// Which daemon socket a client uses when it is not told (socket_discovery.cc); an internal header of cake_client.
#pragma once

#include <chrono>
#include <string>

#include "absl/status/statusor.h"

namespace cake {

// $CAKE_SOCKET as given, else ChooseDaemonSocket's pick; while no socket exists at all (a daemon starting alongside
// this engine), looks again until `deadline`.
absl::StatusOr<std::string> FindDaemonSocket(std::chrono::system_clock::time_point deadline);

}  // namespace cake
