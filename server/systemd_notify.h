// sd_notify without libsystemd: one datagram to $NOTIFY_SOCKET (READY=1, STOPPING=1, WATCHDOG=1).
#pragma once

#include <chrono>
#include <optional>
#include <string_view>

namespace cake {

// Does nothing when not started by systemd (no NOTIFY_SOCKET).
void NotifySystemd(std::string_view state);

// The watchdog interval systemd asked for (WatchdogSec=), if any.
std::optional<std::chrono::microseconds> SystemdWatchdogInterval();

}  // namespace cake
