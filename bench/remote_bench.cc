// cake-bench remote: I/O-only loads of a cached prefix from the remote tier (Redis) into a region, beside
// redis-benchmark GETs of values of the same part size with the same number of connections and the same pipeline
// depth, in the same run against the same server: the limit the link and Redis set.
#include <hiredis/hiredis.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "bench/bench_command.h"
#include "bench/bench_common.h"
#include "bench/benchmarks.h"
#include "examples/simulated_engine/simulated_storage.h"
#include "storage/chunk_file.h"
#include "storage/redis/redis_cluster_client.h"
#include "testing/redis_process.h"

namespace cake::bench {
namespace {

// redis-benchmark's GET requests per second, from its --csv output ("GET","12345.67",...).
// With cluster, its clients are spread over the masters, each on keys of its own node's slots.
absl::StatusOr<double> RedisBenchmarkGetRps(const ScratchDir& scratch, const std::string& host, int port,
                                            uint64_t value_bytes, uint32_t connections, uint32_t pipeline,
                                            uint64_t requests, bool cluster) {
  // The SET test writes the value GET then reads (without -r both use the one key "key:__rand_int__", one per
  // master in cluster mode).
  // clang-format off
  std::vector<std::string> args = {"redis-benchmark", "-h", host, "-p", absl::StrCat(port), "-t", "set,get",
                                   "-d", absl::StrCat(value_bytes), "-c", absl::StrCat(connections), "-P",
                                   absl::StrCat(pipeline), "-n", absl::StrCat(requests), "--csv"};
  // clang-format on
  if (cluster) args.push_back("--cluster");
  const std::filesystem::path log = scratch.path() / "redis-benchmark.log";
  CAKE_ASSIGN_OR_RETURN(auto rc, RunProgram(args, log));
  const std::string out = ReadWholeFile(log);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat(absl::StrJoin(args, " "), " exited with ", rc, ":\n", out));
  }
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (line.substr(0, 6) != "\"GET\",") continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ',');
    double rps = 0;
    if (fields.size() >= 2 &&
        absl::SimpleAtod(absl::StripAsciiWhitespace(fields[1]).substr(1, fields[1].size() - 2), &rps)) {
      return rps;
    }
  }
  return absl::InternalError(absl::StrCat("no GET line in redis-benchmark's output:\n", out));
}

// The tier's work without the daemon: per chunk, one call that GETs its parts (one hash tag, so one master) into
// the chunk's own place in a buffer as large as the load's region (prefaulted, as the region is), through
// RedisClusterClient directly, from `streams` threads at once, each taking the next chunk when its last one has
// landed (1: one chunk after another). The daemon is held to the best of these shapes. Reading every chunk into
// one small buffer instead would flatter the client: its 16 MiB stay in the cache, where the load's gigabyte
// cannot.
class BareClient {
 public:
  static absl::StatusOr<std::unique_ptr<BareClient>> Open(const std::string& endpoints, bool use_io_uring,
                                                          uint32_t chunks, uint32_t parts_per_chunk,
                                                          uint64_t part_bytes) {
    RedisClusterClient::Options options;
    options.endpoints = absl::StrSplit(endpoints, ',');
    options.use_io_uring = use_io_uring;
    CAKE_ASSIGN_OR_RETURN(auto client, RedisClusterClient::Open(options));
    std::unique_ptr<BareClient> bare(new BareClient(std::move(client), chunks, parts_per_chunk, part_bytes));
    bare->landing_.assign(uint64_t{chunks} * parts_per_chunk * part_bytes, std::byte{1});
    const std::string value(part_bytes, 'v');
    const std::vector<std::byte> chunk_value(uint64_t{parts_per_chunk} * part_bytes, std::byte{'v'});
    bare->chunk_checksum_ = PayloadChecksum(chunk_value);
    for (uint32_t c = 0; c < chunks; ++c) {
      std::vector<RedisCommand> sets;
      for (uint32_t p = 0; p < parts_per_chunk; ++p) {
        RedisCommand set = Command("SET", c, p);
        set.value = std::as_bytes(std::span(value));
        set.has_value = true;
        sets.push_back(std::move(set));
      }
      CAKE_RETURN_IF_ERROR(bare->client_->Execute(sets).status());
    }
    return bare;
  }
  BareClient(const BareClient&) = delete;
  BareClient& operator=(const BareClient&) = delete;
  ~BareClient() {
    std::vector<RedisCommand> dels;
    for (uint32_t c = 0; c < chunks_; ++c) {
      for (uint32_t p = 0; p < parts_per_chunk_; ++p) dels.push_back(Command("DEL", c, p));
    }
    (void)client_->Execute(dels);
  }

  // Reads every chunk once; Gbit/s. `verified`: each chunk is hashed as its bytes land (a chunk's parts come in
  // order on one connection), the work the remote tier does for every chunk, and checked against the stored bytes'
  // checksum.
  absl::StatusOr<double> Run(uint32_t streams, bool verified) {
    std::atomic<uint32_t> next{0};
    std::vector<absl::Status> failed(streams);
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (uint32_t t = 0; t < streams; ++t) {
      threads.emplace_back([&, t] {
        for (uint32_t c = next++; c < chunks_; c = next++) {
          const std::span<std::byte> chunk =
              std::span(landing_).subspan(uint64_t{c} * parts_per_chunk_ * part_bytes_, parts_per_chunk_ * part_bytes_);
          std::vector<RedisCommand> gets;
          IncrementalPayloadChecksum checksum;
          for (uint32_t p = 0; p < parts_per_chunk_; ++p) {
            RedisCommand get = Command("GET", c, p);
            get.sink = chunk.subspan(p * part_bytes_, part_bytes_);
            if (verified) get.on_landed = [&checksum](std::span<const std::byte> landed) { checksum.Add(landed); };
            gets.push_back(std::move(get));
          }
          auto replies = client_->Execute(gets);
          if (!replies.ok()) {
            failed[t] = replies.status();
            return;
          }
          for (const RedisReply& r : *replies) {
            if (r->type != REDIS_REPLY_STRING || r->str != nullptr) {
              failed[t] = absl::InternalError("a GET missed its sink");
              return;
            }
          }
          if (verified && checksum.Digest() != chunk_checksum_) {
            failed[t] = absl::DataLossError(absl::StrCat("chunk ", c, " landed with the wrong checksum"));
            return;
          }
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    for (const absl::Status& status : failed) CAKE_RETURN_IF_ERROR(status);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return chunks_ * parts_per_chunk_ * part_bytes_ * 8 / seconds / 1e9;
  }

 private:
  BareClient(std::unique_ptr<RedisClusterClient> client, uint32_t chunks, uint32_t parts_per_chunk, uint64_t part_bytes)
      : client_(std::move(client)), chunks_(chunks), parts_per_chunk_(parts_per_chunk), part_bytes_(part_bytes) {}
  // A command on part p of chunk c: the chunk number is the hash tag, so a chunk's parts share a master.
  static RedisCommand Command(const char* verb, uint32_t c, uint32_t p) {
    RedisCommand cmd;
    cmd.verb = verb;
    cmd.key = absl::StrCat("cake-bench-alone:{", c, "}:", p);
    return cmd;
  }

  std::unique_ptr<RedisClusterClient> client_;
  const uint32_t chunks_;
  const uint32_t parts_per_chunk_;
  const uint64_t part_bytes_;
  std::vector<std::byte> landing_;  // chunk c at c * parts_per_chunk * part_bytes
  uint64_t chunk_checksum_ = 0;     // of every chunk's bytes as stored
};

}  // namespace

absl::Status RunRemoteBench(const RemoteBenchOptions& options) {
  if (options.mib < options.chunk_mib || options.chunk_mib == 0 || options.part_kib == 0) {
    return absl::InvalidArgumentError("need --mib >= --chunk-mib > 0 and --part-kib > 0");
  }
  if (!OnPath("redis-benchmark")) {
    return absl::FailedPreconditionError(
        "redis-benchmark is not on PATH: this bench measures Redis with it in the same run; install it "
        "(apt-get install -y redis-tools, or scripts/setup) and run again");
  }
  // Redis: a private server (or cluster) unless one was named.
  std::optional<RedisServer> private_redis;
  std::optional<RedisCluster> private_cluster;
  std::string host = "127.0.0.1";
  int port = 0;
  std::string endpoints;  // what caked is given
  const bool cluster = options.cluster_masters > 0;
  if (cluster) {
    if (!options.redis.empty()) return absl::InvalidArgumentError("--cluster starts its own cluster; drop --redis");
    CAKE_ASSIGN_OR_RETURN(auto started, RedisCluster::Start(static_cast<int>(options.cluster_masters)));
    private_cluster.emplace(std::move(started));
    port = private_cluster->node(0).port();
    endpoints = absl::StrJoin(private_cluster->addresses(), ",");
  } else if (options.redis.empty()) {
    CAKE_ASSIGN_OR_RETURN(auto started, RedisServer::Start());
    private_redis.emplace(std::move(started));
    port = private_redis->port();
  } else {
    const size_t colon = options.redis.rfind(':');
    if (colon == std::string::npos || !absl::SimpleAtoi(options.redis.substr(colon + 1), &port)) {
      return absl::InvalidArgumentError(absl::StrCat("--redis '", options.redis, "' is not host:port"));
    }
    host = options.redis.substr(0, colon);
  }
  const std::string address = absl::StrCat(host, ":", port);
  if (endpoints.empty()) endpoints = address;
  // As many connections as the load has reads in flight; in cluster mode redis-benchmark deals them out over the
  // masters in turn, as the load's chunks fall on masters by their keys.
  const uint32_t benchmark_connections = options.window;

  const uint64_t chunk_bytes = options.chunk_mib << 20;
  const uint64_t part_bytes = options.part_kib << 10;
  const uint32_t chunk_tokens = static_cast<uint32_t>(chunk_bytes / sim::kProxyBytesPerToken);
  const NamespaceSpec ns = sim::ProxyNamespace(absl::StrCat("remote-", getpid()), chunk_tokens);
  const uint32_t chunks = static_cast<uint32_t>(options.mib / options.chunk_mib);
  const uint64_t bytes = uint64_t{chunks} * chunk_bytes;
  const uint32_t parts_per_chunk = static_cast<uint32_t>((chunk_bytes + part_bytes - 1) / part_bytes);

  // The part size has no flag: a config file in a private folder (which also takes redis-benchmark's output).
  CAKE_ASSIGN_OR_RETURN(auto scratch, ScratchDir::Create("cake-bench-remote"));
  // The proxy namespace counts 1 KiB per token, so a large prefix (2 GiB: 2M tokens) is a longer prompt than the
  // daemon accepts by default: the limit is raised to the prompt, which is what an operator would do.
  const uint64_t prompt_tokens = uint64_t{chunks} * chunk_tokens;
  const std::string config_path = scratch.WriteFile(
      "caked.toml", absl::StrCat("[remote]\npart_bytes = ", part_bytes, "\n[limits]\nmax_prompt_tokens = ",
                                 std::max<uint64_t>(prompt_tokens, uint64_t{1} << 20), "\n"));
  // A DRAM tier smaller than twice the prefix: loads of it are not promoted, so every run reads Redis.
  CAKE_ASSIGN_OR_RETURN(auto target,
                        OpenDaemon("", {"--config", config_path, "--remote", endpoints, "--remote-key-prefix",
                                        absl::StrCat("cake-bench-", getpid(), ":"), "--dram-capacity-mib",
                                        absl::StrCat(options.mib + 2 * options.chunk_mib), "--window",
                                        absl::StrCat(options.window), "--io-threads", absl::StrCat(options.window),
                                        "--remote-read-threads", absl::StrCat(options.read_threads)}));
  Client& client = *target.client;
  CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(bytes));
  absl::Cleanup release_region = [&] { client.ReleaseRegion(region).IgnoreError(); };
  const std::vector<uint32_t> prompt = SyntheticPrompt(uint64_t{chunks} * chunk_tokens, 71);
  for (uint32_t c = 0; c < chunks; ++c) FillChunkPattern({region.data() + c * chunk_bytes, chunk_bytes}, c);
  CAKE_RETURN_IF_ERROR(client.Store(ns, TokensPrompt(prompt), 0, chunks, region, 0).status());
  CAKE_RETURN_IF_ERROR(WaitForCounter(client, "write_back_written", chunks, std::chrono::seconds(60)));
  absl::Cleanup evict_remote = [&] { client.Evict(TierKind::kRemote).IgnoreError(); };
  CAKE_RETURN_IF_ERROR(client.Evict(TierKind::kDram).status());
  CAKE_ASSIGN_OR_RETURN(auto lookup, client.Lookup(ns, TokensPrompt(prompt)));
  if (lookup.cached_chunks != chunks ||
      std::count(lookup.tiers.begin(), lookup.tiers.end(), TierKind::kRemote) != chunks) {
    return absl::InternalError(absl::StrCat("only ", lookup.cached_chunks, " of ", chunks, " chunks are in Redis"));
  }

  LoadOptions load;
  load.ns = ns;
  load.prompt = TokensPrompt(prompt);
  load.region = &region;
  // Both warmed up first, untimed: Redis's reply buffers and the daemon's connections are made once, not in run 1.
  // In cluster mode redis-benchmark's figure moves in steps of its event loop's 250 ms ticks (the same 64 GETs
  // measured 8.49 or 4.26 Gbit/s, nothing between): sixteen times the requests make it a rate again.
  const uint64_t requests = uint64_t{chunks} * parts_per_chunk * (cluster ? 16 : 1);
  CAKE_RETURN_IF_ERROR(TimedIoOnlyLoad(client, load, chunks, chunk_bytes).status());
  CAKE_RETURN_IF_ERROR(
      RedisBenchmarkGetRps(scratch, host, port, part_bytes, benchmark_connections, parts_per_chunk, requests, cluster)
          .status());
  // The bare client in each shape: through io_uring and through poll, one chunk at a time and as many at once as
  // the load's window. Both clients read the same keys (each stores them when it opens, the same bytes), apart from
  // the tier's; each run of the daemon is followed by one run of each shape, so the machine's moods fall on all alike.
  // One more shape is not a candidate for the best: io_uring at the window, hashing every chunk as it lands as the
  // tier does (the tier's transport; Redis is an untrusted peer, so the tier cannot skip it). The tier against it
  // says what the daemon costs beyond the hash.
  struct Shape {
    bool io_uring;
    uint32_t streams;
    bool verified = false;
    std::string name() const {
      return absl::StrFormat("%s x%u%s", io_uring ? "io_uring" : "poll", streams, verified ? " hashed" : "");
    }
  };
  std::vector<Shape> shapes = {{true, 1}, {false, 1}};
  if (options.window > 1) shapes.insert(shapes.end(), {{true, options.window}, {false, options.window}});
  const size_t hashed_shape = shapes.size();
  shapes.push_back({true, options.window, true});
  CAKE_ASSIGN_OR_RETURN(auto bare_uring,
                        BareClient::Open(endpoints, /*use_io_uring=*/true, chunks, parts_per_chunk, part_bytes));
  CAKE_ASSIGN_OR_RETURN(auto bare_poll,
                        BareClient::Open(endpoints, /*use_io_uring=*/false, chunks, parts_per_chunk, part_bytes));
  auto run_shape = [&](const Shape& shape) {
    return (shape.io_uring ? bare_uring : bare_poll)->Run(shape.streams, shape.verified);
  };
  for (const Shape& shape : shapes) CAKE_RETURN_IF_ERROR(run_shape(shape).status());  // warm-up, untimed
  std::vector<double> remote_gbps, benchmark_gbps;
  std::vector<std::vector<double>> bare_gbps(shapes.size());
  for (uint32_t run = 0; run < options.runs; ++run) {
    CAKE_ASSIGN_OR_RETURN(auto seconds, TimedIoOnlyLoad(client, load, chunks, chunk_bytes));
    remote_gbps.push_back(bytes * 8 / seconds / 1e9);
    std::string bare_line;
    for (size_t i = 0; i < shapes.size(); ++i) {
      CAKE_ASSIGN_OR_RETURN(const double gbps, run_shape(shapes[i]));
      bare_gbps[i].push_back(gbps);
      absl::StrAppend(&bare_line, absl::StrFormat(", %s %.2f", shapes[i].name(), gbps));
    }
    // The same bytes as GETs of one part each, options.window connections, a chunk's parts per pipeline.
    CAKE_ASSIGN_OR_RETURN(auto rps, RedisBenchmarkGetRps(scratch, host, port, part_bytes, benchmark_connections,
                                                         parts_per_chunk, requests, cluster));
    benchmark_gbps.push_back(rps * part_bytes * 8 / 1e9);
    std::printf("  run %u: caked remote load %.2f Gbit/s (%.3f s); bare client%s; redis-benchmark GET %.2f Gbit/s\n",
                run + 1, remote_gbps.back(), seconds, bare_line.c_str() + 1, benchmark_gbps.back());
    std::fflush(stdout);
  }
  bare_uring.reset();
  bare_poll.reset();
  size_t best_shape = 0;
  for (size_t i = 1; i < hashed_shape; ++i) {
    if (Median(bare_gbps[i]) > Median(bare_gbps[best_shape])) best_shape = i;
  }
  const auto stats = client.Stats();
  const double ratio = Median(remote_gbps) / Median(benchmark_gbps);
  std::printf(
      "cake-bench remote: %u chunks of %llu MiB (%llu MiB) in parts of %llu KiB from %s at %s; window %u; every "
      "byte checked\n",
      chunks, static_cast<unsigned long long>(options.chunk_mib), static_cast<unsigned long long>(bytes >> 20),
      static_cast<unsigned long long>(options.part_kib),
      cluster ? absl::StrCat("a Redis Cluster of ", options.cluster_masters, " masters").c_str() : "Redis",
      endpoints.c_str(), options.window);
  std::printf(
      "  median: remote tier %.2f Gbit/s, redis-benchmark GET (%u connections, pipeline %u) %.2f Gbit/s: %.0f%%\n",
      Median(remote_gbps), benchmark_connections, parts_per_chunk, Median(benchmark_gbps), 100 * ratio);
  // Per run, the daemon against the best shape's run beside it.
  std::vector<double> per_run;
  std::vector<double> per_run_hashed;
  for (size_t r = 0; r < remote_gbps.size(); ++r) {
    per_run.push_back(remote_gbps[r] / bare_gbps[best_shape][r]);
    per_run_hashed.push_back(remote_gbps[r] / bare_gbps[hashed_shape][r]);
  }
  std::printf("  the bare client, a chunk per call, medians in Gbit/s:");
  for (size_t i = 0; i < shapes.size(); ++i) std::printf(" %s %.2f;", shapes[i].name().c_str(), Median(bare_gbps[i]));
  std::printf(
      "\n  remote tier / the bare client's best shape (%s): median of per-run ratios %.3f (%.3f to %.3f); "
      "goal at least 0.90\n",
      shapes[best_shape].name().c_str(), Median(per_run), *std::min_element(per_run.begin(), per_run.end()),
      *std::max_element(per_run.begin(), per_run.end()));
  std::printf(
      "  remote tier / the bare client hashing as the tier does (%s): median of per-run ratios %.3f (%.3f to %.3f)\n",
      shapes[hashed_shape].name().c_str(), Median(per_run_hashed),
      *std::min_element(per_run_hashed.begin(), per_run_hashed.end()),
      *std::max_element(per_run_hashed.begin(), per_run_hashed.end()));
  if (stats.ok() && stats->count("tier_remote_errors") && stats->at("tier_remote_errors") > 0) {
    std::printf("  note: %llu remote errors during the run\n",
                static_cast<unsigned long long>(stats->at("tier_remote_errors")));
  }
  JsonReport report;
  report.Set("bytes", static_cast<double>(bytes));
  report.Set("chunk_bytes", static_cast<double>(chunk_bytes));
  report.Set("part_bytes", static_cast<double>(part_bytes));
  report.Set("window", options.window);
  report.Set("cluster_masters", options.cluster_masters);
  report.Set("remote_gbps", Median(remote_gbps));
  report.Set("redis_benchmark_gbps", Median(benchmark_gbps));
  report.Set("remote_over_redis_benchmark", ratio);
  report.Set("read_threads", options.read_threads);
  report.Set("client_alone_uring_gbps", Median(bare_gbps[0]));
  report.Set("client_alone_poll_gbps", Median(bare_gbps[1]));
  report.Set("bare_client_best_streams", shapes[best_shape].streams);
  report.Set("bare_client_best_io_uring", shapes[best_shape].io_uring ? 1 : 0);
  report.Set("bare_client_best_gbps", Median(bare_gbps[best_shape]));
  report.Set("remote_over_bare_client", Median(per_run));
  report.Set("bare_client_hashed_gbps", Median(bare_gbps[hashed_shape]));
  report.Set("remote_over_bare_client_hashed", Median(per_run_hashed));
  return report.WriteTo(options.json_path);
}

void AddRemoteCommand(CLI::App& app) {
  auto options = std::make_shared<RemoteBenchOptions>();
  CLI::App* command = app.add_subcommand(
      "remote", "loads from the remote tier (Redis) beside redis-benchmark GETs of the same part size");
  command->add_option("--redis", options->redis, "host:port of a running Redis (default: a private redis-server)");
  command->add_option("--json", options->json_path, "also write the results to this file as one JSON object");
  command->add_option("--mib", options->mib, "prefix size, MiB")->capture_default_str();
  command->add_option("--chunk-mib", options->chunk_mib, "chunk size, MiB")->capture_default_str();
  command->add_option("--part-kib", options->part_kib, "Redis value (part) size, KiB")->capture_default_str();
  command->add_option("--window", options->window, "reads in flight = redis-benchmark connections")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  command->add_option("--runs", options->runs, "runs of each")->capture_default_str()->check(CLI::Range(1u, 100u));
  command
      ->add_option("--cluster", options->cluster_masters,
                   "read from a private Redis Cluster of this many masters (redis-benchmark --cluster with "
                   "--window connections)")
      ->check(CLI::Range(3u, 16u));
  command
      ->add_option("--read-threads", options->read_threads,
                   "caked --remote-read-threads: chunks read from Redis at once (0: caked's default)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 64u));
  RunWhenParsed(command, options, RunRemoteBench);
}

}  // namespace cake::bench
