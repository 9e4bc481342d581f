// cake-bench io, rebuild and store: the disk tier against fio on the same folder in the same run. `io` loads a
// cached prefix from disk into a region with a cold page cache (io_uring and pread), `rebuild` times the start-up
// index rebuild over many chunk files, `store` times Store until write-back has put every chunk on disk.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "bench/bench_command.h"
#include "bench/bench_common.h"
#include "bench/benchmarks.h"
#include "examples/simulated_engine/models.h"
#include "spdlog/spdlog.h"
#include "storage/chunk_file.h"
#include "storage/disk/clean_stop_index.h"
#include "storage/disk/disk_tier.h"
#include "storage/dram_tier.h"
#include "storage/tier_manager.h"

namespace cake::bench {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMiB = uint64_t{1} << 20;
// The write-back of a large prefix takes a while on a slow disk; no progress for this long means it is stuck
// (a refused write is counted by the daemon, not reported, so a stall is how it shows here).
constexpr std::chrono::seconds kWriteBackStall{60};

// The bootstrap 95% interval of the median of `samples` (2000 resamples, a fixed seed: the same samples give the
// same interval).
std::pair<double, double> MedianInterval(const std::vector<double>& samples) {
  if (samples.size() < 2) return {Median(samples), Median(samples)};
  std::mt19937_64 rng(20261203);
  std::uniform_int_distribution<size_t> pick(0, samples.size() - 1);
  std::vector<double> medians;
  std::vector<double> resample(samples.size());
  for (int b = 0; b < 2000; ++b) {
    for (double& s : resample) s = samples[pick(rng)];
    medians.push_back(Median(resample));
  }
  return {Percentile(medians, 2.5), Percentile(medians, 97.5)};
}

// ---- fio and the page cache ----

// caked's defaults for a load's readers (loader.io_threads) and each one's reads in flight (disk.queue_depth):
// the shape of the fio job that reads the tier's own files.
constexpr uint32_t kCakedDefaultIoThreads = 4;
constexpr uint32_t kTierQueueDepth = 32;

absl::Status RequireFio() {
  if (OnPath("fio")) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "fio is not on PATH: this bench measures the disk with fio in the same run; install it (apt-get install -y "
      "fio) and run again");
}

// The number after `"key"` and a colon, searched from `from`; nullopt when absent.
std::optional<double> JsonNumberAfter(const std::string& text, const std::string& key, size_t from) {
  const size_t at = text.find(absl::StrCat("\"", key, "\""), from);
  if (at == std::string::npos) return std::nullopt;
  const size_t colon = text.find(':', at);
  if (colon == std::string::npos) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text.c_str() + colon + 1, &end);
  if (end == text.c_str() + colon + 1) return std::nullopt;
  return value;
}

// The disk tiers this process opens log their recovery at info level; the summary says what matters.
void QuietStorageLog() { spdlog::set_level(spdlog::level::warn); }

// Where `"key" : {` starts, from `from`: the job's "read" object, not the "rw" : "read" option before it.
size_t FindJsonObject(const std::string& text, const std::string& key, size_t from) {
  const std::string quoted = absl::StrCat("\"", key, "\"");
  for (size_t at = text.find(quoted, from); at != std::string::npos; at = text.find(quoted, at + 1)) {
    size_t i = at + quoted.size();
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    if (i >= text.size() || text[i] != ':') continue;
    ++i;
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    if (i < text.size() && text[i] == '{') return at;
  }
  return std::string::npos;
}

// Runs fio with `args` (after "fio") and JSON output written beside `scratch`; returns the JSON text.
absl::StatusOr<std::string> RunFioWithArgs(const fs::path& scratch, std::vector<std::string> args) {
  const fs::path json = fs::path(scratch).concat(".fio.json");
  const fs::path log = fs::path(scratch).concat(".fio.log");
  absl::Cleanup remove_outputs = [&] {
    std::error_code ec;
    fs::remove(json, ec);
    fs::remove(log, ec);
  };
  args.insert(args.begin(), "fio");
  args.push_back("--output-format=json");
  args.push_back(absl::StrCat("--output=", json.string()));
  CAKE_ASSIGN_OR_RETURN(auto rc, RunProgram(args, log));
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat(absl::StrJoin(args, " "), " exited with ", rc, ": ", ReadWholeFile(log), ReadWholeFile(json)));
  }
  return ReadWholeFile(json);
}

// Runs one fio job on `file` with `job` options and JSON output; returns the JSON text.
absl::StatusOr<std::string> RunFioJob(const fs::path& file, const std::vector<std::string>& job) {
  std::vector<std::string> args = {"--name=cake", absl::StrCat("--filename=", file.string())};
  args.insert(args.end(), job.begin(), job.end());
  return RunFioWithArgs(file, std::move(args));
}

// A number from fio's JSON: jobs[0].<direction>[.<object>].<key>.
absl::StatusOr<double> FioFigure(const std::string& text, const std::string& direction, const std::string& object,
                                 const std::string& key) {
  const size_t jobs = text.find("\"jobs\"");
  size_t at = jobs == std::string::npos ? jobs : FindJsonObject(text, direction, jobs);
  if (at != std::string::npos && !object.empty()) at = FindJsonObject(text, object, at);
  std::optional<double> value = at == std::string::npos ? std::nullopt : JsonNumberAfter(text, key, at);
  if (!value || *value <= 0) {
    return absl::InternalError(
        absl::StrCat("no ", direction, ".", object, object.empty() ? "" : ".", key, " in fio's JSON: ", text));
  }
  return *value;
}

// fio on `file` with the bench's one job shape: 1 MiB blocks, 32 in flight, io_uring, O_DIRECT. `rw` is "read"
// or "write"; returns the job's bandwidth in bytes per second (fio's JSON, jobs[0].<rw>.bw_bytes).
absl::StatusOr<double> RunFio(const fs::path& file, const std::string& rw, uint64_t mib) {
  CAKE_ASSIGN_OR_RETURN(auto text,
                        RunFioJob(file, {absl::StrCat("--rw=", rw), "--bs=1M", "--iodepth=32", "--ioengine=io_uring",
                                         "--direct=1", absl::StrCat("--size=", mib, "M")}));
  return FioFigure(text, rw, "", "bw_bytes");
}

// fio reading `files` whole in the disk tier's own shape: `jobs` jobs (a load's readers), file i going to job
// i % jobs, each job's files one after another with `depth` reads of 1 MiB in flight, io_uring, O_DIRECT. The job
// file goes beside `scratch`. Returns the jobs' bytes per second together.
absl::StatusOr<double> RunFioReadOfFiles(const fs::path& scratch, const std::vector<fs::path>& files, uint32_t jobs,
                                         uint32_t depth) {
  const fs::path job_file = fs::path(scratch).concat(".files.fio");
  absl::Cleanup remove_job_file = [&] {
    std::error_code ec;
    fs::remove(job_file, ec);
  };
  std::string text = absl::StrCat(
      "[global]\nrw=read\nbs=1M\nioengine=io_uring\ndirect=1\nfile_service_type=sequential\ngroup_reporting=1\n"
      "iodepth=",
      depth, "\n");
  for (uint32_t j = 0; j < jobs && j < files.size(); ++j) {
    std::vector<std::string> mine;
    for (size_t i = j; i < files.size(); i += jobs) mine.push_back(files[i].string());
    absl::StrAppend(&text, "[reader", j, "]\nfilename=", absl::StrJoin(mine, ":"), "\n");
  }
  {
    std::ofstream out(job_file);
    out << text;
    if (!out.flush()) return absl::UnavailableError(absl::StrCat("cannot write the fio job file ", job_file.string()));
  }
  CAKE_ASSIGN_OR_RETURN(auto json, RunFioWithArgs(scratch, {job_file.string()}));
  return FioFigure(json, "read", "", "bw_bytes");
}

// ---- the prefix and the daemon ----

struct Prefix {
  NamespaceSpec ns;
  uint64_t chunk_bytes = 0;
  uint32_t chunks = 0;
  uint64_t bytes = 0;
  std::vector<uint32_t> tokens;
};

absl::StatusOr<Prefix> MakePrefix(uint64_t mib, uint32_t seed) {
  const sim::ModelSpec& model = *sim::FindModel("llama3.1-8b");
  Prefix p;
  p.ns = sim::KvNamespace(model);
  CAKE_ASSIGN_OR_RETURN(auto layout, Namespace::Create(p.ns));
  p.chunk_bytes = layout.chunk_bytes();
  p.chunks = static_cast<uint32_t>(mib * kMiB / p.chunk_bytes);
  if (p.chunks == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--mib ", mib, " is less than one ", p.chunk_bytes >> 20, " MiB chunk of ", model.name));
  }
  p.bytes = uint64_t{p.chunks} * p.chunk_bytes;
  p.tokens = SyntheticPrompt(uint64_t{p.chunks} * p.ns.chunk_tokens, seed);
  return p;
}

// Fills a region with the prefix's pattern and stores every chunk; the region is the caller's to release.
absl::StatusOr<MappedRegion> RegisterFilledRegion(Client& client, const Prefix& p) {
  CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(p.bytes));
  for (uint32_t c = 0; c < p.chunks; ++c) {
    FillChunkPattern({region.data() + uint64_t{c} * p.chunk_bytes, p.chunk_bytes}, c);
  }
  return region;
}

absl::Status StoreAll(Client& client, const Prefix& p, const MappedRegion& region) {
  CAKE_ASSIGN_OR_RETURN(auto stored, client.Store(p.ns, TokensPrompt(p.tokens), 0, p.chunks, region, 0));
  if (stored.stored_chunks + stored.already_cached != p.chunks) {
    return absl::InternalError(absl::StrCat("Store took ", stored.stored_chunks, " of ", p.chunks, " chunks (",
                                            stored.already_cached, " already cached)"));
  }
  return absl::OkStatus();
}

// The line caked logs when its disk tier opens ("disk tier at ...: <backend> backend, ..."), for the summary.
std::string DiskTierLogLine(const std::string& log) {
  const size_t at = log.find("disk tier at ");
  if (at == std::string::npos) return "(no disk tier line in caked's log)";
  const size_t end = log.find('\n', at);
  return log.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string JoinRuns(const std::vector<double>& values) {
  return absl::StrJoin(values, ", ", [](std::string* out, double v) { absl::StrAppend(out, absl::SixDigits(v)); });
}

// ---- cake-bench io ----

struct ColdLoad {
  double seconds = 0;
  std::string disk_line;
  uint64_t promotions = 0;          // chunks the load's daemon copied into DRAM
  uint64_t promotions_dropped = 0;  // skipped because the promotion queue was full
  bool not_promoted = false;        // the load was larger than half the DRAM tier
};

// A fresh daemon on the stored root (so its DRAM tier is empty), a region, a dropped page cache, then one timed
// I/O-only load of the whole prefix, every byte checked. The daemon stops afterwards: a load promotes what it
// read into DRAM, so the next measured load needs a fresh daemon to come from disk again. `settle`: a pause
// between the dropped page cache and the timed load (see the paired comparison in RunIoBench).
absl::StatusOr<ColdLoad> TimedColdLoad(const Prefix& p, const std::vector<std::string>& daemon_args, uint32_t window,
                                       bool* cache_dropped,
                                       std::chrono::milliseconds settle = std::chrono::milliseconds(0)) {
  CAKE_ASSIGN_OR_RETURN(auto target, OpenDaemon("", daemon_args));
  Client& client = *target.client;
  ColdLoad result;
  result.disk_line = DiskTierLogLine(target.spawned->log());

  CAKE_ASSIGN_OR_RETURN(auto region, client.RegisterRegion(p.bytes));
  absl::Cleanup release_region = [&] { client.ReleaseRegion(region).IgnoreError(); };
  CAKE_ASSIGN_OR_RETURN(auto lookup, client.Lookup(p.ns, TokensPrompt(p.tokens)));
  const auto on_disk = std::count(lookup.tiers.begin(), lookup.tiers.end(), TierKind::kDisk);
  if (lookup.cached_chunks != p.chunks || on_disk != p.chunks) {
    return absl::InternalError(absl::StrCat("the restarted daemon finds ", lookup.cached_chunks, " of ", p.chunks,
                                            " chunks cached, ", on_disk, " of them on disk; expected all on disk"));
  }
  *cache_dropped = DropPageCache() && *cache_dropped;
  std::this_thread::sleep_for(settle);

  LoadOptions load;
  load.ns = p.ns;
  load.prompt = TokensPrompt(p.tokens);
  load.region = &region;
  load.io_only = true;
  load.window = window;
  const Clock::time_point start = Clock::now();
  CAKE_ASSIGN_OR_RETURN(auto session, client.StartLoad(load));
  auto done = session->WaitDone();
  result.seconds = SecondsSince(start);
  if (!done.ok()) {
    absl::Status why = session->Release();
    return why.ok() ? done.status() : why;
  }
  if (done->meeting_chunk != 0 || done->loaded_chunks != p.chunks || done->failed_chunks != 0) {
    return absl::InternalError(absl::StrCat("an I/O-only load of ", p.chunks, " chunks on disk loaded ",
                                            done->loaded_chunks, " (meeting chunk ", done->meeting_chunk, ", ",
                                            done->failed_chunks, " failed reads)"));
  }
  for (uint32_t c = 0; c < p.chunks; ++c) {
    const uint64_t offset = session->RegionOffset(c);
    CAKE_RETURN_IF_ERROR(CheckChunkPattern({region.data() + offset, p.chunk_bytes}, c));
  }
  CAKE_RETURN_IF_ERROR(session->Release());
  // The stream has ended, so every promotion this load queued is done.
  CAKE_ASSIGN_OR_RETURN(auto stats, client.Stats());
  auto counter = [&](const char* name) { return stats.contains(name) ? stats.at(name) : uint64_t{0}; };
  result.promotions = counter("write_back_promoted");
  result.promotions_dropped = counter("write_back_promotion_dropped");
  result.not_promoted = counter("loads_not_promoted") > 0;
  return result;
}

// Shared memory of the load's size, mapped and touched page by page, held while a fio read runs: what a tier load
// has (its daemon maps the engine's region, written once through, before the timed read) and a bare fio read does
// not. On this VM a read's speed follows that memory history: fio read 2.2 to 2.9 GB/s while such memory was
// held, and 1.0 to 1.3 right after it was let go (section 27), so a fair paired comparison gives fio the same.
class FreshTouchedMemory {
 public:
  explicit FreshTouchedMemory(uint64_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    data_ = static_cast<std::byte*>(p);
    for (uint64_t at = 0; at < bytes; at += 4096) data_[at] = std::byte{1};
  }
  ~FreshTouchedMemory() {
    if (data_ != nullptr) ::munmap(data_, bytes_);
  }
  FreshTouchedMemory(const FreshTouchedMemory&) = delete;
  FreshTouchedMemory& operator=(const FreshTouchedMemory&) = delete;
  bool ok() const { return data_ != nullptr; }

 private:
  const uint64_t bytes_;
  std::byte* data_ = nullptr;
};

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};
using HostBuffer = std::unique_ptr<std::byte, FreeDeleter>;

// The disk tier alone, in this process, with no daemon: `threads` threads each read whole chunks (chunk t,
// t + threads, ...) through DiskTier::Read into a touched, page-aligned buffer, after a dropped page cache.
// Every byte is checked. Against the daemon's load, this separates the disk tier's own cost from the daemon's.
// With `promote_dram_bytes`, each read is followed by what a daemon load does after it: TierManager::PromoteLater
// into a DRAM tier of that size (on the promotion thread; the time stops when the reads are done, as the
// daemon's LoadDone does not wait for promotions), unless the prefix is larger than half that tier, which the
// daemon does not promote either.
absl::StatusOr<double> TimedInProcessRead(const Prefix& p, const fs::path& root, uint32_t threads,
                                          uint64_t promote_dram_bytes, std::byte* buffer, bool* cache_dropped,
                                          uint64_t* promoted = nullptr) {
  DiskTier::Options o;
  o.root = root;
  o.capacity_bytes = 2 * p.bytes;
  o.io_backend = IoBackend::kUring;
  CAKE_ASSIGN_OR_RETURN(auto disk, DiskTier::Open(o));
  TierManager tiers;
  if (promote_dram_bytes > 0) tiers.AddTier(TierKind::kDram, std::make_unique<DramTier>(promote_dram_bytes));
  tiers.AddTier(TierKind::kDisk, std::move(disk));
  CAKE_ASSIGN_OR_RETURN(auto layout, Namespace::Create(p.ns));
  const std::vector<ChunkKey> keys = layout.KeysForTokens(p.tokens);
  *cache_dropped = DropPageCache() && *cache_dropped;
  // Written just before the timed reads: on this VM, memory left idle while the daemons ran is slow to touch
  // again (see "The machine"), which made this figure lower than the daemon's own loads.
  std::memset(buffer, 0, p.bytes);

  const bool promote = promote_dram_bytes > 0 && p.bytes <= promote_dram_bytes / 2;
  std::atomic<uint64_t> promotions_pending{0};
  std::mutex error_mu;
  absl::Status error;
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> readers;
  for (uint32_t t = 0; t < threads; ++t) {
    readers.emplace_back([&, t] {
      for (uint32_t c = t; c < p.chunks; c += threads) {
        const std::span<std::byte> dst(buffer + uint64_t{c} * p.chunk_bytes, p.chunk_bytes);
        absl::Status s = tiers.Read(TierKind::kDisk, keys[c], dst);
        if (s.ok() && promote) {
          ++promotions_pending;
          if (!tiers.PromoteLater(keys[c], dst, [&] { --promotions_pending; })) --promotions_pending;
        }
        if (!s.ok()) {
          std::lock_guard lock(error_mu);
          if (error.ok()) error = s;
          return;
        }
      }
    });
  }
  for (std::thread& r : readers) r.join();
  const double seconds = SecondsSince(start);
  while (promotions_pending > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (promoted != nullptr) *promoted = tiers.write_back_stats().promotions;
  if (!error.ok()) return error;
  for (uint32_t c = 0; c < p.chunks; ++c) {
    CAKE_RETURN_IF_ERROR(CheckChunkPattern({buffer + uint64_t{c} * p.chunk_bytes, p.chunk_bytes}, c));
  }
  return seconds;
}

}  // namespace

absl::Status RunIoBench(const IoBenchOptions& options) {
  QuietStorageLog();
  CAKE_RETURN_IF_ERROR(RequireFio());
  CAKE_ASSIGN_OR_RETURN(auto prefix, MakePrefix(options.mib, 512));
  const Prefix& p = prefix;
  CAKE_ASSIGN_OR_RETURN(auto root, FreshPath(options.dir, "cake"));
  CAKE_ASSIGN_OR_RETURN(auto fio_file, FreshPath(options.dir, "fio.dat"));
  absl::Cleanup remove_data = [&] {
    RemoveQuietly(root);
    RemoveQuietly(fio_file);
  };

  std::vector<std::string> base_args = {"--disk-root", root.string(), "--disk-capacity-mib",
                                        absl::StrCat(2 * (p.bytes >> 20))};
  if (options.io_threads > 0) base_args = Concat(base_args, {"--io-threads", absl::StrCat(options.io_threads)});
  if (options.daemon_window > 0) base_args = Concat(base_args, {"--window", absl::StrCat(options.daemon_window)});
  if (!options.caked_config.empty()) base_args = Concat(base_args, {"--config", options.caked_config});
  // The storing daemon's DRAM tier of two chunks cannot hold the prefix, yet takes each stored chunk (write-back
  // holds at most half the tier; beyond that, Store writes to disk itself). The loading daemons' DRAM tier is
  // what each chunk read from disk is promoted into, unless the prefix is larger than half of it.
  const std::vector<std::string> store_args =
      Concat(base_args, {"--dram-capacity-mib", absl::StrCat(2 * (p.chunk_bytes >> 20))});
  const uint64_t dram_mib = options.load_dram_mib;
  base_args = Concat(base_args, {"--dram-capacity-mib", absl::StrCat(dram_mib)});

  double store_seconds = 0;
  {
    CAKE_ASSIGN_OR_RETURN(auto target, OpenDaemon("", store_args));
    CAKE_ASSIGN_OR_RETURN(auto region, RegisterFilledRegion(*target.client, p));
    absl::Cleanup release_region = [&] { target.client->ReleaseRegion(region).IgnoreError(); };
    const Clock::time_point start = Clock::now();
    CAKE_RETURN_IF_ERROR(StoreAll(*target.client, p, region));
    CAKE_RETURN_IF_ERROR(WaitForCounter(*target.client, "tier_disk_chunks", p.chunks, kWriteBackStall));
    store_seconds = SecondsSince(start);
  }
  CAKE_ASSIGN_OR_RETURN(auto fio_write, RunFio(fio_file, "write", p.bytes >> 20));

  // The three alternate run by run, so a noisy spell of the shared disk hits each of them alike.
  bool cache_dropped = true;
  std::vector<double> tier_gbps, pread_gbps, fio_gbps, alone_gbps, promote_gbps;
  std::vector<double> promoted_chunks, dropped_promotions, inprocess_promoted;
  bool load_not_promoted = false;
  std::string uring_line, pread_line;
  // One buffer for every in-process read, so later runs pay no first-touch page faults (slow on this VM).
  HostBuffer host(static_cast<std::byte*>(std::aligned_alloc(4096, p.bytes)));
  if (!host) return absl::ResourceExhaustedError("cannot allocate the in-process read buffer");
  for (uint32_t run = 0; run < options.runs; ++run) {
    CAKE_ASSIGN_OR_RETURN(auto uring, TimedColdLoad(p, Concat(base_args, {"--disk-io-backend", "uring"}),
                                                    options.window, &cache_dropped));
    uring_line = uring.disk_line;
    tier_gbps.push_back(GigabytesPerSecond(p.bytes, uring.seconds));
    promoted_chunks.push_back(static_cast<double>(uring.promotions));
    dropped_promotions.push_back(static_cast<double>(uring.promotions_dropped));
    load_not_promoted = uring.not_promoted;
    CAKE_ASSIGN_OR_RETURN(auto pread, TimedColdLoad(p, Concat(base_args, {"--disk-io-backend", "pread"}),
                                                    options.window, &cache_dropped));
    pread_line = pread.disk_line;
    pread_gbps.push_back(GigabytesPerSecond(p.bytes, pread.seconds));
    cache_dropped = DropPageCache() && cache_dropped;
    CAKE_ASSIGN_OR_RETURN(auto alone,
                          TimedInProcessRead(p, root, options.inprocess_threads, 0, host.get(), &cache_dropped));
    alone_gbps.push_back(GigabytesPerSecond(p.bytes, alone));
    uint64_t promoted_in_process = 0;
    CAKE_ASSIGN_OR_RETURN(auto promoting, TimedInProcessRead(p, root, options.inprocess_threads, dram_mib * kMiB,
                                                             host.get(), &cache_dropped, &promoted_in_process));
    inprocess_promoted.push_back(static_cast<double>(promoted_in_process));
    promote_gbps.push_back(GigabytesPerSecond(p.bytes, promoting));
    cache_dropped = DropPageCache() && cache_dropped;
    CAKE_ASSIGN_OR_RETURN(auto fio, RunFio(fio_file, "read", p.bytes >> 20));
    fio_gbps.push_back(fio / 1e9);
    std::printf(
        "  run %u: tier (io_uring) %.3f GB/s, pread %.3f GB/s, in process %.3f GB/s (%.3f with promotion), "
        "fio read %.3f GB/s; the io_uring load promoted %.0f chunks (%.0f dropped)\n",
        run + 1, tier_gbps.back(), pread_gbps.back(), alone_gbps.back(), promote_gbps.back(), fio_gbps.back(),
        promoted_chunks.back(), dropped_promotions.back());
    std::fflush(stdout);
  }

  const double tier = Median(tier_gbps), pread = Median(pread_gbps), fio = Median(fio_gbps);
  const double ratio = tier / fio;
  std::printf("cake-bench io: %u chunks of %llu MiB (llama3.1-8b layout, %llu MiB) from the disk tier at %s\n",
              p.chunks, static_cast<unsigned long long>(p.chunk_bytes >> 20),
              static_cast<unsigned long long>(p.bytes >> 20), root.string().c_str());
  std::printf("  caked: %s\n  caked: %s\n", uring_line.c_str(), pread_line.c_str());
  std::printf("  load window %s, loading daemons' DRAM tier %llu MiB, a fresh daemon per load; page cache %s\n",
              options.window == 0 ? "daemon default" : absl::StrCat(options.window).c_str(),
              static_cast<unsigned long long>(dram_mib),
              cache_dropped ? "dropped before every load and fio read" : "NOT dropped (needs root)");
  std::printf("  store + write-back of the prefix: %.2f s; fio write (same job shape) %.3f GB/s\n", store_seconds,
              fio_write / 1e9);
  std::printf("  %-48s %10s   %s\n", "GB/s (1e9 bytes/s)", "median", "runs");
  std::printf("  %-48s %10.3f   %s\n", "I/O-only load, disk tier, io_uring", tier, JoinRuns(tier_gbps).c_str());
  std::printf("  %-48s %10.3f   %s\n", "I/O-only load, disk tier, pread", pread, JoinRuns(pread_gbps).c_str());
  std::printf("  %-48s %10.3f   %s\n",
              absl::StrCat("DiskTier::Read in process, ", options.inprocess_threads, " threads").c_str(),
              Median(alone_gbps), JoinRuns(alone_gbps).c_str());
  std::printf("  %-48s %10.3f   %s\n",
              absl::StrCat("  same, each read then promoted (", dram_mib, " MiB DRAM)").c_str(), Median(promote_gbps),
              JoinRuns(promote_gbps).c_str());
  std::printf("  %-48s %10.3f   %s\n", "fio read, bs 1M, iodepth 32, io_uring", fio, JoinRuns(fio_gbps).c_str());
  std::printf("  promotions into DRAM per io_uring load: %s (dropped: %s; in process: %s)%s\n",
              JoinRuns(promoted_chunks).c_str(), JoinRuns(dropped_promotions).c_str(),
              JoinRuns(inprocess_promoted).c_str(),
              load_not_promoted ? "; the prefix is larger than half the DRAM tier, so loads do not promote it" : "");
  std::printf("  every load verified byte for byte\n");
  std::printf("  tier / fio = %.0f%% (goal: at least 90%%) -> %s\n", 100 * ratio, ratio >= 0.9 ? "met" : "MISSED");

  JsonReport report;
  if (options.pairs > 0) {
    // Paired: the disk's speed drifts by tens of percent between invocations and within one (section 11 of
    // docs/benchmarks.md), so each tier load is compared with the fio reads next to it, never with a median of
    // reads minutes away; the order within a pair reverses from one pair to the next so no side always gets the
    // warmer disk. fio reads in two shapes: the bench's usual one (one file fio wrote, 32 reads of 1 MiB in
    // flight) and the tier's own (its chunk files, one job per reader of a load, 32 in flight each). The second
    // reads the same bytes as the tier, laid out on disk as the tier wrote them: on this VM two files written and
    // read alike can read 2x to 4x apart (section 27), so a gap against one file fio wrote may be the file's, not
    // the reader's. The goal is held against the shape with the better median, as the remote bench holds the tier
    // to its client's best shape. Each fio read runs while the bench
    // holds fresh, touched shared memory of the load's size, as the tier's load has its region
    // (FreshTouchedMemory): without it, a fio read right after a tier load ran about a third slower (section 27).
    // `settle` (0 unless asked): a pause after the page cache is dropped, before each timed read.
    const auto settle = std::chrono::milliseconds(options.settle_ms);
    std::vector<fs::path> chunk_files;  // the tier's files, tail first as a load reads them
    {
      CAKE_ASSIGN_OR_RETURN(auto layout, Namespace::Create(p.ns));
      for (const ChunkKey& key : layout.KeysForTokens(p.tokens)) chunk_files.push_back(ChunkPath(root, key));
      std::reverse(chunk_files.begin(), chunk_files.end());
    }
    const uint32_t readers = options.io_threads > 0 ? options.io_threads : kCakedDefaultIoThreads;
    enum class FioShape { kOneFile, kChunkFiles };
    auto fio_read = [&](FioShape shape) -> absl::StatusOr<double> {
      const FreshTouchedMemory like_a_region(options.fio_like_region ? p.bytes : 0);
      if (options.fio_like_region && !like_a_region.ok()) {
        return absl::ResourceExhaustedError("cannot map shared memory the size of the load for the fio side");
      }
      cache_dropped = DropPageCache() && cache_dropped;
      std::this_thread::sleep_for(settle);
      CAKE_ASSIGN_OR_RETURN(auto read, shape == FioShape::kOneFile
                                           ? RunFio(fio_file, "read", p.bytes >> 20)
                                           : RunFioReadOfFiles(fio_file, chunk_files, readers, kTierQueueDepth));
      return read / 1e9;
    };
    auto tier_read = [&]() -> absl::StatusOr<double> {
      if (options.pairs_in_process) {
        // The disk tier without the daemon (its buffer written just before, as a region is): splits the daemon's
        // part of a gap from the tier's.
        CAKE_ASSIGN_OR_RETURN(auto seconds,
                              TimedInProcessRead(p, root, options.inprocess_threads, 0, host.get(), &cache_dropped));
        return GigabytesPerSecond(p.bytes, seconds);
      }
      CAKE_ASSIGN_OR_RETURN(auto load, TimedColdLoad(p, Concat(base_args, {"--disk-io-backend", "uring"}),
                                                     options.window, &cache_dropped, settle));
      return GigabytesPerSecond(p.bytes, load.seconds);
    };
    std::vector<double> tier_gbps_paired, one_file_gbps, chunk_files_gbps;
    std::vector<double> vs_one_file, vs_chunk_files, tier_first, tier_last, same;
    for (uint32_t i = 0; i < options.pairs; ++i) {
      const bool tier_goes_first = i % 2 == 0;
      double tier_side = 0, one_file = 0, chunk_files_side = 0;
      if (tier_goes_first) {
        CAKE_ASSIGN_OR_RETURN(tier_side, tier_read());
        CAKE_ASSIGN_OR_RETURN(one_file, fio_read(FioShape::kOneFile));
        CAKE_ASSIGN_OR_RETURN(chunk_files_side, fio_read(FioShape::kChunkFiles));
      } else {
        CAKE_ASSIGN_OR_RETURN(chunk_files_side, fio_read(FioShape::kChunkFiles));
        CAKE_ASSIGN_OR_RETURN(one_file, fio_read(FioShape::kOneFile));
        CAKE_ASSIGN_OR_RETURN(tier_side, tier_read());
      }
      tier_gbps_paired.push_back(tier_side);
      one_file_gbps.push_back(one_file);
      chunk_files_gbps.push_back(chunk_files_side);
      vs_one_file.push_back(tier_side / one_file);
      vs_chunk_files.push_back(tier_side / chunk_files_side);
      // A/A in the tier's shape: the same files read twice in a row.
      CAKE_ASSIGN_OR_RETURN(const double first, fio_read(FioShape::kChunkFiles));
      CAKE_ASSIGN_OR_RETURN(const double second, fio_read(FioShape::kChunkFiles));
      same.push_back(first / second);
      std::printf(
          "  pair %u (tier %s): tier %.3f GB/s; fio one file %.3f (tier / fio %.3f), fio chunk files %.3f (%.3f); "
          "fio / fio %.3f\n",
          i + 1, tier_goes_first ? "first" : "last", tier_side, one_file, vs_one_file.back(), chunk_files_side,
          vs_chunk_files.back(), same.back());
      std::fflush(stdout);
    }
    // The goal is held against the fio shape that read faster (by its median) in this invocation.
    const bool chunk_files_best = Median(chunk_files_gbps) >= Median(one_file_gbps);
    const std::vector<double>& paired = chunk_files_best ? vs_chunk_files : vs_one_file;
    for (uint32_t i = 0; i < options.pairs; ++i) (i % 2 == 0 ? tier_first : tier_last).push_back(paired[i]);
    const auto [low, high] = MedianInterval(paired);
    const auto [one_low, one_high] = MedianInterval(vs_one_file);
    const auto [chunks_low, chunks_high] = MedianInterval(vs_chunk_files);
    const auto [same_low, same_high] = MedianInterval(same);
    // The method resolves a gap when it is larger than the noise an A/A comparison shows.
    const double resolves = std::max(std::fabs(same_high - 1), std::fabs(1 - same_low));
    const std::string tier_side_name =
        options.pairs_in_process
            ? absl::StrCat("the tier side: DiskTier::Read in this process, ", options.inprocess_threads, " threads")
            : "the tier side: a fresh daemon's I/O-only load";
    std::printf(
        "  paired (%s; %lld ms settle before each read; fio %s), %u pairs, GB/s medians: tier %.3f, fio one file "
        "%.3f, fio chunk files (%u jobs x %u) %.3f\n"
        "    tier / fio one file: %.3f (95%% interval %.3f to %.3f); tier / fio chunk files: %.3f (%.3f to %.3f)\n"
        "    against the faster shape (%s): median %.3f (%.3f to %.3f; goal: at least 0.95 -> %s); tier first "
        "%.3f, tier last %.3f\n"
        "    fio / fio (chunk files) %.3f (%.3f to %.3f): the method resolves gaps of about %.1f%% on this disk\n",
        tier_side_name.c_str(), static_cast<long long>(options.settle_ms),
        options.fio_like_region ? "holding fresh memory of the load's size" : "alone", options.pairs,
        Median(tier_gbps_paired), Median(one_file_gbps), readers, kTierQueueDepth, Median(chunk_files_gbps),
        Median(vs_one_file), one_low, one_high, Median(vs_chunk_files), chunks_low, chunks_high,
        chunk_files_best ? "chunk files" : "one file", Median(paired), low, high,
        Median(paired) >= 0.95 ? "met" : "MISSED", Median(tier_first), tier_last.empty() ? 0.0 : Median(tier_last),
        Median(same), same_low, same_high, 100 * resolves);
    report.Set("paired_ratio_median", Median(paired));
    report.Set("paired_ratio_low", low);
    report.Set("paired_ratio_high", high);
    report.Set("paired_against_chunk_files", chunk_files_best ? 1 : 0);
    report.Set("paired_ratio_one_file_median", Median(vs_one_file));
    report.Set("paired_ratio_chunk_files_median", Median(vs_chunk_files));
    report.Set("paired_tier_gbps", Median(tier_gbps_paired));
    report.Set("paired_fio_one_file_gbps", Median(one_file_gbps));
    report.Set("paired_fio_chunk_files_gbps", Median(chunk_files_gbps));
    report.Set("paired_ratio_tier_first_median", Median(tier_first));
    if (!tier_last.empty()) report.Set("paired_ratio_tier_last_median", Median(tier_last));
    report.Set("fio_fio_ratio_median", Median(same));
    report.Set("fio_fio_ratio_low", same_low);
    report.Set("fio_fio_ratio_high", same_high);
    report.Set("resolvable_gap", resolves);
    report.Set("pairs", options.pairs);
    report.Set("settle_ms", options.settle_ms);
    report.Set("fio_like_region", options.fio_like_region ? 1 : 0);
    report.Set("pairs_in_process", options.pairs_in_process ? 1 : 0);
  }
  report.Set("tier_gbps", tier);
  report.Set("pread_gbps", pread);
  report.Set("fio_gbps", fio);
  report.Set("ratio", ratio);
  report.Set("goal_ratio", 0.9);
  report.Set("units", std::string("GB/s = 1e9 bytes per second"));
  for (size_t i = 0; i < tier_gbps.size(); ++i) {
    report.Set(absl::StrCat("tier_gbps_", i + 1), tier_gbps[i]);
    report.Set(absl::StrCat("pread_gbps_", i + 1), pread_gbps[i]);
    report.Set(absl::StrCat("fio_gbps_", i + 1), fio_gbps[i]);
    report.Set(absl::StrCat("disk_tier_inprocess_gbps_", i + 1), alone_gbps[i]);
    report.Set(absl::StrCat("disk_tier_promote_inprocess_gbps_", i + 1), promote_gbps[i]);
    report.Set(absl::StrCat("promotions_", i + 1), promoted_chunks[i]);
    report.Set(absl::StrCat("promotions_dropped_", i + 1), dropped_promotions[i]);
  }
  report.Set("disk_tier_inprocess_gbps", Median(alone_gbps));
  report.Set("disk_tier_promote_inprocess_gbps", Median(promote_gbps));
  report.Set("inprocess_threads", options.inprocess_threads);
  report.Set("fio_write_gbps", fio_write / 1e9);
  report.Set("store_writeback_s", store_seconds);
  report.Set("bytes", static_cast<double>(p.bytes));
  report.Set("chunk_bytes", static_cast<double>(p.chunk_bytes));
  report.Set("window", options.window);
  report.Set("load_dram_mib", static_cast<double>(dram_mib));
  report.Set("load_not_promoted", load_not_promoted ? 1.0 : 0.0);
  report.Set("runs", options.runs);
  report.Set("page_cache_dropped", cache_dropped ? 1.0 : 0.0);
  return report.WriteTo(options.json_path);
}

void AddIoCommand(CLI::App& app) {
  auto options = std::make_shared<IoBenchOptions>();
  CLI::App* command = app.add_subcommand(
      "io", "cold I/O-only loads from the disk tier (io_uring and pread) beside fio on the same folder");
  command->add_option("--dir", options->dir, "folder for the bench's data (on the disk to measure)")->required();
  command->add_option("--json", options->json_path, "also write the results to this file as one JSON object");
  command->add_option("--mib", options->mib, "bytes of prefix to load, in MiB (whole 32 MiB chunks)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{32}, uint64_t{1} << 20));
  command->add_option("--runs", options->runs, "measured runs of each (a fresh daemon per load)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100u));
  command->add_option("--window", options->window, "the load's window, chunks read at once (0: the daemon's default)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 64u));
  command->add_option("--daemon-window", options->daemon_window, "caked --window (0: caked's default)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 64u));
  command->add_option("--io-threads", options->io_threads, "caked --io-threads (0: caked's default)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 256u));
  command->add_option("--caked-config", options->caked_config, "caked --config FILE, e.g. for disk.queue_depth");
  command
      ->add_option("--pairs", options->pairs,
                   "then N pairs of (tier, fio on one file, fio on the tier's chunk files), the order reversing, and "
                   "N (fio, fio) pairs: the median paired ratio, its 95% interval, and the smallest gap the method "
                   "resolves")
      ->capture_default_str()
      ->check(CLI::Range(0u, 1000u));
  command
      ->add_option("--settle-ms", options->settle_ms,
                   "the pairs' pause before each timed read, after the page cache is dropped")
      ->capture_default_str()
      ->check(CLI::Range(0u, 600000u));
  command->add_flag("!--fio-alone", options->fio_like_region,
                    "the pairs' fio reads without the fresh memory of the load's size a tier load has (its region)");
  command->add_flag("--pairs-in-process", options->pairs_in_process,
                    "the pairs' tier side is DiskTier::Read in this process (--inprocess-threads), not a daemon");
  command
      ->add_option(
          "--load-dram-mib", options->load_dram_mib,
          "DRAM tier of the loading daemons, MiB; loads are promoted only when the prefix is at most half of it")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20));
  command
      ->add_option("--inprocess-threads", options->inprocess_threads,
                   "threads of the in-process DiskTier::Read comparison (no daemon)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  RunWhenParsed(command, options, RunIoBench);
}

// ---- cake-bench rebuild ----

namespace {

// Distinct keys spread over the 256 folders the way real (hashed) keys are.
ChunkKey RebuildKey(uint64_t i) {
  ChunkKey key;
  uint64_t mixed = i * 0x9e3779b97f4a7c15ull;
  mixed ^= mixed >> 29;
  mixed *= 0xbf58476d1ce4e5b9ull;
  mixed ^= mixed >> 32;
  std::memcpy(key.bytes.data(), &mixed, 8);
  std::memcpy(key.bytes.data() + 8, &i, 8);
  return key;
}

// How long a start-up may take before caked counts as "over the limit": a million files after a crash take
// tens of seconds on a slow disk.
constexpr std::chrono::seconds kCakedStartLimit{120};

DiskTier::Options RebuildTierOptions(const fs::path& root, uint64_t files, uint64_t payload_bytes) {
  DiskTier::Options o;
  o.root = root;
  o.capacity_bytes = 2 * files * payload_bytes;
  return o;
}

}  // namespace

absl::Status RunRebuildBench(const RebuildBenchOptions& options) {
  QuietStorageLog();
  constexpr uint64_t kPayloadBytes = 4096;
  CAKE_ASSIGN_OR_RETURN(auto root, FreshPath(options.dir, "cake-rebuild"));
  CAKE_ASSIGN_OR_RETURN(auto fio_file, FreshPath(options.dir, "fio-rand.dat"));
  absl::Cleanup remove_data = [&] {
    RemoveQuietly(root);
    RemoveQuietly(fio_file);
  };
  DiskTier::Options tier_options = RebuildTierOptions(root, options.files, kPayloadBytes);
  tier_options.recovery_threads = options.recovery_threads;

  // Each Write syncs its file and its folder: several writers overlap those waits.
  double create_seconds = 0;
  {
    CAKE_ASSIGN_OR_RETURN(auto tier, DiskTier::Open(tier_options));
    std::atomic<uint64_t> next{0};
    std::mutex error_mu;
    absl::Status error;
    const Clock::time_point start = Clock::now();
    std::vector<std::thread> writers;
    for (uint32_t t = 0; t < options.writers; ++t) {
      writers.emplace_back([&] {
        std::vector<std::byte> payload(kPayloadBytes);
        for (uint64_t i = next++; i < options.files; i = next++) {
          std::memcpy(payload.data(), &i, sizeof i);
          if (absl::Status s = tier->Write(RebuildKey(i), payload); !s.ok()) {
            std::lock_guard lock(error_mu);
            if (error.ok()) error = s;
            next = options.files;
          }
        }
      });
    }
    for (std::thread& w : writers) w.join();
    if (!error.ok()) return error;
    create_seconds = SecondsSince(start);
  }

  // Cold: page cache, dentries and inodes dropped before each open, so every folder and header comes from disk.
  // Each run opens the tier twice and starts caked twice on the same root: after a crash (no clean-stop index:
  // every header is read) and after a clean stop (the index the previous close wrote). fio measures the disk's
  // small-read latency in the same run, so a slow spell of the shared disk shows in all of them.
  const std::vector<std::string> caked_args = {"--disk-root", root.string(), "--disk-capacity-mib",
                                               absl::StrCat(tier_options.capacity_bytes / kMiB + 1)};
  const fs::path index_path = root / std::string(kChunkLayoutFolder) / std::string(kCleanStopIndexName);
  const auto crash = [&] {  // what a crash leaves: the files without an index
    std::error_code ec;
    fs::remove(index_path, ec);
  };
  const bool with_fio = OnPath("fio");
  bool cache_dropped = true;
  std::vector<double> open_s, recovery_s, clean_open_s, caked_s, caked_recovery_s, caked_clean_s,
      caked_clean_recovery_s, fio_lat_us, fio_parallel_iops;
  const auto timed_open = [&](bool clean, std::vector<double>& wall_s, std::vector<double>* rebuild_s) -> absl::Status {
    if (!clean) crash();
    cache_dropped = DropPageCache() && cache_dropped;
    const Clock::time_point start = Clock::now();
    auto tier = DiskTier::Open(tier_options);
    const double wall = SecondsSince(start);
    if (!tier.ok()) return tier.status();
    const RecoveryStats& r = (*tier)->recovery();
    if (r.chunks_recovered != options.files || r.clean_stop_index_used != clean ||
        (clean && r.chunks_trusted_from_index != options.files)) {
      return absl::InternalError(absl::StrCat("DiskTier::Open recovered ", r.chunks_recovered, " of ", options.files,
                                              " chunk files, ", r.chunks_trusted_from_index,
                                              " from the clean-stop index; expected ", clean ? "all" : "none"));
    }
    wall_s.push_back(wall);
    if (rebuild_s != nullptr) rebuild_s->push_back(std::chrono::duration<double>(r.duration).count());
    return absl::OkStatus();  // closing the tier writes the index the clean open reads
  };
  const auto timed_caked = [&](bool clean, std::vector<double>& wall_s, std::vector<double>& logged_s) -> absl::Status {
    if (!clean) crash();
    cache_dropped = DropPageCache() && cache_dropped;
    const Clock::time_point spawn = Clock::now();
    auto daemon = SpawnedDaemon::Start(SpawnedDaemon::SiblingCakedPath(), caked_args, kCakedStartLimit);
    const double spawn_wall = SecondsSince(spawn);
    if (daemon.ok()) {
      auto logged = LoggedDiskRecovery(daemon->log());
      const bool used_index = daemon->log().find("from the clean-stop index") != std::string::npos;
      if (!logged || logged->first != options.files || used_index != clean) {
        return absl::InternalError(absl::StrCat("caked did not log recovering ", options.files, " chunks ",
                                                clean ? "from" : "without", " the clean-stop index; its log:\n",
                                                daemon->log()));
      }
      wall_s.push_back(spawn_wall);
      logged_s.push_back(logged->second);
      if (daemon->Stop() != 0) return absl::InternalError("caked did not stop cleanly: " + daemon->log());
    } else if (daemon.status().code() == absl::StatusCode::kDeadlineExceeded) {
      // A start-up slower than kCakedStartLimit is a figure too ("over the limit"), not a failure.
      wall_s.push_back(std::numeric_limits<double>::infinity());
      logged_s.push_back(std::numeric_limits<double>::infinity());
    } else {
      return daemon.status();
    }
    return absl::OkStatus();
  };
  for (uint32_t run = 0; run < options.runs; ++run) {
    // Each clean start reads the index the close before it wrote; the crash start goes last, as a daemon that
    // misses its start limit is killed and writes none.
    CAKE_RETURN_IF_ERROR(timed_open(false, open_s, &recovery_s));
    CAKE_RETURN_IF_ERROR(timed_open(true, clean_open_s, nullptr));
    CAKE_RETURN_IF_ERROR(timed_caked(true, caked_clean_s, caked_clean_recovery_s));
    CAKE_RETURN_IF_ERROR(timed_caked(false, caked_s, caked_recovery_s));

    if (with_fio) {
      // One header read per file: fio's 4 KiB random reads at queue depth 1 show one read's latency, and the same
      // reads from 16 jobs at once the floor that reading headers in parallel can reach.
      CAKE_ASSIGN_OR_RETURN(
          auto qd1, RunFioJob(fio_file, {"--rw=randread", "--bs=4k", "--iodepth=1", "--ioengine=psync", "--direct=1",
                                         "--size=256M", "--runtime=3", "--time_based"}));
      CAKE_ASSIGN_OR_RETURN(auto lat_ns, FioFigure(qd1, "read", "lat_ns", "mean"));
      fio_lat_us.push_back(lat_ns / 1000);
      CAKE_ASSIGN_OR_RETURN(
          auto parallel,
          RunFioJob(fio_file, {"--rw=randread", "--bs=4k", "--iodepth=1", "--ioengine=psync", "--direct=1",
                               "--size=256M", "--runtime=3", "--time_based", "--numjobs=16", "--group_reporting"}));
      CAKE_ASSIGN_OR_RETURN(auto iops, FioFigure(parallel, "read", "", "iops"));
      fio_parallel_iops.push_back(iops);
    }
    std::printf(
        "  run %u: DiskTier::Open after a crash %.2f s, after a clean stop %.2f s; caked start %.2f / %.2f s%s\n",
        run + 1, open_s.back(), clean_open_s.back(), caked_s.back(), caked_clean_s.back(),
        with_fio ? absl::StrCat("; fio 4 KiB random read at QD1 ", absl::SixDigits(fio_lat_us.back()),
                                " us mean, 16 jobs ", absl::SixDigits(fio_parallel_iops.back()), " IOPS")
                       .c_str()
                 : "");
    std::fflush(stdout);
  }
  // Warm, for comparison: the same open right after the others shows how much of the cold time is metadata.
  double warm_open_s = 0;
  {
    crash();
    const Clock::time_point start = Clock::now();
    auto tier = DiskTier::Open(tier_options);
    warm_open_s = SecondsSince(start);
    if (!tier.ok()) return tier.status();
  }

  const double rebuild = Median(open_s);
  const auto seconds_or_over = [](double s) {
    return std::isfinite(s) ? absl::StrFormat("%.3f", s) : absl::StrCat("> ", kCakedStartLimit.count());
  };
  const auto runs_or_over = [&](const std::vector<double>& v) {
    return absl::StrJoin(v, ", ", [&](std::string* out, double s) { out->append(seconds_or_over(s)); });
  };
  std::printf("cake-bench rebuild: %llu chunk files of %llu KiB payload at %s (created in %.1f s by %u writers)\n",
              static_cast<unsigned long long>(options.files), static_cast<unsigned long long>(kPayloadBytes >> 10),
              root.string().c_str(), create_seconds, options.writers);
  std::printf("  page cache %s; %u header readers in process\n",
              cache_dropped ? "dropped before every cold open" : "NOT dropped (needs root)", options.recovery_threads);
  std::printf("  %-52s %10s   %s\n", "seconds", "median", "runs");
  std::printf("  %-52s %10.3f   %s\n", "DiskTier::Open after a crash, cold (wall)", rebuild, JoinRuns(open_s).c_str());
  std::printf("  %-52s %10.3f   %s\n", "  of which index rebuild (RecoveryStats)", Median(recovery_s),
              JoinRuns(recovery_s).c_str());
  std::printf("  %-52s %10.3f   %s\n", "DiskTier::Open after a clean stop, cold (wall)", Median(clean_open_s),
              JoinRuns(clean_open_s).c_str());
  std::printf("  %-52s %10.3f\n", "DiskTier::Open after a crash, warm (wall)", warm_open_s);
  std::printf("  %-52s %10s   %s\n", "caked start until Ping answers, after a crash",
              seconds_or_over(Median(caked_s)).c_str(), runs_or_over(caked_s).c_str());
  std::printf("  %-52s %10s   %s\n", "  of which index rebuild (caked's log)",
              seconds_or_over(Median(caked_recovery_s)).c_str(), runs_or_over(caked_recovery_s).c_str());
  std::printf("  %-52s %10s   %s\n", "caked start until Ping answers, after a clean stop",
              seconds_or_over(Median(caked_clean_s)).c_str(), runs_or_over(caked_clean_s).c_str());
  std::printf("  %-52s %10s   %s\n", "  of which index rebuild (caked's log)",
              seconds_or_over(Median(caked_clean_recovery_s)).c_str(), runs_or_over(caked_clean_recovery_s).c_str());
  double floor_s = 0;
  if (with_fio) {
    const double lat = Median(fio_lat_us);
    floor_s = static_cast<double>(options.files) / Median(fio_parallel_iops);
    std::printf("  fio 4 KiB random reads, QD1: %.1f us mean (runs %s): %llu files x 1 read = %.2f s\n", lat,
                JoinRuns(fio_lat_us).c_str(), static_cast<unsigned long long>(options.files),
                lat * 1e-6 * static_cast<double>(options.files));
    std::printf("  fio 4 KiB random reads, 16 jobs at QD1: %.0f IOPS (runs %s): %llu reads = %.2f s\n",
                Median(fio_parallel_iops), JoinRuns(fio_parallel_iops).c_str(),
                static_cast<unsigned long long>(options.files), floor_s);
    std::printf("  after a crash / that floor: %.2fx (goal: at most 1.1x); after a clean stop / it: %.2fx\n",
                rebuild / floor_s, Median(clean_open_s) / floor_s);
  } else {
    std::printf("  fio is not on PATH (apt-get install -y fio): no disk latency beside the rebuild\n");
  }
  if (options.files <= 100000) {
    std::printf("  rebuild after a crash %.2f s (goal: under 5 s for 100,000 files) -> %s\n", rebuild,
                rebuild < 5 ? "met" : "MISSED");
  }

  JsonReport report;
  report.Set("rebuild_s", rebuild);
  report.Set("clean_open_s", Median(clean_open_s));
  report.Set("files", static_cast<double>(options.files));
  report.Set("goal_s", 5.0);
  report.Set("recovery_s", Median(recovery_s));
  report.Set("warm_open_s", warm_open_s);
  report.Set("caked_start_s", Median(caked_s));  // null: over kCakedStartLimit
  report.Set("caked_recovery_s", Median(caked_recovery_s));
  report.Set("caked_clean_start_s", Median(caked_clean_s));
  report.Set("caked_clean_recovery_s", Median(caked_clean_recovery_s));
  for (size_t i = 0; i < open_s.size(); ++i) {
    report.Set(absl::StrCat("rebuild_s_", i + 1), open_s[i]);
    report.Set(absl::StrCat("clean_open_s_", i + 1), clean_open_s[i]);
    report.Set(absl::StrCat("caked_start_s_", i + 1), caked_s[i]);
    report.Set(absl::StrCat("caked_clean_start_s_", i + 1), caked_clean_s[i]);
  }
  if (with_fio) {
    report.Set("fio_randread_4k_qd1_lat_us", Median(fio_lat_us));
    report.Set("fio_randread_4k_16jobs_iops", Median(fio_parallel_iops));
    report.Set("rebuild_over_floor", rebuild / floor_s);
  }
  report.Set("recovery_threads", static_cast<double>(options.recovery_threads));
  report.Set("create_s", create_seconds);
  report.Set("payload_bytes", static_cast<double>(kPayloadBytes));
  report.Set("page_cache_dropped", cache_dropped ? 1.0 : 0.0);
  return report.WriteTo(options.json_path);
}

void AddRebuildCommand(CLI::App& app) {
  auto options = std::make_shared<RebuildBenchOptions>();
  CLI::App* command = app.add_subcommand(
      "rebuild", "start-up index rebuild over many chunk files (DiskTier::Open and caked), cold page cache");
  command->add_option("--dir", options->dir, "folder for the bench's files")->required();
  command->add_option("--json", options->json_path, "also write the results to this file as one JSON object");
  command->add_option("--files", options->files, "chunk files to create")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{10000000}));
  command->add_option("--runs", options->runs, "measured opens of each kind")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100u));
  command->add_option("--writers", options->writers, "threads creating the files")
      ->capture_default_str()
      ->check(CLI::Range(1u, 256u));
  command
      ->add_option("--recovery-threads", options->recovery_threads,
                   "header readers of the in-process opens after a crash (caked keeps its default)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1024u));
  RunWhenParsed(command, options, RunRebuildBench);
}

// ---- cake-bench store ----

namespace {

// The disk tier's write path alone, in this process: one thread (like the daemon's one write-back thread)
// writes every chunk from a touched buffer through DiskTier::Write into a fresh root.
// DiskTier::Write of every chunk from `threads` threads, each taking the next chunk, as the write-back does.
absl::StatusOr<double> TimedInProcessWrite(const Prefix& p, const fs::path& root, const std::byte* buffer,
                                           uint32_t threads) {
  DiskTier::Options o;
  o.root = root;
  o.capacity_bytes = 2 * p.bytes;
  CAKE_ASSIGN_OR_RETURN(auto disk, DiskTier::Open(o));
  CAKE_ASSIGN_OR_RETURN(auto layout, Namespace::Create(p.ns));
  const std::vector<ChunkKey> keys = layout.KeysForTokens(p.tokens);
  // Read just before the timed writes: memory left idle while the daemon ran is slow to touch again here.
  uint64_t sum = 0;
  for (uint64_t i = 0; i < p.bytes; i += 64) sum += static_cast<uint64_t>(buffer[i]);
  volatile uint64_t sink = sum;
  (void)sink;
  std::atomic<uint32_t> next{0};
  std::mutex error_mu;
  absl::Status error;
  const Clock::time_point start = Clock::now();
  {
    std::vector<std::jthread> writers;
    for (uint32_t t = 0; t < threads; ++t) {
      writers.emplace_back([&] {
        for (uint32_t c; (c = next++) < p.chunks;) {
          absl::Status s = disk->Write(keys[c], {buffer + uint64_t{c} * p.chunk_bytes, p.chunk_bytes});
          if (!s.ok()) {
            std::lock_guard lock(error_mu);
            if (error.ok()) error = s;
          }
        }
      });
    }
  }
  CAKE_RETURN_IF_ERROR(error);
  return SecondsSince(start);
}

}  // namespace

absl::Status RunStoreBench(const StoreBenchOptions& options) {
  QuietStorageLog();
  CAKE_RETURN_IF_ERROR(RequireFio());
  CAKE_ASSIGN_OR_RETURN(auto prefix, MakePrefix(options.mib, 768));
  const Prefix& p = prefix;
  CAKE_ASSIGN_OR_RETURN(auto root, FreshPath(options.dir, "cake-store"));
  CAKE_ASSIGN_OR_RETURN(auto fio_file, FreshPath(options.dir, "fio-write.dat"));
  absl::Cleanup remove_data = [&] {
    RemoveQuietly(root);
    RemoveQuietly(fio_file);
  };
  // DRAM holds the whole prefix and the write-back queue (1 GiB by default) takes every chunk, as in a daemon
  // sized for its working set: the figure is the disk's, not an overflow path's.
  CAKE_ASSIGN_OR_RETURN(auto config_file, FreshPath(options.dir, "cake-store.toml"));
  absl::Cleanup remove_config = [&] { RemoveQuietly(config_file); };
  {
    std::ofstream config(config_file);
    config << "[writeback]\nthreads = " << options.write_back_threads << "\n";
    if (options.dram_prefault) config << "[dram]\nprefault = true\n";
    if (!config) return absl::UnavailableError(absl::StrCat("cannot write ", config_file.string()));
  }
  const std::vector<std::string> daemon_args = {"--config",
                                                config_file.string(),
                                                "--disk-root",
                                                root.string(),
                                                "--disk-capacity-mib",
                                                absl::StrCat(2 * (p.bytes >> 20)),
                                                "--dram-capacity-mib",
                                                absl::StrCat((p.bytes >> 20) + 256)};

  std::vector<double> store_gbps, call_s, total_s, fio_gbps, fio_synced_gbps, alone_gbps;
  HostBuffer host(static_cast<std::byte*>(std::aligned_alloc(4096, p.bytes)));
  if (!host) return absl::ResourceExhaustedError("cannot allocate the in-process write buffer");
  for (uint32_t c = 0; c < p.chunks; ++c)
    FillChunkPattern({host.get() + uint64_t{c} * p.chunk_bytes, p.chunk_bytes}, c);
  for (uint32_t run = 0; run < options.runs; ++run) {
    {
      CAKE_ASSIGN_OR_RETURN(auto target, OpenDaemon("", daemon_args));
      CAKE_ASSIGN_OR_RETURN(auto region, RegisterFilledRegion(*target.client, p));
      absl::Cleanup release_region = [&] { target.client->ReleaseRegion(region).IgnoreError(); };
      const Clock::time_point start = Clock::now();
      CAKE_RETURN_IF_ERROR(StoreAll(*target.client, p, region));
      call_s.push_back(SecondsSince(start));
      CAKE_RETURN_IF_ERROR(WaitForCounter(*target.client, "tier_disk_chunks", p.chunks, kWriteBackStall));
      total_s.push_back(SecondsSince(start));
      store_gbps.push_back(GigabytesPerSecond(p.bytes, total_s.back()));
    }
    RemoveQuietly(root);
    CAKE_ASSIGN_OR_RETURN(auto alone, TimedInProcessWrite(p, root, host.get(), options.write_back_threads));
    alone_gbps.push_back(GigabytesPerSecond(p.bytes, alone));
    RemoveQuietly(root);
    // A fresh file each time: the tier writes new files too, and writing over allocated blocks is cheaper.
    RemoveQuietly(fio_file);
    ::sync();
    CAKE_ASSIGN_OR_RETURN(auto fio, RunFio(fio_file, "write", p.bytes >> 20));
    fio_gbps.push_back(fio / 1e9);
    RemoveQuietly(fio_file);
    ::sync();
    // The tier's durability: a sync after every 32 MiB, from as many writers as the write-back has threads.
    const uint64_t job_mib = std::max<uint64_t>((p.bytes >> 20) / options.write_back_threads, 32);
    CAKE_ASSIGN_OR_RETURN(
        auto synced_text,
        RunFioJob(fio_file, {"--rw=write", "--bs=1M", "--iodepth=32", "--ioengine=io_uring", "--direct=1",
                             "--fdatasync=32", absl::StrCat("--size=", job_mib, "M"),
                             absl::StrCat("--offset_increment=", job_mib, "M"),  // each job its own fresh blocks
                             absl::StrCat("--numjobs=", options.write_back_threads), "--group_reporting"}));
    CAKE_ASSIGN_OR_RETURN(auto synced, FioFigure(synced_text, "write", "", "bw_bytes"));
    fio_synced_gbps.push_back(synced / 1e9);
    RemoveQuietly(fio_file);
    std::printf(
        "  run %u: Store returned after %.2f s, all on disk after %.2f s: %.3f GB/s; DiskTier::Write in "
        "process %.3f GB/s; fio write %.3f GB/s, synced per 32 MiB %.3f GB/s\n",
        run + 1, call_s.back(), total_s.back(), store_gbps.back(), alone_gbps.back(), fio_gbps.back(),
        fio_synced_gbps.back());
    std::fflush(stdout);
  }

  const double store = Median(store_gbps), fio = Median(fio_gbps);
  std::printf(
      "cake-bench store: %u chunks of %llu MiB (llama3.1-8b layout, %llu MiB) stored, then written back to "
      "%s\n",
      p.chunks, static_cast<unsigned long long>(p.chunk_bytes >> 20), static_cast<unsigned long long>(p.bytes >> 20),
      root.string().c_str());
  std::printf("  %-44s %10s   %s\n", "", "median", "runs");
  std::printf("  %-44s %10.3f   %s\n", "Store call returned (s)", Median(call_s), JoinRuns(call_s).c_str());
  std::printf("  %-44s %10.3f   %s\n", "every chunk on disk (s)", Median(total_s), JoinRuns(total_s).c_str());
  std::printf("  %-44s %10.3f   %s\n", "Store to disk, GB/s (1e9 bytes/s)", store, JoinRuns(store_gbps).c_str());
  std::printf("  %-44s %10.3f   %s\n",
              absl::StrCat("DiskTier::Write in process, ", options.write_back_threads, " threads, GB/s").c_str(),
              Median(alone_gbps), JoinRuns(alone_gbps).c_str());
  std::printf("  %-44s %10.3f   %s\n", "fio write, bs 1M, iodepth 32, io_uring, GB/s", fio, JoinRuns(fio_gbps).c_str());
  std::printf("  %-44s %10.3f   %s\n",
              absl::StrCat("  the same, fdatasync per 32 MiB, ", options.write_back_threads, " jobs").c_str(),
              Median(fio_synced_gbps), JoinRuns(fio_synced_gbps).c_str());
  std::printf("  store / fio write = %.0f%%; store / fio synced = %.0f%% (writeback.threads %u, dram.prefault %s)\n",
              100 * store / fio, 100 * store / Median(fio_synced_gbps), options.write_back_threads,
              options.dram_prefault ? "true" : "false");

  JsonReport report;
  report.Set("store_gbps", store);
  report.Set("fio_write_gbps", fio);
  report.Set("ratio", store / fio);
  report.Set("fio_synced_write_gbps", Median(fio_synced_gbps));
  report.Set("ratio_synced", store / Median(fio_synced_gbps));
  report.Set("write_back_threads", static_cast<double>(options.write_back_threads));
  report.Set("dram_prefault", options.dram_prefault ? 1.0 : 0.0);
  report.Set("disk_tier_write_inprocess_gbps", Median(alone_gbps));
  report.Set("store_call_s", Median(call_s));
  report.Set("store_total_s", Median(total_s));
  report.Set("units", std::string("GB/s = 1e9 bytes per second"));
  for (size_t i = 0; i < store_gbps.size(); ++i) {
    report.Set(absl::StrCat("store_gbps_", i + 1), store_gbps[i]);
    report.Set(absl::StrCat("fio_write_gbps_", i + 1), fio_gbps[i]);
    report.Set(absl::StrCat("fio_synced_write_gbps_", i + 1), fio_synced_gbps[i]);
    report.Set(absl::StrCat("disk_tier_write_inprocess_gbps_", i + 1), alone_gbps[i]);
  }
  report.Set("bytes", static_cast<double>(p.bytes));
  report.Set("runs", options.runs);
  return report.WriteTo(options.json_path);
}

void AddStoreCommand(CLI::App& app) {
  auto options = std::make_shared<StoreBenchOptions>();
  CLI::App* command = app.add_subcommand(
      "store", "Store throughput until write-back has every chunk on disk, beside fio's direct write");
  command->add_option("--dir", options->dir, "folder for the bench's data (on the disk to measure)")->required();
  command->add_option("--json", options->json_path, "also write the results to this file as one JSON object");
  command->add_option("--mib", options->mib, "bytes to store, in MiB (whole 32 MiB chunks)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{32}, uint64_t{1} << 20));
  command->add_option("--runs", options->runs, "measured runs of each")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100u));
  command
      ->add_option("--write-back-threads", options->write_back_threads,
                   "caked's writeback.threads, the in-process writer threads and fio's synced jobs")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  command->add_flag("--dram-prefault", options->dram_prefault,
                    "start caked with dram.prefault, so first touches of the DRAM tier are not timed");
  RunWhenParsed(command, options, RunStoreBench);
}

}  // namespace cake::bench
