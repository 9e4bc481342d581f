// cake-bench codec: what the lossless codec (storage/chunk_codec.h) costs and buys. First the codec alone on one
// core (encode and decode GB/s of raw bytes, the ratio), then I/O-only loads of the same prefix from a disk tier
// and from a remote tier, one daemon storing raw and one encoded, their loads alternating in one run so the
// machine's drift falls on both. Throughput is raw (decoded) bytes delivered per second, every byte checked.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "bench/bench_command.h"
#include "bench/bench_common.h"
#include "bench/benchmarks.h"
#include "storage/chunk_codec.h"
#include "storage/lossy_codec.h"
#include "testing/redis_process.h"

namespace cake::bench {
namespace {

// SmolLM2-135M's KV layout (30 layers, 3 KV heads of 64, bf16) at 256 tokens a chunk: 5.6 MiB chunks, the model
// whose real KV docs/research/codec-study measured.
NamespaceSpec CodecNamespace() {
  NamespaceSpec ns;
  ns.model_id = absl::StrCat("codec-bench-", getpid());
  ns.num_layers = 30;
  ns.num_kv_heads = 3;
  ns.head_dim = 64;
  ns.dtype = DType::kBf16;
  ns.chunk_tokens = 256;
  return ns;
}

// Normally distributed values with a scale per channel, rounded to bf16: KV-shaped bytes when no dump is given.
void FillSyntheticBf16(std::span<std::byte> out, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  auto uniform = [&x] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return (static_cast<double>(x >> 11) + 0.5) / 9007199254740992.0;
  };
  for (size_t j = 0; j + 1 < out.size(); j += 2) {
    const float value =
        static_cast<float>(std::sqrt(-2 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()) *
                           (0.05 + static_cast<double>((j / 2) % 64) / 16));
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    out[j] = static_cast<std::byte>(bits >> 16);
    out[j + 1] = static_cast<std::byte>(bits >> 24);
  }
}

absl::StatusOr<std::vector<std::byte>> PrefixBytes(const CodecBenchOptions& options, uint64_t bytes) {
  std::vector<std::byte> kv(bytes);
  if (options.data.empty()) {
    FillSyntheticBf16(kv, 1);
    return kv;
  }
  std::ifstream in(options.data, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--data ", options.data, " cannot be read"));
  in.read(reinterpret_cast<char*>(kv.data()), static_cast<std::streamsize>(bytes));
  const uint64_t got = static_cast<uint64_t>(in.gcount());
  if (got == 0) return absl::InvalidArgumentError(absl::StrCat("--data ", options.data, " is empty"));
  // A dump shorter than the prefix repeats; chunk boundaries then fall elsewhere in it, so chunks still differ.
  for (uint64_t at = got; at < bytes; at += got) std::memcpy(kv.data() + at, kv.data(), std::min(got, bytes - at));
  return kv;
}

struct CodecSpeed {
  double ratio = 0;
  double encode_gbps = 0;
  double decode_gbps = 0;
};

// One thread, every chunk encoded then decoded (and checked), three passes; the best pass of each.
absl::StatusOr<CodecSpeed> MeasureCodec(std::span<const std::byte> kv, uint64_t chunk_bytes) {
  const uint64_t chunks = kv.size() / chunk_bytes;
  std::vector<std::vector<std::byte>> encoded(chunks);
  std::vector<std::byte> out(chunk_bytes);
  double encode_s = 1e30, decode_s = 1e30;
  uint64_t stored = 0;
  for (int pass = 0; pass < 3; ++pass) {
    auto start = Clock::now();
    for (uint64_t c = 0; c < chunks; ++c) {
      encoded[c] = EncodeChunk(ChunkCodec::kPlanesZstd, kv.subspan(c * chunk_bytes, chunk_bytes));
    }
    encode_s = std::min(encode_s, SecondsSince(start));
    start = Clock::now();
    for (uint64_t c = 0; c < chunks; ++c) CAKE_RETURN_IF_ERROR(DecodeChunk(encoded[c], out));
    decode_s = std::min(decode_s, SecondsSince(start));
    stored = 0;
    for (uint64_t c = 0; c < chunks; ++c) {
      stored += encoded[c].size();
      CAKE_RETURN_IF_ERROR(DecodeChunk(encoded[c], out));
      if (std::memcmp(out.data(), kv.data() + c * chunk_bytes, chunk_bytes) != 0) {
        return absl::InternalError(absl::StrCat("chunk ", c, " did not decode to itself"));
      }
    }
  }
  const uint64_t raw = chunks * chunk_bytes;
  return CodecSpeed{static_cast<double>(raw) / static_cast<double>(stored), GigabytesPerSecond(raw, encode_s),
                    GigabytesPerSecond(raw, decode_s)};
}

struct TierRun {
  std::vector<double> raw_gbps, codec_gbps, ratios;
  double daemon_decode_gbps = 0;  // the codec daemon's own decode time per raw byte, on its I/O threads
  double stored_ratio = 0;        // raw bytes over the bytes the tier holds
};

// Two daemons on one tier kind, one raw and one with the codec, the same prefix stored in each; then `runs` pairs
// of I/O-only loads from that tier, the order within a pair alternating.
absl::StatusOr<TierRun> MeasureTier(const std::string& tier, const std::vector<std::string>& raw_args,
                                    const std::vector<std::string>& codec_args, std::span<const std::byte> kv,
                                    uint64_t chunk_bytes, uint32_t runs) {
  const NamespaceSpec ns = CodecNamespace();
  const uint32_t chunks = static_cast<uint32_t>(kv.size() / chunk_bytes);
  const std::vector<uint32_t> prompt = SyntheticPrompt(uint64_t{chunks} * ns.chunk_tokens, 83);
  // DRAM holds the prefix for the Store, and is under twice its size, so loads from the slower tier are not
  // promoted: every run reads the tier.
  const std::string dram_mib = absl::StrCat((kv.size() >> 20) + 2 * (chunk_bytes >> 20) + 2);
  struct Side {
    std::optional<DaemonTarget> target;
    std::optional<MappedRegion> region;
  };
  Side sides[2];
  const std::vector<std::string>* args[2] = {&raw_args, &codec_args};
  for (int s = 0; s < 2; ++s) {
    std::vector<std::string> spawn = *args[s];
    spawn.insert(spawn.end(), {"--dram-capacity-mib", dram_mib});
    CAKE_ASSIGN_OR_RETURN(auto target, OpenDaemon("", spawn));
    sides[s].target.emplace(std::move(target));
    Client& client = *sides[s].target->client;
    CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(kv.size()));
    std::memcpy(region.data(), kv.data(), kv.size());
    CAKE_RETURN_IF_ERROR(client.Store(ns, TokensPrompt(prompt), 0, chunks, region, 0).status());
    sides[s].region.emplace(std::move(region));
    CAKE_RETURN_IF_ERROR(WaitForCounter(client, "write_back_written", chunks, std::chrono::seconds(300)));
    CAKE_RETURN_IF_ERROR(client.Evict(TierKind::kDram).status());
  }
  const ChunkCheck check = [&](std::span<const std::byte> bytes, uint32_t c) -> absl::Status {
    if (std::memcmp(bytes.data(), kv.data() + uint64_t{c} * chunk_bytes, chunk_bytes) != 0) {
      return absl::DataLossError(absl::StrCat("chunk ", c, " loaded from the ", tier, " tier differs"));
    }
    return absl::OkStatus();
  };
  TierRun result;
  for (uint32_t run = 0; run <= runs; ++run) {  // run 0 warms both up, untimed
    double gbps[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      const int s = (run % 2 == 0) ? k : 1 - k;
      Client& client = *sides[s].target->client;
      LoadOptions load;
      load.ns = ns;
      load.prompt = TokensPrompt(prompt);
      load.region = &*sides[s].region;
      CAKE_ASSIGN_OR_RETURN(const double seconds, TimedIoOnlyLoad(client, load, chunks, chunk_bytes, check));
      gbps[s] = GigabytesPerSecond(kv.size(), seconds);
    }
    if (run == 0) continue;
    result.raw_gbps.push_back(gbps[0]);
    result.codec_gbps.push_back(gbps[1]);
    result.ratios.push_back(gbps[1] / gbps[0]);
    std::printf("  %s run %u: raw %.2f GB/s, planes-zstd %.2f GB/s (%.2fx)\n", tier.c_str(), run, gbps[0], gbps[1],
                gbps[1] / gbps[0]);
    std::fflush(stdout);
  }
  CAKE_ASSIGN_OR_RETURN(auto stats, sides[1].target->client->Stats());
  const auto counter = [&](const std::string& name) -> double {
    auto it = stats.find(absl::StrCat("tier_", tier, "_codec_", name));
    return it == stats.end() ? 0 : static_cast<double>(it->second);
  };
  if (counter("decode_microseconds") > 0) {
    result.daemon_decode_gbps = counter("raw_bytes_decoded") / counter("decode_microseconds") / 1e3;
  }
  if (counter("stored_bytes_encoded") > 0) {
    result.stored_ratio = counter("raw_bytes_encoded") / counter("stored_bytes_encoded");
  }
  for (Side& side : sides) {
    (void)side.target->client->ReleaseRegion(*side.region);
    (void)side.target->client->Evict(TierKind::kRemote);
  }
  return result;
}

// One daemon, one disk tier, the prefix stored in an EXACT, an INT8 and an INT4 namespace; `runs` rounds of
// I/O-only loads of each from disk (the order rotating), raw bytes delivered per second.
absl::Status MeasureLossy(const CodecBenchOptions& options, std::span<const std::byte> kv, uint64_t chunk_bytes,
                          JsonReport& report) {
  CAKE_ASSIGN_OR_RETURN(auto root, FreshPath(options.dir, "cake-codec"));
  absl::Cleanup remove_root = [&] { RemoveQuietly(root); };
  std::vector<std::string> args = {"--disk-root", root.string(), "--dram-capacity-mib",
                                   absl::StrCat(3 * (kv.size() >> 20) + 64)};
  if (options.disk_gbps > 0) args.insert(args.end(), {"--disk-read-gbps", absl::StrCat(options.disk_gbps)});
  CAKE_ASSIGN_OR_RETURN(auto target, OpenDaemon("", args));
  Client& client = *target.client;
  const uint32_t chunks = static_cast<uint32_t>(kv.size() / chunk_bytes);
  const std::vector<uint32_t> prompt = SyntheticPrompt(uint64_t{chunks} * CodecNamespace().chunk_tokens, 89);
  const StoredPrecision precisions[3] = {StoredPrecision::kExact, StoredPrecision::kInt8, StoredPrecision::kInt4};
  const char* names[3] = {"exact", "int8", "int4"};
  std::vector<NamespaceSpec> spaces;
  CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(kv.size()));
  absl::Cleanup release_region = [&] { client.ReleaseRegion(region).IgnoreError(); };
  for (StoredPrecision precision : precisions) {
    NamespaceSpec ns = CodecNamespace();
    ns.stored_precision = precision;
    spaces.push_back(ns);
    std::memcpy(region.data(), kv.data(), kv.size());
    CAKE_RETURN_IF_ERROR(client.Store(ns, TokensPrompt(prompt), 0, chunks, region, 0).status());
  }
  CAKE_RETURN_IF_ERROR(WaitForCounter(client, "write_back_written", 3 * chunks, std::chrono::seconds(300)));
  // What a decoded chunk may differ by: checked against the codec itself, byte for byte. Timed too: one core's
  // encode and decode speed, in raw bytes.
  std::vector<std::vector<std::byte>> expected(3);
  for (int p = 1; p < 3; ++p) {
    const LossyFormat format = LossyFormat::Of(spaces[p]);
    expected[p].resize(kv.size());
    double encode_s = 0, decode_s = 0;
    for (uint32_t c = 0; c < chunks; ++c) {
      auto start = Clock::now();
      const auto encoded = EncodeLossy(format, kv.subspan(uint64_t{c} * chunk_bytes, chunk_bytes));
      encode_s += SecondsSince(start);
      start = Clock::now();
      CAKE_RETURN_IF_ERROR(
          DecodeLossy(encoded, std::span(expected[p]).subspan(uint64_t{c} * chunk_bytes, chunk_bytes)));
      decode_s += SecondsSince(start);
    }
    std::printf("  %s alone, one core: encode %.2f GB/s, decode %.2f GB/s (raw bytes)\n", names[p],
                GigabytesPerSecond(kv.size(), encode_s), GigabytesPerSecond(kv.size(), decode_s));
    report.Set(absl::StrCat("lossy_", names[p], "_decode_gbps_one_core"), GigabytesPerSecond(kv.size(), decode_s));
  }
  std::vector<double> gbps[3];
  for (uint32_t run = 0; run <= options.runs; ++run) {  // run 0 warms up, untimed
    for (int k = 0; k < 3; ++k) {
      const int p = static_cast<int>((run + k) % 3);
      CAKE_RETURN_IF_ERROR(client.Evict(TierKind::kDram).status());
      LoadOptions load;
      load.ns = spaces[p];
      load.prompt = TokensPrompt(prompt);
      load.region = &region;
      const std::span<const std::byte> want = p == 0 ? kv : std::span<const std::byte>(expected[p]);
      const ChunkCheck check = [&](std::span<const std::byte> bytes, uint32_t c) -> absl::Status {
        if (std::memcmp(bytes.data(), want.data() + uint64_t{c} * chunk_bytes, chunk_bytes) != 0) {
          return absl::DataLossError(
              absl::StrCat("chunk ", c, " of the ", names[p], " namespace is not what its codec gives"));
        }
        return absl::OkStatus();
      };
      CAKE_ASSIGN_OR_RETURN(const double seconds, TimedIoOnlyLoad(client, load, chunks, chunk_bytes, check));
      if (run > 0) gbps[p].push_back(GigabytesPerSecond(kv.size(), seconds));
    }
    if (run > 0) {
      std::printf("  run %u: exact %.2f GB/s, int8 %.2f GB/s, int4 %.2f GB/s\n", run, gbps[0].back(), gbps[1].back(),
                  gbps[2].back());
      std::fflush(stdout);
    }
  }
  std::printf(
      "  disk%s: median exact %.2f GB/s, int8 %.2f GB/s (%.2fx, stored %.2fx smaller), int4 %.2f GB/s (%.2fx, "
      "stored %.2fx smaller)\n",
      options.disk_gbps > 0 ? absl::StrCat(" capped at ", options.disk_gbps, " Gbit/s").c_str() : "", Median(gbps[0]),
      Median(gbps[1]), Median(gbps[1]) / Median(gbps[0]),
      static_cast<double>(chunk_bytes) / static_cast<double>(LossyFormat::Of(spaces[1]).encoded_bytes()),
      Median(gbps[2]), Median(gbps[2]) / Median(gbps[0]),
      static_cast<double>(chunk_bytes) / static_cast<double>(LossyFormat::Of(spaces[2]).encoded_bytes()));
  for (int p = 0; p < 3; ++p) report.Set(absl::StrCat("lossy_", names[p], "_gbps"), Median(gbps[p]));
  return absl::OkStatus();
}

}  // namespace

absl::Status RunCodecBench(const CodecBenchOptions& options) {
  const NamespaceSpec ns = CodecNamespace();
  CAKE_ASSIGN_OR_RETURN(const Namespace parsed, Namespace::Create(ns));
  const uint64_t chunk_bytes = parsed.chunk_bytes();
  const uint32_t chunks = static_cast<uint32_t>((options.mib << 20) / chunk_bytes);
  if (chunks < 4) return absl::InvalidArgumentError("--mib must hold at least 4 chunks of 5.6 MiB (--mib 23)");
  const std::vector<std::string> tiers = absl::StrSplit(options.tiers, ',');
  for (const std::string& t : tiers) {
    if (t != "disk" && t != "remote") return absl::InvalidArgumentError("--tiers lists disk and/or remote");
  }
  CAKE_ASSIGN_OR_RETURN(const std::vector<std::byte> kv, PrefixBytes(options, uint64_t{chunks} * chunk_bytes));

  std::printf("cake-bench codec: %u chunks of %.2f MiB (%s), planes-zstd against raw\n", chunks,
              static_cast<double>(chunk_bytes) / (1 << 20),
              options.data.empty() ? "synthetic bf16 KV" : options.data.c_str());
  if (options.lossy) {
    JsonReport report;
    CAKE_RETURN_IF_ERROR(MeasureLossy(options, kv, chunk_bytes, report));
    return report.WriteTo(options.json_path);
  }
  CAKE_ASSIGN_OR_RETURN(const CodecSpeed speed, MeasureCodec(kv, chunk_bytes));
  std::printf("  codec alone, one core: ratio %.3f, encode %.2f GB/s, decode %.2f GB/s (raw bytes)\n", speed.ratio,
              speed.encode_gbps, speed.decode_gbps);
  std::fflush(stdout);
  JsonReport report;
  report.Set("chunk_bytes", static_cast<double>(chunk_bytes));
  report.Set("bytes", static_cast<double>(kv.size()));
  report.Set("ratio", speed.ratio);
  report.Set("encode_gbps_one_core", speed.encode_gbps);
  report.Set("decode_gbps_one_core", speed.decode_gbps);

  for (const std::string& tier : tiers) {
    std::optional<std::filesystem::path> root;
    std::optional<RedisServer> redis;
    absl::Cleanup remove_root = [&] {
      if (root) RemoveQuietly(*root);
    };
    std::vector<std::string> raw_args, codec_args;
    if (tier == "disk") {
      CAKE_ASSIGN_OR_RETURN(auto path, FreshPath(options.dir, "cake-codec"));
      root = path;
      std::filesystem::create_directories(path / "raw");
      std::filesystem::create_directories(path / "codec");
      raw_args = {"--disk-root", (path / "raw").string()};
      codec_args = {"--disk-root", (path / "codec").string(), "--disk-codec", "planes-zstd"};
    } else {
      CAKE_ASSIGN_OR_RETURN(auto started, RedisServer::Start());
      redis.emplace(std::move(started));
      raw_args = {"--remote", redis->address(), "--remote-key-prefix", "raw:"};
      codec_args = {"--remote", redis->address(), "--remote-key-prefix", "codec:", "--remote-codec", "planes-zstd"};
      if (options.remote_gbps > 0) {
        for (auto* args : {&raw_args, &codec_args}) {
          args->insert(args->end(), {"--remote-read-gbps", absl::StrCat(options.remote_gbps)});
        }
      }
    }
    CAKE_ASSIGN_OR_RETURN(const TierRun run, MeasureTier(tier, raw_args, codec_args, kv, chunk_bytes, options.runs));
    if (tier == "remote" && options.remote_gbps > 0)
      std::printf("  remote reads capped at %g Gbit/s\n", options.remote_gbps);
    std::printf(
        "  %s: median raw %.2f GB/s, planes-zstd %.2f GB/s; paired ratio median %.2f (min %.2f, max %.2f); stored "
        "%.3fx smaller; the daemon decoded at %.2f GB/s per I/O thread\n",
        tier.c_str(), Median(run.raw_gbps), Median(run.codec_gbps), Median(run.ratios),
        *std::min_element(run.ratios.begin(), run.ratios.end()), Max(run.ratios), run.stored_ratio,
        run.daemon_decode_gbps);
    std::fflush(stdout);
    report.Set(tier + "_raw_gbps", Median(run.raw_gbps));
    report.Set(tier + "_codec_gbps", Median(run.codec_gbps));
    report.Set(tier + "_paired_ratio", Median(run.ratios));
    report.Set(tier + "_stored_ratio", run.stored_ratio);
    report.Set(tier + "_daemon_decode_gbps", run.daemon_decode_gbps);
  }
  return report.WriteTo(options.json_path);
}

void AddCodecCommand(CLI::App& app) {
  auto options = std::make_shared<CodecBenchOptions>();
  CLI::App* command = app.add_subcommand(
      "codec", "the lossless codec's speed, then disk and remote loads of the same KV stored raw and encoded");
  command->add_option("--dir", options->dir, "folder for the disk tiers")->required();
  command->add_option("--data", options->data, "KV bytes to store, e.g. a real model's KV dump (default: synthetic)");
  command->add_option("--json", options->json_path, "also write the results to this file as one JSON object");
  command->add_option("--mib", options->mib, "prefix size, MiB")->capture_default_str();
  command->add_option("--runs", options->runs, "loads of each, alternating")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100u));
  command->add_option("--tiers", options->tiers, "disk, remote or both (comma-separated)")->capture_default_str();
  command->add_option("--remote-gbps", options->remote_gbps, "cap remote reads as a network link would, Gbit/s")
      ->capture_default_str();
  command->add_flag("--lossy", options->lossy,
                    "instead: disk loads of namespaces stored as INT8 and INT4 against EXACT, one daemon");
  command->add_option("--disk-gbps", options->disk_gbps, "with --lossy: cap the disk tier's reads, Gbit/s")
      ->capture_default_str();
  RunWhenParsed(command, options, RunCodecBench);
}

}  // namespace cake::bench
