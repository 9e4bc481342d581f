// cake-bench soak: the fault and soak bench (never a timed test). N engines, threads each with a client of its own,
// run a random mix of lookups, Cake loads into a host region, inline loads, stores of freshly computed chunks,
// cancelled loads and killed clients (cake_vanishing_engine, SIGKILLed part way through its life) against a private
// caked whose DRAM tier is small enough to evict, with a disk tier in a scratch folder and a private redis-server.
// Meanwhile, from outside the daemon as a failing disk or a peer writing Redis would, it corrupts a share of the
// chunks the engines are about to read from disk or Redis (a payload byte of the chunk file; a byte of a Redis
// value's part or header, or a whole part dropped), and it freezes Redis (SIGSTOP) for a few seconds every few
// seconds. Every chunk a load reports loaded is checked byte for byte against the pattern of its (prompt, chunk).
// Other peers share the socket with the engines: idle connections (--idle-connections) opened before the engines start
// and held, speaking nothing, until the daemon stops, and connection churn (--churn-per-second): fresh gRPC channels
// that send one Ping and are dropped, and raw connects closed at once.
//
// The engines are simulated: computing a chunk takes a fixed time (a sleep). TTFT is the time from LoadStart until
// the engine holds the KV of the whole prompt: what it computed, what was loaded, the chunks failed reads left it,
// and the uncached tail.
//
// After the engines stop: the daemon's load slots and regions still held, its RSS and its descriptors against the
// ones after the warm-up, the connections it still counts open, its counters. Then the dead-remote phase: a Cake
// load of a prompt that only Redis holds, with Redis frozen and then killed, against the same engine computing the
// prompt without the daemon.
//
// Exits non-zero on an unexplained error (an outcome the protocol does not name for what the engine did; a churned
// Ping that failed is one), a loaded chunk that is not bit-exact, a load slot or a region held at the end (once the
// idle timeout and the region lease, --region-lease-ms, have run out), an idle connection the daemon closed, a
// connection it refused (connections_refused), connections it still counts open at the end beyond the bench's own
// (a leak: connections_open grew with the churn), or a daemon that did not exit cleanly; never on timing.
//
// The documented run is `cake-bench soak` (16 engines, 600 s, warm-up 60 s, 1% read errors); ctest runs 4 engines for
// 8 s ("bench: soak runs clean for a few seconds") for correctness alone.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "base/unique_fd.h"
#include "bench/bench_command.h"
#include "bench/bench_common.h"
#include "bench/benchmarks.h"
#include "cake/v1/admin.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "keys/namespace.h"
#include "storage/chunk_file.h"
#include "storage/remote_codec.h"
#include "testing/child_process.h"
#include "testing/redis_process.h"
#include "testing/spawned_daemon.h"

namespace cake::bench {
namespace {

using std::chrono::milliseconds;

// The soak's KV layout: 2 layers x 2 KV heads x head_dim 64 x BF16, 1 KiB a token; chunks of 64 tokens, 64 KiB.
constexpr uint32_t kChunkTokens = 64;
constexpr uint64_t kChunkBytes = uint64_t{kChunkTokens} * 1024;
// The prompts the engines draw from: few enough that loads find what earlier requests stored, together (about
// 60 MiB) several times the DRAM tier and twice the disk tier, so both evict and every tier serves reads.
constexpr uint32_t kPoolPrompts = 48;
constexpr uint32_t kMinPromptChunks = 4;
constexpr uint32_t kMaxPromptChunks = 32;
constexpr uint64_t kDramBytes = uint64_t{16} << 20;
constexpr uint64_t kDiskBytes = uint64_t{32} << 20;
// Redis values in parts of 16 KiB, four a chunk, so one corrupt or missing part among good ones is exercised.
constexpr uint64_t kRemotePartBytes = 16384;
// Longer than the longest Redis pause plus a command timeout (remote.command_timeout_ms, 2 s), so a load waiting on
// a frozen Redis is not taken for a silent client; short enough that a silent one is reaped within a run.
constexpr uint32_t kIdleTimeoutMs = 5000;
// The killed clients all use cake_vanishing_engine's one client id and leave their regions behind until their lease
// runs out (--region-lease-ms; 30 s with 0): the per-client cap (64) is raised to the global one (limits.max_regions,
// 1024), so a long lease's worth of them (one a second at most, see kKillInterval) never refuses a registration.
constexpr uint32_t kMaxRegionsPerClient = 1024;
// A soak engine computes a chunk in 2 ms, by sleeping: 16 engines share two cores with the daemon.
constexpr auto kComputePerChunk = std::chrono::microseconds(2000);
// Redis freezes for 0.5 to 2.5 s, every 3 to 8 s (the first within 1 to 3 s, so a short run has one too).
constexpr double kMinPauseS = 0.5, kMaxPauseS = 2.5, kMinRunS = 3, kMaxRunS = 8;
// At most one killed client a second over all engines (each leaves a region behind), each killed at a random point
// up to one and a half times the life of one left alone (learnt as the run goes): before it connects, while it
// registers, while its load runs, or, a third of the time, after it exited by itself.
constexpr auto kKillInterval = std::chrono::seconds(1);
constexpr int64_t kFirstVanishingLifeUs = 100000;
// cake_vanishing_engine's prompt (tests/tools/vanishing_engine.cc): tests/integration/fixture.h's SmallNamespace,
// 4 chunks of 16 tokens, the tokens of fixture.h's Tokens(64, 1). It exits 5 unless all of it is cached.
constexpr uint32_t kVanishingChunkTokens = 16;
constexpr uint32_t kVanishingChunks = 4;
constexpr char kVanishingClientId[] = "engine-vanishing";
// A call that has not returned for this long is stuck: the bench kills the daemon to end it, and fails.
constexpr auto kStuckAfter = std::chrono::seconds(60);
// The dead-remote phase: a 64-chunk prompt computed at 5 ms a chunk (320 ms compute-only), timed to the microsecond.
constexpr uint32_t kDeadRemoteChunks = 64;
constexpr auto kDeadRemoteComputePerChunk = std::chrono::microseconds(5000);
// Prompt indices (the pattern's first half) of the prompts outside the pool.
constexpr uint32_t kDeadRemotePromptIndex = 1000;
constexpr uint32_t kVanishingPromptIndex = 1001;
constexpr size_t kExamplesKept = 8;
// Every connection of the bench comes from one uid, one peer to the daemon (server.max_connections_per_peer): the
// bench's own client, the engines' (a connection each at most: gRPC shares one among channels alike), the idle
// connections, and this much room for what comes and goes (a killed client's, the churned ones not yet closed, a
// few at a time). Past that, only connections the daemon kept after their peer left (a leak) get refused.
constexpr uint32_t kConnectionSlack = 48;
// What the daemon may take to notice a connection its peer closed, and to count one accepted.
constexpr auto kConnectionSettle = std::chrono::seconds(10);
// The daemon's default server.connection_idle_timeout_ms: the idle connections must outlive the run under it, and
// the soak raises it for runs it would not cover (the closing itself is the integration suite's:
// tests/integration/connection_flood_test.cc).
constexpr uint64_t kDefaultConnectionIdleTimeoutMs = 600000;

NamespaceSpec SoakNamespace() {
  NamespaceSpec ns;
  ns.model_id = "cake-bench/soak";
  ns.num_layers = 2;
  ns.num_kv_heads = 2;
  ns.head_dim = 64;
  ns.dtype = DType::kBf16;
  ns.chunk_tokens = kChunkTokens;
  ns.tenant = "soak";
  return ns;
}

NamespaceSpec VanishingNamespace() {
  NamespaceSpec ns = SoakNamespace();
  ns.model_id = "test/small";
  ns.chunk_tokens = kVanishingChunkTokens;
  ns.tenant = "tenant-a";
  return ns;
}

// tests/integration/fixture.h's Tokens(n, 1), which cake_vanishing_engine asks for.
std::vector<uint32_t> VanishingTokens() {
  std::vector<uint32_t> tokens(size_t{kVanishingChunks} * kVanishingChunkTokens);
  uint32_t x = 2654435761u + 1;
  for (uint32_t& v : tokens) {
    x = x * 1664525u + 1013904223u;
    v = x % 128000;
  }
  return tokens;
}

// The pattern a chunk's bytes follow: one per (prompt, chunk), so a chunk of another prompt, another chunk of the
// same prompt, a stale or a torn chunk all fail the check.
uint32_t PatternId(uint32_t prompt, uint32_t chunk) { return (prompt << 12) | chunk; }

struct Prompt {
  uint32_t index = 0;
  uint32_t chunks = 0;           // full chunks
  std::vector<uint32_t> tokens;  // the full chunks and a partial chunk's worth more, for requests with a tail
  std::vector<ChunkKey> keys;    // the daemon's key of every full chunk (for the faults)
};

absl::StatusOr<Prompt> MakePrompt(const Namespace& ns, uint32_t index, uint32_t chunks) {
  Prompt p;
  p.index = index;
  p.chunks = chunks;
  p.tokens = SyntheticPrompt(size_t{chunks} * kChunkTokens + kChunkTokens - 1, 7000 + index);
  p.keys = ns.KeysForTokens(p.tokens);
  if (p.keys.size() != chunks) return absl::InternalError("a prompt's keys do not match its chunks");
  return p;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
int64_t Nanos(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// The simulated engine's GPU: computing takes a fixed time a chunk, kept on schedule across calls (a late wake-up
// does not push later chunks back); Resume after waiting for the daemon, when the GPU idled.
class SimulatedGpu {
 public:
  SimulatedGpu(Clock::duration per_chunk, bool precise) : per_chunk_(per_chunk), precise_(precise) {}
  double chunk_seconds() const { return Seconds(per_chunk_); }
  void Begin() { free_ = Clock::now(); }
  void Resume() { free_ = std::max(free_, Clock::now()); }
  void Compute(double chunks) {
    if (chunks <= 0) return;
    free_ += std::chrono::duration_cast<Clock::duration>(per_chunk_ * chunks);
    if (precise_) {
      PreciseSleepUntil(free_);  // a spin for the last few hundred microseconds
    } else {
      std::this_thread::sleep_until(free_);
    }
  }

 private:
  Clock::duration per_chunk_;
  bool precise_;
  Clock::time_point free_;
};

// Redis frozen (SIGSTOP) now and then, from a thread of its own. The epoch counts freezes and thaws (odd: frozen
// now), so an outcome can be matched to a freeze it overlapped. Always leaves Redis running when it stops.
class RedisFreezer {
 public:
  RedisFreezer(pid_t pid, uint64_t seed) : pid_(pid), rng_(seed) {}
  ~RedisFreezer() { Stop(); }

  void Start() {
    thread_ = std::thread([this] { Loop(); });
  }
  void Stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  uint64_t epoch() const { return epoch_.load(); }
  bool frozen() const { return epoch() % 2 == 1; }
  // Whether Redis was frozen at some point since `start_epoch` was read.
  bool FrozeSince(uint64_t start_epoch) const { return start_epoch % 2 == 1 || epoch() != start_epoch; }
  int freezes() const { return freezes_; }
  double frozen_seconds() const { return frozen_s_; }

 private:
  void Loop() {
    std::uniform_real_distribution<double> run(kMinRunS, kMaxRunS), pause(kMinPauseS, kMaxPauseS);
    double next_run_s = std::uniform_real_distribution<double>(1, 3)(rng_);
    for (;;) {
      if (Sleep(next_run_s)) return;
      const Clock::time_point frozen_at = Clock::now();
      ::kill(pid_, SIGSTOP);
      epoch_++;
      const bool stopping = Sleep(pause(rng_));
      ::kill(pid_, SIGCONT);
      epoch_++;
      ++freezes_;
      frozen_s_.store(frozen_s_.load() + SecondsSince(frozen_at));
      if (stopping) return;
      next_run_s = run(rng_);
    }
  }
  // True when asked to stop meanwhile.
  bool Sleep(double seconds) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return stopping_; });
  }

  const pid_t pid_;
  std::mt19937_64 rng_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::atomic<uint64_t> epoch_{0};
  std::atomic<int> freezes_{0};  // written by the thread alone
  std::atomic<double> frozen_s_{0};
};

// Read errors injected from outside the daemon: before a load, each chunk of the cached prefix whose fastest tier
// (the Lookup's answer) is the disk or Redis is corrupted there with probability `rate`. The daemon must turn every
// one into a failed chunk the engine computes (or never read it), never into a failed request or a wrong byte.
class ReadFaults {
 public:
  struct Counts {
    uint64_t candidates = 0;      // chunk reads from disk or Redis the lookups announced
    uint64_t disk_payload = 0;    // a payload byte of a chunk file changed
    uint64_t remote_part = 0;     // a byte of one of a Redis value's parts changed
    uint64_t remote_header = 0;   // a byte of a Redis value's header changed
    uint64_t remote_dropped = 0;  // one part of a Redis value deleted (as Redis's eviction would)
    uint64_t gone = 0;            // drawn, but the chunk had left that tier already
    uint64_t skipped_frozen = 0;  // drawn for Redis while it was frozen (the command would wait for the thaw)
    uint64_t injected() const { return disk_payload + remote_part + remote_header + remote_dropped; }
  };

  ReadFaults(double rate, std::filesystem::path disk_root, const RedisServer& redis, std::string key_prefix,
             const RedisFreezer& freezer)
      : rate_(rate),
        disk_root_(std::move(disk_root)),
        redis_(redis),
        key_prefix_(std::move(key_prefix)),
        freezer_(freezer) {}

  void BeforeLoad(const Prompt& prompt, const LookupResult& lookup, std::mt19937_64& rng) {
    std::bernoulli_distribution corrupt(rate_);
    const uint32_t cached = std::min<uint32_t>(lookup.cached_chunks, static_cast<uint32_t>(lookup.tiers.size()));
    for (uint32_t c = 0; c < cached && c < prompt.chunks; ++c) {
      const TierKind tier = lookup.tiers[c];
      if (tier != TierKind::kDisk && tier != TierKind::kRemote) continue;
      ++counts_.candidates;
      if (!corrupt(rng)) continue;
      if (tier == TierKind::kDisk) {
        if (CorruptChunkFile(prompt.keys[c], rng)) {
          ++counts_.disk_payload;
        } else {
          ++counts_.gone;
        }
      } else if (freezer_.frozen()) {
        ++counts_.skipped_frozen;
      } else {
        CorruptRemoteValue(prompt.keys[c], rng);
      }
    }
  }

  Counts counts() const {
    Counts c;
    c.candidates = counts_.candidates;
    c.disk_payload = counts_.disk_payload;
    c.remote_part = counts_.remote_part;
    c.remote_header = counts_.remote_header;
    c.remote_dropped = counts_.remote_dropped;
    c.gone = counts_.gone;
    c.skipped_frozen = counts_.skipped_frozen;
    return c;
  }

 private:
  // One byte of the payload (never the header, never the padding) changed in place (storage/chunk_file.h).
  bool CorruptChunkFile(const ChunkKey& key, std::mt19937_64& rng) {
    UniqueFd fd(::open(ChunkPath(disk_root_, key).c_str(), O_RDWR | O_CLOEXEC));
    if (!fd.valid()) return false;  // evicted, or not written back yet
    uint64_t payload_length = 0;    // header offset 32, little-endian like this machine
    if (::pread(fd.get(), &payload_length, 8, 32) != 8 || payload_length == 0) return false;
    const off_t at = static_cast<off_t>(kChunkHeaderBytes + rng() % payload_length);
    unsigned char byte = 0;
    if (::pread(fd.get(), &byte, 1, at) != 1) return false;
    byte ^= 0xff;
    return ::pwrite(fd.get(), &byte, 1, at) == 1;
  }

  // Through a connection of its own, as another machine's daemon or a stray client would: a byte of one part (most
  // often), a byte of the header, or a whole part deleted (storage/remote_codec.h).
  void CorruptRemoteValue(const ChunkKey& key, std::mt19937_64& rng) {
    // Atomic in Redis: the byte is read and changed in one step, and a value that is gone is not created.
    static constexpr char kChangeByte[] =
        "local n = redis.call('STRLEN', KEYS[1]) "
        "if n == 0 then return 0 end "
        "local at = tonumber(ARGV[1]) % n "
        "local b = string.byte(redis.call('GETRANGE', KEYS[1], at, at)) "
        "redis.call('SETRANGE', KEYS[1], at, string.char((b + 1) % 256)) "
        "return 1";
    const RemoteChunkNames names(key_prefix_, key);
    const uint64_t parts = RemotePartCount(kChunkBytes, kRemotePartBytes);
    const std::string part = names.part(rng() % parts);
    const uint32_t kind = rng() % 100;
    absl::StatusOr<std::string> reply;
    std::atomic<uint64_t>* counter;
    if (kind < 70) {
      reply = redis_.Command({"EVAL", kChangeByte, "1", part, absl::StrCat(rng() % kRemotePartBytes)});
      counter = &counts_.remote_part;
    } else if (kind < 85) {
      reply = redis_.Command({"EVAL", kChangeByte, "1", names.header(), absl::StrCat(rng() % kRemoteHeaderBytes)});
      counter = &counts_.remote_header;
    } else {
      reply = redis_.Command({"DEL", part});
      counter = &counts_.remote_dropped;
    }
    if (reply.ok() && *reply == "1") {
      ++*counter;
    } else {
      ++counts_.gone;  // gone from Redis, or Redis froze between the check and the command and it timed out
    }
  }

  struct AtomicCounts {
    std::atomic<uint64_t> candidates{0}, disk_payload{0}, remote_part{0}, remote_header{0}, remote_dropped{0}, gone{0},
        skipped_frozen{0};
  };
  const double rate_;
  const std::filesystem::path disk_root_;
  const RedisServer& redis_;
  const std::string key_prefix_;
  const RedisFreezer& freezer_;
  AtomicCounts counts_;
};

// The caked process's resident memory (/proc/<pid>/status), bytes.
struct Rss {
  uint64_t total = 0, anon = 0, file = 0, shmem = 0;
};

Rss ReadRss(pid_t pid) {
  Rss rss;
  const std::string text = ReadWholeFile(absl::StrCat("/proc/", pid, "/status"));
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    auto field = [&](absl::string_view name, uint64_t* out) {
      if (!absl::StartsWith(line, name)) return;
      uint64_t kib = 0;
      absl::string_view value = absl::StripAsciiWhitespace(line.substr(name.size()));
      if (absl::EndsWith(value, " kB")) value.remove_suffix(3);
      if (absl::SimpleAtoi(value, &kib)) *out = kib << 10;
    };
    field("VmRSS:", &rss.total);
    field("RssAnon:", &rss.anon);
    field("RssFile:", &rss.file);
    field("RssShmem:", &rss.shmem);
  }
  return rss;
}

double Mib(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// What one engine saw; merged over all of them at the end.
struct Tally {
  std::map<std::string, uint64_t> requests;   // calls made, by kind
  std::map<std::string, uint64_t> explained;  // non-OK outcomes the protocol names for what the engine did
  uint64_t unexplained = 0;
  std::vector<std::string> unexplained_examples;
  uint64_t loads_checked = 0, loads_exact = 0;  // loads whose every loaded chunk was checked / matched
  uint64_t chunks_checked = 0, chunks_wrong = 0;
  std::vector<std::string> wrong_examples;
  uint64_t chunks_loaded = 0, chunks_failed = 0, loads_with_failed_chunks = 0;
  uint64_t stored_chunks = 0, already_cached = 0;
  std::vector<double> ttft_ms;           // loads started after the warm-up
  std::map<int, uint64_t> killed_exits;  // the killed clients' exit statuses (137: the SIGKILL)

  void Unexplained(std::string what) {
    ++unexplained;
    if (unexplained_examples.size() < kExamplesKept) unexplained_examples.push_back(std::move(what));
  }
  void Merge(const Tally& o) {
    for (const auto& [k, v] : o.requests) requests[k] += v;
    for (const auto& [k, v] : o.explained) explained[k] += v;
    unexplained += o.unexplained;
    for (const auto& e : o.unexplained_examples) {
      if (unexplained_examples.size() < kExamplesKept) unexplained_examples.push_back(e);
    }
    loads_checked += o.loads_checked;
    loads_exact += o.loads_exact;
    chunks_checked += o.chunks_checked;
    chunks_wrong += o.chunks_wrong;
    for (const auto& e : o.wrong_examples) {
      if (wrong_examples.size() < kExamplesKept) wrong_examples.push_back(e);
    }
    chunks_loaded += o.chunks_loaded;
    chunks_failed += o.chunks_failed;
    loads_with_failed_chunks += o.loads_with_failed_chunks;
    stored_chunks += o.stored_chunks;
    already_cached += o.already_cached;
    ttft_ms.insert(ttft_ms.end(), o.ttft_ms.begin(), o.ttft_ms.end());
    for (const auto& [k, v] : o.killed_exits) killed_exits[k] += v;
  }
};

// The caked process's open descriptors (/proc/<pid>/fd), and how many of them are sockets.
struct Descriptors {
  uint64_t total = 0, sockets = 0;
};

Descriptors CountDescriptors(pid_t pid) {
  Descriptors d;
  std::error_code ec;
  const std::filesystem::path dir = absl::StrCat("/proc/", pid, "/fd");
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    ++d.total;
    std::error_code link_ec;
    const std::filesystem::path target = std::filesystem::read_symlink(it->path(), link_ec);
    if (!link_ec && absl::StartsWith(target.string(), "socket:")) ++d.sockets;
  }
  return d;
}

// A connection to the daemon's unix socket, speaking nothing yet; UNAVAILABLE when the connect fails.
absl::StatusOr<UniqueFd> ConnectRaw(const std::string& socket_path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", socket_path.c_str());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(absl::StrCat("connect to ", socket_path, ": ", std::strerror(errno)));
  }
  return fd;
}

// Whether the daemon has closed `fd`, without waiting: what it sent (its HTTP/2 settings) is read and dropped.
bool ClosedByDaemon(int fd) {
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n > 0) continue;
    if (n == 0) return true;
    if (errno == EINTR) continue;
    return errno != EAGAIN && errno != EWOULDBLOCK;
  }
}

// Peers that are not engines, all of this process's uid, so counted by the daemon against
// server.max_connections_per_peer together with the engines' connections and the killed clients': idle connections
// held from before the engines start until the daemon stops, and, while the engines run, new connections at a steady
// rate from a thread of its own, alternately a fresh gRPC channel (a subchannel pool of its own, so a connection of
// its own) that sends one Ping and is dropped, and a raw connect closed at once, every other one after half the
// HTTP/2 preface. Every Ping must be answered and every connect accepted; the daemon must close what the churn
// dropped (its connections_open returns to the bench's own long-lived ones) and none of the idle ones (the soak's
// server.connection_idle_timeout_ms outlasts the run). The soak's caked has no TCP listener: unix socket only.
class ConnectionPeers {
 public:
  struct Counts {
    uint64_t pings = 0, pings_ok = 0, raw_connects = 0, raw_half_preface = 0;
    std::vector<double> ping_ms;  // a fresh channel's connect and Ping
  };

  ConnectionPeers(std::string socket_path, double churn_per_second, Tally& errors)
      : socket_path_(std::move(socket_path)), churn_per_second_(churn_per_second), errors_(errors) {}
  ~ConnectionPeers() { StopChurn(); }

  // Opens `n` idle connections; an error when the socket refuses one.
  absl::Status OpenIdle(uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) {
      absl::StatusOr<UniqueFd> fd = ConnectRaw(socket_path_);
      if (!fd.ok()) {
        return absl::UnavailableError(absl::StrCat("idle connection ", i, " of ", n, ": ", fd.status().message()));
      }
      idle_.push_back(std::move(*fd));
    }
    return absl::OkStatus();
  }
  size_t idle_held() const { return idle_.size(); }
  // How many idle connections the daemon has closed so far.
  uint32_t IdleClosedByDaemon() const {
    uint32_t closed = 0;
    for (const UniqueFd& fd : idle_) closed += ClosedByDaemon(fd.get()) ? 1 : 0;
    return closed;
  }

  void StartChurn() {
    if (churn_per_second_ > 0) thread_ = std::thread([this] { Churn(); });
  }
  // Joins the thread; a Ping in flight ends within its deadline. The failures go into the tally given at
  // construction (read only after this).
  void StopChurn() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  const Counts& counts() const { return counts_; }  // after StopChurn

 private:
  static constexpr auto kPingDeadline = std::chrono::seconds(30);

  void Churn() {
    const auto period =
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1 / churn_per_second_));
    Clock::time_point next = Clock::now();
    for (uint64_t i = 0;; ++i) {
      if (i % 2 == 0) {
        FreshChannelPing();
      } else {
        RawConnect(/*half_preface=*/i % 4 == 3);
      }
      // On schedule, but never a burst to catch up after a slow Ping.
      next = std::max(next + period, Clock::now());
      std::unique_lock lock(mu_);
      if (cv_.wait_until(lock, next, [&] { return stopping_; })) return;
    }
  }

  void FreshChannelPing() {
    ++counts_.pings;
    const Clock::time_point start = Clock::now();
    grpc::Status status;
    {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      auto channel =
          grpc::CreateCustomChannel(absl::StrCat("unix:", socket_path_), grpc::InsecureChannelCredentials(), args);
      auto stub = v1::AdminService::NewStub(channel);
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + kPingDeadline);
      v1::PingResponse response;
      status = stub->Ping(&context, v1::PingRequest(), &response);
    }  // the channel, and with it the connection, dropped
    if (status.ok()) {
      ++counts_.pings_ok;
      counts_.ping_ms.push_back(1e3 * SecondsSince(start));
    } else {
      errors_.Unexplained(absl::StrCat("churn: a fresh channel's Ping failed after ", SecondsSince(start),
                                       " s: ", status.error_code(), " ", status.error_message()));
    }
  }

  void RawConnect(bool half_preface) {
    ++counts_.raw_connects;
    absl::StatusOr<UniqueFd> fd = ConnectRaw(socket_path_);
    if (!fd.ok()) {
      errors_.Unexplained(absl::StrCat("churn: a raw connect failed: ", fd.status().message()));
      return;
    }
    if (half_preface) {
      static constexpr char kHalfPreface[] = "PRI * HTTP/2.0\r\n";  // of "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
      ++counts_.raw_half_preface;
      [[maybe_unused]] const ssize_t n = ::send(fd->get(), kHalfPreface, sizeof(kHalfPreface) - 1, MSG_NOSIGNAL);
    }
  }  // closed here

  const std::string socket_path_;
  const double churn_per_second_;
  Tally& errors_;  // the churn thread's own
  std::vector<UniqueFd> idle_;
  Counts counts_;  // the churn thread's, until it is joined
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
};

// One request of the simulated engine and what came of it.
struct LoadRun {
  absl::Status status;  // how the request ended: OK, the daemon's status, or a protocol rule broken (INTERNAL)
  LoadPlan plan;
  LoadDone done;
  double ttft_s = 0;
  uint32_t chunks_checked = 0, chunks_wrong = 0;
  std::string first_wrong;
};

// `chunks` full chunks of `prompt` and `tail_tokens` more: the cached prefix loaded by caked into `region` (inline
// when null) under Cake, or I/O-only, the rest computed by `gpu`, following the plan as docs/protocol.md says an
// engine does (stop at the predicted meeting and wait there, with a fifth of slack). TTFT runs from Start until the
// engine holds the KV of the whole prompt. Once the stream has ended, every chunk of [meeting, cached) is checked
// against its pattern: the daemon touches the window no more, so the loaded bytes must still be there, exact.
LoadRun RunLoad(Client& client, const NamespaceSpec& ns, const Prompt& prompt, uint32_t chunks, uint32_t tail_tokens,
                const MappedRegion* region, bool io_only, SimulatedGpu& gpu) {
  LoadRun run;
  LoadOptions options;
  options.ns = ns;
  options.prompt = TokensPrompt(std::span<const uint32_t>(prompt.tokens).first(chunks * kChunkTokens + tail_tokens));
  options.region = region;
  options.io_only = io_only;
  options.compute_first_chunk_s = gpu.chunk_seconds();
  const Clock::time_point start = Clock::now();
  gpu.Begin();
  auto started = client.StartLoad(options);
  if (!started.ok()) {
    run.status = started.status();
    return run;
  }
  LoadSession& session = **started;
  // The stream ended before the engine was through: its final status says why.
  auto ended = [&](absl::Status why) {
    const absl::Status final_status = session.Release();
    run.status = final_status.ok() ? why : final_status;
    return run;
  };
  auto plan = session.WaitPlan();
  if (!plan.ok()) return ended(plan.status());
  run.plan = *plan;
  const uint32_t cached = plan->cached_chunks;
  if (plan->total_chunks != chunks || cached > chunks || plan->chunk_bytes != kChunkBytes) {
    return ended(absl::InternalError(absl::StrCat("protocol: a plan of ", plan->total_chunks, " chunks, ", cached,
                                                  " cached, of ", plan->chunk_bytes, " bytes for a prompt of ", chunks,
                                                  " chunks of ", kChunkBytes)));
  }
  // The client library's stepper: compute on, wait at the predicted meeting until its deadline, or stop.
  uint32_t computed = 0;
  for (;;) {
    auto step = session.NextStep(computed);
    if (!step.ok() || step->action == FrontStep::Action::kStop) break;  // an ended stream: WaitDone says how
    if (step->action == FrontStep::Action::kWait) {
      session.WaitResidentUntil(computed, step->until);
      gpu.Resume();
      continue;
    }
    gpu.Compute(1);
    ++computed;
    if (!session.ReportProgress(computed).ok()) break;
  }
  auto done = session.WaitDone();
  gpu.Resume();
  if (!done.ok()) return ended(done.status());
  run.done = *done;
  const uint32_t meeting = done->meeting_chunk;
  if (meeting > cached) {
    return ended(absl::InternalError(absl::StrCat("protocol: meeting chunk ", meeting, " above the cached ", cached)));
  }
  for (uint32_t c = meeting; c < cached; ++c) {
    if (!session.IsResident(c)) {
      return ended(absl::InternalError(
          absl::StrCat("protocol: Done at chunk ", meeting, " but chunk ", c, " of ", cached, " was never loaded")));
    }
  }
  // Failed reads move the meeting up: the engine computes what neither it nor the loads covered, then the
  // uncached rest of the prompt, its partial tail included.
  if (computed < meeting) gpu.Compute(meeting - computed);
  gpu.Compute(static_cast<double>(chunks - cached) + static_cast<double>(tail_tokens) / kChunkTokens);
  run.ttft_s = SecondsSince(start);
  run.status = session.Release();
  if (!run.status.ok()) return run;
  for (uint32_t c = meeting; c < cached; ++c) {
    std::span<const std::byte> bytes;
    if (region != nullptr) {
      bytes = {region->data() + session.RegionOffset(c), kChunkBytes};
    } else {
      const std::string_view view = session.InlineChunk(c);
      bytes = {reinterpret_cast<const std::byte*>(view.data()), view.size()};
    }
    ++run.chunks_checked;
    absl::Status same = bytes.size() == kChunkBytes
                            ? CheckChunkPattern(bytes, PatternId(prompt.index, c))
                            : absl::DataLossError(absl::StrCat("chunk ", c, " came with ", bytes.size(), " bytes"));
    if (!same.ok() && run.chunks_wrong++ == 0) {
      run.first_wrong =
          absl::StrCat("prompt ", prompt.index, " chunk ", c, " (", region ? "region" : "inline", ", tier ",
                       c < plan->tiers.size() ? TierKindName(plan->tiers[c]) : "?", "): ", same.message());
    }
  }
  return run;
}

// What every engine shares.
struct SoakWorld {
  SoakWorld(const SoakOptions& options, std::string socket_path, const std::vector<Prompt>& prompts, ReadFaults& faults,
            const RedisFreezer& freezer, std::string vanishing_engine, std::filesystem::path scratch,
            Clock::time_point warmed_up)
      : options(options),
        socket_path(std::move(socket_path)),
        prompts(prompts),
        faults(faults),
        freezer(freezer),
        vanishing_engine(std::move(vanishing_engine)),
        scratch(std::move(scratch)),
        warmed_up(warmed_up) {}

  const SoakOptions& options;
  const std::string socket_path;
  const NamespaceSpec ns = SoakNamespace();
  const std::vector<Prompt>& prompts;
  ReadFaults& faults;
  const RedisFreezer& freezer;
  const std::string vanishing_engine;
  const std::filesystem::path scratch;
  const Clock::time_point warmed_up;  // loads started from here on count for TTFT
  std::atomic<bool> stop{false};
  std::atomic<int64_t> next_kill_ns{0};  // when the next killed client may start (kKillInterval apart)
  std::atomic<uint64_t> killed_started{0};
  std::atomic<int64_t> vanishing_life_us{kFirstVanishingLifeUs};  // how long one lives when left alone
};

// One engine: a client of its own, a region for its loads and stores and one for its cancelled loads (whose
// windows the daemon frees only once the reads in flight have landed), and a random mix of calls until stopped.
class SoakEngine {
 public:
  SoakEngine(int index, SoakWorld& world)
      : index_(index),
        world_(world),
        rng_(world.options.seed * 1000003ull + index),
        gpu_(kComputePerChunk, /*precise=*/false) {}

  void Run() {
    if (SetUp()) {
      while (!world_.stop.load()) Step();
    }
    TearDown();
    Mark(nullptr);
  }

  Tally& tally() { return tally_; }
  // For the watchdog: the call under way (nullptr when none) and since when.
  const char* CurrentCall(Clock::time_point* since) const {
    *since = Clock::time_point(Clock::duration(call_since_.load()));
    return call_.load();
  }

 private:
  struct Request {
    const Prompt* prompt;
    uint32_t chunks;
    uint32_t tail_tokens;
    std::span<const uint32_t> tokens() const {
      return std::span<const uint32_t>(prompt->tokens).first(chunks * kChunkTokens + tail_tokens);
    }
  };

  bool SetUp() {
    Mark("connect");
    auto client = Client::Connect({world_.socket_path, absl::StrCat("soak-engine-", index_)});
    if (!client.ok()) {
      tally_.Unexplained(absl::StrCat("engine ", index_, " connect: ", client.status().ToString()));
      return false;
    }
    client_ = std::move(*client);
    for (auto* region : {&region_, &cancel_region_}) {
      Mark("RegisterRegion");
      ++tally_.requests["RegisterRegion"];
      auto registered = client_->RegisterRegion(uint64_t{kMaxPromptChunks} * kChunkBytes);
      if (!registered.ok()) {
        tally_.Unexplained(absl::StrCat("engine ", index_, " RegisterRegion: ", registered.status().ToString()));
        return false;
      }
      region->emplace(std::move(*registered));
    }
    return true;
  }

  void TearDown() {
    for (auto* region : {&region_, &cancel_region_}) {
      if (!region->has_value()) continue;
      Mark("ReleaseRegion");
      ++tally_.requests["ReleaseRegion"];
      if (absl::Status s = client_->ReleaseRegion(**region); !s.ok()) {
        tally_.Unexplained(absl::StrCat("engine ", index_, " ReleaseRegion: ", s.ToString()));
      }
      region->reset();
    }
  }

  void Mark(const char* call) {
    call_since_.store(Clock::now().time_since_epoch().count());
    call_.store(call);
  }

  void Step() {
    // Out of 100: lookups 15, Cake loads into the region 35, inline loads 15, stores 15, cancels 15, killed
    // clients 5 (at most one a second over all engines; a lookup otherwise).
    const uint32_t draw = rng_() % 100;
    if (draw < 15) {
      Lookup(Draw());
    } else if (draw < 50) {
      Load(Draw(), /*inline_bytes=*/false);
    } else if (draw < 65) {
      Load(Draw(), /*inline_bytes=*/true);
    } else if (draw < 80) {
      const Request r = Draw();
      StoreChunks(*r.prompt, r.tokens(), 0, r.chunks);
    } else if (draw < 95) {
      Cancel(Draw());
    } else {
      KilledClient();
    }
  }

  // A prompt of the pool, whole half the time, else a prefix of it, with a partial chunk's worth of tail or not.
  Request Draw() {
    const Prompt& p = world_.prompts[rng_() % world_.prompts.size()];
    const uint32_t chunks = rng_() % 2 == 0 ? p.chunks : 1 + static_cast<uint32_t>(rng_() % p.chunks);
    const uint32_t tail = rng_() % 2 == 0 ? 0 : static_cast<uint32_t>(rng_() % kChunkTokens);
    return Request{&p, chunks, tail};
  }

  // Sorts a failed call: an outcome the protocol names for what the engine did is explained and counted by what it
  // was; anything else is unexplained.
  void Outcome(const std::string& call, const absl::Status& status, uint64_t freeze_epoch) {
    if (status.ok()) return;
    const absl::string_view message = status.message();
    if (call == "cancel" && status.code() == absl::StatusCode::kFailedPrecondition &&
        absl::StrContains(message, "overlap the window")) {
      // docs/protocol.md, Ending a load: a cancelled load's window is freed once its reads in flight have landed.
      ++tally_.explained["cancel: the region window of the previous cancelled load was still draining"];
    } else if (status.code() == absl::StatusCode::kResourceExhausted) {
      ++tally_.explained[absl::StrCat(call, ": RESOURCE_EXHAUSTED (overload: ", message.substr(0, 80), ")")];
    } else if (status.code() == absl::StatusCode::kDeadlineExceeded && absl::StrContains(message, "idle_timeout_ms") &&
               world_.freezer.FrozeSince(freeze_epoch)) {
      ++tally_.explained[absl::StrCat(call, ": ended as idle while it waited on a frozen Redis")];
    } else {
      tally_.Unexplained(absl::StrCat("engine ", index_, " ", call, ": ", status.ToString()));
    }
  }

  void Lookup(const Request& r) {
    Mark("Lookup");
    const uint64_t epoch = world_.freezer.epoch();
    ++tally_.requests["Lookup"];
    auto lookup = client_->Lookup(world_.ns, TokensPrompt(r.tokens()));
    if (!lookup.ok()) return Outcome("Lookup", lookup.status(), epoch);
    if (lookup->total_chunks != r.chunks || lookup->cached_chunks > r.chunks ||
        lookup->tiers.size() != lookup->cached_chunks || lookup->chunk_bytes != kChunkBytes) {
      tally_.Unexplained(absl::StrCat("engine ", index_, " Lookup: ", lookup->cached_chunks, " of ",
                                      lookup->total_chunks, " chunks cached with ", lookup->tiers.size(),
                                      " tiers for a prompt of ", r.chunks));
    }
  }

  void Load(const Request& r, bool inline_bytes) {
    const std::string call = inline_bytes ? "inline load" : "Cake load";
    // An engine's connector looks first; the faults use the answer to corrupt, a share of the time, chunks the load
    // is about to read from disk or Redis.
    Mark("Lookup");
    uint64_t epoch = world_.freezer.epoch();
    ++tally_.requests["Lookup"];
    auto lookup = client_->Lookup(world_.ns, TokensPrompt(r.tokens()));
    if (!lookup.ok()) return Outcome("Lookup", lookup.status(), epoch);
    world_.faults.BeforeLoad(*r.prompt, *lookup, rng_);

    Mark(inline_bytes ? "inline load" : "Cake load");
    epoch = world_.freezer.epoch();
    const bool io_only = rng_() % 5 == 0;
    const Clock::time_point started = Clock::now();
    ++tally_.requests[call];
    LoadRun run = RunLoad(*client_, world_.ns, *r.prompt, r.chunks, r.tail_tokens, inline_bytes ? nullptr : &*region_,
                          io_only, gpu_);
    if (!run.status.ok()) return Outcome(call, run.status, epoch);
    ++tally_.loads_checked;
    tally_.chunks_checked += run.chunks_checked;
    tally_.chunks_wrong += run.chunks_wrong;
    if (run.chunks_wrong == 0) {
      ++tally_.loads_exact;
    } else if (tally_.wrong_examples.size() < kExamplesKept) {
      tally_.wrong_examples.push_back(run.first_wrong);
    }
    const uint32_t cached = run.plan.cached_chunks, meeting = run.done.meeting_chunk;
    tally_.chunks_loaded += cached - meeting;
    tally_.chunks_failed += run.done.failed_chunks;
    if (run.done.failed_chunks > 0) ++tally_.loads_with_failed_chunks;
    if (started >= world_.warmed_up) tally_.ttft_ms.push_back(run.ttft_s * 1e3);
    // The engine stores what it computed: the uncached rest, and the prefix failed reads left it (the cache heals).
    if (r.chunks > cached) StoreChunks(*r.prompt, r.tokens(), cached, r.chunks - cached);
    if (run.done.failed_chunks > 0 && meeting > 0) StoreChunks(*r.prompt, r.tokens(), 0, meeting);
  }

  // Chunks [first, first + count) freshly computed into the region, then stored.
  void StoreChunks(const Prompt& prompt, std::span<const uint32_t> tokens, uint32_t first, uint32_t count) {
    for (uint32_t i = 0; i < count; ++i) {
      FillChunkPattern({region_->data() + uint64_t{i} * kChunkBytes, kChunkBytes}, PatternId(prompt.index, first + i));
    }
    Mark("Store");
    const uint64_t epoch = world_.freezer.epoch();
    ++tally_.requests["Store"];
    auto stored = client_->Store(world_.ns, TokensPrompt(tokens), first, count, *region_, 0);
    if (!stored.ok()) return Outcome("Store", stored.status(), epoch);
    if (stored->stored_chunks + stored->already_cached != count) {
      tally_.Unexplained(absl::StrCat("engine ", index_, " Store of ", count, " chunks: ", stored->stored_chunks,
                                      " stored, ", stored->already_cached, " already cached"));
    }
    tally_.stored_chunks += stored->stored_chunks;
    tally_.already_cached += stored->already_cached;
  }

  // A load dropped part way: after its plan, a random 0 to 3 ms later or once its top chunk has landed, the engine
  // cancels the stream (the client's TryCancel, as a gRPC client that gives up does).
  void Cancel(const Request& r) {
    Mark("cancel");
    const uint64_t epoch = world_.freezer.epoch();
    LoadOptions options;
    options.ns = world_.ns;
    options.prompt = TokensPrompt(r.tokens());
    const bool inline_bytes = rng_() % 2 == 0;
    options.region = inline_bytes ? nullptr : &*cancel_region_;
    options.io_only = rng_() % 2 == 0;
    options.compute_first_chunk_s = gpu_.chunk_seconds();
    ++tally_.requests["cancel"];
    auto started = client_->StartLoad(options);
    if (!started.ok()) return Outcome("cancel", started.status(), epoch);
    std::unique_ptr<LoadSession> session = std::move(*started);
    auto plan = session->WaitPlan();
    if (!plan.ok()) return Outcome("cancel", session->Release(), epoch);
    if (rng_() % 2 == 0 || plan->cached_chunks == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(rng_() % 3000));
    } else {
      session->WaitResidentUntil(plan->cached_chunks - 1, Clock::now() + milliseconds(20));
    }
    // Inline chunks that arrived before the cancel are the engine's: they must be exact too.
    if (inline_bytes) {
      for (uint32_t c = session->LoadedLow(); c < plan->cached_chunks; ++c) {
        const std::string_view view = session->InlineChunk(c);
        if (view.empty()) continue;
        ++tally_.chunks_checked;
        absl::Status same = view.size() == kChunkBytes
                                ? CheckChunkPattern({reinterpret_cast<const std::byte*>(view.data()), view.size()},
                                                    PatternId(r.prompt->index, c))
                                : absl::DataLossError(absl::StrCat("chunk ", c, " came with ", view.size(), " bytes"));
        if (!same.ok()) {
          ++tally_.chunks_wrong;
          if (tally_.wrong_examples.size() < kExamplesKept) {
            tally_.wrong_examples.push_back(
                absl::StrCat("prompt ", r.prompt->index, " chunk ", c, " (cancelled inline load): ", same.message()));
          }
        }
      }
    }
    session.reset();
  }

  // cake_vanishing_engine registers a region, starts an I/O-only load and exits without a word; it is killed with
  // SIGKILL at a random point of that life (or after it, when it was quicker). Its stream dies with it; its region
  // stays (regions belong to a client id, not a connection: docs/protocol.md, RegisterRegion).
  void KilledClient() {
    const int64_t now = Nanos(Clock::now());
    int64_t next = world_.next_kill_ns.load();
    if (now < next || !world_.next_kill_ns.compare_exchange_strong(
                          next, now + std::chrono::duration_cast<std::chrono::nanoseconds>(kKillInterval).count())) {
      return Lookup(Draw());
    }
    Mark("killed client");
    const uint64_t started_before = world_.killed_started.fetch_add(1);
    ++tally_.requests["killed client"];
    const std::string log_path = (world_.scratch / absl::StrCat("vanishing-", index_, ".log")).string();
    auto child = ChildProcess::Start({{world_.vanishing_engine, world_.socket_path, absl::StrCat(kVanishingChunkTokens),
                                       absl::StrCat(kVanishingChunks)},
                                      log_path,
                                      SIGKILL});
    if (!child.ok()) {
      tally_.Unexplained(absl::StrCat("killed client: could not start: ", child.status().ToString()));
      return;
    }
    const Clock::time_point spawned = Clock::now();
    const double life_us = static_cast<double>(world_.vanishing_life_us.load());
    const Clock::time_point kill_at =
        spawned +
        std::chrono::microseconds(static_cast<int64_t>(std::uniform_real_distribution<double>(0, 1.5 * life_us)(rng_)));
    bool exited_alone = false;
    while (Clock::now() < kill_at && !(exited_alone = child->Poll().has_value())) {
      std::this_thread::sleep_for(milliseconds(1));
    }
    if (exited_alone) {
      const double lived_us = std::chrono::duration<double, std::micro>(Clock::now() - spawned).count();
      world_.vanishing_life_us.store(static_cast<int64_t>(0.8 * life_us + 0.2 * lived_us));
    }
    const int status = child->Signal(SIGKILL);  // the exit status it had, when it was gone already
    ++tally_.killed_exits[status];
    switch (status) {
      case 128 + SIGKILL:  // killed
      case 0:              // exited by itself after its plan, its load still running
        break;
      case 5:  // its load's plan found less than its whole prompt cached (evicted and refetching, or Redis frozen)
        ++tally_.explained["killed client: its prompt was not wholly cached (it exits 5)"];
        break;
      case 3:  // RegisterRegion refused: expected only once the vanished ones fill engine-vanishing's cap
        if (started_before >= kMaxRegionsPerClient) {
          ++tally_.explained["killed client: engine-vanishing's region cap is full (no lease reclaims them)"];
          break;
        }
        [[fallthrough]];
      default:
        tally_.Unexplained(absl::StrCat("killed client exited ", status, ": ", ReadWholeFile(log_path)));
    }
  }

  const int index_;
  SoakWorld& world_;
  std::mt19937_64 rng_;
  SimulatedGpu gpu_;
  std::unique_ptr<Client> client_;
  std::optional<MappedRegion> region_, cancel_region_;
  Tally tally_;
  std::atomic<const char*> call_{nullptr};
  std::atomic<Clock::rep> call_since_{0};
};

// The bytes of every region the daemon holds: client memory it maps, prefaulted, so part of its RSS. nullopt when
// Status does not answer (it waits on a frozen Redis for the remote tier's figures, and refuses when too many
// calls wait so).
std::optional<uint64_t> RegionBytes(Client& client) {
  auto status = client.Status();
  if (!status.ok()) return std::nullopt;
  return status->region_bytes;
}

// The daemon's RSS and the bytes of the regions it maps, read together (Status first, since it may wait).
struct MemorySample {
  Rss rss;
  uint64_t region_bytes = 0;
  uint64_t own() const { return rss.total - std::min(rss.total, region_bytes); }  // the daemon's own memory
};

std::optional<MemorySample> SampleMemory(Client& client, pid_t pid) {
  const std::optional<uint64_t> region_bytes = RegionBytes(client);
  if (!region_bytes) return std::nullopt;
  return MemorySample{ReadRss(pid), *region_bytes};
}

uint64_t Counter(const std::map<std::string, uint64_t>& stats, const std::string& name) {
  auto it = stats.find(name);
  return it == stats.end() ? 0 : it->second;
}

// The dead-remote phase's figures: TTFT of a Cake load of a prompt only Redis holds, and of computing it alone.
struct DeadRemote {
  std::vector<double> compute_only_s;   // the engine alone, before and after the loads below
  std::vector<double> healthy_s;        // Redis up: the prompt loaded from it
  double frozen_first_s = 0;            // the first load after Redis froze (SIGSTOP): it meets the timeout
  std::vector<double> frozen_s;         // the loads after it, back to back
  std::vector<double> frozen_sparse_s;  // loads spaced past the remote tier's longest back-off (2 s)
  double killed_first_s = 0;            // the first load after Redis was killed (connections refused)
  std::vector<double> killed_s;         // the loads after it, back to back
};

// Longer than the remote tier's longest back-off after a failure (2 s, storage/redis/redis_cluster_client.cc): a load
// this far behind the last one finds the back-off over and asks Redis again.
constexpr auto kSparseGap = milliseconds(2500);
constexpr uint32_t kSparseRuns = 3;

// Stores the prompt (DRAM, then write-back to disk and Redis), evicts DRAM and disk, and times Cake loads of it by
// an engine computing 5 ms a chunk: with Redis up, frozen, then killed; compute-only runs before and after. The
// dead states' loads run back to back, as an engine with a queue of requests sends them (the remote tier's
// back-off after a failure then spares most of them the command timeout), and a few with Redis frozen are spaced
// past the back-off (an engine with sparse requests). Failures of the loads go into `tally` (the same rules as the
// soak's); a set-up that cannot be made is an error.
absl::StatusOr<DeadRemote> RunDeadRemotePhase(Client& client, RedisServer& redis, uint32_t runs, Tally& tally) {
  const NamespaceSpec ns = SoakNamespace();
  CAKE_ASSIGN_OR_RETURN(auto keys_ns, Namespace::Create(ns));
  Prompt prompt;
  prompt.index = kDeadRemotePromptIndex;
  prompt.chunks = kDeadRemoteChunks;
  prompt.tokens = SyntheticPrompt(size_t{kDeadRemoteChunks} * kChunkTokens, 99991);
  prompt.keys = keys_ns.KeysForTokens(prompt.tokens);
  CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(uint64_t{kDeadRemoteChunks} * kChunkBytes));
  absl::Cleanup release_region = [&] { client.ReleaseRegion(region).IgnoreError(); };
  for (uint32_t c = 0; c < kDeadRemoteChunks; ++c) {
    FillChunkPattern({region.data() + c * kChunkBytes, kChunkBytes}, PatternId(prompt.index, c));
  }
  CAKE_RETURN_IF_ERROR(client.Store(ns, TokensPrompt(prompt.tokens), 0, kDeadRemoteChunks, region, 0).status());
  // Written back to both slower tiers (the soak's own write-backs may still be draining too), then in Redis alone.
  auto remote_only = [&]() -> absl::Status {
    for (int attempt = 0; attempt < 100; ++attempt) {
      CAKE_ASSIGN_OR_RETURN(auto stats, client.Stats());
      if (Counter(stats, "write_back_queued_bytes") == 0) {
        CAKE_RETURN_IF_ERROR(client.Evict(TierKind::kDram).status());
        CAKE_RETURN_IF_ERROR(client.Evict(TierKind::kDisk).status());
        CAKE_ASSIGN_OR_RETURN(auto lookup, client.Lookup(ns, TokensPrompt(prompt.tokens)));
        if (lookup.cached_chunks == kDeadRemoteChunks &&
            std::all_of(lookup.tiers.begin(), lookup.tiers.end(), [](TierKind t) { return t == TierKind::kRemote; })) {
          return absl::OkStatus();
        }
      }
      std::this_thread::sleep_for(milliseconds(100));
    }
    return absl::DeadlineExceededError("the dead-remote prompt did not come to be held by Redis alone in 10 s");
  };

  DeadRemote out;
  SimulatedGpu gpu(kDeadRemoteComputePerChunk, /*precise=*/true);
  auto compute_only = [&] {
    for (uint32_t i = 0; i < runs; ++i) {
      const Clock::time_point start = Clock::now();
      gpu.Begin();
      gpu.Compute(kDeadRemoteChunks);
      out.compute_only_s.push_back(SecondsSince(start));
    }
  };
  // One timed Cake load; nullopt when it failed (counted in the tally).
  auto cake = [&](const char* what) -> std::optional<double> {
    ++tally.requests[absl::StrCat("dead-remote Cake load (Redis ", what, ")")];
    LoadRun run = RunLoad(client, ns, prompt, kDeadRemoteChunks, 0, &region, /*io_only=*/false, gpu);
    if (!run.status.ok()) {
      tally.Unexplained(absl::StrCat("dead-remote Cake load, Redis ", what, ": ", run.status.ToString()));
      return std::nullopt;
    }
    ++tally.loads_checked;
    tally.chunks_checked += run.chunks_checked;
    tally.chunks_wrong += run.chunks_wrong;
    if (run.chunks_wrong == 0) {
      ++tally.loads_exact;
    } else if (tally.wrong_examples.size() < kExamplesKept) {
      tally.wrong_examples.push_back(run.first_wrong);
    }
    return run.ttft_s;
  };

  compute_only();
  for (uint32_t i = 0; i < runs; ++i) {
    CAKE_RETURN_IF_ERROR(remote_only());  // a load promotes what it read into DRAM: put it back in Redis alone
    if (auto s = cake("up")) out.healthy_s.push_back(*s);
  }
  CAKE_RETURN_IF_ERROR(remote_only());

  // Frozen: the daemon's connections stay open, its new ones are accepted by the kernel, and its commands wait
  // out remote.command_timeout_ms.
  if (::kill(redis.pid(), SIGSTOP) != 0) return absl::InternalError("cannot SIGSTOP redis-server");
  absl::Cleanup thaw = [&] {
    if (redis.pid() > 0) ::kill(redis.pid(), SIGCONT);
  };
  if (auto s = cake("frozen")) out.frozen_first_s = *s;
  for (uint32_t i = 0; i < runs; ++i) {
    if (auto s = cake("frozen")) out.frozen_s.push_back(*s);
  }
  for (uint32_t i = 0; i < std::min(runs, kSparseRuns); ++i) {
    std::this_thread::sleep_for(kSparseGap);
    if (auto s = cake("frozen")) out.frozen_sparse_s.push_back(*s);
  }
  // Killed: connections refused at once.
  redis.Kill();
  if (auto s = cake("killed")) out.killed_first_s = *s;
  for (uint32_t i = 0; i < runs; ++i) {
    if (auto s = cake("killed")) out.killed_s.push_back(*s);
  }
  compute_only();
  return out;
}

std::string JoinCounts(const std::map<std::string, uint64_t>& counts) {
  return absl::StrJoin(counts, ", ",
                       [](std::string* out, const auto& kv) { absl::StrAppend(out, kv.first, " ", kv.second); });
}

// Everything a soak run saw, phase by phase: what the report prints, the JSON holds and the verdict checks.
struct SoakRun {
  const SoakOptions* options = nullptr;
  double warmup_s = 0;
  // The daemon: its connection caps, sized to the bench's own peers.
  uint32_t per_peer_connections = 0;
  uint64_t connection_idle_timeout_ms = 0;
  // Before the engines: the daemon's counters, the bench's own connections, and the idle ones as it counted them.
  std::map<std::string, uint64_t> stats_before;
  uint64_t own_connections = 0;
  uint64_t idle_counted_open = 0;
  size_t idle_held = 0;
  // The engines' phase.
  double soaked_s = 0;
  Tally tally;
  MemorySample warm, end;
  Rss rss_max;
  Descriptors fds_warm;
  uint64_t connections_open_warm = 0;
  uint64_t killed_started = 0;
  double vanishing_life_ms = 0;
  ReadFaults::Counts injected;
  int freezes = 0;
  double frozen_seconds = 0;
  ConnectionPeers::Counts churn;
  // After the engines: what the daemon still held once it had had the time to let go.
  uint64_t active_loads = 0, regions = 0;
  double reaped_after_s = 0;
  uint32_t idle_closed = 0;
  uint64_t connections_expected = 0, connections_open_end = 0;
  double connections_settled_s = 0;
  Descriptors fds_end;
  std::map<std::string, uint64_t> stats_after;
  // The dead-remote phase.
  absl::StatusOr<DeadRemote> dead = absl::UnknownError("not run");
  // The daemon's stop.
  int caked_exit = 0;
  uint64_t log_warnings = 0, log_errors = 0;
  std::vector<std::string> log_error_lines;

  // What a counter of the daemon's moved by over the run.
  uint64_t Delta(const std::string& name) const { return Counter(stats_after, name) - Counter(stats_before, name); }
  uint64_t ConnectionsRefused() const { return Counter(stats_after, "connections_refused"); }
};

// What the run needs and the options allow, before anything starts.
absl::Status CheckSoakOptions(const SoakOptions& options, const std::string& vanishing_engine) {
  if (!options.common.socket_path.empty()) {
    return absl::InvalidArgumentError(
        "cake-bench soak needs a caked of its own (it freezes the daemon's Redis, corrupts its disk tier and reads "
        "its RSS): run it without --socket");
  }
  if (options.engines == 0 || !(options.seconds > 0)) {
    return absl::InvalidArgumentError("need --engines > 0 and --seconds > 0");
  }
  if (::access(vanishing_engine.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("no ", vanishing_engine,
                                                      ": the killed clients run it; build it (ninja -C build "
                                                      "cake_vanishing_engine)"));
  }
  if (!OnPath("redis-server")) {
    return absl::FailedPreconditionError(
        "redis-server is not on PATH (apt-get install -y redis-server, or "
        "scripts/setup)");
  }
  return absl::OkStatus();
}

// The bench's caked: a small DRAM tier, a disk tier under `disk_root`, the private Redis, connection caps sized to
// the bench's peers (kConnectionSlack) and an idle timeout the default, or longer than the run and its end when the
// default would not outlast them.
std::string SoakConfig(const SoakOptions& options, const std::filesystem::path& disk_root, const RedisServer& redis,
                       const std::string& key_prefix, SoakRun& run) {
  run.per_peer_connections = 1 + options.engines + options.idle_connections + kConnectionSlack;
  run.connection_idle_timeout_ms = std::min<uint64_t>(
      86400000,
      std::max<uint64_t>(kDefaultConnectionIdleTimeoutMs, static_cast<uint64_t>((options.seconds + 300) * 1000)));
  return absl::StrCat(
      "[server]\nmax_connections = ", std::max<uint32_t>(1024, run.per_peer_connections),
      "\nmax_connections_per_peer = ", run.per_peer_connections,
      "\nconnection_idle_timeout_ms = ", run.connection_idle_timeout_ms, "\n",
      "[limits]\nmax_regions_per_client = ", kMaxRegionsPerClient, "\n",
      options.region_lease_ms > 0 ? absl::StrCat("region_lease_ms = ", options.region_lease_ms, "\n") : "",
      "[dram]\ncapacity_bytes = ", kDramBytes, "\n", "[disk]\nroot = \"", disk_root.string(),
      "\"\ncapacity_bytes = ", kDiskBytes, "\n", "[remote]\nendpoints = [\"", redis.address(), "\"]\nkey_prefix = \"",
      key_prefix, "\"\npart_bytes = ", kRemotePartBytes, "\n", "[loader]\nidle_timeout_ms = ", kIdleTimeoutMs, "\n");
}

// The pool the engines draw from and the killed clients' prompt, stored whole before the engines start (write-back
// puts them on disk, which evicts, and in Redis).
absl::StatusOr<std::vector<Prompt>> StorePool(Client& client) {
  const NamespaceSpec ns = SoakNamespace();
  CAKE_ASSIGN_OR_RETURN(auto keys_ns, Namespace::Create(ns));
  std::vector<Prompt> prompts;
  uint64_t pool_chunks = 0;
  CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(uint64_t{kMaxPromptChunks} * kChunkBytes));
  absl::Cleanup release_region = [&] { client.ReleaseRegion(region).IgnoreError(); };
  for (uint32_t i = 0; i < kPoolPrompts; ++i) {
    const uint32_t chunks =
        kMinPromptChunks + static_cast<uint32_t>((i * 2654435761u) % (kMaxPromptChunks - kMinPromptChunks + 1));
    CAKE_ASSIGN_OR_RETURN(auto prompt, MakePrompt(keys_ns, i, chunks));
    for (uint32_t c = 0; c < chunks; ++c) {
      FillChunkPattern({region.data() + c * kChunkBytes, kChunkBytes}, PatternId(i, c));
    }
    CAKE_RETURN_IF_ERROR(client.Store(ns, TokensPrompt(prompt.tokens), 0, chunks, region, 0).status());
    pool_chunks += chunks;
    prompts.push_back(std::move(prompt));
  }
  const std::vector<uint32_t> vanishing_tokens = VanishingTokens();
  const uint64_t vanishing_chunk_bytes = uint64_t{kVanishingChunkTokens} * 1024;
  for (uint32_t c = 0; c < kVanishingChunks; ++c) {
    FillChunkPattern({region.data() + c * vanishing_chunk_bytes, vanishing_chunk_bytes},
                     PatternId(kVanishingPromptIndex, c));
  }
  CAKE_RETURN_IF_ERROR(
      client.Store(VanishingNamespace(), TokensPrompt(vanishing_tokens), 0, kVanishingChunks, region, 0).status());
  CAKE_RETURN_IF_ERROR(
      WaitForCounter(client, "write_back_written", 2 * (pool_chunks + kVanishingChunks), std::chrono::seconds(30)));
  return prompts;
}

// Opens the idle connections before the engines start: the daemon must count every one.
absl::Status HoldIdleConnections(Client& client, ConnectionPeers& peers, uint32_t count, SoakRun& run) {
  CAKE_ASSIGN_OR_RETURN(run.stats_before, client.Stats());
  if (!run.stats_before.contains("connections_open")) {
    return absl::FailedPreconditionError("this caked does not count its connections (no connections_open in Stats)");
  }
  // The bench's own long-lived connections: its client's (the engines' share it, or come and go with them).
  run.own_connections = Counter(run.stats_before, "connections_open");
  CAKE_RETURN_IF_ERROR(peers.OpenIdle(count));
  run.idle_held = peers.idle_held();
  for (const Clock::time_point deadline = Clock::now() + kConnectionSettle;;) {
    CAKE_ASSIGN_OR_RETURN(auto stats, client.Stats());
    run.idle_counted_open = Counter(stats, "connections_open");
    if (run.idle_counted_open >= run.own_connections + run.idle_held || Clock::now() > deadline) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  if (run.idle_counted_open < run.own_connections + run.idle_held) {
    return absl::InternalError(absl::StrCat("the daemon counts ", run.idle_counted_open, " connections open with ",
                                            run.idle_held, " idle ones held beside the bench's ", run.own_connections,
                                            " after ", Seconds(kConnectionSettle), " s"));
  }
  return absl::OkStatus();
}

// The soak itself: the engines and the churn run until the end, Redis freezes, reads are corrupted; the daemon's RSS
// is sampled twice a second, and a watchdog looks for calls that never return (it kills the daemon to end one, and
// the run fails).
absl::Status RunEngines(SpawnedDaemon& daemon, Client& client, SoakWorld& world, ConnectionPeers& peers,
                        RedisFreezer& freezer, Clock::time_point soak_start, Clock::time_point soak_end, SoakRun& run) {
  const pid_t caked_pid = daemon.pid();
  std::vector<std::unique_ptr<SoakEngine>> engines;
  std::vector<std::thread> threads;
  // Every path out joins the engines before what they use goes, and thaws Redis.
  absl::Cleanup join_engines = [&] {
    world.stop = true;
    for (std::thread& t : threads) t.join();
    peers.StopChurn();
    freezer.Stop();
  };
  freezer.Start();
  for (uint32_t i = 0; i < run.options->engines; ++i) {
    engines.push_back(std::make_unique<SoakEngine>(static_cast<int>(i), world));
    threads.emplace_back([e = engines.back().get()] { e->Run(); });
  }
  peers.StartChurn();

  bool warm_sampled = false;
  std::string stuck;
  Clock::time_point next_progress = soak_start + std::chrono::seconds(30);
  while (Clock::now() < soak_end) {
    std::this_thread::sleep_for(milliseconds(500));
    const Rss rss = ReadRss(caked_pid);
    if (rss.total > run.rss_max.total) run.rss_max = rss;
    if (!warm_sampled && Clock::now() >= world.warmed_up) {
      if (auto sample = SampleMemory(client, caked_pid)) {
        run.warm = *sample;
        warm_sampled = true;
        run.fds_warm = CountDescriptors(caked_pid);
        if (auto stats = client.Stats(); stats.ok()) run.connections_open_warm = Counter(*stats, "connections_open");
      }
    }
    for (size_t i = 0; i < engines.size() && stuck.empty(); ++i) {
      Clock::time_point since;
      const char* call = engines[i]->CurrentCall(&since);
      if (call != nullptr && Clock::now() - since > kStuckAfter) {
        stuck = absl::StrCat("engine ", i, " has been in ", call, " for ", Seconds(Clock::now() - since), " s");
      }
    }
    if (!stuck.empty()) break;
    if (Clock::now() >= next_progress) {
      if (auto sample = SampleMemory(client, caked_pid)) {
        auto stats = client.Stats();
        std::printf(
            "  %.0f s: caked RSS %.1f MiB (anon %.1f), less the regions it maps (%.1f MiB) %.1f MiB; %llu "
            "descriptors, %llu connections open; Redis frozen %d times\n",
            SecondsSince(soak_start), Mib(sample->rss.total), Mib(sample->rss.anon), Mib(sample->region_bytes),
            Mib(sample->own()), static_cast<unsigned long long>(CountDescriptors(caked_pid).total),
            static_cast<unsigned long long>(stats.ok() ? Counter(*stats, "connections_open") : 0), freezer.freezes());
        std::fflush(stdout);
      }
      next_progress += std::chrono::seconds(30);
    }
  }
  for (int attempt = 0; attempt < 20; ++attempt) {
    if (auto sample = SampleMemory(client, caked_pid)) {
      run.end = *sample;
      break;
    }
    run.end.rss = ReadRss(caked_pid);  // Status did not answer: the regions' bytes stay unknown (0)
    std::this_thread::sleep_for(milliseconds(100));
  }
  if (!warm_sampled) {
    run.warm = run.end;
    run.fds_warm = CountDescriptors(caked_pid);
  }
  if (!stuck.empty()) {
    // A call that never returns cannot be cancelled from here: killing the daemon ends it (and the run).
    const std::string log = daemon.log();
    std::fprintf(stderr, "cake-bench soak: %s; killing caked. Its log ends:\n%s\n", stuck.c_str(),
                 log.substr(log.size() > 4000 ? log.size() - 4000 : 0).c_str());
    daemon.Kill();
  }
  std::move(join_engines).Invoke();
  run.soaked_s = SecondsSince(soak_start);
  for (auto& e : engines) run.tally.Merge(e->tally());
  run.killed_started = world.killed_started.load();
  run.vanishing_life_ms = world.vanishing_life_us.load() / 1e3;
  run.freezes = freezer.freezes();
  run.frozen_seconds = freezer.frozen_seconds();
  run.churn = peers.counts();
  if (!stuck.empty()) {
    run.tally.Unexplained(absl::StrCat("stuck: ", stuck));
    return absl::InternalError(absl::StrCat("soak failed: ", stuck));
  }
  return absl::OkStatus();
}

// The engines are gone and Redis is thawed: waits for the daemon to let go of what they held. A killed client's
// stream ends with its connection; a silent one's after loader.idle_timeout_ms; regions only under a lease. Then
// the connections: every idle one still open, and nothing else counted open but the bench's own (the churn's, the
// engines' and the killed clients' all gone), once the daemon has had the time to notice the last closes.
absl::Status SettleAfterSoak(Client& client, pid_t caked_pid, ConnectionPeers& peers, SoakRun& run) {
  const auto reap_bound = milliseconds(kIdleTimeoutMs + run.options->region_lease_ms) + std::chrono::seconds(5);
  const Clock::time_point reap_start = Clock::now();
  for (;;) {
    CAKE_ASSIGN_OR_RETURN(const DaemonStatus status, client.Status());
    run.active_loads = status.active_loads;
    run.regions = status.regions;
    const bool settled = run.active_loads == 0 && (run.options->region_lease_ms == 0 || run.regions == 0);
    if (settled || Clock::now() - reap_start > reap_bound) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  run.reaped_after_s = SecondsSince(reap_start);
  run.idle_closed = peers.IdleClosedByDaemon();
  run.connections_expected = run.own_connections + run.idle_held - run.idle_closed;
  const Clock::time_point settle_start = Clock::now();
  for (;;) {
    CAKE_ASSIGN_OR_RETURN(auto stats, client.Stats());
    run.connections_open_end = Counter(stats, "connections_open");
    if (run.connections_open_end <= run.connections_expected || Clock::now() - settle_start > kConnectionSettle) {
      break;
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
  run.connections_settled_s = SecondsSince(settle_start);
  run.fds_end = CountDescriptors(caked_pid);
  CAKE_ASSIGN_OR_RETURN(run.stats_after, client.Stats());
  return absl::OkStatus();
}

// Stops the daemon (SIGTERM) and reads its log's warnings and errors (server/main.cc's pattern:
// "<time> <level> caked: <message>").
void StopDaemon(SpawnedDaemon& daemon, SoakRun& run) {
  run.caked_exit = daemon.Stop();
  const std::string caked_log = daemon.log();
  for (absl::string_view line : absl::StrSplit(caked_log, '\n')) {
    if (absl::StrContains(line, " warning caked: ")) ++run.log_warnings;
    if (absl::StrContains(line, " error caked: ") || absl::StrContains(line, " critical caked: ")) {
      ++run.log_errors;
      if (run.log_error_lines.size() < 3) run.log_error_lines.emplace_back(line.substr(0, 300));
    }
  }
  if (run.caked_exit != 0)
    run.tally.Unexplained(absl::StrCat("caked exited with status ", run.caked_exit, " on SIGTERM"));
}

uint64_t Sum(const std::map<std::string, uint64_t>& counts) {
  uint64_t sum = 0;
  for (const auto& [kind, n] : counts) sum += n;
  return sum;
}

double Ratio(uint64_t a, uint64_t b) { return b > 0 ? static_cast<double>(a) / static_cast<double>(b) : 0; }

void PrintSoakReport(const SoakRun& run) {
  const SoakOptions& options = *run.options;
  const Tally& tally = run.tally;
  const ReadFaults::Counts& injected = run.injected;
  const ConnectionPeers::Counts& churn = run.churn;
  const Rss &rss_warm = run.warm.rss, &rss_end = run.end.rss;
  const uint64_t killed_self_exit = tally.killed_exits.count(0) ? tally.killed_exits.at(0) : 0;
  const uint64_t killed_by_signal = tally.killed_exits.count(128 + SIGKILL) ? tally.killed_exits.at(128 + SIGKILL) : 0;
  std::printf(
      "\ncake-bench soak: %u engines, %.0f s (warm-up %.0f s); DRAM %llu MiB, disk %llu MiB, Redis frozen %d "
      "times (%.1f s in all); read errors injected at %g of the chunk reads from disk or Redis\n\n",
      options.engines, run.soaked_s, run.warmup_s, static_cast<unsigned long long>(kDramBytes >> 20),
      static_cast<unsigned long long>(kDiskBytes >> 20), run.freezes, run.frozen_seconds, options.read_error_rate);
  std::printf("| figure | value | goal |\n| --- | --- | --- |\n");
  std::printf("| requests | %llu (%s) | |\n", static_cast<unsigned long long>(Sum(tally.requests)),
              JoinCounts(tally.requests).c_str());
  std::printf("| unexplained errors | %llu | 0 |\n", static_cast<unsigned long long>(tally.unexplained));
  std::printf("| explained outcomes | %llu%s%s | |\n", static_cast<unsigned long long>(Sum(tally.explained)),
              tally.explained.empty() ? "" : ": ", JoinCounts(tally.explained).c_str());
  std::printf("| loads bit-exact | %llu of %llu (%.2f%%); %llu chunks checked, %llu wrong | 100%% |\n",
              static_cast<unsigned long long>(tally.loads_exact), static_cast<unsigned long long>(tally.loads_checked),
              tally.loads_checked == 0 ? 100.0 : 100 * Ratio(tally.loads_exact, tally.loads_checked),
              static_cast<unsigned long long>(tally.chunks_checked),
              static_cast<unsigned long long>(tally.chunks_wrong));
  std::printf(
      "| read errors injected | %llu of %llu disk/Redis chunk reads announced (disk payload %llu; Redis part "
      "%llu, header %llu, part dropped %llu; %llu drawn had left the tier, %llu skipped while Redis was "
      "frozen) | |\n",
      static_cast<unsigned long long>(injected.injected()), static_cast<unsigned long long>(injected.candidates),
      static_cast<unsigned long long>(injected.disk_payload), static_cast<unsigned long long>(injected.remote_part),
      static_cast<unsigned long long>(injected.remote_header), static_cast<unsigned long long>(injected.remote_dropped),
      static_cast<unsigned long long>(injected.gone), static_cast<unsigned long long>(injected.skipped_frozen));
  std::printf(
      "| corrupt chunks the daemon found | disk %llu, Redis %llu; failed reads %llu; loads with failed chunks "
      "%llu, %llu chunks left to the engines by them | each a failed chunk, never a failed request |\n",
      static_cast<unsigned long long>(run.Delta("tier_disk_corrupt_removed")),
      static_cast<unsigned long long>(run.Delta("tier_remote_corrupt_removed")),
      static_cast<unsigned long long>(run.Delta("load_chunk_read_failures")),
      static_cast<unsigned long long>(tally.loads_with_failed_chunks),
      static_cast<unsigned long long>(tally.chunks_failed));
  std::printf(
      "| caked RSS | %.1f MiB after the warm-up, %.1f MiB at the end: %.3f (anon %.1f -> %.1f, shmem %.1f -> "
      "%.1f, file %.1f -> %.1f MiB; peak %.1f); less the regions it maps (%.1f -> %.1f MiB): %.1f -> %.1f "
      "MiB, %.3f | <= 1.05 |\n",
      Mib(rss_warm.total), Mib(rss_end.total), Ratio(rss_end.total, rss_warm.total), Mib(rss_warm.anon),
      Mib(rss_end.anon), Mib(rss_warm.shmem), Mib(rss_end.shmem), Mib(rss_warm.file), Mib(rss_end.file),
      Mib(run.rss_max.total), Mib(run.warm.region_bytes), Mib(run.end.region_bytes), Mib(run.warm.own()),
      Mib(run.end.own()), Ratio(run.end.own(), run.warm.own()));
  std::printf(
      "| TTFT (Start to the whole prompt's KV, 2 ms a computed chunk) | p50 %.2f ms, p99 %.2f ms over %zu "
      "loads after the warm-up | |\n",
      Percentile(tally.ttft_ms, 50), Percentile(tally.ttft_ms, 99), tally.ttft_ms.size());
  std::printf("| load slots held at the end | %llu (after %.1f s) | 0 |\n",
              static_cast<unsigned long long>(run.active_loads), run.reaped_after_s);
  const uint64_t regions_by_counters = Counter(run.stats_after, "regions_registered") -
                                       Counter(run.stats_after, "regions_released") -
                                       Counter(run.stats_after, "regions_reclaimed");
  std::printf(
      "| regions held at the end | %llu (registered - released - reclaimed: %llu), all of client %s: the "
      "engines released theirs; %llu killed clients started (one lives %.0f ms when left alone), %llu "
      "exited by themselves after registering, %llu were killed | 0%s |\n",
      static_cast<unsigned long long>(run.regions), static_cast<unsigned long long>(regions_by_counters),
      kVanishingClientId, static_cast<unsigned long long>(run.killed_started), run.vanishing_life_ms,
      static_cast<unsigned long long>(killed_self_exit), static_cast<unsigned long long>(killed_by_signal),
      options.region_lease_ms > 0 ? "" : " (not enforced: no region lease set)");
  std::printf(
      "| idle connections held | %zu, raw on the unix socket, sending nothing, from before the engines to the "
      "daemon's stop: counted (connections_open %llu -> %llu), %u closed by the daemon (idle timeout %.0f s) | "
      "0 closed |\n",
      run.idle_held, static_cast<unsigned long long>(run.own_connections),
      static_cast<unsigned long long>(run.idle_counted_open), run.idle_closed, run.connection_idle_timeout_ms / 1e3);
  std::printf(
      "| connections churned | %llu: %llu fresh gRPC channels with one Ping (%llu answered; connect and Ping p50 "
      "%.2f ms, p99 %.2f ms, worst %.2f ms), %llu raw connects closed at once (%llu after half the HTTP/2 "
      "preface); the daemon accepted %llu connections over the soak, refused %llu (max_connections_per_peer %u) "
      "| every Ping answered, 0 refused |\n",
      static_cast<unsigned long long>(churn.pings + churn.raw_connects), static_cast<unsigned long long>(churn.pings),
      static_cast<unsigned long long>(churn.pings_ok), Percentile(churn.ping_ms, 50), Percentile(churn.ping_ms, 99),
      Max(churn.ping_ms), static_cast<unsigned long long>(churn.raw_connects),
      static_cast<unsigned long long>(churn.raw_half_preface),
      static_cast<unsigned long long>(run.Delta("connections_admitted")),
      static_cast<unsigned long long>(run.ConnectionsRefused()), run.per_peer_connections);
  std::printf(
      "| connections open at the end | %llu (the bench's own %llu and %llu idle; after %.1f s); %llu after the "
      "warm-up | the bench's own and the idle ones |\n",
      static_cast<unsigned long long>(run.connections_open_end), static_cast<unsigned long long>(run.own_connections),
      static_cast<unsigned long long>(run.idle_held - run.idle_closed), run.connections_settled_s,
      static_cast<unsigned long long>(run.connections_open_warm));
  std::printf(
      "| caked descriptors | %llu after the warm-up (%llu sockets), %llu at the end (%llu sockets) | no growth |\n",
      static_cast<unsigned long long>(run.fds_warm.total), static_cast<unsigned long long>(run.fds_warm.sockets),
      static_cast<unsigned long long>(run.fds_end.total), static_cast<unsigned long long>(run.fds_end.sockets));
  if (run.dead.ok()) {
    const DeadRemote& dead = *run.dead;
    const double compute_s = Median(dead.compute_only_s);
    auto ratios = [&](const std::vector<double>& v) {
      return absl::StrJoin(v, " ",
                           [&](std::string* out, double s) { absl::StrAppendFormat(out, "%.2f", s / compute_s); });
    };
    std::printf(
        "| TTFT, Redis dead / compute-only (%u chunks, 5 ms each: %.1f ms), median of the loads after the first "
        "| frozen (SIGSTOP) %.3f (first %.3f, mean %.3f, worst %.3f; spaced %.1f s apart: %s); killed %.3f "
        "(first %.3f, mean %.3f, worst %.3f); Redis up: %.3f | <= 1.05 |\n",
        kDeadRemoteChunks, 1e3 * compute_s, Median(dead.frozen_s) / compute_s, dead.frozen_first_s / compute_s,
        Mean(dead.frozen_s) / compute_s, Max(dead.frozen_s) / compute_s, Seconds(kSparseGap),
        ratios(dead.frozen_sparse_s).c_str(), Median(dead.killed_s) / compute_s, dead.killed_first_s / compute_s,
        Mean(dead.killed_s) / compute_s, Max(dead.killed_s) / compute_s, Median(dead.healthy_s) / compute_s);
    std::printf("\n  dead-remote loads over compute-only, in order: frozen %.2f | %s; killed %.2f | %s\n",
                dead.frozen_first_s / compute_s, ratios(dead.frozen_s).c_str(), dead.killed_first_s / compute_s,
                ratios(dead.killed_s).c_str());
  }
  std::printf(
      "\n  the engines: %llu chunks loaded, %llu left to them by failed reads; %llu chunks stored, %llu of "
      "them already cached in DRAM\n",
      static_cast<unsigned long long>(tally.chunks_loaded), static_cast<unsigned long long>(tally.chunks_failed),
      static_cast<unsigned long long>(tally.stored_chunks + tally.already_cached),
      static_cast<unsigned long long>(tally.already_cached));
  std::printf(
      "  daemon counters over the soak: loads %llu started, %llu cancelled, %llu idle-ended; DRAM "
      "evictions %llu, disk evictions %llu; promotions %llu; Redis errors %llu, fast failures %llu; "
      "write-back failed %llu\n",
      static_cast<unsigned long long>(run.Delta("loads_started")),
      static_cast<unsigned long long>(run.Delta("loads_cancelled")),
      static_cast<unsigned long long>(run.Delta("loads_idle_ended")),
      static_cast<unsigned long long>(run.Delta("tier_dram_evictions")),
      static_cast<unsigned long long>(run.Delta("tier_disk_evictions")),
      static_cast<unsigned long long>(run.Delta("write_back_promoted")),
      static_cast<unsigned long long>(run.Delta("tier_remote_errors")),
      static_cast<unsigned long long>(run.Delta("tier_remote_fast_failures")),
      static_cast<unsigned long long>(run.Delta("write_back_failed")));
  std::printf("  caked log: %llu warnings, %llu errors; exit status %d on SIGTERM\n",
              static_cast<unsigned long long>(run.log_warnings), static_cast<unsigned long long>(run.log_errors),
              run.caked_exit);
  for (const std::string& line : run.log_error_lines) std::printf("    %s\n", line.c_str());
  // The daemon counts its failed reads by status code (Stats: load_chunk_read_failures_<code>).
  constexpr absl::string_view kByCode = "load_chunk_read_failures_";
  std::printf("  the daemon's failed reads by status code (the set-up and the soak; %llu corrupt):\n",
              static_cast<unsigned long long>(run.Delta("load_chunk_read_failures_data_loss")));
  for (const auto& [name, value] : run.stats_after) {
    if (!absl::StartsWith(name, kByCode) || run.Delta(name) == 0) continue;
    std::printf("    %6llu  %s\n", static_cast<unsigned long long>(run.Delta(name)),
                name.substr(kByCode.size()).c_str());
  }
  for (const std::string& e : tally.unexplained_examples) std::printf("  unexplained: %s\n", e.c_str());
  for (const std::string& e : tally.wrong_examples) std::printf("  not bit-exact: %s\n", e.c_str());
}

absl::Status WriteSoakJson(const SoakRun& run, const std::string& path) {
  const SoakOptions& options = *run.options;
  const Tally& tally = run.tally;
  const ConnectionPeers::Counts& churn = run.churn;
  JsonReport report;
  report.Set("engines", options.engines);
  report.Set("seconds", run.soaked_s);
  report.Set("warmup_seconds", run.warmup_s);
  report.Set("read_error_rate", options.read_error_rate);
  report.Set("requests", static_cast<double>(Sum(tally.requests)));
  for (const auto& [kind, n] : tally.requests) report.Set(absl::StrCat("requests_", kind), static_cast<double>(n));
  report.Set("unexplained_errors", static_cast<double>(tally.unexplained));
  report.Set("explained_outcomes", static_cast<double>(Sum(tally.explained)));
  report.Set("loads_checked", static_cast<double>(tally.loads_checked));
  report.Set("loads_bit_exact", static_cast<double>(tally.loads_exact));
  report.Set("chunks_checked", static_cast<double>(tally.chunks_checked));
  report.Set("chunks_wrong", static_cast<double>(tally.chunks_wrong));
  report.Set("read_errors_injected", static_cast<double>(run.injected.injected()));
  report.Set("read_error_candidates", static_cast<double>(run.injected.candidates));
  report.Set("corrupt_found_disk", static_cast<double>(run.Delta("tier_disk_corrupt_removed")));
  report.Set("corrupt_found_remote", static_cast<double>(run.Delta("tier_remote_corrupt_removed")));
  report.Set("loads_with_failed_chunks", static_cast<double>(tally.loads_with_failed_chunks));
  report.Set("redis_freezes", run.freezes);
  report.Set("redis_frozen_seconds", run.frozen_seconds);
  report.Set("rss_warm_bytes", static_cast<double>(run.warm.rss.total));
  report.Set("rss_end_bytes", static_cast<double>(run.end.rss.total));
  report.Set("rss_end_over_warm", Ratio(run.end.rss.total, run.warm.rss.total));
  report.Set("rss_less_regions_end_over_warm", Ratio(run.end.own(), run.warm.own()));
  report.Set("region_bytes_warm", static_cast<double>(run.warm.region_bytes));
  report.Set("region_bytes_end", static_cast<double>(run.end.region_bytes));
  report.Set("rss_shmem_warm_bytes", static_cast<double>(run.warm.rss.shmem));
  report.Set("rss_shmem_end_bytes", static_cast<double>(run.end.rss.shmem));
  report.Set("ttft_p50_ms", Percentile(tally.ttft_ms, 50));
  report.Set("ttft_p99_ms", Percentile(tally.ttft_ms, 99));
  report.Set("ttft_loads", static_cast<double>(tally.ttft_ms.size()));
  report.Set("active_loads_end", static_cast<double>(run.active_loads));
  report.Set("regions_end", static_cast<double>(run.regions));
  report.Set("killed_clients", static_cast<double>(run.killed_started));
  report.Set("idle_connections", static_cast<double>(run.idle_held));
  report.Set("idle_connections_closed", run.idle_closed);
  report.Set("connection_idle_timeout_ms", static_cast<double>(run.connection_idle_timeout_ms));
  report.Set("churn_per_second", options.churn_per_second);
  report.Set("churn_pings", static_cast<double>(churn.pings));
  report.Set("churn_pings_ok", static_cast<double>(churn.pings_ok));
  report.Set("churn_ping_p50_ms", Percentile(churn.ping_ms, 50));
  report.Set("churn_ping_p99_ms", Percentile(churn.ping_ms, 99));
  report.Set("churn_ping_max_ms", Max(churn.ping_ms));
  report.Set("churn_raw_connects", static_cast<double>(churn.raw_connects));
  report.Set("connections_accepted", static_cast<double>(run.Delta("connections_admitted")));
  report.Set("connections_refused", static_cast<double>(run.ConnectionsRefused()));
  report.Set("max_connections_per_peer", run.per_peer_connections);
  report.Set("connections_own", static_cast<double>(run.own_connections));
  report.Set("connections_open_warm", static_cast<double>(run.connections_open_warm));
  report.Set("connections_open_end", static_cast<double>(run.connections_open_end));
  report.Set("descriptors_warm", static_cast<double>(run.fds_warm.total));
  report.Set("descriptors_end", static_cast<double>(run.fds_end.total));
  report.Set("descriptor_sockets_warm", static_cast<double>(run.fds_warm.sockets));
  report.Set("descriptor_sockets_end", static_cast<double>(run.fds_end.sockets));
  if (run.dead.ok()) {
    const DeadRemote& dead = *run.dead;
    const double compute_s = Median(dead.compute_only_s);
    report.Set("dead_remote_compute_only_s", compute_s);
    report.Set("dead_remote_frozen_first_s", dead.frozen_first_s);
    report.Set("dead_remote_frozen_median_s", Median(dead.frozen_s));
    report.Set("dead_remote_frozen_mean_s", Mean(dead.frozen_s));
    report.Set("dead_remote_frozen_max_s", Max(dead.frozen_s));
    report.Set("dead_remote_frozen_sparse_mean_s", Mean(dead.frozen_sparse_s));
    report.Set("dead_remote_killed_first_s", dead.killed_first_s);
    report.Set("dead_remote_killed_median_s", Median(dead.killed_s));
    report.Set("dead_remote_killed_mean_s", Mean(dead.killed_s));
    report.Set("dead_remote_killed_max_s", Max(dead.killed_s));
    report.Set("dead_remote_up_median_s", Median(dead.healthy_s));
    report.Set("dead_remote_frozen_over_compute", Median(dead.frozen_s) / compute_s);
    report.Set("dead_remote_killed_over_compute", Median(dead.killed_s) / compute_s);
  }
  report.Set("caked_exit_status", run.caked_exit);
  return report.WriteTo(path);
}

// What makes the run fail; never timing.
std::vector<std::string> SoakFailures(const SoakRun& run) {
  std::vector<std::string> failures;
  const Tally& tally = run.tally;
  if (tally.unexplained > 0) failures.push_back(absl::StrCat(tally.unexplained, " unexplained errors"));
  if (tally.chunks_wrong > 0) failures.push_back(absl::StrCat(tally.chunks_wrong, " loaded chunks not bit-exact"));
  if (run.active_loads > 0) failures.push_back(absl::StrCat(run.active_loads, " load slots still held"));
  if (run.options->region_lease_ms > 0 && run.regions > 0) {
    failures.push_back(absl::StrCat(run.regions, " regions still held after the lease"));
  }
  if (run.idle_closed > 0) {
    failures.push_back(
        absl::StrCat(run.idle_closed, " of the ", run.idle_held, " idle connections closed by the daemon"));
  }
  if (run.ConnectionsRefused() > 0) failures.push_back(absl::StrCat(run.ConnectionsRefused(), " connections refused"));
  // After the warm-up the daemon held the same long-lived descriptors and a few more that came and went; the churn
  // alone opens thousands, so a descriptor kept per connection or per call would show far above this.
  if (run.fds_end.total > run.fds_warm.total + kConnectionSlack) {
    failures.push_back(absl::StrCat("caked holds ", run.fds_end.total, " descriptors at the end, ", run.fds_warm.total,
                                    " after the warm-up"));
  }
  if (run.connections_open_end > run.connections_expected) {
    failures.push_back(absl::StrCat(run.connections_open_end, " connections counted open at the end, not ",
                                    run.connections_expected, ": connections kept after their peer left"));
  }
  return failures;
}

}  // namespace

absl::Status RunSoakBench(const SoakOptions& options) {
  const std::string vanishing_engine =
      (std::filesystem::path(SpawnedDaemon::SiblingCakedPath()).parent_path() / "cake_vanishing_engine").string();
  CAKE_RETURN_IF_ERROR(CheckSoakOptions(options, vanishing_engine));
  SoakRun run;
  run.options = &options;
  run.warmup_s = options.warmup_seconds >= 0 ? options.warmup_seconds : std::min(60.0, options.seconds / 5);
  if (run.warmup_s >= options.seconds) return absl::InvalidArgumentError("--warmup-seconds must be below --seconds");
  // This process holds the idle connections and the churn's beside the engines' own descriptors.
  if (rlimit nofile{}; ::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < options.idle_connections + 1024u) {
    nofile.rlim_cur = std::min<rlim_t>(nofile.rlim_max, options.idle_connections + 1024u);
    ::setrlimit(RLIMIT_NOFILE, &nofile);
  }

  // Set-up: Redis (declared first, so it goes last: every freeze is undone, by the freezer's destructor, before it
  // is stopped), the daemon, the pool of prompts, the idle connections.
  CAKE_ASSIGN_OR_RETURN(auto redis, RedisServer::Start());
  CAKE_ASSIGN_OR_RETURN(auto scratch, ScratchDir::Create("cake-bench-soak"));
  const std::filesystem::path disk_root = scratch.path() / "disk";
  const std::string key_prefix = absl::StrCat("soak-", getpid(), ":");
  const std::string config_path =
      scratch.WriteFile("caked.toml", SoakConfig(options, disk_root, redis, key_prefix, run));
  CAKE_ASSIGN_OR_RETURN(auto target, OpenDaemon("", {"--config", config_path, "--no-cuda"}));
  Client& client = *target.client;
  CAKE_ASSIGN_OR_RETURN(const std::vector<Prompt> prompts, StorePool(client));
  Tally connection_errors;  // the churn's: merged into the engines' tally once it is stopped
  ConnectionPeers peers(target.socket_path, options.churn_per_second, connection_errors);
  CAKE_RETURN_IF_ERROR(HoldIdleConnections(client, peers, options.idle_connections, run));

  // The soak.
  RedisFreezer freezer(redis.pid(), options.seed);
  ReadFaults faults(options.read_error_rate, disk_root, redis, key_prefix, freezer);
  const Clock::time_point soak_start = Clock::now();
  const auto after = [&](double seconds) {
    return soak_start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  };
  SoakWorld world(options, target.socket_path, prompts, faults, freezer, vanishing_engine, scratch.path(),
                  after(run.warmup_s));
  std::printf(
      "cake-bench soak: %u engines for %g s (warm-up %g s), caked pid %d, Redis %s, disk tier %s; %zu idle "
      "connections held (the daemon counts %llu open), %g new connections a second\n",
      options.engines, options.seconds, run.warmup_s, target.spawned->pid(), redis.address().c_str(),
      disk_root.string().c_str(), run.idle_held, static_cast<unsigned long long>(run.idle_counted_open),
      options.churn_per_second);
  std::fflush(stdout);
  const absl::Status soaked =
      RunEngines(*target.spawned, client, world, peers, freezer, soak_start, after(options.seconds), run);
  run.tally.Merge(connection_errors);
  if (!soaked.ok()) return soaked;
  run.injected = faults.counts();

  // After the soak: what the daemon still holds, then a dead remote tier against compute-only, then the stop.
  CAKE_RETURN_IF_ERROR(SettleAfterSoak(client, target.spawned->pid(), peers, run));
  std::printf("  soak over after %.1f s; the dead-remote phase (%u runs per Redis state)\n", run.soaked_s,
              options.dead_remote_runs);
  std::fflush(stdout);
  run.dead = RunDeadRemotePhase(client, redis, options.dead_remote_runs, run.tally);
  if (!run.dead.ok()) run.tally.Unexplained(absl::StrCat("dead-remote phase set-up: ", run.dead.status().ToString()));
  target.client.reset();
  StopDaemon(*target.spawned, run);

  PrintSoakReport(run);
  CAKE_RETURN_IF_ERROR(WriteSoakJson(run, options.common.json_path));
  if (const std::vector<std::string> failures = SoakFailures(run); !failures.empty()) {
    return absl::InternalError(absl::StrCat("soak failed: ", absl::StrJoin(failures, "; ")));
  }
  std::printf(
      "\n  soak clean: no unexplained error, every loaded chunk exact, no load slot held, every connection "
      "accepted and none kept\n");
  return absl::OkStatus();
}

void AddSoakCommand(CLI::App& app) {
  auto options = std::make_shared<SoakOptions>();
  CLI::App* command = app.add_subcommand(
      "soak", "fault and soak: many engines mixing every call, corrupt chunks, a paused Redis; checks every byte");
  AddCommonOptions(command, options->common);
  command->add_option("--engines", options->engines, "engines (threads, each its own client)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 256u));
  command->add_option("--seconds", options->seconds, "length of the soak (600 is the documented run)")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 86400.0));
  command->add_option("--warmup-seconds", options->warmup_seconds,
                      "seconds before RSS and TTFT are counted (default: a fifth of --seconds, at most 60)");
  command
      ->add_option("--read-error-rate", options->read_error_rate,
                   "share of the chunk reads from disk or Redis that find the chunk corrupted")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  command
      ->add_option("--dead-remote-runs", options->dead_remote_runs,
                   "timed loads per Redis state (frozen, killed) in the dead-remote phase")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1000u));
  command
      ->add_option("--region-lease-ms", options->region_lease_ms,
                   "limits.region_lease_ms of the bench's caked (killed clients' regions go after it); fail on regions "
                   "held at the end; 0: the daemon's default, unchecked")
      ->capture_default_str();
  command
      ->add_option("--idle-connections", options->idle_connections,
                   "raw unix-socket connections that send nothing, held for the whole run")
      ->capture_default_str()
      ->check(CLI::Range(0u, 4096u));
  command
      ->add_option("--churn-per-second", options->churn_per_second,
                   "new connections a second while the engines run: half a gRPC channel with one Ping, half a raw "
                   "connect closed at once; 0: none")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1000.0));
  command->add_option("--seed", options->seed, "the engines' random draws")->capture_default_str();
  RunWhenParsed(command, options, RunSoakBench);
}

}  // namespace cake::bench
