// Shared set-up for the integration suites: a real caked on a temporary socket, a connected client, and
// prompts whose KV bytes follow a pattern every test can check byte for byte.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cake/v1/admin.grpc.pb.h"
#include "cake/v1/kv.grpc.pb.h"
#include "client/client.h"
#include "grpcpp/grpcpp.h"
#include "testing/spawned_daemon.h"

namespace cake::testing {

// The caked under test: $CAKE_CAKED where set (a test binary that travelled without its build tree, as
// scripts/device-check carries it to a GPU machine), else the one this build made.
inline std::string CakedUnderTest() {
  const char* named = std::getenv("CAKE_CAKED");
  return named != nullptr && *named != '\0' ? std::string(named) : std::string(CAKE_CAKED_PATH);
}

inline SpawnedDaemon StartDaemon(const std::vector<std::string>& args = {}) {
  auto d = SpawnedDaemon::Start(CakedUnderTest(), args);
  if (!d.ok()) FAIL("caked did not start: " << d.status().ToString());
  return std::move(*d);
}

inline std::unique_ptr<Client> Connect(const SpawnedDaemon& d, const std::string& client_id = "engine-a") {
  auto c = Client::Connect({d.socket_path(), client_id});
  if (!c.ok()) FAIL("cannot connect: " << c.status().ToString());
  return std::move(*c);
}

// 2 layers x 2 KV heads x head_dim 64 x BF16: 1 KiB per token.
inline NamespaceSpec SmallNamespace(uint32_t chunk_tokens = 16, std::string tenant = "tenant-a") {
  NamespaceSpec ns;
  ns.model_id = "test/small";
  ns.num_layers = 2;
  ns.num_kv_heads = 2;
  ns.head_dim = 64;
  ns.dtype = DType::kBf16;
  ns.chunk_tokens = chunk_tokens;
  ns.tenant = std::move(tenant);
  return ns;
}
inline constexpr uint64_t kSmallBytesPerToken = 1024;

inline std::vector<uint32_t> Tokens(size_t n, uint32_t seed = 1) {
  std::vector<uint32_t> t(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& v : t) {
    x = x * 1664525u + 1013904223u;
    v = x % 128000;
  }
  return t;
}

// The KV bytes of chunk i of a prompt: every 8-byte word names the seed, the chunk and its position.
inline void FillChunk(std::byte* dst, uint64_t chunk_bytes, uint32_t seed, uint32_t chunk) {
  for (uint64_t w = 0; w < chunk_bytes / 8; ++w) {
    const uint64_t v = (uint64_t{seed} << 48) ^ (uint64_t{chunk} << 32) ^ w;
    std::memcpy(dst + 8 * w, &v, 8);
  }
}

inline bool ChunkMatches(const std::byte* src, uint64_t chunk_bytes, uint32_t seed, uint32_t chunk) {
  std::vector<std::byte> expected(chunk_bytes);
  FillChunk(expected.data(), chunk_bytes, seed, chunk);
  return std::memcmp(src, expected.data(), chunk_bytes) == 0;
}

// Stores chunks [0, count) of the prompt through a scratch region.
inline void StorePrompt(Client& client, const NamespaceSpec& ns, const std::vector<uint32_t>& tokens, uint32_t seed,
                        uint32_t count, uint64_t chunk_bytes) {
  auto region = client.RegisterRegion(count * chunk_bytes);
  REQUIRE(region.ok());
  for (uint32_t i = 0; i < count; ++i) FillChunk(region->data() + i * chunk_bytes, chunk_bytes, seed, i);
  auto stored = client.Store(ns, PromptRef{tokens, {}}, 0, count, *region, 0);
  REQUIRE(stored.ok());
  REQUIRE(stored->stored_chunks + stored->already_cached == count);
  REQUIRE(client.ReleaseRegion(*region).ok());
}

// Raw stubs, for requests the client library would never send.
struct RawStubs {
  explicit RawStubs(const SpawnedDaemon& d) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(1 << 30);
    args.SetMaxSendMessageSize(1 << 30);
    channel = grpc::CreateCustomChannel("unix:" + d.socket_path(), grpc::InsecureChannelCredentials(), args);
    kv = v1::KvService::NewStub(channel);
    admin = v1::AdminService::NewStub(channel);
  }
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::KvService::Stub> kv;
  std::unique_ptr<v1::AdminService::Stub> admin;

  v1::StatusResponse Status() {
    grpc::ClientContext context;
    v1::StatusResponse response;
    REQUIRE(admin->Status(&context, v1::StatusRequest(), &response).ok());
    return response;
  }
};

inline void ToProto(const NamespaceSpec& spec, v1::Namespace* out) {
  out->set_model_id(spec.model_id);
  out->set_num_layers(spec.num_layers);
  out->set_num_kv_heads(spec.num_kv_heads);
  out->set_head_dim(spec.head_dim);
  out->set_dtype(static_cast<v1::DType>(spec.dtype));
  out->set_chunk_tokens(spec.chunk_tokens);
  out->set_tenant(spec.tenant);
}

// A LoadStart message for a raw Load stream (tests that speak the protocol themselves, not through the client).
inline v1::LoadRequest StartOf(const NamespaceSpec& ns, const std::vector<uint32_t>& tokens,
                               const std::string& client_id, const std::string& region_id, uint64_t offset = 0,
                               v1::LoadStart::Mode mode = v1::LoadStart::MODE_CAKE) {
  v1::LoadRequest request;
  v1::LoadStart* start = request.mutable_start();
  start->set_client_id(client_id);
  ToProto(ns, start->mutable_namespace_());
  start->mutable_prompt()->mutable_tokens()->Add(tokens.begin(), tokens.end());
  start->set_region_id(region_id);
  start->set_region_offset(offset);
  start->set_mode(mode);
  return request;
}

// A TCP port on 127.0.0.1 that was free a moment ago, for a daemon's listener.
inline int FreeLoopbackPort() {
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

// Polls until pred() holds or `bound` (10 s) passes; the bound only turns a bug into a failure instead of a hang.
template <typename Pred>
bool Eventually(Pred pred, std::chrono::milliseconds bound = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

// A fresh folder under /tmp, removed with everything in it at scope exit.
struct ScratchFolder {
  ScratchFolder() {
    char tmpl[] = "/tmp/cake-test-XXXXXX";
    const char* made = ::mkdtemp(tmpl);
    REQUIRE(made != nullptr);
    path = made;
  }
  ~ScratchFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  ScratchFolder(const ScratchFolder&) = delete;
  ScratchFolder& operator=(const ScratchFolder&) = delete;
  std::string path;
};

inline std::string WriteFile(const std::string& dir, const std::string& name, const std::string& text) {
  std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

struct Loaded {
  LoadPlan plan;
  LoadDone done;
};

// Runs a whole load with an engine that computes chunk i in compute(i) and stops as soon as its next chunk is
// resident; checks every loaded chunk's bytes.
template <typename ComputeFn>
Loaded RunCakeLoad(Client& client, const LoadOptions& options, uint32_t seed, ComputeFn compute) {
  auto session = client.StartLoad(options);
  REQUIRE(session.ok());
  auto plan = (*session)->WaitPlan();
  REQUIRE(plan.ok());
  for (uint32_t c = 0; c < plan->cached_chunks; ++c) {
    if ((*session)->IsResident(c)) break;
    compute(c);
    REQUIRE((*session)->ReportProgress(c + 1).ok());
  }
  auto done = (*session)->WaitDone();
  REQUIRE(done.ok());
  for (uint32_t c = done->meeting_chunk; c < plan->cached_chunks; ++c) {
    REQUIRE((*session)->IsResident(c));
    const std::byte* bytes = options.region != nullptr
                                 ? options.region->data() + (*session)->RegionOffset(c)
                                 : reinterpret_cast<const std::byte*>((*session)->InlineChunk(c).data());
    INFO("chunk " << c);
    REQUIRE(ChunkMatches(bytes, plan->chunk_bytes, seed, c));
  }
  REQUIRE((*session)->Release().ok());
  return {*plan, *done};
}

// A daemon counter (cakectl stats), 0 when absent.
inline uint64_t Counter(Client& client, const std::string& name) {
  auto stats = client.Stats();
  REQUIRE(stats.ok());
  auto it = stats->find(name);
  return it == stats->end() ? 0 : it->second;
}

// Loads the whole cached prefix (I/O only), into `region` or inline, and checks every loaded chunk against its
// pattern.
inline LoadDone LoadAndVerify(Client& client, const NamespaceSpec& ns, const std::vector<uint32_t>& tokens,
                              uint32_t seed, const MappedRegion* region = nullptr) {
  LoadOptions options{ns, {tokens, {}}, region};
  options.io_only = true;
  auto session = client.StartLoad(options);
  REQUIRE(session.ok());
  auto plan = (*session)->WaitPlan();
  REQUIRE(plan.ok());
  auto done = (*session)->WaitDone();
  REQUIRE(done.ok());
  for (uint32_t c = done->meeting_chunk; c < plan->cached_chunks; ++c) {
    INFO("chunk " << c);
    const std::byte* bytes = region != nullptr ? region->data() + (*session)->RegionOffset(c)
                                               : reinterpret_cast<const std::byte*>((*session)->InlineChunk(c).data());
    REQUIRE(ChunkMatches(bytes, plan->chunk_bytes, seed, c));
  }
  REQUIRE((*session)->Release().ok());
  return *done;
}

// Runs a shell command, standard error folded into the output.
struct CommandResult {
  int exit_code;
  std::string output;
};

inline CommandResult Run(const std::string& command) {
  CommandResult result{-1, ""};
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) result.output.append(buf, n);
  int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace cake::testing
