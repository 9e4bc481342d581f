// Which system call family reads the disk tier: chosen in the config, parsed once at start-up.
#pragma once

#include <optional>
#include <string_view>

#include "base/enum_names.h"

namespace cake {

enum class IoBackend {
  kAuto,   // io_uring when a ring can be created, else pread (logged)
  kUring,  // io_uring or fail
  kPread,  // plain pread(2), one call at a time
};
// The config's spelling (disk.io_backend, --disk-io-backend).
inline constexpr EnumName<IoBackend> kIoBackendWords[] = {
    {IoBackend::kAuto, "auto"}, {IoBackend::kUring, "uring"}, {IoBackend::kPread, "pread"}};
constexpr const char* IoBackendWord(IoBackend backend) { return NameIn(kIoBackendWords, backend, "auto"); }
constexpr std::optional<IoBackend> ParseIoBackend(std::string_view name) { return ValueIn(kIoBackendWords, name); }
// For logs: the config's word, io_uring spelled out as the kernel's interface is named.
constexpr const char* IoBackendName(IoBackend backend) {
  return backend == IoBackend::kUring ? "io_uring" : IoBackendWord(backend);
}

}  // namespace cake
