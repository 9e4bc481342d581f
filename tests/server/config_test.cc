// caked's configuration: defaults, TOML overlay with strict key checking, and cross-field validation.
#include "server/config.h"

#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <string>

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

[dram]
capacity_bytes = 1073741824
read_gbps = 12.5
prefault = true
promotion_queue_bytes = 1048576

[loader]
window = 8
io_threads = 2

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
)");
  REQUIRE(c.ok());
  CHECK(c->remote_endpoints == std::vector<std::string>{"10.0.0.5:6379", "10.0.0.6:6379"});
  CHECK(c->remote_user == "cake");
  CHECK(c->remote_password == "pw");
  CHECK(c->remote_key_prefix == "prod:");
  CHECK(c->remote_part_bytes == 1048576);
  CHECK(c->remote_ttl_s == 3600);
  CHECK(c->remote_read_gbps == 7);
  CHECK(DefaultConfig().remote_endpoints.empty());
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
}
}  // namespace cake
