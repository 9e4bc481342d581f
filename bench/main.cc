// cake-bench: the benchmarks, each driving a real caked (see bench/benchmarks.h); the demo is cake-demo
// (examples/demo).
#include <cstdio>

#include "CLI/CLI.hpp"
#include "bench/benchmarks.h"

namespace {

void AddCommonOptions(CLI::App* command, cake::bench::CommonOptions& common) {
  command->add_option("--socket", common.socket_path,
                      "unix socket of a running caked (default: start a private caked from next to cake-bench)");
  command->add_option("--json", common.json_path, "also write the results to this file as one JSON object");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cake-bench: benchmarks for caked"};
  app.set_version_flag("--version", std::string("cake-bench ") + CAKE_VERSION);
  app.require_subcommand(1);

  cake::bench::LookupBenchOptions lookup;
  CLI::App* lookup_command =
      app.add_subcommand("lookup", "Lookup latency of 16K- and 128K-token prompts beside a trivial unary call");
  AddCommonOptions(lookup_command, lookup.common);
  lookup_command->add_option("--iterations", lookup.iterations, "measured calls of each kind")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1000000u));

  cake::bench::RegionBenchOptions region;
  CLI::App* region_command =
      app.add_subcommand("region", "I/O-only load throughput from the DRAM tier into a region, beside memcpy");
  AddCommonOptions(region_command, region.common);
  region_command->add_option("--mib", region.mib, "bytes of prefix to load, in MiB (whole 32 MiB chunks)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{32}, uint64_t{1} << 20));
  region_command->add_option("--cuda-device", region.cuda_device,
                             "load into device memory on this CUDA device (against cudaMemcpy from pinned memory)");
  region_command->add_option("--runs", region.runs, "measured runs of each")
      ->capture_default_str()
      ->check(CLI::Range(1u, 10000u));

  cake::bench::ClientLoadBenchOptions client_load;
  CLI::App* client_load_command = app.add_subcommand(
      "client-load", "timed I/O-only loads by the C++ client of a stored fp32 prompt (for python3 -m cake.bench)");
  AddCommonOptions(client_load_command, client_load.common);
  client_load_command->add_option("--tokens-file", client_load.tokens_file, "the prompt, u32 little-endian")
      ->required();
  client_load_command->add_option("--model-id", client_load.model_id, "the namespace's model id")->required();
  client_load_command->add_option("--layers", client_load.layers, "namespace layers")->required();
  client_load_command->add_option("--kv-heads", client_load.kv_heads, "namespace KV heads")->required();
  client_load_command->add_option("--head-dim", client_load.head_dim, "namespace head dimension")->required();
  client_load_command->add_option("--chunk-tokens", client_load.chunk_tokens, "tokens per chunk")->required();
  client_load_command->add_option("--runs", client_load.runs, "measured loads (after one warm-up)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 10000u));

  cake::bench::EngineBenchOptions engine;
  CLI::App* engine_command = app.add_subcommand(
      "engine", "the CPU transformer against caked: compute-only, I/O-only, Cake and every forced split, bit-exact");
  AddCommonOptions(engine_command, engine.common);
  cake::engine::AddModelOptions(engine_command, engine.model);
  engine_command->add_option("--tokens", engine.tokens, "prompt lengths")->delimiter(',')->capture_default_str();
  engine_command
      ->add_option("--load-ratios", engine.load_ratios,
                   "read throttles, as load-everything time over compute-everything time")
      ->delimiter(',')
      ->capture_default_str();
  engine_command->add_option("--throttles", engine.throttles_gbps, "read throttles in Gbit/s (replace the ratios)")
      ->delimiter(',');
  engine_command->add_option("--sweep-step", engine.sweep_step, "forced meeting points every N chunks")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100000u));
  engine_command
      ->add_option("--disk-codec", engine.disk_codec,
                   "the private daemon's disk.codec (planes-zstd: stored "
                   "encoded; the throttle then caps encoded bytes)")
      ->capture_default_str();
  engine_command
      ->add_option("--stored-precision", engine.stored_precision,
                   "the engine's namespace stored as exact, int8 or int4 on disk (lossy: runs that load are held to "
                   "compute-only's first token, not every KV byte)")
      ->capture_default_str();

  cake::bench::EngineCurveOptions curve;
  CLI::App* curve_command = app.add_subcommand(
      "engine-curve", "the CPU transformer's measured compute time per chunk against chunk index, two model sizes");
  AddCommonOptions(curve_command, curve.common);
  cake::engine::AddModelOptions(curve_command, curve.small);
  cake::engine::AddModelOptions(curve_command, curve.large, "large-");
  curve_command->add_option("--tokens", curve.tokens, "prompt length")->capture_default_str();
  curve_command->add_option("--out", curve.out_prefix, "writes PREFIX.csv and PREFIX.png")->capture_default_str();

  cake::bench::IoBenchOptions io;
  CLI::App* io_command = app.add_subcommand(
      "io", "cold I/O-only loads from the disk tier (io_uring and pread) beside fio on the same folder");
  io_command->add_option("--dir", io.dir, "folder for the bench's data (on the disk to measure)")->required();
  io_command->add_option("--json", io.json_path, "also write the results to this file as one JSON object");
  io_command->add_option("--mib", io.mib, "bytes of prefix to load, in MiB (whole 32 MiB chunks)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{32}, uint64_t{1} << 20));
  io_command->add_option("--runs", io.runs, "measured runs of each (a fresh daemon per load)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100u));
  io_command->add_option("--window", io.window, "the load's window, chunks read at once (0: the daemon's default)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 64u));
  io_command->add_option("--daemon-window", io.daemon_window, "caked --window (0: caked's default)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 64u));
  io_command->add_option("--io-threads", io.io_threads, "caked --io-threads (0: caked's default)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 256u));
  io_command->add_option("--caked-config", io.caked_config, "caked --config FILE, e.g. for disk.queue_depth");
  io_command
      ->add_option("--pairs", io.pairs,
                   "then N pairs of (tier, fio on one file, fio on the tier's chunk files), the order reversing, and "
                   "N (fio, fio) pairs: the median paired ratio, its 95% interval, and the smallest gap the method "
                   "resolves")
      ->capture_default_str()
      ->check(CLI::Range(0u, 1000u));
  io_command
      ->add_option("--settle-ms", io.settle_ms,
                   "the pairs' pause before each timed read, after the page cache is dropped")
      ->capture_default_str()
      ->check(CLI::Range(0u, 600000u));
  io_command->add_flag("!--fio-alone", io.fio_like_region,
                       "the pairs' fio reads without the fresh memory of the load's size a tier load has (its region)");
  io_command->add_flag("--pairs-in-process", io.pairs_in_process,
                       "the pairs' tier side is DiskTier::Read in this process (--inprocess-threads), not a daemon");
  io_command
      ->add_option(
          "--load-dram-mib", io.load_dram_mib,
          "DRAM tier of the loading daemons, MiB; loads are promoted only when the prefix is at most half of it")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20));
  io_command
      ->add_option("--inprocess-threads", io.inprocess_threads,
                   "threads of the in-process DiskTier::Read comparison (no daemon)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));

  cake::bench::RebuildBenchOptions rebuild;
  CLI::App* rebuild_command = app.add_subcommand(
      "rebuild", "start-up index rebuild over many chunk files (DiskTier::Open and caked), cold page cache");
  rebuild_command->add_option("--dir", rebuild.dir, "folder for the bench's files")->required();
  rebuild_command->add_option("--json", rebuild.json_path, "also write the results to this file as one JSON object");
  rebuild_command->add_option("--files", rebuild.files, "chunk files to create")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{10000000}));
  rebuild_command->add_option("--runs", rebuild.runs, "measured opens of each kind")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100u));
  rebuild_command->add_option("--writers", rebuild.writers, "threads creating the files")
      ->capture_default_str()
      ->check(CLI::Range(1u, 256u));
  rebuild_command
      ->add_option("--recovery-threads", rebuild.recovery_threads,
                   "header readers of the in-process opens after a crash (caked keeps its default)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1024u));

  cake::bench::StoreBenchOptions store;
  CLI::App* store_command = app.add_subcommand(
      "store", "Store throughput until write-back has every chunk on disk, beside fio's direct write");
  store_command->add_option("--dir", store.dir, "folder for the bench's data (on the disk to measure)")->required();
  store_command->add_option("--json", store.json_path, "also write the results to this file as one JSON object");
  store_command->add_option("--mib", store.mib, "bytes to store, in MiB (whole 32 MiB chunks)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{32}, uint64_t{1} << 20));
  store_command->add_option("--runs", store.runs, "measured runs of each")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100u));
  store_command
      ->add_option("--write-back-threads", store.write_back_threads,
                   "caked's writeback.threads, the in-process writer threads and fio's synced jobs")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  store_command->add_flag("--dram-prefault", store.dram_prefault,
                          "start caked with dram.prefault, so first touches of the DRAM tier are not timed");

  cake::bench::GridOptions grid;
  CLI::App* grid_command = app.add_subcommand(
      "grid", "the paper's grid: compute-only, I/O-only, Cake and the oracle per bandwidth and utilisation");
  AddCommonOptions(grid_command, grid.common);
  grid_command->add_option("--model", grid.models, "longalpaca-7b, longalpaca-13b, llama3.1-8b, llama3.1-70b")
      ->delimiter(',')
      ->capture_default_str();
  grid_command->add_option("--tokens", grid.tokens, "prompt lengths, multiples of the I/O chunk")
      ->delimiter(',')
      ->capture_default_str();
  grid_command->add_option("--bits", grid.bits, "KV bits per value (16, 8, 3: compression)")
      ->delimiter(',')
      ->capture_default_str();
  grid_command->add_option("--bandwidths", grid.bandwidths, "storage bandwidths, Gbit/s")
      ->delimiter(',')
      ->capture_default_str();
  grid_command->add_option("--utils", grid.utils, "shares of the step budget the request gets")
      ->delimiter(',')
      ->capture_default_str();
  grid_command->add_option("--gpu-tflops", grid.gpu_tflops, "effective prefill TFLOP/s of the GPU (F)")
      ->capture_default_str();
  grid_command->add_option("--time-scale", grid.time_scale, "divide every duration by this")->capture_default_str();
  grid_command->add_option("--chunk-tokens", grid.chunk_tokens, "I/O chunk, tokens")
      ->capture_default_str()
      ->check(CLI::Range(16u, 4096u));
  grid_command->add_option("--step-tokens", grid.step_tokens, "engine step budget, tokens")
      ->capture_default_str()
      ->check(CLI::Range(16u, 65536u));
  grid_command->add_option("--repeats", grid.repeats, "I/O-only and Cake runs per cell, the median reported")
      ->capture_default_str()
      ->check(CLI::Range(1u, 99u));

  cake::bench::OverheadOptions overhead;
  CLI::App* overhead_command =
      app.add_subcommand("overhead", "the daemon's CPU time per loaded chunk, over many loads of small chunks");
  AddCommonOptions(overhead_command, overhead.common);
  overhead_command->add_option("--loads", overhead.loads, "measured loads")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100000u));
  overhead_command->add_option("--chunks", overhead.chunks, "chunks of 16 KiB per load")
      ->capture_default_str()
      ->check(CLI::Range(1u, 65536u));

  cake::bench::ConcurrentOptions concurrent;
  CLI::App* concurrent_command = app.add_subcommand(
      "concurrent", "many cached requests at once on one simulated disk: mean and p99 TTFT per arbiter policy");
  AddCommonOptions(concurrent_command, concurrent.common);
  concurrent_command->add_option("--policies", concurrent.policies, "arbiter policies to compare (srf, fifo, fair)")
      ->delimiter(',')
      ->capture_default_str();
  concurrent_command->add_option("--requests", concurrent.requests, "requests arriving at once")
      ->capture_default_str()
      ->check(CLI::Range(1u, 256u));
  concurrent_command->add_option("--min-tokens", concurrent.min_tokens, "shortest prompt")->capture_default_str();
  concurrent_command->add_option("--max-tokens", concurrent.max_tokens, "longest prompt")->capture_default_str();
  concurrent_command->add_option("--model", concurrent.model, "KV size per token of this model")->capture_default_str();
  concurrent_command->add_option("--bandwidth", concurrent.bandwidth_gbps, "the disk's Gbit/s")->capture_default_str();
  concurrent_command->add_option("--time-scale", concurrent.time_scale, "divide every duration by this")
      ->capture_default_str();
  concurrent_command->add_option("--window", concurrent.window, "caked --window")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));

  cake::bench::FluctuateOptions fluctuate;
  CLI::App* fluctuate_command = app.add_subcommand(
      "fluctuate", "one Cake load while the engine's budget and the disk's bandwidth change: both cursors over time");
  AddCommonOptions(fluctuate_command, fluctuate.common);
  fluctuate_command->add_option("--model", fluctuate.model, "KV size and cost model")->capture_default_str();
  fluctuate_command->add_option("--tokens", fluctuate.tokens, "prompt length, a multiple of 128")
      ->capture_default_str();
  fluctuate_command->add_option("--max-budget", fluctuate.max_budget, "most tokens per step for the request")
      ->capture_default_str()
      ->check(CLI::Range(1u, 512u));
  fluctuate_command->add_option("--max-gbps", fluctuate.max_gbps, "highest bandwidth drawn")->capture_default_str();
  fluctuate_command->add_option("--interval-ms", fluctuate.interval_ms, "time between bandwidth changes")
      ->capture_default_str();
  fluctuate_command->add_option("--gpu-tflops", fluctuate.gpu_tflops, "F; 0 balances compute and load on average")
      ->capture_default_str();
  fluctuate_command->add_option("--time-scale", fluctuate.time_scale, "divide every duration by this")
      ->capture_default_str();
  fluctuate_command->add_option("--seed", fluctuate.seed, "random draws")->capture_default_str();
  fluctuate_command->add_option("--out", fluctuate.out_prefix, "writes PREFIX.csv and PREFIX.png")
      ->capture_default_str();

  cake::bench::AdaptiveOptions adaptive;
  CLI::App* adaptive_command = app.add_subcommand(
      "adaptive", "a long cached request and a burst of short ones: first come first served against adaptive order");
  AddCommonOptions(adaptive_command, adaptive.common);
  adaptive_command->add_option("--model", adaptive.model, "cost model and KV size")->capture_default_str();
  adaptive_command->add_option("--cached-tokens", adaptive.cached_tokens, "the cached request's prompt")
      ->capture_default_str();
  adaptive_command->add_option("--short-requests", adaptive.short_requests, "uncached requests of 32 to 448 tokens")
      ->capture_default_str()
      ->check(CLI::Range(0u, 1000u));
  adaptive_command->add_option("--step-tokens", adaptive.step_tokens, "engine step budget")
      ->capture_default_str()
      ->check(CLI::Range(16u, 65536u));
  adaptive_command->add_option("--bandwidth", adaptive.bandwidth_gbps, "the disk's Gbit/s")->capture_default_str();
  adaptive_command->add_option("--gpu-tflops", adaptive.gpu_tflops, "F")->capture_default_str();
  adaptive_command->add_option("--time-scale", adaptive.time_scale, "divide every duration by this")
      ->capture_default_str();

  cake::bench::QueueBenchOptions queue;
  CLI::App* queue_command = app.add_subcommand(
      "queue", "requests queued before one engine, prompts on disk only: TTFT with and without prefetch");
  queue_command->add_option("--dir", queue.dir, "folder for the disk tier")->required();
  queue_command->add_option("--json", queue.json_path, "also write the results to this file as one JSON object");
  queue_command->add_option("--requests", queue.requests, "requests per round and mode")->capture_default_str();
  queue_command->add_option("--prompt-mib", queue.prompt_mib, "each request's prompt, MiB of KV")
      ->capture_default_str();
  queue_command->add_option("--arrival-ms", queue.arrival_ms, "mean gap between arrivals, ms")->capture_default_str();
  queue_command->add_option("--compute-us", queue.compute_us_per_chunk, "the engine's time per computed chunk, us")
      ->capture_default_str();
  queue_command->add_option("--decode-ms", queue.decode_ms, "the engine's time per request after its prefill, ms")
      ->capture_default_str();
  queue_command
      ->add_option("--tier", queue.tier, "where the prompts are cached: disk, or remote (a private redis-server)")
      ->capture_default_str()
      ->check(CLI::IsMember({"disk", "remote"}));
  queue_command->add_option("--disk-gbps", queue.disk_gbps, "cap the disk tier's reads, Gbit/s (0: none)")
      ->capture_default_str();
  queue_command->add_option("--rounds", queue.rounds, "rounds of each mode, alternating")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100u));
  queue_command->add_option("--seed", queue.seed, "arrival times")->capture_default_str();
  cake::bench::TiersOptions tiers;
  CLI::App* tiers_command = app.add_subcommand(
      "tiers", "one prefix from DRAM alone, disk alone and half from each, both tiers capped at the same bandwidth");
  tiers_command->add_option("--dir", tiers.dir, "folder for the disk tier")->required();
  tiers_command->add_option("--json", tiers.json_path, "also write the results to this file as one JSON object");
  tiers_command->add_option("--mib", tiers.mib, "prefix size, MiB")->capture_default_str();
  tiers_command->add_option("--gbps", tiers.gbps, "each tier's read cap, Gbit/s")->capture_default_str();
  tiers_command->add_option("--runs", tiers.runs, "runs of each")->capture_default_str()->check(CLI::Range(1u, 100u));

  cake::bench::CodecBenchOptions codec;
  CLI::App* codec_command = app.add_subcommand(
      "codec", "the lossless codec's speed, then disk and remote loads of the same KV stored raw and encoded");
  codec_command->add_option("--dir", codec.dir, "folder for the disk tiers")->required();
  codec_command->add_option("--data", codec.data,
                            "KV bytes to store, e.g. a real model's KV dump (default: synthetic)");
  codec_command->add_option("--json", codec.json_path, "also write the results to this file as one JSON object");
  codec_command->add_option("--mib", codec.mib, "prefix size, MiB")->capture_default_str();
  codec_command->add_option("--runs", codec.runs, "loads of each, alternating")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100u));
  codec_command->add_option("--tiers", codec.tiers, "disk, remote or both (comma-separated)")->capture_default_str();
  codec_command->add_option("--remote-gbps", codec.remote_gbps, "cap remote reads as a network link would, Gbit/s")
      ->capture_default_str();
  codec_command->add_flag("--lossy", codec.lossy,
                          "instead: disk loads of namespaces stored as INT8 and INT4 against EXACT, one daemon");
  codec_command->add_option("--disk-gbps", codec.disk_gbps, "with --lossy: cap the disk tier's reads, Gbit/s")
      ->capture_default_str();

  cake::bench::RemoteBenchOptions remote;
  CLI::App* remote_command = app.add_subcommand(
      "remote", "loads from the remote tier (Redis) beside redis-benchmark GETs of the same part size");
  remote_command->add_option("--redis", remote.redis, "host:port of a running Redis (default: a private redis-server)");
  remote_command->add_option("--json", remote.json_path, "also write the results to this file as one JSON object");
  remote_command->add_option("--mib", remote.mib, "prefix size, MiB")->capture_default_str();
  remote_command->add_option("--chunk-mib", remote.chunk_mib, "chunk size, MiB")->capture_default_str();
  remote_command->add_option("--part-kib", remote.part_kib, "Redis value (part) size, KiB")->capture_default_str();
  remote_command->add_option("--window", remote.window, "reads in flight = redis-benchmark connections")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  remote_command->add_option("--runs", remote.runs, "runs of each")->capture_default_str()->check(CLI::Range(1u, 100u));
  remote_command
      ->add_option("--cluster", remote.cluster_masters,
                   "read from a private Redis Cluster of this many masters (redis-benchmark --cluster with "
                   "--window connections)")
      ->check(CLI::Range(3u, 16u));
  remote_command
      ->add_option("--read-threads", remote.read_threads,
                   "caked --remote-read-threads: chunks read from Redis at once (0: caked's default)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 64u));

  cake::bench::MixedOptions mixed;
  CLI::App* mixed_command = app.add_subcommand(
      "mixed", "Cake with a prefix spread over DRAM, disk and Redis at once, against each tier alone");
  mixed_command->add_option("--dir", mixed.dir, "folder for the disk tier")->required();
  mixed_command->add_option("--json", mixed.json_path, "also write the results to this file as one JSON object");
  mixed_command->add_option("--model", mixed.model, "llama3.1-8b, llama3.1-70b, longalpaca-7b, longalpaca-13b")
      ->capture_default_str();
  mixed_command->add_option("--tokens", mixed.tokens, "prompt length")->capture_default_str();
  mixed_command->add_option("--util", mixed.util, "the request's share of each step's budget")->capture_default_str();
  mixed_command->add_option("--gpu-tflops", mixed.gpu_tflops, "effective prefill TFLOP/s")->capture_default_str();
  mixed_command->add_option("--dram-gbps", mixed.dram_gbps, "modelled DRAM-tier bandwidth")->capture_default_str();
  mixed_command->add_option("--disk-gbps", mixed.disk_gbps, "modelled disk-tier bandwidth")->capture_default_str();
  mixed_command->add_option("--remote-gbps", mixed.remote_gbps, "modelled remote-tier bandwidths, one row each")
      ->delimiter(',')
      ->capture_default_str();
  mixed_command->add_option("--dram-share", mixed.dram_share, "share of the prefix (its start) in DRAM")
      ->capture_default_str();
  mixed_command->add_option("--disk-share", mixed.disk_share, "share of the prefix (next) on disk")
      ->capture_default_str();
  mixed_command->add_option("--time-scale", mixed.time_scale, "every duration divided by this")->capture_default_str();

  cake::bench::SoakOptions soak;
  CLI::App* soak_command = app.add_subcommand(
      "soak", "fault and soak: many engines mixing every call, corrupt chunks, a paused Redis; checks every byte");
  AddCommonOptions(soak_command, soak.common);
  soak_command->add_option("--engines", soak.engines, "engines (threads, each its own client)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 256u));
  soak_command->add_option("--seconds", soak.seconds, "length of the soak (600 is the documented run)")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 86400.0));
  soak_command->add_option("--warmup-seconds", soak.warmup_seconds,
                           "seconds before RSS and TTFT are counted (default: a fifth of --seconds, at most 60)");
  soak_command
      ->add_option("--read-error-rate", soak.read_error_rate,
                   "share of the chunk reads from disk or Redis that find the chunk corrupted")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  soak_command
      ->add_option("--dead-remote-runs", soak.dead_remote_runs,
                   "timed loads per Redis state (frozen, killed) in the dead-remote phase")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1000u));
  soak_command
      ->add_option("--region-lease-ms", soak.region_lease_ms,
                   "limits.region_lease_ms of the bench's caked (killed clients' regions go after it); fail on regions "
                   "held at the end; 0: the daemon's default, unchecked")
      ->capture_default_str();
  soak_command
      ->add_option("--idle-connections", soak.idle_connections,
                   "raw unix-socket connections that send nothing, held for the whole run")
      ->capture_default_str()
      ->check(CLI::Range(0u, 4096u));
  soak_command
      ->add_option("--churn-per-second", soak.churn_per_second,
                   "new connections a second while the engines run: half a gRPC channel with one Ping, half a raw "
                   "connect closed at once; 0: none")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1000.0));
  soak_command->add_option("--seed", soak.seed, "the engines' random draws")->capture_default_str();

  cake::bench::ScaleOptions scale;
  CLI::App* scale_command = app.add_subcommand(
      "scale", "how costs grow: calls and loads with more clients, index memory and start-up with more chunks");
  scale_command->add_option("--json", scale.json_path, "also write the results to this file as one JSON object");
  scale_command->add_option("--dir", scale.dir, "folder for the disk tier's chunk files")->capture_default_str();
  scale_command->add_option("--parts", scale.parts, "calls, loads, dram, disk (comma-separated)")
      ->delimiter(',')
      ->capture_default_str();
  scale_command->add_option("--clients", scale.clients, "clients calling at once, one point each")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(1u, 4096u));
  scale_command->add_option("--loads", scale.loads, "loads at once, one point each")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(1u, 4096u));
  scale_command->add_option("--sizes", scale.sizes, "stored chunks, one point each per tier")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 32));
  scale_command->add_option("--seconds", scale.seconds, "each measured phase of calls")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 600.0));
  scale_command->add_option("--rounds", scale.rounds, "Ping and Lookup phases per point, alternating")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100u));
  scale_command->add_option("--load-chunks", scale.load_chunks, "4 KiB chunks per load")
      ->capture_default_str()
      ->check(CLI::Range(1u, 8192u));
  scale_command->add_option("--max-disk-chunks", scale.max_disk_chunks, "larger disk sizes are left out (time)")
      ->capture_default_str();

  cake::bench::FleetOptions fleet;
  CLI::App* fleet_command = app.add_subcommand(
      "fleet",
      "daemons sharing a Redis Cluster under multi-turn sessions routed at random, against daemons alone; "
      "then a master failed over and another killed: errors, wrong bytes, hit rate over time");
  fleet_command->add_option("--dir", fleet.dir, "folder for the daemons' disk tiers")->required();
  fleet_command->add_option("--json", fleet.json_path, "also write the results to this file as one JSON object");
  fleet_command->add_option("--daemons", fleet.daemons, "daemons in the fleet")
      ->capture_default_str()
      ->check(CLI::Range(1u, 16u));
  fleet_command->add_option("--workers", fleet.workers, "engine threads")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  fleet_command->add_option("--sessions", fleet.sessions, "sessions in each of the shared and local phases")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100000u));
  fleet_command->add_option("--turns", fleet.turns, "turns a session")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100u));
  fleet_command->add_option("--first-tokens", fleet.first_tokens, "the first turn's prompt")->capture_default_str();
  fleet_command->add_option("--turn-tokens", fleet.turn_tokens, "tokens each later turn adds")->capture_default_str();
  fleet_command->add_option("--chunk-tokens", fleet.chunk_tokens, "tokens a chunk (1 KiB each)")->capture_default_str();
  fleet_command->add_option("--think-ms", fleet.think_ms, "at least this between a session's turns")
      ->capture_default_str();
  fleet_command
      ->add_option("--compute-ms-per-chunk", fleet.compute_ms_per_chunk,
                   "simulated compute of a missed chunk, added to the measured Lookup + load time for the TTFT")
      ->capture_default_str();
  fleet_command->add_option("--dram-mib", fleet.dram_mib, "each daemon's DRAM tier")->capture_default_str();
  fleet_command->add_option("--disk-mib", fleet.disk_mib, "each daemon's disk tier")->capture_default_str();
  fleet_command->add_option("--failover-seconds", fleet.failover_seconds, "length of the failover phase")
      ->capture_default_str();
  fleet_command
      ->add_option("--manual-failover-at", fleet.manual_failover_at_s,
                   "when master 0 is failed over by hand (then killed), s into the phase")
      ->capture_default_str();
  fleet_command->add_option("--kill-at", fleet.kill_at_s, "when master 1 is killed, s into the phase")
      ->capture_default_str();
  fleet_command->add_option("--window-seconds", fleet.window_s, "the hit rate's windows")->capture_default_str();

  CLI11_PARSE(app, argc, argv);

  absl::Status status;
  if (lookup_command->parsed()) {
    status = cake::bench::RunLookupBench(lookup);
  } else if (fleet_command->parsed()) {
    status = cake::bench::RunFleetBench(fleet);
  } else if (scale_command->parsed()) {
    status = cake::bench::RunScaleBench(scale);
  } else if (soak_command->parsed()) {
    status = cake::bench::RunSoakBench(soak);
  } else if (client_load_command->parsed()) {
    status = cake::bench::RunClientLoadBench(client_load);
  } else if (region_command->parsed()) {
    status = cake::bench::RunRegionBench(region);
  } else if (io_command->parsed()) {
    status = cake::bench::RunIoBench(io);
  } else if (rebuild_command->parsed()) {
    status = cake::bench::RunRebuildBench(rebuild);
  } else if (store_command->parsed()) {
    status = cake::bench::RunStoreBench(store);
  } else if (mixed_command->parsed()) {
    status = cake::bench::RunMixedBench(mixed);
  } else if (remote_command->parsed()) {
    status = cake::bench::RunRemoteBench(remote);
  } else if (codec_command->parsed()) {
    status = cake::bench::RunCodecBench(codec);
  } else if (queue_command->parsed()) {
    status = cake::bench::RunQueueBench(queue);
  } else if (tiers_command->parsed()) {
    status = cake::bench::RunTiersBench(tiers);
  } else if (adaptive_command->parsed()) {
    status = cake::bench::RunAdaptiveBench(adaptive);
  } else if (fluctuate_command->parsed()) {
    status = cake::bench::RunFluctuateBench(fluctuate);
  } else if (concurrent_command->parsed()) {
    status = cake::bench::RunConcurrentBench(concurrent);
  } else if (overhead_command->parsed()) {
    status = cake::bench::RunOverheadBench(overhead);
  } else if (engine_command->parsed()) {
    status = cake::bench::RunEngineBench(engine);
  } else if (curve_command->parsed()) {
    status = cake::bench::RunEngineCurveBench(curve);
  } else {
    status = cake::bench::RunGridBench(grid);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "cake-bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
