// Nobody who can connect can use up the daemon's descriptors: connections past a peer's cap or the daemon's are
// closed at accept (counted), connections that sit idle or never finish their handshake are closed, and while
// another local user floods the socket and the TCP port with idle connections at four times the daemon's
// descriptor limit, an engine is still answered and the daemon stays alive and small.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "tests/integration/fixture.h"

using namespace cake;
using namespace cake::testing;

namespace {

using Clock = std::chrono::steady_clock;

int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// A connected socket that sends nothing; -1 when the connect itself fails. `source` binds the local address first
// (a TCP peer is counted by its address; 127.0.0.0/8 is all loopback).
int ConnectUnix(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

int ConnectTcp(int port, const char* source) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &local.sin_addr);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the daemon closed `fd` within `within`: reads (and drops) what it sends until the end of the stream.
bool ClosedByPeer(int fd, std::chrono::milliseconds within) {
  const auto deadline = Clock::now() + within;
  char buffer[4096];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
  return false;
}

uint64_t RssKib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

uint64_t StatsCounter(RawStubs& raw, const std::string& name) {
  grpc::ClientContext context;
  v1::StatsResponse response;
  REQUIRE(raw.admin->Stats(&context, v1::StatsRequest(), &response).ok());
  auto it = response.counters().find(name);
  REQUIRE(it != response.counters().end());
  return it->second;
}

// A config of `text` plus who may call: this user on the socket (an engine), and a TCP caller with a token (a TCP
// listener needs someone who may use it).
std::string TempConfig(const std::string& text) {
  char dir[] = "/tmp/cake-flood-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string token = WriteFile(dir, "token", "flood-test-token\n");
  std::filesystem::permissions(token, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  return WriteFile(dir, "caked.toml",
                   text + "\n[[access.principal]]\nname = \"engine\"\nunix_uids = [" + std::to_string(::geteuid()) +
                       "]\ntenants = [\"*\"]\nroles = [\"engine\", \"monitor\", \"admin\"]\n"
                       "[[access.principal]]\nname = \"remote\"\ntoken_file = \"" + token +
                       "\"\ntenants = [\"*\"]\nroles = [\"engine\", \"monitor\"]\n");
}

// caked under a descriptor limit of `limit` (soft and hard: caked raises its soft limit to the hard one).
std::string CakedUnderDescriptorLimit(const std::string& dir, int limit) {
  const std::string wrapper = dir + "/caked-limited";
  std::ofstream(wrapper) << "#!/bin/sh\nexec /usr/bin/prlimit --nofile=" << limit << ":" << limit << " "
                         << CAKE_CAKED_PATH << " \"$@\"\n";
  std::filesystem::permissions(wrapper, std::filesystem::perms::owner_all);
  return wrapper;
}

template <typename Call>
double MillisecondsOf(Call&& call) {
  const auto started = Clock::now();
  call();
  return std::chrono::duration<double, std::milli>(Clock::now() - started).count();
}

}  // namespace

TEST_CASE("an idle connection is closed after connection_idle_timeout_ms, a silent TCP one after the handshake timeout") {
  const int port = FreeLoopbackPort();
  const std::string config = TempConfig(
      "[server]\nconnection_idle_timeout_ms = 300\n[tcp]\nlisten = \"127.0.0.1:" + std::to_string(port) +
      "\"\nallow_plaintext_loopback = true\nhandshake_timeout_ms = 300\n");
  SpawnedDaemon daemon = StartDaemon({"--config", config});
  auto client = Connect(daemon);
  REQUIRE(client->Ping().ok());
  const int unix_fd = ConnectUnix(daemon.socket_path());
  const int tcp_fd = ConnectTcp(port, "127.0.0.1");
  REQUIRE(unix_fd >= 0);
  REQUIRE(tcp_fd >= 0);
  // At 14c19ab both stayed open for good (140 s and counting in the review).
  CHECK(ClosedByPeer(unix_fd, std::chrono::seconds(5)));
  CHECK(ClosedByPeer(tcp_fd, std::chrono::seconds(5)));
  ::close(unix_fd);
  ::close(tcp_fd);
  // A client whose connection the daemon closed reconnects on its next call. gRPC's synchronous C++ client polls
  // an idle channel only every 5 s (its backup poller), so it notices the close within 5 s; a call in that window
  // fails once with UNAVAILABLE, which is why the default timeout is 10 minutes, not seconds.
  std::this_thread::sleep_for(std::chrono::milliseconds(6000));
  const absl::Status ping = client->Ping();
  INFO(ping.ToString());
  CHECK(ping.ok());
  std::filesystem::remove_all(std::filesystem::path(config).parent_path());
}

TEST_CASE("one peer's connections past max_connections_per_peer are closed at accept, counted as refused") {
  const std::string config = TempConfig("[server]\nmax_connections_per_peer = 8\nmax_connections = 64\n");
  SpawnedDaemon daemon = StartDaemon({"--config", config});
  RawStubs raw(daemon);
  REQUIRE(raw.Status().version().size() > 0);  // the stubs' own connection: 1 of this uid's 8
  std::vector<int> held;
  for (int i = 0; i < 20; ++i) held.push_back(ConnectUnix(daemon.socket_path()));
  // The first 7 stay open, the 13 past the cap are closed by the daemon at once.
  int closed = 0;
  for (int fd : held) closed += ClosedByPeer(fd, std::chrono::milliseconds(300)) ? 1 : 0;
  CHECK(closed == 13);
  CHECK(StatsCounter(raw, "connections_refused") >= 13);
  for (int fd : held) ::close(fd);
  std::filesystem::remove_all(std::filesystem::path(config).parent_path());
}

TEST_CASE("an idle-connection flood at 4x the descriptor limit leaves the daemon alive and an engine answered") {
  if (::geteuid() != 0) {
    WARN("skipped: the flood comes from a second local user, which needs root to become");
    return;
  }
  // This process holds the flood's connections too.
  rlimit own{};
  ::getrlimit(RLIMIT_NOFILE, &own);
  own.rlim_cur = own.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &own);
  REQUIRE(own.rlim_cur >= 3000);

  constexpr int kDescriptorLimit = 256;
  constexpr int kFlood = 4 * kDescriptorLimit;  // per listener
  const int port = FreeLoopbackPort();
  // Idle and handshake timeouts far beyond the test: the attacker holds everything it got for the whole test.
  const std::string config = TempConfig(
      "[server]\nsocket_mode = 0o666\nconnection_idle_timeout_ms = 600000\n[tcp]\nlisten = \"127.0.0.1:" +
      std::to_string(port) + "\"\nallow_plaintext_loopback = true\nhandshake_timeout_ms = 600000\n");
  const std::string dir = std::filesystem::path(config).parent_path();
  auto started = SpawnedDaemon::Start(CakedUnderDescriptorLimit(dir, kDescriptorLimit), {"--config", config});
  REQUIRE(started.ok());
  SpawnedDaemon daemon = std::move(*started);
  // The other user must reach the socket: its folder is searchable by all (the socket itself is 0666 here).
  std::filesystem::permissions(daemon.run_dir(), std::filesystem::perms::owner_all |
                                                     std::filesystem::perms::group_exec |
                                                     std::filesystem::perms::others_exec);
  RawStubs raw(daemon);
  const uint64_t rss_before = RssKib(daemon.pid());

  // The attacker: another uid, every connection it can open, on the socket and from 127.0.0.2 on the port, held
  // until the test ends. Raw system calls only between fork and _exit.
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t attacker = ::fork();
  REQUIRE(attacker >= 0);
  if (attacker == 0) {
    ::close(ready[0]);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    int opened = 0;
    for (int i = 0; i < kFlood; ++i) opened += ConnectUnix(daemon.socket_path()) >= 0 ? 1 : 0;
    for (int i = 0; i < kFlood; ++i) opened += ConnectTcp(port, "127.0.0.2") >= 0 ? 1 : 0;
    [[maybe_unused]] ssize_t n = ::write(ready[1], &opened, sizeof(opened));
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  int attacker_connects = 0;
  REQUIRE(::read(ready[0], &attacker_connects, sizeof(attacker_connects)) == sizeof(attacker_connects));
  ::close(ready[0]);
  // Let the daemon accept (and refuse) the whole backlog.
  std::this_thread::sleep_for(std::chrono::seconds(1));

  // An engine on the socket: every call answered, promptly.
  auto client = Connect(daemon);
  const NamespaceSpec ns = SmallNamespace();
  const std::vector<uint32_t> tokens = Tokens(64);
  double ping_ms = 0, lookup_ms = 0, register_ms = 0, store_ms = 0;
  ping_ms = MillisecondsOf([&] { CHECK(client->Ping().ok()); });
  lookup_ms = MillisecondsOf([&] { CHECK(client->Lookup(ns, PromptRef{tokens, {}}).ok()); });
  const auto register_started = Clock::now();
  auto region = client->RegisterRegion(4 * 16 * kSmallBytesPerToken);
  register_ms = std::chrono::duration<double, std::milli>(Clock::now() - register_started).count();
  REQUIRE(region.ok());
  for (uint32_t i = 0; i < 4; ++i) FillChunk(region->data() + i * 16 * kSmallBytesPerToken, 16 * kSmallBytesPerToken, 7, i);
  store_ms = MillisecondsOf([&] { CHECK(client->Store(ns, PromptRef{tokens, {}}, 0, 4, *region, 0).ok()); });
  // An engine on the TCP port, from its own address.
  auto tcp_channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  auto tcp_admin = v1::AdminService::NewStub(tcp_channel);
  double tcp_ping_ms = 0;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    context.AddMetadata("authorization", "Bearer flood-test-token");
    v1::PingResponse pong;
    tcp_ping_ms = MillisecondsOf([&] { CHECK(tcp_admin->Ping(&context, v1::PingRequest(), &pong).ok()); });
  }
  const uint64_t open = StatsCounter(raw, "connections_open");
  // The flood's uid is named by no principal: its socket connections are closed at accept before the caps count
  // them (connections_refused_unnamed_uid); the TCP ones pass the gate's caps.
  const uint64_t refused =
      StatsCounter(raw, "connections_refused") + StatsCounter(raw, "connections_refused_unnamed_uid");
  const uint64_t rss_after = RssKib(daemon.pid());
  // The figures docs/reliability.md quotes (run with -s to see them).
  INFO("attacker connects " << attacker_connects << ", open " << open << ", refused " << refused);
  std::cout << "flood of " << 2 * kFlood << " idle connections at a descriptor limit of " << kDescriptorLimit
            << ": attacker's connects that succeeded " << attacker_connects << "; daemon serves " << open
            << ", refused " << refused << "; engine Ping " << ping_ms << " ms, Lookup " << lookup_ms
            << " ms, RegisterRegion " << register_ms << " ms, Store " << store_ms << " ms, TCP Ping " << tcp_ping_ms
            << " ms; RSS " << rss_before / 1024 << " -> " << rss_after / 1024 << " MiB\n";
  // The attacker holds at most its cap on each listener (64 by default); the rest was closed at accept.
  CHECK(open <= 64 * 2 + 8);
  CHECK(refused >= 2 * kFlood - 2 * 64 - 8);
  // Generous bounds: these are answered, not timed; the machine is shared. The figures are printed above.
  CHECK(ping_ms < 2000);
  CHECK(lookup_ms < 2000);
  CHECK(register_ms < 2000);
  CHECK(store_ms < 2000);
  CHECK(rss_after < rss_before + 128 * 1024);
  CHECK(::kill(daemon.pid(), 0) == 0);

  ::kill(attacker, SIGKILL);
  int status = 0;
  ::waitpid(attacker, &status, 0);
  CHECK(daemon.Stop() == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a scrape is answered at once while 80 idle connections hold the metrics endpoint") {
  SpawnedDaemon daemon = StartDaemon({"--metrics-listen", "127.0.0.1:0"});
  RawStubs raw(daemon);
  const std::string address = raw.Status().metrics_address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  std::vector<int> idle;
  for (int i = 0; i < 80; ++i) idle.push_back(ConnectTcp(port, "127.0.0.1"));
  // At 14c19ab (civetweb, two threads, a 10 s request timeout) 50 of these starved scrapes for 40 s and more.
  const auto started = Clock::now();
  const int scraper = ConnectTcp(port, "127.0.0.1");
  REQUIRE(scraper >= 0);
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  REQUIRE(::send(scraper, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size()));
  std::string reply;
  char buffer[65536];
  while (true) {
    pollfd p{scraper, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) break;
    const ssize_t n = ::recv(scraper, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    reply.append(buffer, static_cast<size_t>(n));
  }
  const double scrape_ms = std::chrono::duration<double, std::milli>(Clock::now() - started).count();
  INFO("scrape took " << scrape_ms << " ms");
  CHECK(reply.rfind("HTTP/1.1 200 OK", 0) == 0);
  CHECK(reply.find("cake_connections_open") != std::string::npos);
  CHECK(scrape_ms < 3000);
  // An idle connection is closed by its deadline (5 s), not held.
  for (int fd : idle) {
    if (fd >= 0) CHECK(ClosedByPeer(fd, std::chrono::seconds(10)));
  }
  for (int fd : idle) ::close(fd);
  ::close(scraper);
}
