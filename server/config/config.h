// caked's configuration: embedded defaults, then a TOML file, then command-line flags, in that order; read,
// written back and checked here (the values themselves: daemon_config.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/arbiter_policy.h"
#include "server/config/daemon_config.h"
#include "storage/io/io_backend.h"

namespace cake {

// The embedded defaults, with run_dir resolved for the current user.
DaemonConfig DefaultConfig();

// Overlays a TOML file onto `base`. A missing key keeps its value; an unknown key, a wrong type or a value out of
// range is an INVALID_ARGUMENT naming the key, so a typo never silently runs with defaults.
absl::StatusOr<DaemonConfig> LoadConfigFile(const std::string& path, DaemonConfig base);

// The configuration as TOML that LoadConfigFile reads back (caked --print-config, cakectl config): every key,
// defaults included, the socket resolved. Secrets (remote.password, keys.secret) are masked; files that hold
// secrets are named by path only.
std::string FormatConfig(const DaemonConfig& config);

// Whether a tcp.listen address names a loopback host (127.0.0.1, [::1], localhost).
bool IsLoopbackListenAddress(std::string_view address);

// Reads a secret (a password, a token) from a file that only its owner may read: a file group or others can read,
// or that belongs to a user other than root and this process's, is refused (FAILED_PRECONDITION naming it).
// Trailing newlines are dropped.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, std::string_view what);

// Reads the secrets the configuration names by file or environment into it, the last step of building it (so a
// secret it cannot read stops start-up, --check-config included, and the tiers are built from values alone):
// remote.password_file into remote.password, then $CAKE_REMOTE_PASSWORD over both. (The TLS key stays a file: its
// provider re-reads it when certificates rotate.)
absl::Status ReadConfigSecrets(DaemonConfig& config);

// Checks cross-field rules (e.g. the window fits the I/O queue).
absl::Status ValidateConfig(const DaemonConfig& config);

// The config's words for the enum-valued options, parsed where they are read (file or flag): an unknown word is
// an INVALID_ARGUMENT naming `where` (the key or the flag) and the accepted words.
absl::StatusOr<IoBackend> ParseIoBackendOption(std::string_view word, std::string_view where);
absl::StatusOr<ArbiterPolicy> ParseArbiterOption(std::string_view word, std::string_view where);
absl::StatusOr<ChunkCodec> ParseChunkCodecOption(std::string_view word, std::string_view where);

}  // namespace cake
