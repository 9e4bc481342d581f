// Every kind of bad request gets its own gRPC status code and a message a person can act on, and the daemon
// goes on serving everyone else with nothing lost.
#include "tests/integration/fixture.h"

using namespace cake;
using namespace cake::testing;

namespace {

v1::LookupRequest LookupOf(const NamespaceSpec& ns, const std::vector<uint32_t>& tokens) {
  v1::LookupRequest request;
  ToProto(ns, request.mutable_namespace_());
  request.mutable_prompt()->mutable_tokens()->Add(tokens.begin(), tokens.end());
  return request;
}

grpc::Status CallLookup(RawStubs& raw, const v1::LookupRequest& request) {
  grpc::ClientContext context;
  v1::LookupResponse response;
  return raw.kv->Lookup(&context, request, &response);
}

// Sends the given messages on one Load stream and returns how it ended.
grpc::Status RunLoadStream(RawStubs& raw, const std::vector<v1::LoadRequest>& requests) {
  grpc::ClientContext context;
  auto stream = raw.kv->Load(&context);
  for (const auto& r : requests) {
    if (!stream->Write(r)) break;
  }
  stream->WritesDone();
  v1::LoadResponse response;
  while (stream->Read(&response)) {
  }
  return stream->Finish();
}

void ExpectCode(const grpc::Status& status, grpc::StatusCode code, const std::string& words) {
  INFO("status: " << status.error_code() << " " << status.error_message());
  CHECK(status.error_code() == code);
  CHECK(status.error_message().find(words) != std::string::npos);
}

}  // namespace

TEST_CASE("bad requests get specific codes and the daemon keeps serving", "[bad-input]") {
  const std::string limits_dir = "/tmp";
  auto config = WriteFile(limits_dir, "cake-bad-input-" + std::to_string(getpid()) + ".toml",
                          "[limits]\nmax_prompt_tokens = 4096\nmax_region_bytes = 16777216\n");
  // Without device regions, even on a machine with a GPU: a CUDA region request is one of the bad inputs.
  auto daemon = StartDaemon({"--config", config, "--no-cuda"});
  std::remove(config.c_str());
  RawStubs raw(daemon);
  auto client = Connect(daemon, "engine-a");
  auto intruder = Connect(daemon, "engine-b");
  const auto ns = SmallNamespace();
  const uint64_t chunk_bytes = 16 * kSmallBytesPerToken;
  const auto tokens = Tokens(16 * 8);
  StorePrompt(*client, ns, tokens, 5, 8, chunk_bytes);
  auto region = client->RegisterRegion(8 * chunk_bytes);
  REQUIRE(region.ok());

  SECTION("Lookup") {
    ExpectCode(CallLookup(raw, LookupOf(ns, {})), grpc::StatusCode::INVALID_ARGUMENT, "empty");
    auto both = LookupOf(ns, tokens);
    both.mutable_prompt()->add_chunk_keys(std::string(16, 'k'));
    ExpectCode(CallLookup(raw, both), grpc::StatusCode::INVALID_ARGUMENT, "both");
    v1::LookupRequest short_key;
    ToProto(ns, short_key.mutable_namespace_());
    short_key.mutable_prompt()->add_chunk_keys(std::string(16, 'k'));
    short_key.mutable_prompt()->add_chunk_keys("too-short");
    ExpectCode(CallLookup(raw, short_key), grpc::StatusCode::INVALID_ARGUMENT, "chunk key 1 is 9 bytes");
    ExpectCode(CallLookup(raw, LookupOf(ns, Tokens(5000))), grpc::StatusCode::INVALID_ARGUMENT,
               "limits.max_prompt_tokens");
    auto no_layers = ns;
    no_layers.num_layers = 0;
    ExpectCode(CallLookup(raw, LookupOf(no_layers, tokens)), grpc::StatusCode::INVALID_ARGUMENT, "num_layers");
    auto no_dtype = LookupOf(ns, tokens);
    no_dtype.mutable_namespace_()->set_dtype(v1::DTYPE_UNSPECIFIED);
    ExpectCode(CallLookup(raw, no_dtype), grpc::StatusCode::INVALID_ARGUMENT, "dtype");
    auto bad_rank = LookupOf(ns, tokens);
    bad_rank.mutable_namespace_()->set_tp_size(2);
    bad_rank.mutable_namespace_()->set_tp_rank(2);
    ExpectCode(CallLookup(raw, bad_rank), grpc::StatusCode::INVALID_ARGUMENT, "tp_rank");
    auto huge_chunk = ns;
    huge_chunk.num_layers = 4096;
    huge_chunk.num_kv_heads = 4096;
    huge_chunk.chunk_tokens = 4096;
    ExpectCode(CallLookup(raw, LookupOf(huge_chunk, Tokens(4096))), grpc::StatusCode::INVALID_ARGUMENT,
               "limits.max_chunk_bytes");
    // 2-byte chunks would cost every tier a page and an index entry each while its budget counted 2 bytes.
    auto tiny_chunk = ns;
    tiny_chunk.num_layers = 1;
    tiny_chunk.num_kv_heads = 1;
    tiny_chunk.head_dim = 1;
    tiny_chunk.chunk_tokens = 1;
    ExpectCode(CallLookup(raw, LookupOf(tiny_chunk, Tokens(16))), grpc::StatusCode::INVALID_ARGUMENT,
               "limits.min_chunk_bytes");
  }

  SECTION("regions") {
    v1::RegisterRegionRequest request;
    v1::RegisterRegionResponse response;
    request.set_client_id("engine-a");
    request.set_bytes(0);
    {
      grpc::ClientContext context;
      ExpectCode(raw.kv->RegisterRegion(&context, request, &response), grpc::StatusCode::INVALID_ARGUMENT,
                 "region size 0");
    }
    request.set_bytes(uint64_t{1} << 40);
    {
      grpc::ClientContext context;
      ExpectCode(raw.kv->RegisterRegion(&context, request, &response), grpc::StatusCode::INVALID_ARGUMENT,
                 "limits.max_region_bytes");
    }
    request.set_bytes(4096);
    request.set_client_id("");
    {
      grpc::ClientContext context;
      ExpectCode(raw.kv->RegisterRegion(&context, request, &response), grpc::StatusCode::INVALID_ARGUMENT, "client_id");
    }
    request.set_client_id("engine-a");
    request.set_kind(v1::REGION_CUDA_IPC);
    {
      grpc::ClientContext context;
      ExpectCode(raw.kv->RegisterRegion(&context, request, &response), grpc::StatusCode::FAILED_PRECONDITION,
                 "no device regions");
    }
    CHECK(intruder->ReleaseRegion(*region).code() == absl::StatusCode::kPermissionDenied);
    REQUIRE(client->ReleaseRegion(*region).ok());
    CHECK(client->ReleaseRegion(*region).code() == absl::StatusCode::kNotFound);
  }

  SECTION("Load") {
    ExpectCode(RunLoadStream(raw, {StartOf(ns, tokens, "engine-b", region->id())}), grpc::StatusCode::PERMISSION_DENIED,
               "another client");
    ExpectCode(RunLoadStream(raw, {StartOf(ns, tokens, "engine-a", "r-doesnotexist")}), grpc::StatusCode::NOT_FOUND,
               "not registered");
    ExpectCode(RunLoadStream(raw, {StartOf(ns, tokens, "engine-a", region->id(), region->size() + 1)}),
               grpc::StatusCode::OUT_OF_RANGE, "past the end");
    ExpectCode(RunLoadStream(raw, {StartOf(ns, {}, "engine-a", region->id())}), grpc::StatusCode::INVALID_ARGUMENT,
               "empty");
    v1::LoadRequest progress;
    progress.mutable_progress()->set_computed_through(1);
    ExpectCode(RunLoadStream(raw, {progress}), grpc::StatusCode::FAILED_PRECONDITION, "before Start");
    auto start = StartOf(ns, tokens, "engine-a", region->id());
    ExpectCode(RunLoadStream(raw, {start, start}), grpc::StatusCode::INVALID_ARGUMENT, "twice");
    v1::LoadRequest beyond;
    beyond.mutable_progress()->set_computed_through(1000);
    ExpectCode(RunLoadStream(raw, {start, beyond}), grpc::StatusCode::INVALID_ARGUMENT, "computed_through 1000");
    auto held_beyond = start;
    held_beyond.mutable_start()->set_computed_through(1000);
    ExpectCode(RunLoadStream(raw, {held_beyond}), grpc::StatusCode::INVALID_ARGUMENT, "computed_through 1000");
    auto wide = start;
    wide.mutable_start()->set_window(100000);
    ExpectCode(RunLoadStream(raw, {wide}), grpc::StatusCode::INVALID_ARGUMENT, "loader.max_window");
    ExpectCode(RunLoadStream(raw, {v1::LoadRequest()}), grpc::StatusCode::INVALID_ARGUMENT, "none of");
  }

  SECTION("Store") {
    auto of_another = intruder->Store(ns, {tokens, {}}, 0, 1, *region, 0);
    CHECK(of_another.status().code() == absl::StatusCode::kPermissionDenied);
    CHECK(client->Store(ns, {tokens, {}}, 6, 4, *region, 0).status().code() == absl::StatusCode::kOutOfRange);
    CHECK(client->Store(ns, {tokens, {}}, 0, 0, *region, 0).status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(client->Store(ns, {tokens, {}}, 0, 8, *region, 1).status().code() == absl::StatusCode::kOutOfRange);
    std::vector<std::string_view> wrong_size = {"abc"};
    auto inline_bad = client->StoreInline(ns, {tokens, {}}, 0, wrong_size);
    CHECK(inline_bad.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(inline_bad.status().message()).find("inline chunk 0 is 3 bytes") != std::string::npos);
  }

  // Whatever was refused above, the daemon still serves, and the stored prefix is intact.
  CHECK(client->Ping().ok());
  auto lookup = client->Lookup(ns, {tokens, {}});
  REQUIRE(lookup.ok());
  CHECK(lookup->cached_chunks == 8);
  LoadOptions options{ns, {tokens, {}}, nullptr};
  options.io_only = true;
  auto session = client->StartLoad(options);
  REQUIRE(session.ok());
  auto done = (*session)->WaitDone();
  REQUIRE(done.ok());
  CHECK(done->loaded_chunks == 8);
  for (uint32_t c = 0; c < 8; ++c) {
    CHECK(ChunkMatches(reinterpret_cast<const std::byte*>((*session)->InlineChunk(c).data()), chunk_bytes, 5, c));
  }
  CHECK((*session)->Release().ok());
}

TEST_CASE("too many regions for one client is RESOURCE_EXHAUSTED", "[bad-input]") {
  auto config =
      WriteFile("/tmp", "cake-regions-" + std::to_string(getpid()) + ".toml", "[limits]\nmax_regions_per_client = 2\n");
  auto daemon = StartDaemon({"--config", config});
  std::remove(config.c_str());
  auto client = Connect(daemon);
  auto a = client->RegisterRegion(4096);
  auto b = client->RegisterRegion(4096);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto c = client->RegisterRegion(4096);
  CHECK(c.status().code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(client->ReleaseRegion(*a).ok());
  CHECK(client->RegisterRegion(4096).ok());
}
