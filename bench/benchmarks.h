// The cake-bench subcommands. Each drives a real caked (the one at --socket, or a private one it starts), prints
// a readable summary and, with --json, writes its figures as one JSON object. Each is its options, its Run...Bench,
// and its Add...Command, which adds the subcommand, its flags and its run to cake-bench (bench/bench_command.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "examples/cpu_engine/engine_harness.h"

namespace CLI {
class App;
}  // namespace CLI

namespace cake::bench {

struct CommonOptions {
  std::string socket_path;  // empty: start a private caked
  std::string json_path;    // empty: no JSON file
};

// Lookup latency for 16K- and 128K-token prompts beside a trivial unary call on the same channel.
struct LookupBenchOptions {
  CommonOptions common;
  uint32_t iterations = 1000;
};
absl::Status RunLookupBench(const LookupBenchOptions& options);
void AddLookupCommand(CLI::App& app);  // cake-bench lookup

// Throughput of I/O-only loads from the DRAM tier into a host region, beside memcpy of the same bytes.
struct RegionBenchOptions {
  CommonOptions common;
  uint64_t mib = 256;
  uint32_t runs = 10;
  std::optional<int> cuda_device;  // a CUDA device region instead of a host one
};
absl::Status RunRegionBench(const RegionBenchOptions& options);
void AddRegionCommand(CLI::App& app);  // cake-bench region

// Timed I/O-only loads by the C++ client of a prompt (u32 tokens in a file) stored in an fp32 namespace, for
// the Python client's bench to compare against on the same daemon.
struct ClientLoadBenchOptions {
  CommonOptions common;
  std::string tokens_file;
  std::string model_id;
  uint32_t layers = 1, kv_heads = 1, head_dim = 1, chunk_tokens = 256;
  uint32_t runs = 5;
};
absl::Status RunClientLoadBench(const ClientLoadBenchOptions& options);
void AddClientLoadCommand(CLI::App& app);  // cake-bench client-load

// A larger CPU transformer (examples/cpu_engine) with grouped-query attention, for the compute curve.
inline engine::ModelOptions LargeEngineModel() {
  engine::ModelOptions m;
  m.shape.hidden = 1024;
  m.shape.heads = 16;
  m.shape.kv_heads = 4;
  m.shape.intermediate = 2816;
  return m;
}

// Real compute against a real caked: compute-only, I/O-only, Cake and every forced split per prompt length and
// read throttle, with the assembled KV cache checked against full compute's byte for byte.
struct EngineBenchOptions {
  CommonOptions common;
  engine::ModelOptions model;
  std::vector<uint32_t> tokens = {1024, 2048};
  // Throttles as the time to load the whole prompt over the time to compute it (so both sides matter whatever
  // this machine's speed); explicit --throttles (Gbit/s) replace them.
  std::vector<double> load_ratios = {0.5, 1, 2};
  std::vector<double> throttles_gbps;
  uint32_t sweep_step = 1;          // forced meeting points every this many chunks
  std::string disk_codec = "none";  // the private daemon's disk.codec
  // The engine's namespace's stored_precision: exact, int8 or int4 (lossy: loaded runs are held to the first
  // token, not every KV byte).
  std::string stored_precision = "exact";
};
absl::Status RunEngineBench(const EngineBenchOptions& options);
void AddEngineCommand(CLI::App& app);  // cake-bench engine

// The measured per-chunk compute curve (the paper's Figure 4) of two model sizes, and its linear fit.
struct EngineCurveOptions {
  CommonOptions common;
  engine::ModelOptions small;
  engine::ModelOptions large = LargeEngineModel();
  uint32_t tokens = 4096;
  std::string out_prefix = "engine-curve";  // writes <prefix>.csv and, with gnuplot, <prefix>.png
};
absl::Status RunEngineCurveBench(const EngineCurveOptions& options);
void AddEngineCurveCommand(CLI::App& app);  // cake-bench engine-curve

// Cold loads of a cached prefix from the disk tier (io_uring, then pread) into a region, beside fio reading a
// file of the same size in the same folder, in the same run.
struct IoBenchOptions {
  std::string dir;        // the bench's data goes in <dir>/cake and <dir>/fio.dat, removed afterwards
  std::string json_path;  // empty: no JSON file
  uint64_t mib = 2048;
  uint32_t runs = 3;
  uint32_t window = 0;             // the load's window (LoadOptions.window); 0: the daemon's default
  uint32_t daemon_window = 0;      // caked --window; 0: caked's default
  uint32_t io_threads = 0;         // caked --io-threads; 0: caked's default
  std::string caked_config;        // caked --config, for settings without a flag (e.g. disk.queue_depth)
  uint32_t inprocess_threads = 4;  // threads of the in-process DiskTier::Read comparison
  uint64_t load_dram_mib = 64;     // DRAM tier of the loading daemons (caked --dram-capacity-mib)
  // After the runs: this many pairs of (io_uring load, fio read), the order alternating, and as many pairs of
  // (fio read, fio read): the median of the per-pair ratios, its bootstrap 95% interval, and the fio-against-fio
  // interval, which is the smallest gap the method can see on this disk. 0: none.
  uint32_t pairs = 0;
  uint32_t settle_ms = 0;  // a pause before each of the pairs' timed reads, after the page cache is dropped
  // The pairs' fio reads run while the bench holds fresh, touched shared memory of the load's size, as a load has
  // its region (false: fio alone, as before 2026-12-04).
  bool fio_like_region = true;
  // The pairs' tier side is DiskTier::Read in the bench's process (inprocess_threads threads), not a daemon's load.
  bool pairs_in_process = false;
};
absl::Status RunIoBench(const IoBenchOptions& options);
void AddIoCommand(CLI::App& app);  // cake-bench io

// Start-up index rebuild over many small chunk files: DiskTier::Open and caked's start-up, cold page cache.
struct RebuildBenchOptions {
  std::string dir;  // the files go in <dir>/cake-rebuild, removed afterwards
  std::string json_path;
  uint64_t files = 100000;
  uint32_t runs = 3;
  uint32_t writers = 16;           // threads creating the files
  uint32_t recovery_threads = 32;  // DiskTier::Options::recovery_threads of the in-process opens
};
absl::Status RunRebuildBench(const RebuildBenchOptions& options);
void AddRebuildCommand(CLI::App& app);  // cake-bench rebuild

// Store throughput until write-back has put every chunk on disk, beside fio's direct write in the same run.
struct StoreBenchOptions {
  std::string dir;  // <dir>/cake-store and <dir>/fio-write.dat, removed afterwards
  std::string json_path;
  uint64_t mib = 1024;
  uint32_t runs = 3;
  uint32_t write_back_threads = 4;  // caked's writeback.threads, and the in-process writers
  bool dram_prefault = false;       // caked's dram.prefault: the Store's copies land in memory touched at start-up
};
absl::Status RunStoreBench(const StoreBenchOptions& options);
void AddStoreCommand(CLI::App& app);  // cake-bench store

// The paper's evaluation grid on the simulated engine and storage: compute-only, I/O-only, Cake and the oracle
// split per cell (model x prompt length x KV bits x bandwidth x utilisation), speedup tables and JSON rows.
struct GridOptions {
  CommonOptions common;
  std::vector<std::string> models = {"llama3.1-8b"};
  std::vector<uint32_t> tokens = {16384};
  std::vector<uint32_t> bits = {16};  // KV compression: 16, 8 or 3 bits per value means fewer bytes to load
  std::vector<double> bandwidths = {7, 25, 32, 56, 100};
  std::vector<double> utils = {0.125, 0.5, 0.875, 1};
  double gpu_tflops = 100;  // F, the effective prefill throughput of the whole GPU
  double time_scale = 10;   // every duration divided by this
  uint32_t chunk_tokens = 128;
  uint32_t step_tokens = 512;
  // I/O-only and Cake runs per cell (alternating), the median reported: loads of tens of milliseconds move by a
  // few milliseconds with one late wake-up on a shared machine. Compute-only is sleep-paced and runs once.
  uint32_t repeats = 3;
};
absl::Status RunGridBench(const GridOptions& options);
void AddGridCommand(CLI::App& app);  // cake-bench grid

// The daemon's CPU time per loaded chunk (scheduling, messages), over many I/O-only loads of small chunks.
struct OverheadOptions {
  CommonOptions common;
  uint32_t loads = 20;
  uint32_t chunks = 1024;
};
absl::Status RunOverheadBench(const OverheadOptions& options);
void AddOverheadCommand(CLI::App& app);  // cake-bench overhead

// Many cached requests at once on one simulated disk: mean and p99 time to first token per arbiter policy.
struct ConcurrentOptions {
  CommonOptions common;
  std::vector<std::string> policies = {"fifo", "fair", "srf"};
  uint32_t requests = 16;
  uint32_t min_tokens = 512;
  uint32_t max_tokens = 16384;
  std::string model = "llama3.1-8b";
  double bandwidth_gbps = 25;
  double time_scale = 4;
  uint32_t window = 4;
};
absl::Status RunConcurrentBench(const ConcurrentOptions& options);
void AddConcurrentCommand(CLI::App& app);  // cake-bench concurrent

// One Cake load while the engine's budget and the disk's bandwidth change under it: both cursors over time.
struct FluctuateOptions {
  CommonOptions common;
  std::string model = "llama3.1-8b";
  uint32_t tokens = 16384;
  uint32_t max_budget = 512;  // tokens of a 512-token step the request may get
  double max_gbps = 25;
  double interval_ms = 100;  // modelled time between bandwidth changes
  double gpu_tflops = 0;     // 0: balanced on average
  double time_scale = 1;
  uint32_t seed = 1;
  std::string out_prefix = "fluctuate";  // writes <prefix>.csv and, with gnuplot, <prefix>.png
};
absl::Status RunFluctuateBench(const FluctuateOptions& options);
void AddFluctuateCommand(CLI::App& app);  // cake-bench fluctuate

// One long cached request and a burst of short uncached ones on one engine: first come first served against the
// adaptive order (uncached prefills first, the Cake request with what is left of each step's budget).
struct AdaptiveOptions {
  CommonOptions common;
  std::string model = "llama3.1-8b";
  uint32_t cached_tokens = 16384;
  uint32_t short_requests = 22;
  uint32_t step_tokens = 512;
  double bandwidth_gbps = 25;
  double gpu_tflops = 100;
  double time_scale = 1;
};
absl::Status RunAdaptiveBench(const AdaptiveOptions& options);
void AddAdaptiveCommand(CLI::App& app);  // cake-bench adaptive

// One prefix loaded from DRAM alone, disk alone and half from each, both tiers capped at the same bandwidth.
struct TiersOptions {
  std::string dir;  // the disk tier goes in <dir>/cake-tiers, removed afterwards
  std::string json_path;
  uint64_t mib = 256;
  double gbps = 7;
  uint32_t runs = 3;
};
absl::Status RunTiersBench(const TiersOptions& options);
void AddTiersCommand(CLI::App& app);  // cake-bench tiers

// Requests queued before one engine, each with its prompt on disk only, served with and without prefetch
// (LookupRequest.prefetch when a request arrives), alternating in one run; TTFT from arrival.
struct QueueBenchOptions {
  std::string dir;  // the disk tier goes in <dir>/cake-queue, removed afterwards
  std::string json_path;
  uint32_t requests = 24;
  uint64_t prompt_mib = 32;
  double arrival_ms = 120;  // mean gap between arrivals (Poisson)
  uint32_t compute_us_per_chunk = 4000;
  uint32_t decode_ms = 150;   // per request, after its prefill: the engine busy, the disk idle
  std::string tier = "disk";  // where the prompts are cached: "disk", or "remote" (a private redis-server)
  double disk_gbps = 0;       // the disk tier's read cap; 0: none
  uint32_t rounds = 2;
  uint32_t seed = 1;
};
absl::Status RunQueueBench(const QueueBenchOptions& options);
void AddQueueCommand(CLI::App& app);  // cake-bench queue

// The lossless chunk codec (disk.codec, remote.codec): its encode and decode speed on one core, then I/O-only loads
// of the same KV from a disk tier and a remote tier (a private redis-server) stored raw and encoded, alternating in
// one run; throughput is raw bytes delivered per second.
struct CodecBenchOptions {
  std::string dir;   // the disk tiers go in <dir>/cake-codec, removed afterwards
  std::string data;  // KV bytes to store (a dump of a real model's KV); empty: synthetic bf16 KV
  std::string json_path;
  uint64_t mib = 256;
  uint32_t runs = 5;
  std::string tiers = "disk,remote";
  // Caps the remote tier's reads (both daemons'), as a network link between the daemon and Redis would: loopback
  // Redis on a small machine is bound by CPU, not by a link. The cap counts the bytes Redis sends (encoded). 0: none.
  double remote_gbps = 0;
  // Instead: the lossy precisions (Namespace.stored_precision) against exact, on one daemon's disk tier capped at
  // disk_gbps (0: the disk's own speed).
  bool lossy = false;
  double disk_gbps = 0;
};
absl::Status RunCodecBench(const CodecBenchOptions& options);
void AddCodecCommand(CLI::App& app);  // cake-bench codec

// I/O-only loads of a prefix from the remote tier (Redis) beside redis-benchmark GETs of the same part size,
// connections and pipeline depth, against the same server in the same run.
struct RemoteBenchOptions {
  std::string redis;  // host:port of a running Redis; empty: a private redis-server on loopback
  std::string json_path;
  uint64_t mib = 256;
  uint64_t chunk_mib = 16;  // Llama-3.1-8B's 128-token chunk at 16-bit KV
  uint64_t part_kib = 4096;
  uint32_t window = 4;  // reads in flight (caked --window and --io-threads) = redis-benchmark connections
  uint32_t runs = 5;
  // Masters of a private Redis Cluster to read from instead of one server (0: one server); redis-benchmark then
  // runs in its --cluster mode, its `window` connections dealt out over the masters in turn.
  uint32_t cluster_masters = 0;
  uint32_t read_threads = 0;  // caked --remote-read-threads (0: its default)
};
absl::Status RunRemoteBench(const RemoteBenchOptions& options);
void AddRemoteCommand(CLI::App& app);  // cake-bench remote

// Cake with a prefix spread over DRAM, disk and Redis at once (each tier capped at its modelled bandwidth) against
// the same prefix in one tier alone, on the simulated engine of `grid`; one row per remote bandwidth.
struct MixedOptions {
  std::string dir;  // the disk tier goes in <dir>/cake-mixed, removed afterwards
  std::string json_path;
  std::string model = "llama3.1-8b";
  uint32_t tokens = 16384;
  double util = 0.5;
  double gpu_tflops = 100;
  double dram_gbps = 32;
  double disk_gbps = 25;
  std::vector<double> remote_gbps = {7, 25};
  double dram_share = 1.0 / 3;  // the first share of the prefix is in DRAM, the next on disk, the rest in Redis
  double disk_share = 1.0 / 3;
  double time_scale = 1;
  uint32_t chunk_tokens = 128;
  uint32_t step_tokens = 512;
};
absl::Status RunMixedBench(const MixedOptions& options);
void AddMixedCommand(CLI::App& app);  // cake-bench mixed

// A fault and soak bench, never a timed test: `engines` engines (threads, each its own client) for `seconds` mixing
// lookups, Cake loads into a host region, inline loads, stores, cancelled loads and killed clients against a private
// caked with DRAM, disk and Redis tiers, while a share of the chunks about to be read from disk or Redis is corrupted
// and Redis is frozen now and then. Every loaded chunk is checked byte for byte; the daemon's RSS, TTFT, the load
// slots and regions held at the end and the TTFT with a dead Redis against compute-only are reported. Meanwhile idle
// connections are held and new ones churned. Fails on an unexplained error, a load that is not bit-exact, a load
// slot held at the end, or a connection the daemon refused, closed unasked or kept, never on timing.
struct SoakOptions {
  CommonOptions common;  // --socket is refused: the bench freezes the daemon's Redis and reads the daemon's RSS
  uint32_t engines = 16;
  double seconds = 600;
  double warmup_seconds = -1;      // below 0: a fifth of `seconds`, at most 60
  double read_error_rate = 0.01;   // share of the chunk reads from disk or Redis that find the chunk corrupted
  uint32_t dead_remote_runs = 10;  // timed loads per Redis state in the dead-remote phase
  // limits.region_lease_ms of the bench's caked: killed clients' regions are released once it runs out; the bench
  // waits it out at the end and fails on any region still held. 0 leaves the daemon's default (30 s) and does not
  // check.
  uint32_t region_lease_ms = 2000;
  // Raw unix-socket connections opened before the engines start that send nothing, held for the whole run: the
  // daemon must count them and must not close them (its idle timeout is set to outlast the run).
  uint32_t idle_connections = 32;
  // New connections a second while the engines run, half a fresh gRPC channel that sends one Ping and is dropped,
  // half a raw connect closed at once; 0: none. Every Ping must be answered, and the connections must all go.
  double churn_per_second = 50;
  uint32_t seed = 1;
};
absl::Status RunSoakBench(const SoakOptions& options);
void AddSoakCommand(CLI::App& app);  // cake-bench soak

// How caked's costs grow, each as a curve with a fitted slope: Lookup (a stored 16K-token prompt) and Ping per
// second and p99 with more clients at once, each on a connection of its own; the daemon's CPU per loaded chunk and
// the TTFT of I/O-only loads from DRAM with more loads at once; the daemon's memory per stored chunk beyond the
// chunks' bytes (the tiers' indexes) in the DRAM and disk tiers at growing chunk counts, and the disk tier's
// start-up after a clean stop and after a crash at each. Private daemons only, configured by the bench.
struct ScaleOptions {
  std::string json_path;         // empty: no JSON file
  std::string dir = "/var/tmp";  // the disk tier's chunk files go in <dir>/cake-bench-scale, removed afterwards
  std::vector<std::string> parts = {"calls", "loads", "dram", "disk"};
  std::vector<uint32_t> clients = {1, 8, 64, 256};
  std::vector<uint32_t> loads = {1, 16, 64, 256};
  std::vector<uint64_t> sizes = {100000, 1000000, 10000000};  // chunks; sizes a tier cannot hold here are reported
  double seconds = 1.5;                                       // each measured phase of calls
  uint32_t rounds = 2;                                        // Ping and Lookup phases per point, alternating
  uint32_t load_chunks = 128;                                 // 4 KiB chunks per load
  uint64_t max_disk_chunks = 1000000;                         // files are created at 6,000 to 13,000 a second
};
absl::Status RunScaleBench(const ScaleOptions& options);
void AddScaleCommand(CLI::App& app);  // cake-bench scale

// A fleet of `daemons` caked on this machine, each with its own DRAM and disk, sharing a Redis Cluster of 3 masters
// with a replica each, under multi-turn sessions whose turns are routed to a random daemon: the hit rate and TTFT
// (Lookup + an I/O-only load, measured, plus compute_ms_per_chunk for each missed chunk) against as many daemons
// without the cluster on the same turns; then fresh sessions while a master is failed over by hand and its old self
// killed, and later another master is killed outright: errors and wrong bytes (both must be 0, or the bench fails)
// and the hit rate per window of time, with the time each fault took to recover from.
struct FleetOptions {
  std::string dir;  // the daemons' disk tiers go in <dir>/cake-fleet, removed afterwards
  std::string json_path;
  uint32_t daemons = 4;
  uint32_t workers = 4;    // engine threads, each with a client and a region on every daemon
  uint32_t sessions = 48;  // in each of the shared and local phases
  uint32_t turns = 6;
  uint32_t first_tokens = 1024;
  uint32_t turn_tokens = 256;
  uint32_t chunk_tokens = 64;  // of 1 KiB a token (the simulated engine's stand-in KV)
  uint32_t think_ms = 100;     // at least this between a session's turns
  double compute_ms_per_chunk = 5;
  uint32_t dram_mib = 256;
  uint32_t disk_mib = 512;
  double failover_seconds = 36;
  double manual_failover_at_s = 10;
  double kill_at_s = 20;
  double window_s = 1;
};
absl::Status RunFleetBench(const FleetOptions& options);
void AddFleetCommand(CLI::App& app);  // cake-bench fleet

}  // namespace cake::bench
