#include "server/config/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>
#include <type_traits>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "scheduler/io_pool.h"
#include "server/config/config_keys.h"
#include "storage/chunk_codec.h"

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
  // One table of an array of tables ([[access.principal]]); `name` says which in messages.
  TableReader(const toml::table* table, std::string name) : name_(std::move(name)), table_(table) {}

  // A word naming one of an enum's values, parsed here so the rest of the daemon sees only the enum.
  template <typename Enum>
  void Word(std::string_view key, Enum* out, absl::StatusOr<Enum> (*parse)(std::string_view, std::string_view)) {
    if (const toml::node* n = Find(key)) {
      auto v = n->value<std::string>();
      if (!v) return Fail(key, "a string");
      auto parsed = parse(*v, absl::StrCat(name_, ".", std::string(key)));
      if (parsed.ok()) {
        *out = *parsed;
      } else if (error_.ok()) {
        error_ = parsed.status();
      }
    }
  }

  void String(std::string_view key, std::string* out) {
    if (const toml::node* n = Find(key)) {
      if (auto v = n->value<std::string>()) {
        *out = *v;
      } else {
        Fail(key, "a string");
      }
    }
  }
  void StringList(std::string_view key, std::vector<std::string>* out) {
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
  template <typename T>
  void UnsignedList(std::string_view key, std::vector<T>* out, int64_t max) {
    if (const toml::node* n = Find(key)) {
      const toml::array* list = n->as_array();
      std::vector<T> values;
      if (list != nullptr) {
        for (const toml::node& item : *list) {
          auto v = item.is_integer() ? item.value<int64_t>() : std::nullopt;
          if (!v || *v < 0 || *v > max) {
            list = nullptr;
            break;
          }
          values.push_back(static_cast<T>(*v));
        }
      }
      if (list == nullptr) {
        Fail(key, absl::StrCat("a list of integers from 0 to ", max));
      } else {
        *out = std::move(values);
      }
    }
  }
  void Bool(std::string_view key, bool* out) {
    if (const toml::node* n = Find(key)) {
      if (auto v = n->value_exact<bool>()) {
        *out = *v;
      } else {
        Fail(key, "true or false");
      }
    }
  }
  template <typename T>
  void Unsigned(std::string_view key, T* out, uint64_t min, uint64_t max) {
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
  void Double(std::string_view key, double* out, double min, double max) {
    if (const toml::node* n = Find(key)) {
      auto v = n->is_number() ? n->value<double>() : std::nullopt;  // integers convert too; booleans do not
      if (!v || !(*v >= min && *v <= max)) {                        // written so that nan fails too
        Fail(key, absl::StrCat("a number from ", min, " to ", max));
      } else {
        *out = *v;
      }
    }
  }

  // A key read elsewhere (an array of tables), so Finish does not call it unknown.
  void Skip(std::string_view key) { Find(key); }

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
  const toml::node* Find(std::string_view key) {
    if (table_ == nullptr) return nullptr;
    used_.insert(std::string(key));
    return table_->get(key);
  }
  void Fail(std::string_view key, const std::string& expected) {
    if (error_.ok()) {
      error_ = absl::InvalidArgumentError(absl::StrCat(name_, ".", std::string(key), " must be ", expected));
    }
  }

  std::string name_;
  const toml::table* table_ = nullptr;
  std::set<std::string> used_;
  absl::Status error_;
};

// [[access.principal]]: every entry names itself and says who it is and what it may do; names are unique.
absl::Status ReadPrincipals(const toml::table& root, std::vector<PrincipalConfig>* out) {
  const toml::table* access = root.get_as<toml::table>("access");
  if (access == nullptr) return absl::OkStatus();
  const toml::node* node = access->get("principal");
  if (node == nullptr) return absl::OkStatus();
  const toml::array* list = node->as_array();
  if (list == nullptr || !list->is_array_of_tables()) {
    return absl::InvalidArgumentError("access.principal must be an array of tables: write [[access.principal]]");
  }
  std::set<std::string> names;
  std::vector<PrincipalConfig> principals;
  for (size_t i = 0; i < list->size(); ++i) {
    PrincipalConfig p;
    TableReader t(list->get(i)->as_table(), absl::StrCat("access.principal[", i, "]"));
    t.String("name", &p.name);
    t.UnsignedList("unix_uids", &p.unix_uids, UINT32_MAX - 1);
    t.StringList("unix_users", &p.unix_users);
    t.StringList("tls_identities", &p.tls_identities);
    t.String("token_file", &p.token_file);
    t.StringList("tenants", &p.tenants);
    t.StringList("roles", &p.roles);
    CAKE_RETURN_IF_ERROR(t.Finish());
    if (p.name.empty()) return absl::InvalidArgumentError(absl::StrCat("access.principal[", i, "] has no name"));
    if (!names.insert(p.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("two [[access.principal]] entries are named \"", p.name, "\""));
    }
    principals.push_back(std::move(p));
  }
  *out = std::move(principals);
  return absl::OkStatus();
}

// One key of the table `reader` reads, into its field of `c`, by the field's type.
void ReadKey(TableReader& reader, const ConfigKey& key, DaemonConfig& c) {
  const auto unsigned_range = [&key] {
    return std::pair{static_cast<uint64_t>(key.min), static_cast<uint64_t>(key.max)};
  };
  std::visit(
      [&](auto field) {
        auto& value = field(c);
        using T = std::remove_reference_t<decltype(value)>;
        if constexpr (std::is_same_v<T, uint32_t> || std::is_same_v<T, uint64_t>) {
          const auto [min, max] = unsigned_range();
          reader.Unsigned(key.name, &value, min, max);
        } else if constexpr (std::is_same_v<T, double>) {
          reader.Double(key.name, &value, key.min, key.max);
        } else if constexpr (std::is_same_v<T, bool>) {
          reader.Bool(key.name, &value);
        } else if constexpr (std::is_same_v<T, std::string>) {
          reader.String(key.name, &value);
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          reader.StringList(key.name, &value);
        } else if constexpr (std::is_same_v<T, std::vector<int>>) {
          reader.UnsignedList(key.name, &value, static_cast<int64_t>(key.max));
        } else if constexpr (std::is_same_v<T, IoBackend>) {
          reader.Word(key.name, &value, ParseIoBackendOption);
        } else if constexpr (std::is_same_v<T, ChunkCodec>) {
          reader.Word(key.name, &value, ParseChunkCodecOption);
        } else {
          static_assert(std::is_same_v<T, ArbiterPolicy>);
          reader.Word(key.name, &value, ParseArbiterOption);
        }
      },
      key.field);
}

// "server, tcp, ...", for the message that names an unknown table.
std::string KnownTables() {
  std::string known;
  for (std::string_view table : ConfigTables()) known += (known.empty() ? "" : ", ") + std::string(table);
  return known;
}

}  // namespace

bool IsLoopbackListenAddress(std::string_view address) {
  for (std::string_view host : {"127.0.0.1:", "localhost:", "[::1]:"}) {
    if (address.substr(0, host.size()) == host) return true;
  }
  return false;
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, std::string_view what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open ", std::string(what), " ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  std::string secret;
  absl::Status status;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    status = absl::FailedPreconditionError(absl::StrCat(std::string(what), " ", path, " is not a regular file"));
  } else if ((st.st_mode & 077) != 0 || (st.st_uid != ::geteuid() && st.st_uid != 0)) {
    status = absl::FailedPreconditionError(absl::StrCat(
        std::string(what), " ", path, " may be read by others (mode ", absl::StrFormat("%04o", st.st_mode & 07777),
        ", owner uid ", st.st_uid, "): make it owned by the daemon's user and mode 0600"));
  } else if (st.st_size > 64 * 1024) {
    status = absl::FailedPreconditionError(absl::StrCat(std::string(what), " ", path, " is larger than 64 KiB"));
  } else {
    secret.resize(static_cast<size_t>(st.st_size));
    const ssize_t n = ::read(fd, secret.data(), secret.size());
    if (n < 0) status = absl::FailedPreconditionError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    secret.resize(n < 0 ? 0 : static_cast<size_t>(n));
    while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
    if (status.ok() && secret.empty()) {
      status = absl::FailedPreconditionError(absl::StrCat(std::string(what), " ", path, " is empty"));
    }
  }
  ::close(fd);
  if (!status.ok()) return status;
  return secret;
}

absl::StatusOr<DaemonConfig> LoadConfigFile(const std::string& path, DaemonConfig c) {
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    return absl::InvalidArgumentError(absl::StrCat("config ", path, " line ", where.line, " column ", where.column,
                                                   ": ", std::string(e.description())));
  }
  std::set<std::string_view> tables(ConfigTables().begin(), ConfigTables().end());
  for (const auto& [key, value] : root) {
    if (!tables.contains(key.str())) {
      return absl::InvalidArgumentError(
          absl::StrCat("config ", path, ": unknown table [", std::string(key.str()), "]; known: ", KnownTables()));
    }
  }
  if (auto s = ReadPrincipals(root, &c.principals); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config ", path, ": ", s.message()));
  }
  for (std::string_view table : ConfigTables()) {
    TableReader reader(root, std::string(table));
    if (table == "access") reader.Skip("principal");  // read above: an array of tables
    for (const ConfigKey& key : ConfigKeys()) {
      if (key.table == table) ReadKey(reader, key, c);
    }
    if (auto s = reader.Finish(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("config ", path, ": ", s.message()));
    }
  }
  // The config is readable by the engines' group (0640 root:cake): a password written into it is theirs too.
  if (struct stat st{}; !c.remote_password.empty() && ::stat(path.c_str(), &st) == 0 && (st.st_mode & 044) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("config ", path, " holds remote.password but group or others may read it (mode ",
                     absl::StrFormat("%04o", st.st_mode & 07777),
                     "): move the password to remote.password_file (mode 0600) or $CAKE_REMOTE_PASSWORD"));
  }
  return c;
}

absl::Status ValidateConfig(const DaemonConfig& c) {
  if (c.run_dir.empty() && c.socket.empty())
    return absl::InvalidArgumentError("server.run_dir or server.socket must be set");
  // A DaemonConfig built in code (tests, benches, the demo) bypasses the key ranges: the values that would leave
  // the daemon unable to work are checked again here.
  if (c.dram_capacity_bytes == 0) {
    return absl::InvalidArgumentError("dram.capacity_bytes (--dram-capacity-mib) must be positive");
  }
  if (c.io_threads == 0) return absl::InvalidArgumentError("loader.io_threads (--io-threads) must be at least 1");
  if (c.remote_read_threads > 1024) {
    return absl::InvalidArgumentError(
        "remote.read_threads (--remote-read-threads) must be at most 1024 (0: one per Redis master, at least 2, at "
        "most loader.io_threads)");
  }
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
    return absl::InvalidArgumentError(
        absl::StrCat("server.transport_memory_bytes (", c.transport_memory_bytes,
                     ") must be at least twice server.max_message_bytes (", c.max_message_bytes,
                     "): one message of the largest size must fit beside the rest of the traffic"));
  }
  if (c.max_connections_per_peer > c.max_connections) {
    return absl::InvalidArgumentError(absl::StrCat("server.max_connections_per_peer (", c.max_connections_per_peer,
                                                   ") exceeds server.max_connections (", c.max_connections,
                                                   "): one peer could then hold every connection"));
  }
  if (c.tcp_identify_timeout_ms < c.handshake_timeout_ms) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tcp.identify_timeout_ms (", c.tcp_identify_timeout_ms, ") is shorter than tcp.handshake_timeout_ms (",
        c.handshake_timeout_ms, "): a connection could then be closed before its handshake may end"));
  }
  if (c.max_health_watches_per_peer > c.max_health_watches) {
    return absl::InvalidArgumentError(absl::StrCat(
        "server.max_health_watches_per_peer (", c.max_health_watches_per_peer, ") exceeds server.max_health_watches (",
        c.max_health_watches, "): one peer could then hold every health Watch stream"));
  }
  if (c.default_chunk_tokens > c.max_chunk_tokens) {
    return absl::InvalidArgumentError("limits.default_chunk_tokens exceeds limits.max_chunk_tokens");
  }
  if (!c.remote_password.empty() && !c.remote_password_file.empty()) {
    return absl::InvalidArgumentError("set remote.password or remote.password_file, not both");
  }
  if (c.access_single_user && !c.principals.empty()) {
    return absl::InvalidArgumentError(
        "access.single_user = true and [[access.principal]] entries contradict each other: remove one");
  }
  static const std::set<std::string> kRoles = {"engine", "monitor", "admin"};
  for (const PrincipalConfig& p : c.principals) {
    for (const std::string& role : p.roles) {
      if (!kRoles.contains(role)) {
        return absl::InvalidArgumentError(
            absl::StrCat("principal \"", p.name, "\" has role \"", role, "\"; accepted: engine, monitor, admin"));
      }
    }
    if (p.roles.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("principal \"", p.name, "\" has no roles (engine, monitor, admin)"));
    }
    if (std::find(p.roles.begin(), p.roles.end(), "engine") != p.roles.end() && p.tenants.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("principal \"", p.name, "\" is an engine but has no tenants: give tenants = [\"...\"]"));
    }
    if (p.unix_uids.empty() && p.unix_users.empty() && p.tls_identities.empty() && p.token_file.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("principal \"", p.name,
                       "\" names no way to recognise it: unix_uids, unix_users, tls_identities or token_file"));
    }
  }
  if (!c.metrics_listen.empty()) {
    const size_t colon = c.metrics_listen.rfind(':');
    const std::string port = colon == std::string::npos ? "" : c.metrics_listen.substr(colon + 1);
    if (colon == 0 || port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
        std::stoul(port) > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics.listen \"", c.metrics_listen, "\" must be host:port, e.g. \"127.0.0.1:9464\""));
    }
  }
  if (!c.tcp_listen.empty()) {
    const bool tls = !c.tls_cert_file.empty() || !c.tls_key_file.empty();
    if (tls && (c.tls_cert_file.empty() || c.tls_key_file.empty())) {
      return absl::InvalidArgumentError("tcp.tls_cert_file and tcp.tls_key_file go together");
    }
    if (!tls && !c.tcp_allow_plaintext_loopback) {
      return absl::InvalidArgumentError(
          "tcp.listen needs tcp.tls_cert_file and tcp.tls_key_file: plaintext TCP is refused "
          "(tcp.allow_plaintext_loopback "
          "permits it on a loopback address, for tests)");
    }
    if (!tls && !IsLoopbackListenAddress(c.tcp_listen)) {
      return absl::InvalidArgumentError(absl::StrCat("tcp.listen \"", c.tcp_listen,
                                                     "\" is not a loopback address: plaintext is allowed only on "
                                                     "127.0.0.1, [::1] or localhost"));
    }
    bool someone_can_call = false;
    for (const PrincipalConfig& p : c.principals)
      someone_can_call |= !p.tls_identities.empty() || !p.token_file.empty();
    if (!someone_can_call) {
      return absl::InvalidArgumentError(
          "tcp.listen is set but no [[access.principal]] has tls_identities or a token_file: nobody could call");
    }
    if (!c.tls_client_ca_file.empty() && !tls) {
      return absl::InvalidArgumentError("tcp.tls_client_ca_file needs tcp.tls_cert_file and tcp.tls_key_file");
    }
  } else if (!c.tls_client_ca_file.empty() || !c.tls_cert_file.empty()) {
    return absl::InvalidArgumentError("tcp.tls_* are set but tcp.listen is not");
  }
  static const std::set<std::string> kLevels = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  if (!kLevels.contains(c.log_level)) {
    return absl::InvalidArgumentError(absl::StrCat("server.log_level is \"", c.log_level,
                                                   "\"; accepted: trace, debug, info, warn, error, critical, off"));
  }
  return absl::OkStatus();
}

namespace {

constexpr const char* kMasked = "(set; masked)";

template <typename T>
toml::array Array(const std::vector<T>& values) {
  toml::array out;
  for (const T& v : values) {
    if constexpr (std::is_integral_v<T>) {
      out.push_back(static_cast<int64_t>(v));
    } else {
      out.push_back(v);
    }
  }
  return out;
}

// TOML integers are signed 64-bit: a value past that (nobody's real config) is written as the largest one.
int64_t Int(uint64_t v) { return v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v); }

}  // namespace

std::string FormatConfig(const DaemonConfig& config) {
  DaemonConfig c = config;  // the fields are reached through accessors that take a DaemonConfig&
  toml::table root;
  for (std::string_view name : ConfigTables()) {
    toml::table table;
    for (const ConfigKey& key : ConfigKeys()) {
      if (key.table != name) continue;
      std::visit(
          [&](auto field) {
            const auto& value = field(c);
            using T = std::remove_cvref_t<decltype(value)>;
            const std::string_view k = key.name;
            if constexpr (std::is_same_v<T, std::string>) {
              if (key.secret) {
                table.insert(k, value.empty() ? "" : kMasked);
              } else if (&value == &c.socket) {
                table.insert(k, c.socket_path());  // resolved: where the daemon listens
              } else {
                table.insert(k, value);
              }
            } else if constexpr (std::is_same_v<T, uint32_t> || std::is_same_v<T, uint64_t>) {
              table.insert(k, Int(value));
            } else if constexpr (std::is_same_v<T, std::vector<std::string>> || std::is_same_v<T, std::vector<int>>) {
              table.insert(k, Array(value));
            } else if constexpr (std::is_same_v<T, IoBackend>) {
              table.insert(k, IoBackendWord(value));
            } else if constexpr (std::is_same_v<T, ArbiterPolicy>) {
              table.insert(k, ArbiterPolicyName(value));
            } else if constexpr (std::is_same_v<T, ChunkCodec>) {
              table.insert(k, std::string(ChunkCodecName(value)));
            } else {
              table.insert(k, value);
            }
          },
          key.field);
    }
    if (name == "access" && !c.principals.empty()) {
      toml::array principals;
      for (const PrincipalConfig& p : c.principals) {
        principals.push_back(toml::table{{"name", p.name},
                                         {"unix_uids", Array(p.unix_uids)},
                                         {"unix_users", Array(p.unix_users)},
                                         {"tls_identities", Array(p.tls_identities)},
                                         {"token_file", p.token_file},
                                         {"tenants", Array(p.tenants)},
                                         {"roles", Array(p.roles)}});
      }
      table.insert("principal", std::move(principals));
    }
    root.insert(name, std::move(table));
  }
  std::ostringstream out;
  out << toml::toml_formatter(root, toml::toml_formatter::default_flags & ~toml::format_flags::indentation);
  return out.str() + "\n";
}

absl::Status ReadConfigSecrets(DaemonConfig& config) {
  if (!config.remote_password_file.empty()) {
    absl::StatusOr<std::string> password =
        ReadSecretFile(config.remote_password_file, "the Redis password (remote.password_file)");
    if (!password.ok()) return password.status();
    config.remote_password = *std::move(password);
  }
  if (const char* password = std::getenv("CAKE_REMOTE_PASSWORD"); password != nullptr) {
    config.remote_password = password;
  }
  return absl::OkStatus();
}

absl::StatusOr<IoBackend> ParseIoBackendOption(std::string_view word, std::string_view where) {
  if (auto parsed = ParseIoBackend(word)) return *parsed;
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(where), " is \"", std::string(word), "\"; accepted: auto, uring, pread"));
}

absl::StatusOr<ChunkCodec> ParseChunkCodecOption(std::string_view word, std::string_view where) {
  absl::StatusOr<ChunkCodec> parsed = ParseChunkCodec(word);
  if (parsed.ok()) return parsed;
  return absl::InvalidArgumentError(absl::StrCat(std::string(where), ": ", parsed.status().message()));
}

absl::StatusOr<ArbiterPolicy> ParseArbiterOption(std::string_view word, std::string_view where) {
  if (auto parsed = ParseArbiterPolicy(word)) return *parsed;
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(where), " is \"", std::string(word), "\"; accepted: srf, fifo, fair"));
}

}  // namespace cake
