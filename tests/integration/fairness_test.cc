// No caller can hold every load slot, and the access policy a reload installs governs loads already running:
// per-principal and per-client load caps (RESOURCE_EXHAUSTED naming the cap), a reload that revokes a caller
// ending its running loads, a reload that would drop every principal refused unless single-user mode is said, RPC
// metrics that label only the methods the daemon has, and scrapes that run while the daemon stops.
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "grpcpp/generic/generic_stub.h"
#include "tests/integration/fixture.h"

using namespace cake;
using namespace cake::testing;

namespace {

using LoadStream = grpc::ClientReaderWriter<v1::LoadRequest, v1::LoadResponse>;

// A Load stream held open: the daemon counts it from its Start until it ends.
struct OpenLoad {
  std::unique_ptr<grpc::ClientContext> context = std::make_unique<grpc::ClientContext>();
  std::unique_ptr<LoadStream> stream;

  // Writes what is left unsent, reads to the end and returns how the daemon ended the stream.
  grpc::Status End() {
    stream->WritesDone();
    v1::LoadResponse response;
    while (stream->Read(&response)) {
    }
    return stream->Finish();
  }
};

OpenLoad StartLoad(RawStubs& raw, const NamespaceSpec& ns, const std::vector<uint32_t>& tokens,
                   const std::string& client_id) {
  OpenLoad load;
  load.stream = raw.kv->Load(load.context.get());
  REQUIRE(load.stream->Write(StartOf(ns, tokens, client_id, "", 0, v1::LoadStart::MODE_IO_ONLY)));
  return load;
}

// The first message of a started load: its Plan, or nothing when the daemon ended the stream at Start.
bool Planned(OpenLoad& load) {
  v1::LoadResponse response;
  return load.stream->Read(&response) && response.has_plan();
}

std::string Principal(const std::string& name, const std::string& roles) {
  return "[[access.principal]]\nname = \"" + name + "\"\nunix_uids = [" + std::to_string(::geteuid()) +
         "]\ntenants = [\"tenant-a\"]\nroles = [" + roles + "]\n";
}

// The daemon's log, once `words` are in it (a reload is applied on the daemon's own time).
bool LogSays(const SpawnedDaemon& daemon, const std::string& words) {
  return Eventually([&] { return daemon.log().find(words) != std::string::npos; });
}

// One scrape that may find the endpoint gone: the reply, or empty.
std::string TryScrape(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
    char buffer[65536];
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 2000) <= 0) break;
      const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      reply.append(buffer, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return reply;
}

// One scrape of a running endpoint.
std::string Scrape(int port) {
  const std::string reply = TryScrape(port);
  REQUIRE(!reply.empty());
  return reply;
}

}  // namespace

TEST_CASE("one principal, or one client of it, cannot hold every load slot", "[fairness]") {
  char dir[] = "/tmp/cake-fairness-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string config = WriteFile(dir, "caked.toml",
                                       "[limits]\nmax_concurrent_loads = 8\nmax_concurrent_loads_per_principal = 3\n"
                                       "max_concurrent_loads_per_client = 2\n");
  SpawnedDaemon daemon = StartDaemon({"--config", config});
  std::filesystem::remove_all(dir);
  auto client = Connect(daemon);
  RawStubs raw(daemon);
  const NamespaceSpec ns = SmallNamespace(16);
  const std::vector<uint32_t> tokens = Tokens(64, 31);
  StorePrompt(*client, ns, tokens, 31, 4, 16 * kSmallBytesPerToken);

  // This user (single-user mode counts each local uid as its own principal) runs two loads as client "a"...
  std::vector<OpenLoad> held;
  for (int i = 0; i < 2; ++i) {
    held.push_back(StartLoad(raw, ns, tokens, "a"));
    REQUIRE(Planned(held.back()));
  }
  // ...a third as "a" is past the client's cap,
  OpenLoad refused_client = StartLoad(raw, ns, tokens, "a");
  CHECK_FALSE(Planned(refused_client));
  grpc::Status status = refused_client.End();
  INFO(status.error_message());
  CHECK(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(status.error_message().find("limits.max_concurrent_loads_per_client (2)") != std::string::npos);
  // ...another client of the same user gets the principal's last slot,
  held.push_back(StartLoad(raw, ns, tokens, "b"));
  REQUIRE(Planned(held.back()));
  // ...and then no client of this user gets one, though the daemon has five free.
  OpenLoad refused_principal = StartLoad(raw, ns, tokens, "c");
  CHECK_FALSE(Planned(refused_principal));
  status = refused_principal.End();
  INFO(status.error_message());
  CHECK(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(status.error_message().find("uid " + std::to_string(::geteuid()) +
                                    " is running limits.max_concurrent_loads_per_principal (3)") != std::string::npos);
  CHECK(raw.Status().active_loads() == 3);

  // A slot that ends is the principal's again at once.
  CHECK(held.front().End().ok());
  held.erase(held.begin());
  OpenLoad again = StartLoad(raw, ns, tokens, "c");
  CHECK(Planned(again));
  CHECK(again.End().ok());
  for (auto& load : held) CHECK(load.End().ok());
  CHECK(Eventually([&] { return raw.Status().active_loads() == 0; }));
}

TEST_CASE("a reload that revokes a caller ends its running loads, and one that drops every principal is refused",
          "[fairness][reload]") {
  char dir[] = "/tmp/cake-reload-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string config = WriteFile(dir, "caked.toml", Principal("self", "\"engine\", \"admin\""));
  SpawnedDaemon daemon = StartDaemon({"--config", config});
  auto client = Connect(daemon);
  RawStubs raw(daemon);
  const NamespaceSpec ns = SmallNamespace(16);
  const std::vector<uint32_t> tokens = Tokens(64, 32);
  StorePrompt(*client, ns, tokens, 32, 4, 16 * kSmallBytesPerToken);
  OpenLoad running = StartLoad(raw, ns, tokens, "engine-a");
  REQUIRE(Planned(running));

  // The principal keeps administering but is no longer an engine: its running load ends, saying why.
  WriteFile(dir, "caked.toml", Principal("self", "\"admin\""));
  REQUIRE(::kill(daemon.pid(), SIGHUP) == 0);
  REQUIRE(LogSays(daemon, "1 running loads of callers the new policy no longer lets load were ended"));
  const grpc::Status ended = running.End();
  INFO(ended.error_message());
  CHECK(ended.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  CHECK(ended.error_message().find("reloaded") != std::string::npos);
  CHECK(Eventually([&] { return raw.Status().active_loads() == 0; }));

  // A config that lost its principals would make every local user an engine of every tenant: refused, and the
  // policy stays (this user is still no engine).
  WriteFile(dir, "caked.toml", "[server]\nlog_level = \"info\"\n");
  REQUIRE(::kill(daemon.pid(), SIGHUP) == 0);
  REQUIRE(LogSays(daemon, "names no [[access.principal]]"));
  auto lookup = client->Lookup(ns, PromptRef{tokens, {}});
  CHECK(lookup.status().code() == absl::StatusCode::kPermissionDenied);

  // Saying so is how an operator means it.
  WriteFile(dir, "caked.toml", "[access]\nsingle_user = true\n");
  REQUIRE(::kill(daemon.pid(), SIGHUP) == 0);
  CHECK(Eventually([&] { return client->Lookup(ns, PromptRef{tokens, {}}).ok(); }));
  CHECK(daemon.Stop() == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("calls to methods the daemon does not have are counted as one label, not one each", "[fairness][metrics]") {
  SpawnedDaemon daemon = StartDaemon({"--metrics-listen", "127.0.0.1:0"});
  RawStubs raw(daemon);
  const std::string address = raw.Status().metrics_address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));

  // Anyone who can connect may send any path before being identified; 100 invented ones would each have taken
  // one of the 64 label slots.
  grpc::GenericStub generic(raw.channel);
  for (int i = 0; i < 100; ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::Slice empty_message("");
    grpc::ByteBuffer request(&empty_message, 1);
    grpc::ByteBuffer response;
    grpc::Status status;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    generic.UnaryCall(&context, "/cake.v1.KvService/Invented" + std::to_string(i), grpc::StubOptions(), &request,
                      &response, [&](grpc::Status s) {
                        std::lock_guard<std::mutex> lock(mu);
                        status = std::move(s);
                        done = true;
                        cv.notify_one();
                      });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    CHECK(status.error_code() == grpc::StatusCode::UNIMPLEMENTED);
  }
  CHECK(raw.Status().version().size() > 0);  // a real method, counted under its own name

  const std::string metrics = Scrape(port);
  CHECK(metrics.find("Invented") == std::string::npos);
  CHECK(metrics.find("method=\"unimplemented\"") != std::string::npos);
  CHECK(metrics.find("method=\"cake.v1.AdminService/Status\"") != std::string::npos);
}

TEST_CASE("scrapes that run while the daemon stops end cleanly: the endpoint stops before the state it reads",
          "[fairness][metrics][lifecycle]") {
  SpawnedDaemon daemon = StartDaemon({"--metrics-listen", "127.0.0.1:0"});
  RawStubs raw(daemon);
  const std::string address = raw.Status().metrics_address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  std::atomic<bool> stop{false};
  std::atomic<int> answered{0};
  std::vector<std::thread> scrapers;
  for (int i = 0; i < 4; ++i) {
    scrapers.emplace_back([&] {
      while (!stop) {
        if (TryScrape(port).find("cake_build_info") != std::string::npos) ++answered;
      }
    });
  }
  REQUIRE(Eventually([&] { return answered.load() >= 20; }));
  const int exit_code = daemon.Stop();  // SIGTERM while the scrapers keep asking
  stop = true;
  for (std::thread& t : scrapers) t.join();
  INFO(daemon.log());
  CHECK(exit_code == 0);
  CHECK(daemon.log().find("stopped") != std::string::npos);
}

TEST_CASE("a stop in the middle of a load, a prefetch and scrapes ends each cleanly, in the services' Stop order",
          "[fairness][metrics][lifecycle][prefetch]") {
  // DaemonState::Stop ends prefetch, timers, the disposer and the pools in one written order; under
  // AddressSanitizer (scripts/sanitize asan) a member used after it went would be a report, and here a crash.
  ScratchFolder root;
  // Disk reads at about a quarter of a second per chunk: the stop finds every read below still running.
  SpawnedDaemon daemon =
      StartDaemon({"--metrics-listen", "127.0.0.1:0", "--disk-root", root.path, "--disk-read-gbps", "0.002"});
  auto client = Connect(daemon);
  RawStubs raw(daemon);
  const std::string address = raw.Status().metrics_address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  const auto ns = SmallNamespace(64);
  constexpr uint64_t kChunkBytes = 64 * kSmallBytesPerToken;
  constexpr uint32_t kChunks = 16;
  const auto loaded = Tokens(64 * kChunks, 3), prefetched = Tokens(64 * kChunks, 4);
  for (const auto& [tokens, seed] : {std::pair{loaded, 61u}, std::pair{prefetched, 62u}}) {
    StorePrompt(*client, ns, tokens, seed, kChunks, kChunkBytes);
  }
  REQUIRE(Eventually([&] { return Counter(*client, "tier_disk_chunks") == 2 * kChunks; }));
  REQUIRE(client->Evict(TierKind::kDram).ok());

  auto lookup = client->Lookup(ns, {prefetched, {}}, {.prefetch = true});
  REQUIRE(lookup.ok());
  REQUIRE(lookup->prefetch_chunks > 0);
  REQUIRE(Eventually([&] { return Counter(*client, "prefetch_chunks_copied") >= 1; }));

  auto region = client->RegisterRegion(kChunks * kChunkBytes);
  REQUIRE(region.ok());
  LoadOptions options{ns, {loaded, {}}, &*region};
  options.io_only = true;
  auto session = client->StartLoad(options);
  REQUIRE(session.ok());
  auto plan = (*session)->WaitPlan();
  REQUIRE(plan.ok());
  REQUIRE(plan->cached_chunks == kChunks);
  REQUIRE(Eventually([&] { return (*session)->LoadedLow() < kChunks; }));

  std::atomic<bool> stop{false};
  std::atomic<int> answered{0};
  std::vector<std::thread> scrapers;
  for (int i = 0; i < 2; ++i) {
    scrapers.emplace_back([&] {
      while (!stop) {
        if (TryScrape(port).find("cake_build_info") != std::string::npos) ++answered;
      }
    });
  }
  REQUIRE(Eventually([&] { return answered.load() >= 10; }));
  const uint32_t landed_before_stop = kChunks - (*session)->LoadedLow();
  const int exit_code = daemon.Stop();  // SIGTERM: the load, the prefetch's copies and the scrapes all in flight
  stop = true;
  for (std::thread& t : scrapers) t.join();
  INFO(daemon.log());
  CHECK(exit_code == 0);
  CHECK(daemon.log().find("stopped") != std::string::npos);
  CHECK(landed_before_stop < kChunks);      // the load was still reading
  CHECK_FALSE((*session)->Release().ok());  // and was ended by the stop, not finished
  CHECK(daemon.log().find("1 live loads cancelled") != std::string::npos);
}
