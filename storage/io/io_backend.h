// Which system call family reads the disk tier: chosen in the config, parsed once at start-up.
#pragma once

#include <optional>
#include <string_view>

namespace cake {

enum class IoBackend {
  kAuto,   // io_uring when a ring can be created, else pread (logged)
  kUring,  // io_uring or fail
  kPread,  // plain pread(2), one call at a time
};
const char* IoBackendName(IoBackend backend);  // for logs: "auto", "io_uring", "pread"
// The config's spelling: "auto", "uring", "pread".
std::optional<IoBackend> ParseIoBackend(std::string_view name);

}  // namespace cake
