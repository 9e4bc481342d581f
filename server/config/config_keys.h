// Every key of caked's configuration, described once: its table and name, the DaemonConfig field it sets, the
// range a value must fall in, its command-line flag (if any) and what it means. The TOML reader
// (LoadConfigFile), the writer (FormatConfig, caked --print-config) and the flags (server/config/config_flags.h) are
// all driven by this one list, so a key cannot be read but not written, or flagged under another range.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "scheduler/arbiter_policy.h"
#include "storage/chunk_codec.h"
#include "storage/io/io_backend.h"

namespace cake {

struct DaemonConfig;

// Where a key's value lives in a DaemonConfig, by its type.
using ConfigField =
    std::variant<uint32_t& (*)(DaemonConfig&), uint64_t& (*)(DaemonConfig&), double& (*)(DaemonConfig&),
                 bool& (*)(DaemonConfig&), std::string& (*)(DaemonConfig&),
                 std::vector<std::string>& (*)(DaemonConfig&), std::vector<int>& (*)(DaemonConfig&),
                 IoBackend& (*)(DaemonConfig&), ArbiterPolicy& (*)(DaemonConfig&), ChunkCodec& (*)(DaemonConfig&)>;

struct ConfigKey {
  std::string_view table;  // "loader"
  std::string_view name;   // "window": the key is loader.window
  ConfigField field;
  // Numbers (and each number of a list): the accepted range, inclusive. Every bound is exact as a double.
  double min = 0;
  double max = 0;
  // The flag that overrides the file, "" for none. A bool's flag comes in two: --dram-prefault, --no-dram-prefault.
  std::string_view flag;
  std::string_view help;
  // The flag's value is shifted left this many bits (--dram-capacity-mib: 20, into capacity_bytes).
  unsigned flag_shift = 0;
  bool secret = false;  // written masked by FormatConfig
};

// The keys, table by table, in the order deploy/caked.toml and caked --print-config list them.
std::span<const ConfigKey> ConfigKeys();

// The tables of the file, in that order ("access" included: its [[access.principal]] entries are read apart).
std::span<const std::string_view> ConfigTables();

// "loader.window".
std::string FullKeyName(const ConfigKey& key);

}  // namespace cake
