// Clients that go silent, give up or ask for much cannot hold the daemon's resources: a load whose client neither
// sends nor reads is ended and frees its slot and window (one that keeps reporting is not), a region whose
// registration the client gave up on is released, and a large registration does not hold a load's reads up.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "base/status_macros.h"
#include "tests/integration/fixture.h"

using namespace cake;
using namespace cake::testing;

namespace {

SpawnedDaemon DaemonWithIdleTimeout(uint32_t ms, uint32_t region_lease_ms = 30000,
                                    uint64_t max_inline_bytes = uint64_t{512} << 20) {
  char dir[] = "/tmp/cake-idle-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string config = WriteFile(dir, "caked.toml",
                                       "[loader]\nidle_timeout_ms = " + std::to_string(ms) +
                                           "\nmax_inline_bytes = " + std::to_string(max_inline_bytes) +
                                           "\n[limits]\nregion_lease_ms = " + std::to_string(region_lease_ms) + "\n");
  auto daemon = StartDaemon({"--config", config});
  std::filesystem::remove_all(dir);
  return daemon;
}

// A daemon that ends loads after 300 ms of silence, a client and raw stubs on it, and a prompt of `chunks` chunks
// of `chunk_tokens` tokens stored in it.
struct SilentSetup {
  SilentSetup(uint32_t chunk_tokens, uint32_t chunks, uint32_t seed)
      : daemon(DaemonWithIdleTimeout(300)),
        client(Connect(daemon)),
        raw(daemon),
        ns(SmallNamespace(chunk_tokens)),
        chunk_bytes(uint64_t{chunk_tokens} * kSmallBytesPerToken),
        tokens(Tokens(size_t{chunk_tokens} * chunks)) {
    StorePrompt(*client, ns, tokens, seed, chunks, chunk_bytes);
  }
  SpawnedDaemon daemon;
  std::unique_ptr<Client> client;
  RawStubs raw;
  NamespaceSpec ns;
  uint64_t chunk_bytes;
  std::vector<uint32_t> tokens;
};

// Reads what the stream still holds, then its end.
template <typename Stream>
grpc::Status ReadToEnd(Stream& stream) {
  v1::LoadResponse response;
  while (stream->Read(&response)) {
  }
  return stream->Finish();
}

uint64_t ActiveLoads(RawStubs& raw) {
  grpc::ClientContext context;
  v1::StatusResponse status;
  REQUIRE(raw.admin->Status(&context, v1::StatusRequest(), &status).ok());
  return status.active_loads();
}

}  // namespace

TEST_CASE("a load whose client goes silent is ended, and its slot and window come back", "[silent]") {
  SilentSetup s(64, 8, 71);
  auto& [daemon, client, raw, ns, chunk_bytes, tokens] = s;
  auto region = client->RegisterRegion(8 * chunk_bytes);
  REQUIRE(region.ok());

  // An engine that sends Start and then nothing, and reads nothing.
  grpc::ClientContext context;
  auto stream = raw.kv->Load(&context);
  REQUIRE(stream->Write(StartOf(ns, tokens, client->client_id(), region->id(), 0, v1::LoadStart::MODE_IO_ONLY)));
  // Waited for by its end, not by its being active: the idle timeout is 300 ms, a window a loaded machine's
  // Status calls could miss; the counter proves the load existed and was ended for its silence.
  REQUIRE(Eventually([&] { return Counter(*client, "loads_idle_ended") == 1; }, std::chrono::seconds(20)));
  REQUIRE(Eventually([&] { return ActiveLoads(raw) == 0; }, std::chrono::seconds(20)));

  // The stream it held says why, once the engine looks.
  const grpc::Status ended = ReadToEnd(stream);
  INFO(ended.error_message());
  CHECK(ended.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  CHECK(ended.error_message().find("loader.idle_timeout_ms") != std::string::npos);

  // Its window is free: the same region loads again at once.
  auto done = LoadAndVerify(*client, ns, tokens, 71, &*region);
  CHECK(done.loaded_chunks == 8);
}

TEST_CASE("an inline load whose client never reads is ended, its unread bytes freed", "[silent]") {
  SilentSetup s(1024, 16, 73);  // 1 MiB chunks, one a message: more than gRPC buffers unread
  auto& [daemon, client, raw, ns, chunk_bytes, tokens] = s;

  grpc::ClientContext context;
  auto stream = raw.kv->Load(&context);
  REQUIRE(stream->Write(StartOf(ns, tokens, client->client_id(), "", 0, v1::LoadStart::MODE_IO_ONLY)));
  // The daemon's write of a chunk nobody reads stays pending: the idle watch cancels it and ends the load.
  REQUIRE(Eventually([&] { return Counter(*client, "loads_idle_ended") == 1; }, std::chrono::seconds(20)));
  REQUIRE(Eventually([&] { return ActiveLoads(raw) == 0; }, std::chrono::seconds(20)));
  CHECK_FALSE(ReadToEnd(stream).ok());
  CHECK(client->Ping().ok());
}

TEST_CASE("inline loads whose clients do not read hold loader.max_inline_bytes at most, all together", "[silent]") {
  // 1 MiB chunks, window 4: each unread load alone would hold 4 MiB; the budget is 3 MiB for all of them.
  auto daemon = DaemonWithIdleTimeout(1500, 30000, uint64_t{3} << 20);
  auto client = Connect(daemon);
  RawStubs raw(daemon);
  const auto ns = SmallNamespace(1024);
  const uint64_t chunk_bytes = 1024 * kSmallBytesPerToken;
  const auto tokens = Tokens(1024 * 16, 74);
  StorePrompt(*client, ns, tokens, 74, 16, chunk_bytes);

  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReaderWriter<v1::LoadRequest, v1::LoadResponse>>> streams;
  for (int i = 0; i < 3; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    streams.push_back(raw.kv->Load(contexts.back().get()));
    REQUIRE(streams.back()->Write(StartOf(ns, tokens, "engine-unread", "", 0, v1::LoadStart::MODE_IO_ONLY)));
  }
  REQUIRE(Eventually([&] { return raw.Status().active_loads() == 3; }));
  REQUIRE(Eventually([&] { return Counter(*client, "inline_reads_waited") >= 1; }));
  for (int i = 0; i < 5; ++i) {  // however long they sit there
    CHECK(Counter(*client, "inline_bytes_held") <= uint64_t{3} << 20);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // An engine that reads gets its turn as soon as room comes back (here: once the silent loads are ended).
  auto done = LoadAndVerify(*client, ns, tokens, 74);
  CHECK(done.loaded_chunks == 16);
  CHECK(Eventually([&] { return Counter(*client, "loads_idle_ended") == 3; }));  // room came from the first
  for (auto& stream : streams) CHECK_FALSE(ReadToEnd(stream).ok());
  CHECK(Eventually([&] { return Counter(*client, "inline_bytes_held") == 0; }));
}

TEST_CASE("an engine that keeps reporting keeps its load, however long it computes", "[silent]") {
  SilentSetup s(64, 8, 72);
  auto& [daemon, client, raw, ns, chunk_bytes, tokens] = s;
  auto region = client->RegisterRegion(8 * chunk_bytes);
  REQUIRE(region.ok());

  grpc::ClientContext context;
  auto stream = raw.kv->Load(&context);
  REQUIRE(stream->Write(StartOf(ns, tokens, client->client_id(), region->id(), 0, v1::LoadStart::MODE_CAKE)));
  std::thread reader([&] {
    v1::LoadResponse response;
    while (stream->Read(&response)) {
    }
  });
  // Ten times the idle timeout, with a Progress (the same chunk count: it is still computing) every 50 ms: a
  // sixth of the timeout, so a loaded machine's late wake-ups do not make a silence of it.
  for (int i = 0; i < 60; ++i) {
    v1::LoadRequest progress;
    progress.mutable_progress()->set_computed_through(0);
    REQUIRE(stream->Write(progress));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(ActiveLoads(raw) == 1);
  v1::LoadRequest release;
  release.mutable_release();
  REQUIRE(stream->Write(release));
  stream->WritesDone();
  reader.join();
  CHECK(stream->Finish().ok());
  CHECK(Counter(*client, "loads_idle_ended") == 0);
}

TEST_CASE("a region whose registration the client gave up on is released, not left to nobody", "[silent]") {
  auto daemon = StartDaemon();
  auto client = Connect(daemon);
  RawStubs raw(daemon);
  // A 256 MiB region takes far longer than a millisecond to map: the client's deadline passes first.
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1));
  v1::RegisterRegionRequest request;
  request.set_client_id("impatient");
  request.set_bytes(uint64_t{256} << 20);
  v1::RegisterRegionResponse response;
  const grpc::Status status = raw.kv->RegisterRegion(&context, request, &response);
  REQUIRE(status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);

  auto regions = [&] {
    grpc::ClientContext c;
    v1::StatusResponse s;
    REQUIRE(raw.admin->Status(&c, v1::StatusRequest(), &s).ok());
    return s.regions();
  };
  // Whether the daemon made it before noticing or not, nothing is left, and a made one is counted as reclaimed.
  REQUIRE(Eventually([&] { return Counter(*client, "regions_registered") == Counter(*client, "regions_reclaimed"); },
                     std::chrono::seconds(20)));
  CHECK(regions() == 0);
}

TEST_CASE("a region whose owner died or went silent is released once its lease runs out, a live owner's is kept",
          "[silent][lease]") {
  // A 1 s lease: the live client renews every third of it, each renewal with that third as its deadline, which on
  // a loaded machine wants more than the hundred-odd milliseconds a shorter lease leaves.
  auto daemon = DaemonWithIdleTimeout(300, 1000);
  RawStubs raw(daemon);
  const auto ns = SmallNamespace(256);
  const uint64_t chunk_bytes = 256 * kSmallBytesPerToken;
  const auto tokens = Tokens(256 * 4, 1);  // the vanishing engine generates the same prompt
  auto client = Connect(daemon, "engine-alive");
  StorePrompt(*client, ns, tokens, 9, 4, chunk_bytes);
  // The client library renews its regions (every third of the lease) while it lives.
  auto kept = client->RegisterRegion(4 * chunk_bytes);
  REQUIRE(kept.ok());

  // A real process that registers a region, starts a load and dies without a word.
  const std::string command = std::string(CAKE_VANISHING_ENGINE_PATH) + " " + daemon.socket_path() + " 256 4";
  REQUIRE(std::system(command.c_str()) == 0);
  // A caller that registers through the raw API and never renews.
  grpc::ClientContext context;
  v1::RegisterRegionRequest request;
  request.set_client_id("engine-silent");
  request.set_bytes(4096);
  v1::RegisterRegionResponse registered;
  REQUIRE(raw.kv->RegisterRegion(&context, request, &registered).ok());
  CHECK(registered.lease_ms() == 1000);

  // Both are gone within a few leases (the dead engine's load ends first, after the idle timeout); the live
  // client's region is kept all along, however long it stays unused.
  REQUIRE(Eventually([&] { return Counter(*client, "regions_expired") == 2; }, std::chrono::seconds(20)));
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));  // three more leases
  CHECK(Counter(*client, "regions_expired") == 2);
  CHECK(raw.Status().regions() == 1);
  grpc::ClientContext renew_context;
  v1::RenewRegionRequest renew;
  renew.set_client_id("engine-silent");
  renew.set_region_id(registered.region_id());
  v1::RenewRegionResponse renewed;
  const grpc::Status late = raw.kv->RenewRegion(&renew_context, renew, &renewed);
  CHECK(late.error_code() == grpc::StatusCode::NOT_FOUND);
  auto done = LoadAndVerify(*client, ns, tokens, 9, &*kept);
  CHECK(done.loaded_chunks == 4);
  CHECK(client->ReleaseRegion(*kept).ok());
}

TEST_CASE("a load's reads never queue behind a region's set-up", "[silent][reads-first]") {
  // One I/O thread: were registrations run there, the load's reads would wait for the whole page mapping.
  auto daemon = StartDaemon({"--io-threads", "1"});
  auto client = Connect(daemon);
  const auto ns = SmallNamespace(64);
  const uint64_t chunk_bytes = 64 * kSmallBytesPerToken;
  const auto tokens = Tokens(64 * 8);
  StorePrompt(*client, ns, tokens, 91, 8, chunk_bytes);
  const uint64_t registered_before = Counter(*client, "regions_registered");

  std::atomic<bool> registered{false};
  std::chrono::steady_clock::duration registration_took{};
  std::thread big([&] {
    // The raw call: the daemon's page mapping alone (a client library would map the region afterwards, too).
    RawStubs raw(daemon);
    grpc::ClientContext context;
    v1::RegisterRegionRequest request;
    request.set_client_id("big-region");
    request.set_bytes(uint64_t{2} << 30);  // over a second of page mapping on this VM
    v1::RegisterRegionResponse response;
    const auto started = std::chrono::steady_clock::now();
    (void)raw.kv->RegisterRegion(&context, request, &response);
    registration_took = std::chrono::steady_clock::now() - started;
    registered = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the registration is under way
  auto done = LoadAndVerify(*client, ns, tokens, 91);
  const bool load_first = !registered.load();
  big.join();
  CHECK(done.loaded_chunks == 8);
  // A registration that took over a second left the load (started 0.1 s in, milliseconds long) all the time it
  // needed: the load must have finished first. Where mapping 2 GiB is quicker (a fast machine), the order says
  // nothing.
  if (registration_took > std::chrono::seconds(1)) {
    CHECK(load_first);
  } else if (!load_first) {
    WARN("the registration finished in under a second, before the load: this run cannot tell the order");
  }
  CHECK(Counter(*client, "regions_registered") == registered_before + 1);
}

TEST_CASE("a Load stream opened without a Start is ended after loader.start_timeout_ms", "[integration][silent]") {
  char dir[] = "/tmp/cake-start-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string config = WriteFile(dir, "caked.toml", "[loader]\nstart_timeout_ms = 300\n");
  SpawnedDaemon daemon = StartDaemon({"--config", config});
  std::filesystem::remove_all(dir);
  RawStubs raw(daemon);
  grpc::ClientContext context;
  auto stream = raw.kv->Load(&context);  // headers only: the daemon holds a stream that has said nothing
  const auto opened = std::chrono::steady_clock::now();
  const grpc::Status status = ReadToEnd(stream);
  CHECK(status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  CHECK_THAT(status.error_message(), Catch::Contains("no Start within 300 ms"));
  CHECK(std::chrono::steady_clock::now() - opened < std::chrono::seconds(10));
  // Loads that do start are not held to it.
  auto client = Connect(daemon);
  const NamespaceSpec ns = SmallNamespace(16);
  const std::vector<uint32_t> tokens = Tokens(16 * 2);
  StorePrompt(*client, ns, tokens, 7, 2, 16 * kSmallBytesPerToken);
  for (int round = 0; round < 2; ++round) {
    LoadOptions load;
    load.ns = ns;
    load.prompt = PromptRef{tokens, {}};
    load.io_only = true;
    auto session = client->StartLoad(load);
    REQUIRE(session.ok());
    auto plan = (*session)->WaitPlan();
    REQUIRE(plan.ok());
    CHECK(plan->cached_chunks == 2);
    REQUIRE((*session)->WaitDone().ok());
    CHECK((*session)->Release().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
  }
  CHECK_THAT(daemon.log(), Catch::Contains("start_timeout_ms is 300 ms"));
}

TEST_CASE("a client loads again after its daemon restarts on the same socket", "[integration][silent]") {
  char dir[] = "/tmp/cake-restart-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string socket = std::string(dir) + "/caked.sock";
  auto first = StartDaemon({"--socket", socket});
  auto client = Connect(first);
  const NamespaceSpec ns = SmallNamespace(16);
  const std::vector<uint32_t> tokens = Tokens(16 * 2);
  auto load_once = [&]() -> absl::StatusOr<LoadPlan> {
    LoadOptions load;
    load.ns = ns;
    load.prompt = PromptRef{tokens, {}};
    CAKE_ASSIGN_OR_RETURN(auto session, client->StartLoad(load));
    CAKE_ASSIGN_OR_RETURN(LoadPlan plan, session->WaitPlan());
    CAKE_RETURN_IF_ERROR(session->Release());
    return plan;
  };
  REQUIRE(load_once().ok());
  CHECK(first.Stop() == 0);
  auto second = StartDaemon({"--socket", socket});
  // gRPC reconnects the channel on its own.
  absl::StatusOr<LoadPlan> plan = load_once();
  for (int retry = 0; !plan.ok() && retry < 50; ++retry) {  // the channel's reconnect may take a moment
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    plan = load_once();
  }
  REQUIRE(plan.ok());
  CHECK(plan->cached_chunks == 0);
  std::filesystem::remove_all(dir);
}
