#include "server/config.h"

#include <toml++/toml.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/io_pool.h"

namespace cake {

std::string DaemonConfig::socket_path() const { return socket.empty() ? run_dir + "/caked.sock" : socket; }

DaemonConfig DefaultConfig() {
  DaemonConfig c;
  if (geteuid() == 0) {
    c.run_dir = "/run/cake";
  } else if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && *xdg != '\0') {
    c.run_dir = absl::StrCat(xdg, "/cake");
  } else {
    c.run_dir = absl::StrCat("/tmp/cake-", geteuid());
  }
  return c;
}

namespace {

// Reads one table of the file, remembering which keys it used so the rest can be reported as unknown.
class TableReader {
 public:
  TableReader(const toml::table& root, std::string name) : name_(std::move(name)) {
    if (const toml::node* n = root.get(name_)) {
      table_ = n->as_table();
      if (table_ == nullptr) error_ = absl::InvalidArgumentError(absl::StrCat("[", name_, "] must be a table"));
    }
  }

  // A word naming one of an enum's values, parsed here so the rest of the daemon sees only the enum.
  template <typename Enum>
  void Word(const char* key, Enum* out, absl::StatusOr<Enum> (*parse)(std::string_view, std::string_view)) {
    if (const toml::node* n = Find(key)) {
      auto v = n->value<std::string>();
      if (!v) return Fail(key, "a string");
      auto parsed = parse(*v, absl::StrCat(name_, ".", key));
      if (parsed.ok()) {
        *out = *parsed;
      } else if (error_.ok()) {
        error_ = parsed.status();
      }
    }
  }

  void String(const char* key, std::string* out) {
    if (const toml::node* n = Find(key)) {
      if (auto v = n->value<std::string>()) {
        *out = *v;
      } else {
        Fail(key, "a string");
      }
    }
  }
  void StringList(const char* key, std::vector<std::string>* out) {
    if (const toml::node* n = Find(key)) {
      const toml::array* list = n->as_array();
      std::vector<std::string> values;
      if (list != nullptr) {
        for (const toml::node& item : *list) {
          auto v = item.value<std::string>();
          if (!v) {
            list = nullptr;
            break;
          }
          values.push_back(*v);
        }
      }
      if (list == nullptr) {
        Fail(key, "a list of strings");
      } else {
        *out = std::move(values);
      }
    }
  }
  void UnsignedList(const char* key, std::vector<int>* out, int max) {
    if (const toml::node* n = Find(key)) {
      const toml::array* list = n->as_array();
      std::vector<int> values;
      if (list != nullptr) {
        for (const toml::node& item : *list) {
          auto v = item.is_integer() ? item.value<int64_t>() : std::nullopt;
          if (!v || *v < 0 || *v > max) {
            list = nullptr;
            break;
          }
          values.push_back(static_cast<int>(*v));
        }
      }
      if (list == nullptr) {
        Fail(key, absl::StrCat("a list of integers from 0 to ", max));
      } else {
        *out = std::move(values);
      }
    }
  }
  void Bool(const char* key, bool* out) {
    if (const toml::node* n = Find(key)) {
      if (auto v = n->value_exact<bool>()) {
        *out = *v;
      } else {
        Fail(key, "true or false");
      }
    }
  }
  template <typename T>
  void Unsigned(const char* key, T* out, uint64_t min, uint64_t max) {
    if (const toml::node* n = Find(key)) {
      // Only a TOML integer: value<int64_t>() alone would also turn `true` or `4.0` into a number.
      auto v = n->is_integer() ? n->value<int64_t>() : std::nullopt;
      if (!v || *v < 0 || static_cast<uint64_t>(*v) < min || static_cast<uint64_t>(*v) > max) {
        Fail(key, absl::StrCat("an integer from ", min, " to ", max));
      } else {
        *out = static_cast<T>(*v);
      }
    }
  }
  void Double(const char* key, double* out, double min, double max) {
    if (const toml::node* n = Find(key)) {
      auto v = n->is_number() ? n->value<double>() : std::nullopt;  // integers convert too; booleans do not
      if (!v || !(*v >= min && *v <= max)) {                        // written so that nan fails too
        Fail(key, absl::StrCat("a number from ", min, " to ", max));
      } else {
        *out = *v;
      }
    }
  }

  absl::Status Finish() {
    if (!error_.ok() || table_ == nullptr) return error_;
    std::vector<std::string> unknown;
    for (const auto& [key, value] : *table_) {
      if (!used_.contains(std::string(key.str()))) unknown.push_back(std::string(key.str()));
    }
    if (!unknown.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown key(s) in [", name_, "]: ", absl::StrJoin(unknown, ", "),
                                                     " (docs/operations.md lists every key)"));
    }
    return absl::OkStatus();
  }

 private:
  const toml::node* Find(const char* key) {
    if (table_ == nullptr) return nullptr;
    used_.insert(key);
    return table_->get(key);
  }
  void Fail(const char* key, const std::string& expected) {
    if (error_.ok()) {
      error_ = absl::InvalidArgumentError(absl::StrCat(name_, ".", key, " must be ", expected));
    }
  }

  std::string name_;
  const toml::table* table_ = nullptr;
  std::set<std::string> used_;
  absl::Status error_;
};

}  // namespace

absl::StatusOr<DaemonConfig> LoadConfigFile(const std::string& path, DaemonConfig c) {
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    return absl::InvalidArgumentError(absl::StrCat("config ", path, " line ", where.line, " column ", where.column,
                                                   ": ", std::string(e.description())));
  }
  static const std::set<std::string> kTables = {"server", "limits", "dram", "disk", "remote", "cuda", "writeback", "loader", "keys"};
  for (const auto& [key, value] : root) {
    if (!kTables.contains(std::string(key.str()))) {
      return absl::InvalidArgumentError(absl::StrCat("config ", path, ": unknown table [", std::string(key.str()),
                                                     "]; known: server, limits, dram, disk, remote, writeback, loader, keys"));
    }
  }
  constexpr uint64_t kU32 = UINT32_MAX;
  TableReader server(root, "server");
  server.String("run_dir", &c.run_dir);
  server.String("socket", &c.socket);
  server.Unsigned("socket_mode", &c.socket_mode, 0, 0777);
  server.Unsigned("max_message_bytes", &c.max_message_bytes, 1 << 20, INT32_MAX);
  server.Unsigned("transport_memory_bytes", &c.transport_memory_bytes, 2 << 20, uint64_t{1} << 40);
  server.Double("shutdown_grace_s", &c.shutdown_grace_s, 0, 3600);
  server.String("log_level", &c.log_level);
  TableReader limits(root, "limits");
  limits.Unsigned("max_prompt_tokens", &c.max_prompt_tokens, 1, uint64_t{1} << 32);
  limits.Unsigned("max_chunk_bytes", &c.max_chunk_bytes, 1, uint64_t{1} << 40);
  limits.Unsigned("min_chunk_bytes", &c.min_chunk_bytes, 1, uint64_t{1} << 30);
  limits.Unsigned("max_chunk_tokens", &c.max_chunk_tokens, 1, kU32);
  limits.Unsigned("default_chunk_tokens", &c.default_chunk_tokens, 1, kU32);
  limits.Unsigned("max_region_bytes", &c.max_region_bytes, 1, uint64_t{1} << 50);
  limits.Unsigned("max_regions_per_client", &c.max_regions_per_client, 1, kU32);
  limits.Unsigned("max_regions", &c.max_regions, 1, kU32);
  limits.Unsigned("max_total_region_bytes", &c.max_total_region_bytes, 1, uint64_t{1} << 56);
  limits.Unsigned("max_concurrent_loads", &c.max_concurrent_loads, 1, 1 << 20);
  limits.Unsigned("region_lease_ms", &c.region_lease_ms, 100, 86400000);
  TableReader dram(root, "dram");
  dram.Unsigned("capacity_bytes", &c.dram_capacity_bytes, 1, uint64_t{1} << 50);
  dram.Double("read_gbps", &c.dram_read_gbps, 0, 1e6);
  dram.Double("read_burst_us", &c.dram_read_burst_us, 0, 1e6);
  dram.Bool("prefault", &c.dram_prefault);
  dram.Unsigned("promotion_queue_bytes", &c.dram_promotion_queue_bytes, 0, uint64_t{1} << 44);
  TableReader disk(root, "disk");
  disk.String("root", &c.disk_root);
  disk.Unsigned("capacity_bytes", &c.disk_capacity_bytes, 1, uint64_t{1} << 56);
  disk.Unsigned("queue_depth", &c.disk_queue_depth, 1, 4096);
  disk.Word("io_backend", &c.disk_io_backend, ParseIoBackendOption);
  disk.Bool("allow_buffered", &c.disk_allow_buffered);
  disk.Unsigned("recovery_threads", &c.disk_recovery_threads, 1, 1024);
  disk.Double("read_gbps", &c.disk_read_gbps, 0, 1e6);
  TableReader remote(root, "remote");
  remote.StringList("endpoints", &c.remote_endpoints);
  remote.String("user", &c.remote_user);
  remote.String("password", &c.remote_password);
  remote.String("key_prefix", &c.remote_key_prefix);
  remote.Unsigned("part_bytes", &c.remote_part_bytes, 4096, uint64_t{512} << 20);
  remote.Unsigned("connections", &c.remote_connections, 1, 1024);
  remote.Unsigned("connect_timeout_ms", &c.remote_connect_timeout_ms, 1, 600000);
  remote.Unsigned("command_timeout_ms", &c.remote_command_timeout_ms, 1, 600000);
  remote.Unsigned("ttl_s", &c.remote_ttl_s, 0, uint64_t{1} << 31);
  remote.Double("read_gbps", &c.remote_read_gbps, 0, 1e6);
  remote.Bool("promote_to_disk", &c.remote_promote_to_disk);
  TableReader cuda(root, "cuda");
  cuda.Bool("enabled", &c.cuda_enabled);
  cuda.UnsignedList("devices", &c.cuda_devices, 1023);
  cuda.Unsigned("max_region_bytes", &c.cuda_max_region_bytes, 1, uint64_t{1} << 50);
  cuda.Bool("pin_dram", &c.cuda_pin_dram);
  TableReader writeback(root, "writeback");
  writeback.Unsigned("queue_bytes", &c.write_back_queue_bytes, 0, uint64_t{1} << 44);
  TableReader loader(root, "loader");
  loader.Unsigned("window", &c.load_window, 1, 4096);
  loader.Unsigned("max_window", &c.max_load_window, 1, 4096);
  loader.Unsigned("idle_timeout_ms", &c.load_idle_timeout_ms, 50, 86400000);
  loader.Unsigned("max_inline_bytes", &c.max_inline_bytes, 1 << 20, uint64_t{1} << 44);
  loader.Unsigned("io_threads", &c.io_threads, 1, 1024);
  loader.Word("arbiter", &c.arbiter, ParseArbiterOption);
  loader.Unsigned("arbiter_starvation_ms", &c.arbiter_starvation_ms, 1, 3600000);
  TableReader keys(root, "keys");
  keys.String("secret", &c.key_secret);
  for (TableReader* t : {&server, &limits, &dram, &disk, &remote, &cuda, &writeback, &loader, &keys}) {
    if (auto s = t->Finish(); !s.ok())
      return absl::InvalidArgumentError(absl::StrCat("config ", path, ": ", s.message()));
  }
  return c;
}

absl::Status ValidateConfig(const DaemonConfig& c) {
  if (c.run_dir.empty() && c.socket.empty())
    return absl::InvalidArgumentError("server.run_dir or server.socket must be set");
  // Flags bypass the TOML ranges: the ones that would leave the daemon unable to work are checked again here.
  if (c.dram_capacity_bytes == 0) {
    return absl::InvalidArgumentError("dram.capacity_bytes (--dram-capacity-mib) must be positive");
  }
  if (c.io_threads == 0) return absl::InvalidArgumentError("loader.io_threads (--io-threads) must be at least 1");
  if (!(c.dram_read_burst_us >= 0) || !std::isfinite(c.dram_read_burst_us)) {
    return absl::InvalidArgumentError("dram.read_burst_us (--dram-read-burst-us) must be 0 or more microseconds");
  }
  const std::pair<const char*, double> read_caps[] = {{"dram.read_gbps (--dram-read-gbps)", c.dram_read_gbps},
                                                      {"disk.read_gbps (--disk-read-gbps)", c.disk_read_gbps},
                                                      {"remote.read_gbps (--remote-read-gbps)", c.remote_read_gbps}};
  for (const auto& [name, gbps] : read_caps) {
    // The floor is ThrottledTier's kMinReadCapGbps (server code does not include the throttle for one number).
    if (!(gbps >= 0) || !std::isfinite(gbps) || (gbps > 0 && gbps < 0.001)) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must be 0 (no cap) or at least 0.001 Gbit/s"));
    }
  }
  if (c.load_window == 0) return absl::InvalidArgumentError("loader.window (--window) must be at least 1");
  if (c.load_window > c.max_load_window) {
    return absl::InvalidArgumentError(
        absl::StrCat("loader.window (", c.load_window, ") exceeds loader.max_window (", c.max_load_window, ")"));
  }
  if (c.transport_memory_bytes < 2 * c.max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "server.transport_memory_bytes (", c.transport_memory_bytes, ") must be at least twice server.max_message_bytes (",
        c.max_message_bytes, "): one message of the largest size must fit beside the rest of the traffic"));
  }
  if (c.default_chunk_tokens > c.max_chunk_tokens) {
    return absl::InvalidArgumentError("limits.default_chunk_tokens exceeds limits.max_chunk_tokens");
  }
  static const std::set<std::string> kLevels = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  if (!kLevels.contains(c.log_level)) {
    return absl::InvalidArgumentError(absl::StrCat("server.log_level is \"", c.log_level,
                                                   "\"; accepted: trace, debug, info, warn, error, critical, off"));
  }
  return absl::OkStatus();
}

absl::StatusOr<IoBackend> ParseIoBackendOption(std::string_view word, std::string_view where) {
  if (auto parsed = ParseIoBackend(word)) return *parsed;
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(where), " is \"", std::string(word), "\"; accepted: auto, uring, pread"));
}

absl::StatusOr<ArbiterPolicy> ParseArbiterOption(std::string_view word, std::string_view where) {
  if (auto parsed = ParseArbiterPolicy(word)) return *parsed;
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(where), " is \"", std::string(word), "\"; accepted: srf, fifo, fair"));
}

}  // namespace cake
