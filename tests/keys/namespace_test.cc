// Namespace validation and the chained chunk keys, with golden vectors that pin the key format.
#include "keys/namespace.h"

#include <toml++/toml.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

namespace cake {
namespace {

NamespaceSpec TestSpec() {
  NamespaceSpec spec;
  spec.model_id = "test-model";
  spec.num_layers = 2;
  spec.num_kv_heads = 2;
  spec.head_dim = 4;
  spec.dtype = DType::kBf16;
  spec.chunk_tokens = 4;
  spec.tenant = "t";
  return spec;
}

Namespace MakeNamespace(NamespaceSpec spec = TestSpec(), std::string_view secret = {}) {
  auto ns = Namespace::Create(std::move(spec), NamespaceLimits{}, secret);
  REQUIRE(ns.ok());
  return *std::move(ns);
}

std::vector<uint32_t> Iota(uint32_t n, uint32_t first = 0) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<std::string> HexAll(const std::vector<ChunkKey>& keys) {
  std::vector<std::string> out;
  for (const ChunkKey& k : keys) out.push_back(k.Hex());
  return out;
}

absl::Status CreateStatus(const NamespaceSpec& spec, const NamespaceLimits& limits = {}) {
  return Namespace::Create(spec, limits).status();
}

}  // namespace

// These values are on the wire and on disk: a change here orphans every stored chunk, so it must be deliberate
// (a new key version), never a side effect of a refactor. They were checked against an independent SHA-256
// computation of the documented encoding, not just copied from the implementation.
TEST_CASE("namespace: golden key vectors", "[namespace]") {
  Namespace ns = MakeNamespace();
  CHECK(ns.id().Hex() == "7bc5ed66a28f7b98501c71b471e4124e");
  CHECK(ns.root().Hex() == "abb95579f37320b785ec432dd2da62d7");
  const std::vector<uint32_t> tokens = Iota(16);
  CHECK(HexAll(ns.KeysForTokens(tokens)) == std::vector<std::string>{
                                                "5a0970907ea8f21bfc333e4d867d1f4c",
                                                "06319f375fef49890e34babe9f660648",
                                                "162064a608bee51554a58be67a61b03e",
                                                "c5f2a63aaa6447a49653d9ac55031ded",
                                            });

  const std::string engine_key(16, 'a');
  const std::vector<std::string_view> engine = {engine_key};
  auto engine_keys = ns.KeysForEngineKeys(engine);
  REQUIRE(engine_keys.ok());
  CHECK(HexAll(*engine_keys) == std::vector<std::string>{"4e55fb6a72bd0a79c0911f2bf4beff2d"});

  // The key secret changes the root only; the id is the same.
  Namespace secret = MakeNamespace(TestSpec(), "secret");
  CHECK(secret.id().Hex() == "7bc5ed66a28f7b98501c71b471e4124e");
  CHECK(secret.root().Hex() == "9c69e236222973946110abbaf182b256");
}

// The vectors the Python client checks too (python/tests/test_keys.py): one file, two implementations.
TEST_CASE("namespace: the shared golden vectors file", "[namespace]") {
  const toml::table file = toml::parse_file(CAKE_SOURCE_DIR "/tests/golden/chunk_keys.toml");
  const toml::array* vectors = file["vector"].as_array();
  REQUIRE(vectors != nullptr);
  REQUIRE(vectors->size() >= 3);
  auto u32 = [](const toml::table& t, const char* key) { return static_cast<uint32_t>(t[key].value_or(int64_t{0})); };
  auto strings = [](const toml::table& t, const char* key) {
    std::vector<std::string> out;
    if (const toml::array* a = t[key].as_array()) {
      for (const toml::node& n : *a) out.push_back(n.value_or(std::string()));
    }
    return out;
  };
  for (const toml::node& node : *vectors) {
    const toml::table& v = *node.as_table();
    INFO(v["name"].value_or(std::string()));
    NamespaceSpec spec;
    spec.model_id = v["model_id"].value_or(std::string());
    spec.num_layers = u32(v, "num_layers");
    spec.num_kv_heads = u32(v, "num_kv_heads");
    spec.head_dim = u32(v, "head_dim");
    spec.dtype = static_cast<DType>(u32(v, "dtype"));
    spec.tp_rank = u32(v, "tp_rank");
    spec.tp_size = u32(v, "tp_size");
    spec.chunk_tokens = u32(v, "chunk_tokens");
    spec.tenant = v["tenant"].value_or(std::string());
    spec.stored_precision = static_cast<StoredPrecision>(u32(v, "stored_precision"));  // absent: 0, EXACT
    Namespace ns = MakeNamespace(spec, v["secret"].value_or(std::string()));
    CHECK(ns.id().Hex() == v["namespace_id"].value_or(std::string()));
    CHECK(ns.root().Hex() == v["root"].value_or(std::string()));
    std::vector<uint32_t> tokens;
    for (const toml::node& t : *v["tokens"].as_array()) tokens.push_back(static_cast<uint32_t>(t.value_or(int64_t{0})));
    CHECK(HexAll(ns.KeysForTokens(tokens)) == strings(v, "keys"));
    std::vector<std::string> engine_bytes;
    for (const std::string& hex : strings(v, "engine_keys")) {
      std::string raw;
      for (size_t i = 0; i + 1 < hex.size(); i += 2)
        raw.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
      engine_bytes.push_back(raw);
    }
    const std::vector<std::string_view> engine(engine_bytes.begin(), engine_bytes.end());
    auto stored = ns.KeysForEngineKeys(engine);
    REQUIRE(stored.ok());
    CHECK(HexAll(*stored) == strings(v, "stored_engine_keys"));
  }
}

TEST_CASE("namespace: a partial tail chunk gets no key", "[namespace]") {
  Namespace ns = MakeNamespace();
  const auto full = ns.KeysForTokens(Iota(16));
  const auto with_tail = ns.KeysForTokens(Iota(18));
  CHECK(with_tail == full);
  CHECK(ns.KeysForTokens(Iota(15)).size() == 3);
  CHECK(ns.KeysForTokens(Iota(3)).empty());
  CHECK(ns.KeysForTokens({}).empty());
}

TEST_CASE("namespace: tenants are isolated", "[namespace]") {
  NamespaceSpec other = TestSpec();
  other.tenant = "u";
  Namespace a = MakeNamespace();
  Namespace b = MakeNamespace(other);
  CHECK_FALSE(a.id() == b.id());
  CHECK_FALSE(a.root() == b.root());
  const auto ka = a.KeysForTokens(Iota(16));
  const auto kb = b.KeysForTokens(Iota(16));
  REQUIRE(ka.size() == 4);
  REQUIRE(kb.size() == 4);
  for (size_t i = 0; i < ka.size(); ++i) CHECK_FALSE(ka[i] == kb[i]);
}

TEST_CASE("namespace: the key secret changes root and keys but not the id", "[namespace]") {
  Namespace a = MakeNamespace(TestSpec(), "secret-a");
  Namespace b = MakeNamespace(TestSpec(), "secret-b");
  Namespace none = MakeNamespace(TestSpec());
  CHECK(a.id() == b.id());
  CHECK(a.id() == none.id());
  CHECK_FALSE(a.root() == b.root());
  CHECK_FALSE(a.root() == none.root());
  const auto ka = a.KeysForTokens(Iota(16));
  const auto kb = b.KeysForTokens(Iota(16));
  for (size_t i = 0; i < ka.size(); ++i) CHECK_FALSE(ka[i] == kb[i]);
}

TEST_CASE("namespace: every layout field is part of the id", "[namespace]") {
  const ChunkKey base = MakeNamespace().id();
  auto id_with = [](auto mutate) {
    NamespaceSpec spec = TestSpec();
    mutate(spec);
    return MakeNamespace(spec).id();
  };
  CHECK_FALSE(id_with([](NamespaceSpec& s) { s.model_id = "test-model2"; }) == base);
  CHECK_FALSE(id_with([](NamespaceSpec& s) { s.num_layers = 3; }) == base);
  CHECK_FALSE(id_with([](NamespaceSpec& s) { s.num_kv_heads = 3; }) == base);
  CHECK_FALSE(id_with([](NamespaceSpec& s) { s.head_dim = 8; }) == base);
  CHECK_FALSE(id_with([](NamespaceSpec& s) { s.dtype = DType::kFp16; }) == base);
  CHECK_FALSE(id_with([](NamespaceSpec& s) {
                s.tp_size = 2;
                s.tp_rank = 1;
              }) == base);
  CHECK_FALSE(id_with([](NamespaceSpec& s) { s.tp_size = 2; }) == base);
  CHECK_FALSE(id_with([](NamespaceSpec& s) { s.chunk_tokens = 8; }) == base);
  CHECK_FALSE(id_with([](NamespaceSpec& s) { s.tenant = ""; }) == base);
  // Same spec, same id: the id is a pure function of the spec.
  CHECK(MakeNamespace().id() == base);
}

TEST_CASE("namespace: keys are chained over the whole prefix", "[namespace]") {
  Namespace ns = MakeNamespace();
  const std::vector<uint32_t> a = Iota(16);

  SECTION("a shared first chunk gives the same first key, a later difference changes only later keys") {
    std::vector<uint32_t> b = a;
    b[9] = 1000;  // inside chunk 2
    const auto ka = ns.KeysForTokens(a);
    const auto kb = ns.KeysForTokens(b);
    CHECK(ka[0] == kb[0]);
    CHECK(ka[1] == kb[1]);
    CHECK_FALSE(ka[2] == kb[2]);
    CHECK_FALSE(ka[3] == kb[3]);
  }
  SECTION("a different first chunk changes every key, even where later chunks are equal") {
    std::vector<uint32_t> b = a;
    b[0] = 1000;
    const auto ka = ns.KeysForTokens(a);
    const auto kb = ns.KeysForTokens(b);
    for (size_t i = 0; i < ka.size(); ++i) CHECK_FALSE(ka[i] == kb[i]);
  }
  SECTION("equal chunks at different positions get different keys") {
    const std::vector<uint32_t> same(16, 7);
    const auto k = ns.KeysForTokens(same);
    CHECK_FALSE(k[0] == k[1]);
    CHECK_FALSE(k[1] == k[2]);
  }
}

TEST_CASE("namespace: engine-supplied keys", "[namespace]") {
  Namespace ns = MakeNamespace();
  const std::string e0(16, 'a');
  const std::string e1(16, 'b');

  SECTION("16-byte keys map to tenant-specific keys") {
    const std::vector<std::string_view> engine = {e0, e1};
    auto keys = ns.KeysForEngineKeys(engine);
    REQUIRE(keys.ok());
    REQUIRE(keys->size() == 2);
    CHECK_FALSE((*keys)[0] == (*keys)[1]);

    NamespaceSpec other = TestSpec();
    other.tenant = "u";
    auto other_keys = MakeNamespace(other).KeysForEngineKeys(engine);
    REQUIRE(other_keys.ok());
    CHECK_FALSE((*keys)[0] == (*other_keys)[0]);
    CHECK_FALSE((*keys)[1] == (*other_keys)[1]);

    // Deterministic, and a different scheme from token keys: the same 16 bytes never alias a token chain.
    auto again = ns.KeysForEngineKeys(engine);
    REQUIRE(again.ok());
    CHECK(*again == *keys);
  }
  SECTION("an empty list gives no keys") {
    auto keys = ns.KeysForEngineKeys({});
    REQUIRE(keys.ok());
    CHECK(keys->empty());
  }
  SECTION("a key of the wrong length is rejected, naming its index") {
    const std::string short_key(15, 'c');
    const std::string long_key(17, 'c');
    for (const std::string* bad : {&short_key, &long_key}) {
      const std::vector<std::string_view> engine = {e0, e1, *bad};
      auto keys = ns.KeysForEngineKeys(engine);
      REQUIRE_FALSE(keys.ok());
      CHECK(keys.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK_THAT(std::string(keys.status().message()), Catch::Contains("chunk key 2"));
    }
  }
}

TEST_CASE("namespace: validation names the bad field", "[namespace]") {
  auto expect_invalid = [](const NamespaceSpec& spec, const char* field, const NamespaceLimits& limits = {}) {
    absl::Status s = CreateStatus(spec, limits);
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Catch::Contains(field));
  };
  REQUIRE(CreateStatus(TestSpec()).ok());

  NamespaceSpec s = TestSpec();
  s.model_id = "";
  expect_invalid(s, "model_id");
  s = TestSpec();
  s.model_id = std::string(257, 'm');
  expect_invalid(s, "model_id");
  s = TestSpec();
  s.tenant = std::string(257, 't');
  expect_invalid(s, "tenant");
  s = TestSpec();
  s.num_layers = 0;
  expect_invalid(s, "num_layers");
  s = TestSpec();
  s.num_kv_heads = 0;
  expect_invalid(s, "num_kv_heads");
  s = TestSpec();
  s.head_dim = 0;
  expect_invalid(s, "head_dim");
  s = TestSpec();
  s.dtype = static_cast<DType>(0);
  expect_invalid(s, "dtype");
  s = TestSpec();
  s.dtype = static_cast<DType>(6);
  expect_invalid(s, "dtype");
  s = TestSpec();
  s.tp_size = 2;
  s.tp_rank = 2;
  expect_invalid(s, "tp_rank");
  s = TestSpec();
  s.chunk_tokens = 0;
  expect_invalid(s, "chunk_tokens");
  s = TestSpec();
  s.chunk_tokens = NamespaceLimits{}.max_chunk_tokens + 1;
  expect_invalid(s, "chunk_tokens");
  s = TestSpec();
  s.chunk_tokens = 9;
  expect_invalid(s, "chunk_tokens", NamespaceLimits{.max_chunk_bytes = uint64_t{1} << 30, .max_chunk_tokens = 8});

  SECTION("a chunk over max_chunk_bytes is rejected; exactly at the limit is accepted") {
    // 64 bytes per token * 4 tokens = 256 bytes per chunk.
    NamespaceLimits limits;
    limits.max_chunk_bytes = 255;
    expect_invalid(TestSpec(), "max_chunk_bytes", limits);
    limits.max_chunk_bytes = 256;
    CHECK(CreateStatus(TestSpec(), limits).ok());
  }
  SECTION("a chunk size that overflows 64 bits is still rejected") {
    // 2 * 4096 * 4096 * 16384 * 4 = 2^41 bytes per token; 2^23 tokens make exactly 2^64, which wraps to 0.
    NamespaceSpec huge = TestSpec();
    huge.num_layers = 4096;
    huge.num_kv_heads = 4096;
    huge.head_dim = 16384;
    huge.dtype = DType::kFp32;
    huge.chunk_tokens = 1u << 23;
    NamespaceLimits limits;
    limits.max_chunk_tokens = UINT32_MAX;
    expect_invalid(huge, "max_chunk_bytes", limits);
  }
}

TEST_CASE("namespace: tp_size 0 means 1", "[namespace]") {
  NamespaceSpec spec = TestSpec();
  spec.tp_size = 0;
  Namespace ns = MakeNamespace(spec);
  CHECK(ns.spec().tp_size == 1);
  CHECK(ns.id() == MakeNamespace().id());
}

TEST_CASE("namespace: bytes per token and per chunk", "[namespace]") {
  Namespace ns = MakeNamespace();
  CHECK(ns.bytes_per_token() == 2 * 2 * 2 * 4 * 2);
  CHECK(ns.chunk_bytes() == 64 * 4);
  CHECK(ns.chunk_tokens() == 4);

  NamespaceSpec spec = TestSpec();
  spec.num_layers = 32;
  spec.num_kv_heads = 8;
  spec.head_dim = 128;
  spec.dtype = DType::kFp32;
  spec.chunk_tokens = 256;
  Namespace big = MakeNamespace(spec);
  CHECK(big.bytes_per_token() == uint64_t{2} * 32 * 8 * 128 * 4);
  CHECK(big.chunk_bytes() == big.bytes_per_token() * 256);

  CHECK(DTypeBytes(DType::kFp32) == 4);
  CHECK(DTypeBytes(DType::kFp16) == 2);
  CHECK(DTypeBytes(DType::kBf16) == 2);
  CHECK(DTypeBytes(DType::kFp8) == 1);
  CHECK(DTypeBytes(DType::kInt8) == 1);
  CHECK(DTypeBytes(static_cast<DType>(0)) == 0);
}

TEST_CASE("namespace: key hex is lowercase, 32 digits", "[namespace]") {
  ChunkKey k;
  for (size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = static_cast<uint8_t>(i * 17);
  CHECK(k.Hex() == "00112233445566778899aabbccddeeff");
}

}  // namespace cake
