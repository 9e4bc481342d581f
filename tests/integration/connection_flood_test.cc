// Nobody who can connect can use up the daemon's descriptors: connections past a peer's cap or the daemon's are
// closed at accept (counted), connections that sit idle or never finish their handshake are closed, and while
// another local user floods the socket and the TLS port with idle connections, TLS connections without
// credentials and health Watch streams, each at four times the daemon's descriptor limit, an engine is still
// answered, the daemon stays alive and small, and it stops cleanly.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/integration/fixture.h"
#include "tests/integration/flood_helpers.h"

using namespace cake;
using namespace cake::testing;
using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

namespace {

using Clock = std::chrono::steady_clock;

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

// A fresh folder for a config (and certificates).
std::string TempDir() {
  char dir[] = "/tmp/cake-flood-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  return dir;
}

// A config in `dir` of `text` plus who may call: this user on the socket (an engine), and a TCP caller with a
// token (a TCP listener needs someone who may use it).
std::string ConfigIn(const std::string& dir, const std::string& text) {
  const std::string token = WriteFile(dir, "token", "flood-test-token\n");
  std::filesystem::permissions(token, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  return WriteFile(dir, "caked.toml",
                   text + "\n[[access.principal]]\nname = \"engine\"\nunix_uids = [" + std::to_string(::geteuid()) +
                       "]\ntenants = [\"*\"]\nroles = [\"engine\", \"monitor\", \"admin\"]\n"
                       "[[access.principal]]\nname = \"remote\"\ntoken_file = \"" +
                       token + "\"\ntenants = [\"*\"]\nroles = [\"engine\", \"monitor\"]\n");
}

std::string TempConfig(const std::string& text) { return ConfigIn(TempDir(), text); }

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

TEST_CASE(
    "an idle connection is closed after connection_idle_timeout_ms, a silent TCP one after the handshake timeout") {
  const int port = FreeLoopbackPort();
  const std::string config =
      TempConfig("[server]\nconnection_idle_timeout_ms = 300\n[tcp]\nlisten = \"127.0.0.1:" + std::to_string(port) +
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

TEST_CASE(
    "a flood of idle connections, unauthenticated TLS connections and health Watch streams at 4x the "
    "descriptor limit leaves the daemon alive, small and stoppable, and an engine answered") {
  if (::geteuid() != 0) {
    WARN("skipped: the flood comes from a second local user, which needs root to become");
    return;
  }
  // This process holds the idle connections, and the attacker's tool (which inherits the limit) the rest.
  rlimit own{};
  ::getrlimit(RLIMIT_NOFILE, &own);
  own.rlim_cur = own.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &own);
  REQUIRE(own.rlim_cur >= 3000);

  constexpr int kDescriptorLimit = 256;
  constexpr int kFlood = 4 * kDescriptorLimit;  // of each kind
  constexpr int kWatchConnections = 8;          // the Watch streams are spread over these
  constexpr int kPerPeer = 64;                  // server.max_connections_per_peer's default
  const int port = FreeLoopbackPort();
  // A TLS port, whose callers name themselves with a token. Idle and handshake timeouts far beyond the test: the
  // attacker holds everything it got for the whole test.
  const std::string dir = TempDir();
  MakeCertificates(dir);
  const std::string config =
      ConfigIn(dir, "[server]\nsocket_mode = 0o666\nconnection_idle_timeout_ms = 600000\n[tcp]\nlisten = \"127.0.0.1:" +
                        std::to_string(port) + "\"\ntls_cert_file = \"" + dir + "/server.pem\"\ntls_key_file = \"" +
                        dir + "/server.key\"\nhandshake_timeout_ms = 600000\nidentify_timeout_ms = 600000\n");
  auto started = SpawnedDaemon::Start(CakedUnderDescriptorLimit(dir, kDescriptorLimit), {"--config", config});
  REQUIRE(started.ok());
  SpawnedDaemon daemon = std::move(*started);
  // The other user must reach the socket: its folder is searchable by all (the socket itself is 0666 here).
  std::filesystem::permissions(daemon.run_dir(), std::filesystem::perms::owner_all |
                                                     std::filesystem::perms::group_exec |
                                                     std::filesystem::perms::others_exec);
  RawStubs raw(daemon);
  const uint64_t rss_before = RssKib(daemon.pid());

  // The attacker, uid 65534, named by no principal, all at once:
  //  - from 127.0.0.3, health Watch streams over kWatchConnections connections, then connections that finish the
  //    TLS and HTTP/2 handshakes without credentials and call nothing: cake_flood_peer, which holds them all and
  //    answers nothing, not even the stop's GOAWAY ping;
  //  - then idle connections on the socket, and from 127.0.0.2 on the port (which never start their TLS
  //    handshake), opened with raw system calls (nothing else is safe between fork and _exit).
  // Both are killed however the test ends (they hold everything until then).
  struct KillOnExit {
    std::vector<pid_t> pids;
    ~KillOnExit() {
      for (pid_t pid : pids) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
    }
  } attackers;
  int peer_out[2];
  REQUIRE(::pipe(peer_out) == 0);
  const std::string port_arg = std::to_string(port), flood_arg = std::to_string(kFlood),
                    watch_connections_arg = std::to_string(kWatchConnections);
  const auto flood_started = Clock::now();
  const pid_t peer = ::fork();
  REQUIRE(peer >= 0);
  if (peer == 0) {
    ::dup2(peer_out[1], 1);
    ::close(peer_out[0]);
    ::close(peer_out[1]);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    ::execl(CAKE_FLOOD_PEER_PATH, CAKE_FLOOD_PEER_PATH, "127.0.0.1", port_arg.c_str(), "127.0.0.3", flood_arg.c_str(),
            flood_arg.c_str(), watch_connections_arg.c_str(), static_cast<char*>(nullptr));
    ::_exit(3);
  }
  attackers.pids.push_back(peer);
  ::close(peer_out[1]);
  // The tool's one line: "ready handshakes=N handshakes_refused=N watches=N watches_refused=N watch_connections=N".
  std::string peer_line;
  for (const auto deadline = Clock::now() + std::chrono::seconds(60);
       peer_line.find('\n') == std::string::npos && Clock::now() < deadline;) {
    pollfd p{peer_out[0], POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buffer[512];
    const ssize_t n = ::read(peer_out[0], buffer, sizeof(buffer));
    if (n <= 0) break;
    peer_line.append(buffer, static_cast<size_t>(n));
  }
  const double flood_s = std::chrono::duration<double>(Clock::now() - flood_started).count();
  INFO("cake_flood_peer said: " << peer_line);
  REQUIRE(peer_line.rfind("ready ", 0) == 0);
  // Then the idle connections, once the Watch and TLS connections hold the loopback peer's share: every TCP
  // connection from this host counts as the one peer "loopback", so these from 127.0.0.2 are all closed at accept.
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t idler = ::fork();
  REQUIRE(idler >= 0);
  if (idler == 0) {
    ::close(ready[0]);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    int opened = 0;
    for (int i = 0; i < kFlood; ++i) opened += ConnectUnix(daemon.socket_path()) >= 0 ? 1 : 0;
    for (int i = 0; i < kFlood; ++i) opened += ConnectTcp(port, "127.0.0.2") >= 0 ? 1 : 0;
    [[maybe_unused]] ssize_t n = ::write(ready[1], &opened, sizeof(opened));
    ::pause();
    ::_exit(0);
  }
  attackers.pids.push_back(idler);
  ::close(ready[1]);
  int idle_connects = 0;
  REQUIRE(::read(ready[0], &idle_connects, sizeof(idle_connects)) == sizeof(idle_connects));
  ::close(ready[0]);
  std::map<std::string, int> tls;
  {
    std::istringstream fields(peer_line.substr(6));
    for (std::string field; fields >> field;) {
      const size_t eq = field.find('=');
      if (eq != std::string::npos) tls[field.substr(0, eq)] = std::stoi(field.substr(eq + 1));
    }
  }
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
  for (uint32_t i = 0; i < 4; ++i)
    FillChunk(region->data() + i * 16 * kSmallBytesPerToken, 16 * kSmallBytesPerToken, 7, i);
  store_ms = MillisecondsOf([&] { CHECK(client->Store(ns, PromptRef{tokens, {}}, 0, 4, *region, 0).ok()); });
  // A probe on the socket: Check answered, and a Watch of its own served (the attacker's 8 are its address's).
  auto health =
      Health::NewStub(grpc::CreateChannel("unix:" + daemon.socket_path(), grpc::InsecureChannelCredentials()));
  double check_ms = 0, watch_ms = 0;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    HealthCheckResponse response;
    check_ms = MillisecondsOf([&] { CHECK(health->Check(&context, HealthCheckRequest(), &response).ok()); });
    CHECK(response.status() == HealthCheckResponse::SERVING);
  }
  {
    grpc::ClientContext context;
    HealthCheckResponse response;
    std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> watch;
    watch_ms = MillisecondsOf([&] {
      watch = health->Watch(&context, HealthCheckRequest());
      CHECK(watch->Read(&response));
    });
    CHECK(response.status() == HealthCheckResponse::SERVING);
    context.TryCancel();
    watch->Finish();
  }
  // A TCP engine on this host would share the loopback peer's share, which the attacker holds: local engines use
  // the socket, which keeps a quarter of server.max_connections that no TCP peer can take.
  const uint64_t open = StatsCounter(raw, "connections_open");
  // The flood's uid is named by no principal: its socket connections are closed at accept before the caps count
  // them (connections_refused_unnamed_uid); the TCP ones pass the gate's caps.
  const uint64_t refused =
      StatsCounter(raw, "connections_refused") + StatsCounter(raw, "connections_refused_unnamed_uid");
  const uint64_t evicted = StatsCounter(raw, "connections_stranger_evicted");
  // The probe's Watch is gone once the daemon has seen its cancel; the attacker's were refused on their headers.
  CHECK(Eventually([&] { return StatsCounter(raw, "health_watches_open") == 0; }));
  const uint64_t watches_open = StatsCounter(raw, "health_watches_open");
  const uint64_t watches_refused = StatsCounter(raw, "health_watches_refused");
  const uint64_t rss_after = RssKib(daemon.pid());

  // The figures docs/reliability.md quotes (run with -s to see them).
  std::cout << "flood at a descriptor limit of " << kDescriptorLimit << ", from uid 65534 (" << flood_s
            << " s to open): " << kFlood << " idle connections on the socket and " << kFlood
            << " from 127.0.0.2 on the TLS port (" << idle_connects << " connects succeeded); from 127.0.0.3 " << kFlood
            << " Watch streams over " << kWatchConnections << " connections (" << tls["watch_connections"]
            << " established, " << tls["watches"] << " streams served, " << tls["watches_refused"] << " refused) and "
            << kFlood << " TLS connections without credentials (" << tls["handshakes"]
            << " finished the TLS and HTTP/2 handshakes, " << tls["handshakes_refused"]
            << " closed at accept). Daemon: " << open << " connections served, " << refused << " refused at accept, "
            << evicted << " strangers closed to make room; Watch streams " << watches_open << " open, "
            << watches_refused << " refused. Engine on the socket: Ping " << ping_ms << " ms, Lookup " << lookup_ms
            << " ms, RegisterRegion " << register_ms << " ms, Store " << store_ms << " ms, health Check " << check_ms
            << " ms, its own Watch's first status " << watch_ms << " ms. RSS " << rss_before / 1024 << " -> "
            << rss_after / 1024 << " MiB\n";
  // The attacker holds at most the loopback peer's cap (64 by default), whatever addresses it connects from: each
  // connection past it was closed at accept (the socket's: no principal names the uid) or took the place of the
  // oldest stranger (TCP); the engine's are a few.
  CHECK(open <= kPerPeer + 8);
  CHECK(refused + evicted >= static_cast<uint64_t>(3 * kFlood + kWatchConnections - kPerPeer));
  CHECK(tls["watch_connections"] == kWatchConnections);
  CHECK(tls["handshakes"] >= 1);
  CHECK(tls["handshakes"] + tls["handshakes_refused"] == kFlood);
  // Watch streams over TCP without credentials: refused on their headers (UNAUTHENTICATED), none served. At
  // 4054af8 eight were served (server.max_health_watches_per_peer), the rest refused past the cap.
  CHECK(tls["watches"] == 0);
  CHECK(tls["watches_refused"] == kFlood);
  CHECK(watches_open == 0);
  // Generous bounds: these are answered, not timed; the machine is shared. The figures are printed above.
  CHECK(ping_ms < 2000);
  CHECK(lookup_ms < 2000);
  CHECK(register_ms < 2000);
  CHECK(store_ms < 2000);
  CHECK(check_ms < 2000);
  CHECK(watch_ms < 2000);
#if !defined(__SANITIZE_ADDRESS__)  // the daemon is built with it too: its quarantine keeps what the handshakes freed
  CHECK(rss_after < rss_before + 128 * 1024);
#endif
  CHECK(::kill(daemon.pid(), 0) == 0);

  // A stop, with the attacker still holding everything: connections that never answer the goodbye are closed after
  // the grace period (server.shutdown_grace_s, 5 s).
  const auto stopping = Clock::now();
  const int stop_status = daemon.Stop();
  const double stop_s = std::chrono::duration<double>(Clock::now() - stopping).count();
  std::cout << "stop with the flood held: " << stop_s << " s, exit status " << stop_status << "\n";
  CHECK(stop_status == 0);
  CHECK(stop_s < 15);

  ::close(peer_out[0]);
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
