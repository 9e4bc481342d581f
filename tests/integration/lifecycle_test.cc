// The daemon's life cycle as an operator sees it: start-up checks, cakectl, a clean stop that leaves nothing
// behind, and recovery from a crash's stale socket.
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "tests/integration/fixture.h"

using namespace cake;
using namespace cake::testing;

TEST_CASE("SIGTERM stops cleanly: live loads cancelled, regions released, socket removed, exit 0", "[lifecycle]") {
  auto daemon = StartDaemon({"--dram-read-gbps", "0.01"});
  auto client = Connect(daemon);
  const auto ns = SmallNamespace(256);
  const uint64_t chunk_bytes = 256 * kSmallBytesPerToken;
  const auto tokens = Tokens(256 * 16);  // 16 chunks at 0.2 s each: still loading when SIGTERM comes
  StorePrompt(*client, ns, tokens, 1, 16, chunk_bytes);
  auto region = client->RegisterRegion(16 * chunk_bytes);
  REQUIRE(region.ok());
  LoadOptions options{ns, {tokens, {}}, &*region};
  options.io_only = true;
  auto session = client->StartLoad(options);
  REQUIRE(session.ok());
  REQUIRE((*session)->WaitPlan().ok());

  // The region's shared-memory name is visible until the daemon releases it.
  bool found_shm = false;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    found_shm |= entry.path().filename().string().rfind("cake-", 0) == 0;
  }
  CHECK(found_shm);

  const std::string socket = daemon.socket_path();
  CHECK(daemon.Stop() == 0);
  CHECK(!std::filesystem::exists(socket));
  CHECK(!(*session)->WaitDone().ok());  // the load was cancelled, not left hanging
  CHECK(daemon.log().find("stopped") != std::string::npos);
}

TEST_CASE("cakectl reports status and stats as text or JSON and its exit codes tell failures apart", "[lifecycle]") {
  auto daemon = StartDaemon({"--dram-read-gbps", "25", "--dram-capacity-mib", "1536"});
  const std::string cakectl = std::string(CAKE_CAKECTL_PATH) + " --socket " + daemon.socket_path();
  auto status = Run(cakectl + " status");
  CHECK(status.exit_code == 0);
  CHECK(status.output.find("tier dram:") != std::string::npos);
  CHECK(status.output.find("of 1.5 GiB") != std::string::npos);  // sizes for people
  CHECK(status.output.find("reads capped at 25 Gbit/s") != std::string::npos);
  auto stats = Run(cakectl + " stats");
  CHECK(stats.exit_code == 0);
  CHECK(stats.output.find("lookups 0") != std::string::npos);
  // JSON: protobuf's mapping of the reply, field names as in admin.proto, numbers exact.
  auto json = Run(cakectl + " --output json status");
  CHECK(json.exit_code == 0);
  CHECK(json.output.find("\"capacity_bytes\": \"1610612736\"") != std::string::npos);
  CHECK(json.output.find("\"draining\": false") != std::string::npos);
  auto version = Run(std::string(CAKE_CAKECTL_PATH) + " --version");
  CHECK(version.exit_code == 0);
  CHECK(version.output.find("cakectl 0.") != std::string::npos);
  // Not running: 3. Refused by the daemon: 1. Bad usage: 2.
  auto nobody = Run(std::string(CAKE_CAKECTL_PATH) + " --socket /tmp/cake-nonexistent.sock ping");
  CHECK(nobody.exit_code == 3);
  CHECK(nobody.output.find("no daemon answers") != std::string::npos);
  auto refused = Run(cakectl + " evict --tier tape");  // not a tier: refused before any call
  CHECK(refused.exit_code == 2);
  CHECK(refused.output.find("tape") != std::string::npos);
  CHECK(Run(cakectl + " evict").exit_code == 2);
  CHECK(Run(cakectl + " --output yaml status").exit_code == 2);
  // Drain and resume.
  auto drained = Run(cakectl + " drain");
  CHECK(drained.exit_code == 0);
  CHECK(drained.output.find("draining: new loads are refused") != std::string::npos);
  CHECK(Run(cakectl + " status").output.find("(draining") != std::string::npos);
  CHECK(Run(cakectl + " drain --resume").output.find("taking loads") != std::string::npos);
}

TEST_CASE("start-up refuses bad configuration and a second daemon on a live socket", "[lifecycle]") {
  auto bad = WriteFile("/tmp", "cake-bad-" + std::to_string(getpid()) + ".toml", "[dram]\ncapacity_gib = 4\n");
  auto result = Run(std::string(CAKE_CAKED_PATH) + " --config " + bad + " --check-config");
  std::remove(bad.c_str());
  CHECK(result.exit_code == 2);
  CHECK(result.output.find("unknown key(s) in [dram]: capacity_gib") != std::string::npos);

  auto syntax = WriteFile("/tmp", "cake-syntax-" + std::to_string(getpid()) + ".toml", "[server\n");
  result = Run(std::string(CAKE_CAKED_PATH) + " --config " + syntax + " --check-config");
  std::remove(syntax.c_str());
  CHECK(result.exit_code == 2);
  CHECK(result.output.find("line 1") != std::string::npos);

  // The shipped configuration documents every key with its default, so it must always pass the same checks.
  result = Run(std::string(CAKE_CAKED_PATH) + " --config " CAKE_SOURCE_DIR "/deploy/caked.toml --check-config");
  CHECK(result.exit_code == 0);

  auto daemon = StartDaemon();
  result = Run(std::string(CAKE_CAKED_PATH) + " --socket " + daemon.socket_path());
  CHECK(result.exit_code == 1);
  CHECK(result.output.find("another daemon is listening") != std::string::npos);
  CHECK(Connect(daemon)->Ping().ok());  // the first daemon is unharmed
}

TEST_CASE("a socket folder in a folder anyone may write to must be this user's own, closed, and no symlink",
          "[lifecycle][hostile]") {
  // A stand-in for /tmp: world-writable and sticky, as the fallback run folder's parent is.
  char base[] = "/tmp/cake-shared-XXXXXX";
  REQUIRE(mkdtemp(base) != nullptr);
  REQUIRE(chmod(base, 01777) == 0);
  const std::string dir = std::string(base) + "/cake-run";
  const std::string socket = dir + "/caked.sock";
  auto refused = [&](const std::string& why) {
    auto result = Run(std::string(CAKE_CAKED_PATH) + " --socket " + socket + " --dram-capacity-mib 16");
    CHECK(result.exit_code == 1);
    CHECK_THAT(result.output, Catch::Contains(why));
    CHECK_FALSE(std::filesystem::exists(socket));
  };
  SECTION("absent: the daemon creates it 0700 and serves") {
    auto daemon = StartDaemon({"--socket", socket});
    struct stat st {};
    REQUIRE(stat(dir.c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 0700);
    CHECK(Connect(daemon)->Ping().ok());
  }
  SECTION("made first, open to everyone: refused") {
    REQUIRE(mkdir(dir.c_str(), 0700) == 0);
    REQUIRE(chmod(dir.c_str(), 0777) == 0);
    refused("is open to other users (mode 0777)");
  }
  SECTION("a symbolic link to somewhere else: refused") {
    REQUIRE(symlink(base, dir.c_str()) == 0);
    refused("is a symbolic link");
  }
  SECTION("made first by another user: refused (run as root, which can give the folder away)") {
    if (geteuid() == 0) {
      REQUIRE(mkdir(dir.c_str(), 0700) == 0);
      REQUIRE(chown(dir.c_str(), 65534, 65534) == 0);
      refused("belongs to another user (uid 65534)");
    }
  }
  std::filesystem::remove_all(base);
}

TEST_CASE("a daemon killed with SIGKILL leaves a stale socket and regions the next start clears", "[lifecycle]") {
  auto daemon = StartDaemon();
  const std::string socket = daemon.socket_path();
  const std::string its_segments = "cake-" + std::to_string(daemon.pid()) + "-";
  auto segments_left = [&] {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
      n += e.path().filename().string().rfind(its_segments, 0) == 0;
    }
    return n;
  };
  auto client = Connect(daemon);
  auto first = client->RegisterRegion(1 << 20);
  auto second = client->RegisterRegion(1 << 20);
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  daemon.Kill();
  REQUIRE(std::filesystem::exists(socket));
  CHECK(segments_left() == 2);  // nobody will release these now
  auto again = SpawnedDaemon::Start(CAKE_CAKED_PATH, {"--socket", socket});
  REQUIRE(again.ok());
  CHECK(again->log().find("stale socket") != std::string::npos);
  // Every caked's start sweeps what dead processes left (tests/cuda/region_test.cc tests the sweep itself), so in a
  // parallel suite another test's daemon may clear these first and this one finds none to name: what must hold is
  // that none is left once this one has started.
  CHECK(segments_left() == 0);
  CHECK(Connect(*again)->Ping().ok());
}

TEST_CASE("a setting from the file holds unless a flag says otherwise", "[lifecycle]") {
  auto file = WriteFile("/tmp", "cake-prefault-" + std::to_string(getpid()) + ".toml",
                        "[dram]\ncapacity_bytes = 16777216\nprefault = true\n");
  {
    auto daemon = StartDaemon({"--config", file});
    CHECK(daemon.log().find("DRAM tier: 16 MiB prefaulted") != std::string::npos);
  }
  {
    auto daemon = StartDaemon({"--config", file, "--no-dram-prefault"});
    CHECK(daemon.log().find("prefaulted") == std::string::npos);
  }
  {
    auto daemon = StartDaemon({"--dram-capacity-mib", "16", "--dram-prefault"});
    CHECK(daemon.log().find("DRAM tier: 16 MiB prefaulted") != std::string::npos);
  }
  auto zero = Run(std::string(CAKE_CAKED_PATH) + " --dram-capacity-mib 0 --check-config");
  CHECK(zero.exit_code == 2);
  CHECK(zero.output.find("--dram-capacity-mib") != std::string::npos);
  std::remove(file.c_str());
}

TEST_CASE("a tier's read cap changes while the daemon runs, bad requests get the right codes", "[lifecycle][admin]") {
  auto daemon = StartDaemon({"--dram-read-gbps", "8"});
  auto client = Connect(daemon);
  auto previous = client->SetReadCap(TierKind::kDram, 2.5);
  REQUIRE(previous.ok());
  CHECK(*previous == 8);
  auto status = client->Status();
  REQUIRE(status.ok());
  bool dram_capped = false;
  for (const DaemonStatus::Tier& tier : status->tiers) {
    if (tier.kind == TierKind::kDram) dram_capped = tier.read_cap_gbps == 2.5;
  }
  CHECK(dram_capped);

  auto by_cakectl =
      Run(std::string(CAKE_CAKECTL_PATH) + " --socket " + daemon.socket_path() + " read-cap --tier dram --gbps 4");
  CHECK(by_cakectl.exit_code == 0);
  CHECK(by_cakectl.output.find("dram read cap: 2.5 -> 4 Gbit/s") != std::string::npos);

  CHECK(client->SetReadCap(TierKind::kNone, 1).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(client->SetReadCap(TierKind::kDram, 0).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(client->SetReadCap(TierKind::kDram, -1).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(client->SetReadCap(TierKind::kDram, std::nan("")).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(client->SetReadCap(TierKind::kDisk, 1).status().code() == absl::StatusCode::kNotFound);
  auto uncapped = StartDaemon();
  auto refused = Connect(uncapped)->SetReadCap(TierKind::kDram, 1);
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(refused.status().message().find("--dram-read-gbps") != std::string_view::npos);
  CHECK(client->Ping().ok());  // the daemon serves on
}

TEST_CASE("read caps cannot wedge the daemon: a floor, a raised cap frees queued reads, a stop interrupts them",
          "[lifecycle][admin][hostile]") {
  auto daemon = StartDaemon({"--dram-read-gbps", "8"});
  auto client = Connect(daemon);
  CHECK(client->SetReadCap(TierKind::kDram, 1e-6).status().code() == absl::StatusCode::kInvalidArgument);
  const auto ns = SmallNamespace(1024);
  const uint64_t chunk_bytes = 1024 * kSmallBytesPerToken;  // 1 MiB
  const auto tokens = Tokens(1024 * 16);
  StorePrompt(*client, ns, tokens, 81, 16, chunk_bytes);

  // At the floor, 16 MiB take over two minutes; raised to 8 Gbit/s, the reads already waiting finish at once.
  REQUIRE(client->SetReadCap(TierKind::kDram, 0.001).ok());
  {
    LoadOptions options{ns, {tokens, {}}, nullptr};
    options.io_only = true;
    auto session = client->StartLoad(options);
    REQUIRE(session.ok());
    REQUIRE((*session)->WaitPlan().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the first reads are asleep in the bucket
    REQUIRE(client->SetReadCap(TierKind::kDram, 8).ok());
    auto done = (*session)->WaitDone();
    REQUIRE(done.ok());
    CHECK(done->loaded_chunks == 16);
    REQUIRE((*session)->Release().ok());
  }

  // At the floor again, with a load asleep in the bucket: SIGTERM still stops the daemon within its grace.
  REQUIRE(client->SetReadCap(TierKind::kDram, 0.001).ok());
  LoadOptions options{ns, {tokens, {}}, nullptr};
  options.io_only = true;
  auto stuck = client->StartLoad(options);
  REQUIRE(stuck.ok());
  REQUIRE((*stuck)->WaitPlan().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto stop_started = std::chrono::steady_clock::now();
  CHECK(daemon.Stop() == 0);
  CHECK(std::chrono::steady_clock::now() - stop_started < std::chrono::seconds(30));  // bounded, not a speed
}

namespace {

// The socket systemd gives a Type=notify service: the daemon's READY=1, WATCHDOG=1 and STOPPING=1 land here.
class NotifySocket {
 public:
  NotifySocket() {
    char dir[] = "/tmp/cake-notify-XXXXXX";
    REQUIRE(mkdtemp(dir) != nullptr);
    dir_ = dir;
    path_ = dir_ + "/notify.sock";
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path_.c_str());
    REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  }
  ~NotifySocket() {
    close(fd_);
    std::filesystem::remove_all(dir_);
  }
  const std::string& path() const { return path_; }
  // Every message that arrives within `window`.
  std::vector<std::string> Collect(std::chrono::milliseconds window) {
    std::vector<std::string> out;
    const auto end = std::chrono::steady_clock::now() + window;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0) return out;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[512];
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n > 0) out.emplace_back(buf, static_cast<size_t>(n));
    }
  }

 private:
  std::string dir_, path_;
  int fd_ = -1;
};

size_t CountOf(const std::vector<std::string>& messages, const std::string& what) {
  return static_cast<size_t>(std::count(messages.begin(), messages.end(), what));
}

// Messages until `count` of `what` have come, or `bound` has passed.
std::vector<std::string> CollectUntil(NotifySocket& notify, const std::string& what, size_t count,
                                      std::chrono::milliseconds bound) {
  std::vector<std::string> out;
  const auto end = std::chrono::steady_clock::now() + bound;
  while (CountOf(out, what) < count && std::chrono::steady_clock::now() < end) {
    auto more = notify.Collect(std::chrono::milliseconds(50));
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}

size_t Occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

}  // namespace

TEST_CASE("the systemd watchdog is fed only while a new connection to the socket gets an answer", "[lifecycle]") {
  // Waited for by events, never counted in fixed windows: on a loaded machine a window can end before the check
  // it was meant to see. A self-check every 500 ms, each with 250 ms to get its answer.
  NotifySocket notify;
  setenv("NOTIFY_SOCKET", notify.path().c_str(), 1);
  setenv("WATCHDOG_USEC", "1000000", 1);
  auto daemon = StartDaemon();
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  constexpr auto kBound = std::chrono::seconds(20);

  const auto serving = CollectUntil(notify, "WATCHDOG=1", 3, kBound);
  CHECK(CountOf(serving, "READY=1") == 1);
  CHECK(CountOf(serving, "WATCHDOG=1") == 3);

  // The socket file goes (a clean-up of /run, say): connected engines go on, but no new one can reach the
  // daemon, so systemd must get to restart it. Once a check has failed after the move, none that began before
  // it is left (the checks run one after another), and no later one can pass.
  const std::string kFailed = "self-check failed";
  const size_t failed_before = Occurrences(daemon.log(), kFailed);  // a slow answer may have failed one already
  const std::string moved = daemon.socket_path() + ".moved";
  REQUIRE(std::rename(daemon.socket_path().c_str(), moved.c_str()) == 0);
  REQUIRE(Eventually([&] { return Occurrences(daemon.log(), kFailed) > failed_before; }, kBound));
  notify.Collect(std::chrono::milliseconds(100));  // what was sent before the failure
  CHECK(CountOf(notify.Collect(std::chrono::milliseconds(2500)), "WATCHDOG=1") == 0);  // five checks' time

  REQUIRE(std::rename(moved.c_str(), daemon.socket_path().c_str()) == 0);
  CHECK(CountOf(CollectUntil(notify, "WATCHDOG=1", 2, kBound), "WATCHDOG=1") == 2);
  CHECK(daemon.Stop() == 0);
  CHECK(CountOf(CollectUntil(notify, "STOPPING=1", 1, std::chrono::seconds(5)), "STOPPING=1") == 1);
}
