// caked's configuration: defaults, TOML overlay with strict key checking, and cross-field validation.
#include "server/config/config.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "server/config/config_flags.h"
#include "server/config/config_keys.h"

namespace cake {
namespace {

// A TOML file that exists for one test.
class TempConfig {
 public:
  explicit TempConfig(const std::string& text) {
    char path[] = "/tmp/cake-config-test-XXXXXX.toml";
    const int fd = mkstemps(path, 5);
    REQUIRE(fd >= 0);
    close(fd);
    path_ = path;
    std::ofstream(path_) << text;
  }
  ~TempConfig() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

absl::StatusOr<DaemonConfig> Load(const std::string& text) {
  TempConfig file(text);
  return LoadConfigFile(file.path(), DefaultConfig());
}

// The load fails with INVALID_ARGUMENT and says what is wrong where.
void ExpectInvalid(const std::string& text, const std::string& mentions) {
  auto c = Load(text);
  REQUIRE_FALSE(c.ok());
  INFO(c.status().ToString());
  CHECK(c.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(c.status().message()), Catch::Contains(mentions));
}

}  // namespace

TEST_CASE("config: defaults", "[config]") {
  const DaemonConfig c = DefaultConfig();
  CHECK_FALSE(c.run_dir.empty());
  if (geteuid() == 0) CHECK(c.run_dir == "/run/cake");
  CHECK(c.socket.empty());
  CHECK(c.socket_path() == c.run_dir + "/caked.sock");
  CHECK(c.socket_mode == 0660);
  CHECK(c.max_message_bytes == uint64_t{256} << 20);
  CHECK(c.transport_memory_bytes == uint64_t{1} << 30);
  CHECK(c.region_lease_ms == 30000);
  CHECK(c.shutdown_grace_s == 5);
  CHECK(c.log_level == "info");
  CHECK(c.max_prompt_tokens == 1u << 20);
  CHECK(c.max_chunk_bytes == uint64_t{1} << 30);
  CHECK(c.max_chunk_tokens == 1u << 16);
  CHECK(c.default_chunk_tokens == 256);
  CHECK(c.max_region_bytes == uint64_t{64} << 30);
  CHECK(c.max_regions_per_client == 64);
  CHECK(c.max_concurrent_loads == 256);
  CHECK(c.max_concurrent_loads_per_principal == 192);
  CHECK(c.max_concurrent_loads_per_client == 128);
  CHECK_FALSE(c.access_single_user);
  CHECK(c.dram_capacity_bytes == uint64_t{4} << 30);
  CHECK(c.dram_read_gbps == 0);
  CHECK(c.load_window == 4);
  CHECK(c.max_load_window == 64);
  CHECK(c.io_threads == 4);
  CHECK(c.key_secret.empty());
  CHECK(ValidateConfig(c).ok());
}

TEST_CASE("config: run_dir follows XDG_RUNTIME_DIR for other users", "[config]") {
  if (geteuid() == 0) {
    WARN("running as root: run_dir is /run/cake whatever the environment says");
    return;
  }
  const char* old = getenv("XDG_RUNTIME_DIR");
  const std::string saved = old ? old : "";
  setenv("XDG_RUNTIME_DIR", "/tmp/xdg-test", 1);
  CHECK(DefaultConfig().run_dir == "/tmp/xdg-test/cake");
  unsetenv("XDG_RUNTIME_DIR");
  CHECK(DefaultConfig().run_dir == "/tmp/cake-" + std::to_string(geteuid()));
  if (old) setenv("XDG_RUNTIME_DIR", saved.c_str(), 1);
}

TEST_CASE("config: a file overrides the keys it sets and keeps the rest", "[config]") {
  auto c = Load(R"(
[server]
socket = "/tmp/x.sock"
socket_mode = 0o600
shutdown_grace_s = 2      # an integer where a float is expected converts
log_level = "debug"

[limits]
max_concurrent_loads = 8
max_concurrent_loads_per_principal = 6
max_concurrent_loads_per_client = 4

[dram]
capacity_bytes = 1073741824
read_gbps = 12.5
prefault = true
promotion_queue_bytes = 1048576

[loader]
window = 8
io_threads = 2
max_inline_bytes_per_principal = 2097152

[keys]
secret = "s3cret"
)");
  REQUIRE(c.ok());
  CHECK(c->socket == "/tmp/x.sock");
  CHECK(c->socket_path() == "/tmp/x.sock");
  CHECK(c->socket_mode == 0600);
  CHECK(c->shutdown_grace_s == 2);
  CHECK(c->log_level == "debug");
  CHECK(c->max_concurrent_loads == 8);
  CHECK(c->max_concurrent_loads_per_principal == 6);
  CHECK(c->max_concurrent_loads_per_client == 4);
  CHECK(c->max_inline_bytes_per_principal == 2u << 20);
  CHECK(c->dram_capacity_bytes == uint64_t{1} << 30);
  CHECK(c->dram_read_gbps == 12.5);
  CHECK(c->dram_prefault);
  CHECK(c->dram_promotion_queue_bytes == 1 << 20);
  CHECK(c->load_window == 8);
  CHECK(c->io_threads == 2);
  CHECK(c->key_secret == "s3cret");

  const DaemonConfig d = DefaultConfig();
  CHECK(c->run_dir == d.run_dir);
  CHECK(c->max_message_bytes == d.max_message_bytes);
  CHECK(c->max_chunk_tokens == d.max_chunk_tokens);
  CHECK(c->max_load_window == d.max_load_window);
  CHECK(ValidateConfig(*c).ok());
}

TEST_CASE("config: an empty file is the base unchanged", "[config]") {
  DaemonConfig base = DefaultConfig();
  base.load_window = 7;
  TempConfig file("# nothing here\n");
  auto c = LoadConfigFile(file.path(), base);
  REQUIRE(c.ok());
  CHECK(c->load_window == 7);
  CHECK(c->io_threads == base.io_threads);
}

TEST_CASE("config: mistakes are INVALID_ARGUMENT naming the key or line", "[config]") {
  SECTION("unknown key") { ExpectInvalid("[loader]\nwindow = 4\nwindw = 8\n", "windw"); }
  SECTION("unknown key names its table") { ExpectInvalid("[dram]\ncapacity = 1\n", "[dram]"); }
  SECTION("unknown table") { ExpectInvalid("[disk]\npath = \"/x\"\n", "[disk]"); }
  SECTION("a known table's name used as a plain key") { ExpectInvalid("loader = 3\n", "[loader] must be a table"); }
  SECTION("wrong type: string for a number") { ExpectInvalid("[loader]\nwindow = \"eight\"\n", "loader.window"); }
  SECTION("wrong type: number for a string") { ExpectInvalid("[server]\nlog_level = 3\n", "server.log_level"); }
  SECTION("wrong type: bool for a number") { ExpectInvalid("[loader]\nio_threads = true\n", "loader.io_threads"); }
  SECTION("wrong type: bool for a float") { ExpectInvalid("[dram]\nread_gbps = true\n", "dram.read_gbps"); }
  SECTION("wrong type: fraction for an integer") { ExpectInvalid("[loader]\nwindow = 2.5\n", "loader.window"); }
  SECTION("wrong type: float for an integer") { ExpectInvalid("[loader]\nwindow = 4.0\n", "loader.window"); }
  SECTION("wrong type: table for a number") { ExpectInvalid("[loader]\nwindow = { a = 1 }\n", "loader.window"); }
  SECTION("out of range: too small") { ExpectInvalid("[loader]\nwindow = 0\n", "loader.window"); }
  SECTION("out of range: too large") { ExpectInvalid("[loader]\nmax_window = 5000\n", "loader.max_window"); }
  SECTION("out of range: negative") { ExpectInvalid("[limits]\nmax_chunk_bytes = -1\n", "limits.max_chunk_bytes"); }
  SECTION("out of range: socket mode") { ExpectInvalid("[server]\nsocket_mode = 0o1777\n", "server.socket_mode"); }
  SECTION("out of range: float") { ExpectInvalid("[dram]\nread_gbps = -1.0\n", "dram.read_gbps"); }
  SECTION("out of range: infinity") { ExpectInvalid("[server]\nshutdown_grace_s = inf\n", "server.shutdown_grace_s"); }
  SECTION("not a number") { ExpectInvalid("[dram]\nread_gbps = nan\n", "dram.read_gbps"); }
  SECTION("an unknown word for an enum") { ExpectInvalid("[loader]\narbiter = \"lifo\"\n", "loader.arbiter"); }
  SECTION("an unknown I/O backend") { ExpectInvalid("[disk]\nio_backend = \"aio\"\n", "accepted: auto, uring, pread"); }
  SECTION("wrong type: number for a word") { ExpectInvalid("[disk]\nio_backend = 1\n", "disk.io_backend"); }
  SECTION("syntax error names the line") { ExpectInvalid("[loader]\nwindow = 4\nio_threads = = 2\n", "line 3"); }
  SECTION("syntax error: duplicate key") { ExpectInvalid("[loader]\nwindow = 4\nwindow = 5\n", "line 3"); }
}

TEST_CASE("config: enum-valued options are parsed once, where they are read", "[config]") {
  TempConfig file("[disk]\nio_backend = \"pread\"\n[loader]\narbiter = \"fair\"\n");
  auto c = LoadConfigFile(file.path(), DefaultConfig());
  REQUIRE(c.ok());
  CHECK(c->disk_io_backend == IoBackend::kPread);
  CHECK(c->arbiter == ArbiterPolicy::kFairShare);
  CHECK(DefaultConfig().disk_io_backend == IoBackend::kAuto);
  CHECK(DefaultConfig().arbiter == ArbiterPolicy::kShortestRemaining);
  // The flags go through the same words, named as flags.
  CHECK(ParseArbiterOption("fifo", "--arbiter").value() == ArbiterPolicy::kFifo);
  const auto bad = ParseIoBackendOption("aio", "--disk-io-backend");
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("--disk-io-backend is \"aio\""));
}

TEST_CASE("config: a missing file is an error naming it", "[config]") {
  auto c = LoadConfigFile("/nonexistent/cake/caked.toml", DefaultConfig());
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(c.status().message()), Catch::Contains("/nonexistent/cake/caked.toml"));
}

TEST_CASE("config: ValidateConfig checks rules across fields", "[config]") {
  DaemonConfig c = DefaultConfig();
  REQUIRE(ValidateConfig(c).ok());

  SECTION("window above max_window") {
    c.load_window = 65;
    absl::Status s = ValidateConfig(c);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Catch::Contains("loader.window"));
    c.load_window = 64;
    CHECK(ValidateConfig(c).ok());
  }
  SECTION("bad log level") {
    c.log_level = "verbose";
    absl::Status s = ValidateConfig(c);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Catch::Contains("server.log_level"));
    for (const char* level : {"trace", "debug", "info", "warn", "error", "critical", "off"}) {
      c.log_level = level;
      CHECK(ValidateConfig(c).ok());
    }
  }
  SECTION("an unknown codec is refused where it is read, named with the accepted ones") {
    CHECK_THAT(std::string(ParseChunkCodecOption("lz4", "disk.codec").status().message()),
               Catch::Contains("disk.codec: unknown codec \"lz4\"; the codecs are \"none\" and \"planes-zstd\""));
    CHECK(*ParseChunkCodecOption("planes-zstd", "remote.codec") == ChunkCodec::kPlanesZstd);
    c.disk_codec = ChunkCodec::kPlanesZstd;
    c.remote_codec = ChunkCodec::kPlanesZstd;
    CHECK(ValidateConfig(c).ok());
  }
  SECTION("zeros that flags can set and the file cannot") {
    c.dram_capacity_bytes = 0;
    CHECK_THAT(std::string(ValidateConfig(c).message()), Catch::Contains("--dram-capacity-mib"));
    c = DefaultConfig();
    c.io_threads = 0;
    CHECK_THAT(std::string(ValidateConfig(c).message()), Catch::Contains("--io-threads"));
    c = DefaultConfig();
    c.load_window = 0;
    CHECK(ValidateConfig(c).code() == absl::StatusCode::kInvalidArgument);
    c = DefaultConfig();
    c.dram_read_burst_us = -1;
    CHECK_THAT(std::string(ValidateConfig(c).message()), Catch::Contains("--dram-read-burst-us"));
    c.dram_read_burst_us = 0;
    CHECK(ValidateConfig(c).ok());
  }
  SECTION("a transport quota that a largest message could fill alone") {
    c.transport_memory_bytes = 2 * c.max_message_bytes - 1;
    CHECK_THAT(std::string(ValidateConfig(c).message()), Catch::Contains("server.transport_memory_bytes"));
    c.transport_memory_bytes = 2 * c.max_message_bytes;
    CHECK(ValidateConfig(c).ok());
  }
  SECTION("default chunk larger than the maximum") {
    c.default_chunk_tokens = c.max_chunk_tokens + 1;
    CHECK(ValidateConfig(c).code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("nowhere to put the socket") {
    c.run_dir.clear();
    c.socket.clear();
    CHECK(ValidateConfig(c).code() == absl::StatusCode::kInvalidArgument);
    c.socket = "/tmp/caked.sock";
    CHECK(ValidateConfig(c).ok());
  }
}

}  // namespace cake

namespace cake {
TEST_CASE("config: the [remote] table", "[config][remote]") {
  auto c = Load(R"([remote]
endpoints = ["10.0.0.5:6379", "10.0.0.6:6379"]
user = "cake"
password = "pw"
key_prefix = "prod:"
part_bytes = 1048576
ttl_s = 3600
read_gbps = 7
read_threads = 2
)");
  REQUIRE(c.ok());
  CHECK(c->remote_endpoints == std::vector<std::string>{"10.0.0.5:6379", "10.0.0.6:6379"});
  CHECK(c->remote_user == "cake");
  CHECK(c->remote_password == "pw");
  CHECK(c->remote_key_prefix == "prod:");
  CHECK(c->remote_part_bytes == 1048576);
  CHECK(c->remote_ttl_s == 3600);
  CHECK(c->remote_read_gbps == 7);
  CHECK(c->RemoteReadThreads(3) == 2);  // set, it is what it says, whatever Redis is
  CHECK(c->RemoteReadThreads(0) == 2);
  CHECK(DefaultConfig().remote_endpoints.empty());
  // Unset: one thread per master, at least two, at most loader.io_threads (4); io_threads when Redis did not
  // answer at start-up.
  CHECK(DefaultConfig().remote_read_threads == 0);
  CHECK(DefaultConfig().io_threads == 4);
  CHECK(DefaultConfig().RemoteReadThreads(0) == 4);
  CHECK(DefaultConfig().RemoteReadThreads(1) == 2);
  CHECK(DefaultConfig().RemoteReadThreads(3) == 3);
  CHECK(DefaultConfig().RemoteReadThreads(10) == 4);
  ExpectInvalid("[remote]\nread_threads = 5000\n", "remote.read_threads");
  ExpectInvalid("[remote]\nendpoints = \"10.0.0.5:6379\"\n", "remote.endpoints must be a list of strings");
  ExpectInvalid("[remote]\nendpoints = [6379]\n", "remote.endpoints must be a list of strings");
  ExpectInvalid("[remote]\npart_bytes = 10\n", "remote.part_bytes");
  ExpectInvalid("[remote]\nendpoint = []\n", "unknown key(s) in [remote]: endpoint");

  // Flags bypass the file's ranges: a negative or non-finite read cap is refused, not taken as "no cap".
  DaemonConfig flags = DefaultConfig();
  flags.remote_read_gbps = -1;
  absl::Status s = ValidateConfig(flags);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("--remote-read-gbps"));
  flags.remote_read_gbps = 0;
  flags.disk_read_gbps = std::nan("");
  CHECK_THAT(std::string(ValidateConfig(flags).message()), Catch::Contains("--disk-read-gbps"));
  flags.disk_read_gbps = 7;
  CHECK(ValidateConfig(flags).ok());
  flags.remote_read_threads = 5000;
  CHECK_THAT(std::string(ValidateConfig(flags).message()), Catch::Contains("--remote-read-threads"));
}

TEST_CASE("config: [access] principals and [tcp]", "[config][access]") {
  auto c = Load(R"([tcp]
listen = "0.0.0.0:7070"
tls_cert_file = "/etc/cake/tls/server.pem"
tls_key_file = "/etc/cake/tls/server.key"
tls_client_ca_file = "/etc/cake/tls/clients.pem"
tls_reload_s = 30

[[access.principal]]
name = "vllm-a"
unix_uids = [1001, 1002]
tls_identities = ["spiffe://prod/vllm-a"]
tenants = ["a", "shared"]
roles = ["engine"]

[[access.principal]]
name = "ops"
unix_users = ["root"]
roles = ["admin"]
)");
  REQUIRE(c.ok());
  CHECK(c->tcp_listen == "0.0.0.0:7070");
  CHECK(c->tls_client_ca_file == "/etc/cake/tls/clients.pem");
  CHECK(c->tls_reload_s == 30);
  REQUIRE(c->principals.size() == 2);
  CHECK(c->principals[0].name == "vllm-a");
  CHECK(c->principals[0].unix_uids == std::vector<uint32_t>{1001, 1002});
  CHECK(c->principals[0].tenants == std::vector<std::string>{"a", "shared"});
  CHECK(c->principals[1].unix_users == std::vector<std::string>{"root"});
  // Single-user mode said outright cannot stand beside principals.
  DaemonConfig both = *c;
  both.access_single_user = true;
  CHECK_THAT(std::string(ValidateConfig(both).message()), Catch::Contains("contradict"));
  CHECK(ValidateConfig(*c).ok());
  CHECK(DefaultConfig().principals.empty());
  CHECK(DefaultConfig().tcp_listen.empty());

  ExpectInvalid("[[access.principal]]\nroles = [\"engine\"]\ntenants = [\"a\"]\n", "has no name");
  ExpectInvalid("[[access.principal]]\nname = \"x\"\ncolour = 1\n", "unknown key(s) in [access.principal[0]]: colour");
  ExpectInvalid("[access]\nprincipal = 3\n", "[[access.principal]]");
  ExpectInvalid("[[access.principal]]\nname = \"x\"\n[[access.principal]]\nname = \"x\"\n", "two [[access.principal]]");
  ExpectInvalid("[tcp]\nlisten = 7\n", "tcp.listen must be a string");

  auto rule = [](auto&& change) {
    DaemonConfig config = DefaultConfig();
    config.principals.push_back(PrincipalConfig{"p", {1001}, {}, {}, "", {"a"}, {"engine"}});
    change(config);
    return std::string(ValidateConfig(config).message());
  };
  CHECK_THAT(rule([](DaemonConfig& c) { c.principals[0].roles = {"root"}; }), Catch::Contains("accepted: engine"));
  CHECK_THAT(rule([](DaemonConfig& c) { c.principals[0].roles = {}; }), Catch::Contains("has no roles"));
  CHECK_THAT(rule([](DaemonConfig& c) { c.principals[0].tenants = {}; }), Catch::Contains("has no tenants"));
  CHECK_THAT(rule([](DaemonConfig& c) { c.principals[0].unix_uids = {}; }), Catch::Contains("no way to recognise"));
  // TCP: TLS unless plaintext is allowed, and then only on loopback; and somebody must be able to call.
  CHECK_THAT(rule([](DaemonConfig& c) { c.tcp_listen = "0.0.0.0:7070"; }), Catch::Contains("plaintext TCP is refused"));
  CHECK_THAT(rule([](DaemonConfig& c) {
               c.tcp_listen = "10.0.0.1:7070";
               c.tcp_allow_plaintext_loopback = true;
             }),
             Catch::Contains("not a loopback address"));
  CHECK_THAT(rule([](DaemonConfig& c) {
               c.tcp_listen = "127.0.0.1:7070";
               c.tcp_allow_plaintext_loopback = true;
             }),
             Catch::Contains("nobody could call"));
  CHECK_THAT(rule([](DaemonConfig& c) {
               c.tcp_listen = "0.0.0.0:7070";
               c.tls_cert_file = "/x.pem";
             }),
             Catch::Contains("go together"));
  CHECK_THAT(rule([](DaemonConfig& c) { c.tls_cert_file = "/x.pem"; }), Catch::Contains("tcp.listen is not"));
  CHECK(IsLoopbackListenAddress("[::1]:7070"));
  CHECK(IsLoopbackListenAddress("localhost:7070"));
  CHECK_FALSE(IsLoopbackListenAddress("127.0.0.1.evil.example:7070"));
}

TEST_CASE("config: secrets stay out of readable files", "[config][access]") {
  // A password in a config the engines' group can read is refused; in an owner-only one it is accepted.
  TempConfig config("[remote]\nendpoints = [\"127.0.0.1:6379\"]\npassword = \"hunter2\"\n");
  REQUIRE(chmod(config.path().c_str(), 0600) == 0);
  CHECK(LoadConfigFile(config.path(), DefaultConfig()).ok());
  REQUIRE(chmod(config.path().c_str(), 0640) == 0);
  auto refused = LoadConfigFile(config.path(), DefaultConfig());
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("remote.password_file"));
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("0640"));

  TempConfig secret("hunter2\n");
  REQUIRE(chmod(secret.path().c_str(), 0600) == 0);
  auto read = ReadSecretFile(secret.path(), "the test secret");
  REQUIRE(read.ok());
  CHECK(*read == "hunter2");  // the newline an editor adds is not part of it
  REQUIRE(chmod(secret.path().c_str(), 0644) == 0);
  auto readable = ReadSecretFile(secret.path(), "the test secret");
  CHECK(readable.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(readable.status().message()), Catch::Contains("mode 0600"));
  CHECK(ReadSecretFile("/nonexistent/secret", "x").status().code() == absl::StatusCode::kFailedPrecondition);
  TempConfig empty("");
  CHECK_THAT(std::string(ReadSecretFile(empty.path(), "x").status().message()), Catch::Contains("is empty"));
}
}  // namespace cake

namespace cake {

TEST_CASE("config: FormatConfig reads back as the same configuration, secrets masked", "[config]") {
  auto c = Load(R"(
[server]
log_level = "debug"
[metrics]
listen = "127.0.0.1:9464"
max_namespace_series = 9
[[access.principal]]
name = "vllm"
unix_uids = [1001]
tenants = ["a", "b"]
roles = ["engine"]
[disk]
root = "/var/cache/cake"
io_backend = "pread"
[remote]
endpoints = ["redis:6379"]
password_file = "/etc/cake/private/redis"
[loader]
arbiter = "fair"
[keys]
secret = "hunter2"
)");
  REQUIRE(c.ok());
  const std::string printed = FormatConfig(*c);
  CHECK(printed.find("hunter2") == std::string::npos);
  CHECK_THAT(printed, Catch::Contains("(set; masked)"));
  auto again = Load(printed);
  REQUIRE(again.ok());
  CHECK(again->metrics_listen == "127.0.0.1:9464");
  CHECK(again->metrics_max_namespace_series == 9);
  REQUIRE(again->principals.size() == 1);
  CHECK(again->principals[0].tenants == std::vector<std::string>{"a", "b"});
  CHECK(again->disk_io_backend == IoBackend::kPread);
  CHECK(again->arbiter == ArbiterPolicy::kFairShare);
  CHECK(again->remote_password_file == "/etc/cake/private/redis");
  CHECK(again->key_secret == "(set; masked)");
  // Everything but the masked secret survives the trip.
  again->key_secret = c->key_secret;
  CHECK(FormatConfig(*again) == printed);
}

TEST_CASE("config: metrics.listen must be host:port", "[config]") {
  for (const char* bad : {"localhost", ":9464", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:http"}) {
    DaemonConfig c = DefaultConfig();
    c.metrics_listen = bad;
    INFO(bad);
    CHECK(ValidateConfig(c).code() == absl::StatusCode::kInvalidArgument);
  }
  DaemonConfig c = DefaultConfig();
  c.metrics_listen = "[::1]:0";
  CHECK(ValidateConfig(c).ok());
}

TEST_CASE("config: health Watch caps, in all and per peer", "[config]") {
  CHECK(DefaultConfig().max_health_watches == 256);
  CHECK(DefaultConfig().max_health_watches_per_peer == 8);
  auto c = Load("[server]\nmax_health_watches = 16\nmax_health_watches_per_peer = 2\n");
  REQUIRE(c.ok());
  CHECK(c->max_health_watches == 16);
  CHECK(c->max_health_watches_per_peer == 2);
  CHECK_THAT(FormatConfig(*c), Catch::Contains("max_health_watches_per_peer = 2"));
  auto zero = Load("[server]\nmax_health_watches = 0\n");
  CHECK(zero.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(zero.status().message()), Catch::Contains("server.max_health_watches"));
  DaemonConfig one_peer_takes_all = DefaultConfig();
  one_peer_takes_all.max_health_watches_per_peer = one_peer_takes_all.max_health_watches + 1;
  const absl::Status s = ValidateConfig(one_peer_takes_all);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("server.max_health_watches_per_peer"));
}

}  // namespace cake

namespace cake {

TEST_CASE("config: every key of the list is in deploy/caked.toml, is written by FormatConfig, and reads back",
          "[config]") {
  std::ifstream file(CAKE_SOURCE_DIR "/deploy/caked.toml");
  REQUIRE(file.good());
  // Which keys the documented file names (set or commented out), table by table.
  std::set<std::string> documented;
  std::string line, table;
  while (std::getline(file, line)) {
    if (line.size() > 2 && line[0] == '[' && line[1] != '[') table = line.substr(1, line.find(']') - 1);
    size_t start = line.find_first_not_of("# ");
    const size_t equals = line.find(" =");
    if (start == std::string::npos || equals == std::string::npos || equals < start || table.empty()) continue;
    documented.insert(table + "." + line.substr(start, equals - start));
  }
  const std::string written = FormatConfig(DefaultConfig());
  std::set<std::string> names;
  for (const ConfigKey& key : ConfigKeys()) {
    INFO(FullKeyName(key));
    CHECK(names.insert(FullKeyName(key)).second);
    CHECK(documented.contains(FullKeyName(key)));
    CHECK(!key.help.empty());
    CHECK(written.find("\n" + std::string(key.name) + " = ") != std::string::npos);
    CHECK(std::find(ConfigTables().begin(), ConfigTables().end(), key.table) != ConfigTables().end());
  }
}

namespace {

absl::StatusOr<DaemonConfig> WithFlags(std::vector<std::string> args, DaemonConfig config = DefaultConfig()) {
  CLI::App app;
  ConfigFlags flags(app);
  args.insert(args.begin(), "caked");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  app.parse(static_cast<int>(argv.size()), argv.data());
  if (auto s = flags.ApplyTo(config); !s.ok()) return s;
  return config;
}

}  // namespace

TEST_CASE("config: flags come from the key list and keep its ranges", "[config]") {
  auto c = WithFlags({"--dram-capacity-mib", "8", "--window", "16", "--no-cuda", "--arbiter", "fifo", "--remote",
                      "a:1,b:2", "--cuda-devices", "0,1", "--dram-read-gbps", "2.5", "--dram-prefault"});
  REQUIRE(c.ok());
  CHECK(c->dram_capacity_bytes == 8u << 20);
  CHECK(c->load_window == 16);
  CHECK_FALSE(c->cuda_enabled);
  CHECK(c->arbiter == ArbiterPolicy::kFifo);
  CHECK(c->remote_endpoints == std::vector<std::string>{"a:1", "b:2"});
  CHECK(c->cuda_devices == std::vector<int>{0, 1});
  CHECK(c->dram_read_gbps == 2.5);
  CHECK(c->dram_prefault);

  // A flag not given keeps what the file said.
  DaemonConfig file = DefaultConfig();
  file.load_window = 7;
  file.socket = "/tmp/from-the-file.sock";
  c = WithFlags({}, file);
  REQUIRE(c.ok());
  CHECK(c->load_window == 7);
  CHECK(c->socket == "/tmp/from-the-file.sock");
  // --run-dir moves the socket with it, unless --socket says where.
  c = WithFlags({"--run-dir", "/tmp/elsewhere"}, file);
  REQUIRE(c.ok());
  CHECK(c->socket_path() == "/tmp/elsewhere/caked.sock");
  c = WithFlags({"--run-dir", "/tmp/elsewhere", "--socket", "/tmp/s.sock"}, file);
  REQUIRE(c.ok());
  CHECK(c->socket_path() == "/tmp/s.sock");

  // The key's range holds for its flag, and the message names both.
  for (const auto& [args, mentions] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--window", "0"}, "loader.window (--window) must be an integer from 1 to 4096"},
           {{"--io-threads", "5000"}, "loader.io_threads (--io-threads)"},
           {{"--dram-capacity-mib", "0"}, "dram.capacity_bytes (--dram-capacity-mib)"},
           {{"--disk-read-gbps", "1e7"}, "disk.read_gbps (--disk-read-gbps)"},
           {{"--cuda-devices", "2000"}, "cuda.devices (--cuda-devices)"},
           {{"--arbiter", "lifo"}, "--arbiter is \"lifo\""},
           {{"--dram-prefault", "--no-dram-prefault"}, "contradict"}}) {
    INFO(args.front());
    c = WithFlags(args);
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(c.status().message()), Catch::Contains(mentions));
  }
}

}  // namespace cake

namespace cake {

TEST_CASE("config: secrets named by file or environment are read while the configuration is built", "[config]") {
  TempConfig secret("hunter2\n");  // mkstemps makes it owner-only
  DaemonConfig c = DefaultConfig();
  c.remote_password_file = secret.path();
  ::unsetenv("CAKE_REMOTE_PASSWORD");
  REQUIRE(ReadConfigSecrets(c).ok());
  CHECK(c.remote_password == "hunter2");  // the tiers are built from the value; the trailing newline is dropped
  CHECK(FormatConfig(c).find("hunter2") == std::string::npos);  // and it stays masked when written back

  ::setenv("CAKE_REMOTE_PASSWORD", "from-env", 1);
  REQUIRE(ReadConfigSecrets(c).ok());
  CHECK(c.remote_password == "from-env");
  ::unsetenv("CAKE_REMOTE_PASSWORD");

  // A password others may read is refused before any tier is built, naming the key.
  ::chmod(secret.path().c_str(), 0644);
  const absl::Status refused = ReadConfigSecrets(c);
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(refused.message()), Catch::Contains("remote.password_file"));
  c.remote_password_file = "/nonexistent/cake-password";
  CHECK_FALSE(ReadConfigSecrets(c).ok());
}

}  // namespace cake
