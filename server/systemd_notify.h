// sd_notify without libsystemd: one datagram to $NOTIFY_SOCKET (READY=1, STOPPING=1, WATCHDOG=1).
#pragma once

#include <chrono>
#include <optional>
#include <string_view>

namespace cake {

// Does nothing when not started by systemd (no NOTIFY_SOCKET).
void NotifySystemd(std::string_view state);

// Log lines for where they go: under systemd (stdout is the journal: $JOURNAL_STREAM) each line starts with its
// syslog priority ("<3>" for errors) and carries no timestamp of its own, so `journalctl -p err` finds errors;
// on a terminal or in a file, a timestamp and the level's name.
void ConfigureLogFormat();

// The watchdog interval systemd asked for (WatchdogSec=), if any.
std::optional<std::chrono::microseconds> SystemdWatchdogInterval();

}  // namespace cake
