// What every cake-bench subcommand shares: reaching a daemon (a running one or a private one), timing,
// percentiles, the JSON report, synthetic prompts and the KV byte pattern that lets a bench check loaded bytes.
// The pieces cake-demo needs too live in examples/harness; the benches name them as their own.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "examples/harness/harness.h"

namespace cake::bench {

using harness::CheckChunkPattern;
using harness::Clock;
using harness::DaemonTarget;
using harness::FillChunkPattern;
using harness::JsonReport;
using harness::PreciseSleepUntil;
using harness::ReadWholeFile;
using harness::RemoveQuietly;
using harness::ScratchDir;
using harness::SecondsSince;
using harness::SyntheticPrompt;
using harness::TokensPrompt;
using harness::WaitForCounter;

// The benches' client id in the daemon's sessions and stats.
inline constexpr char kClientId[] = "cake-bench";

// Connects to `socket_path`, or, when it is empty, starts caked from next to cake-bench with `spawn_args` and
// connects to that.
inline absl::StatusOr<DaemonTarget> OpenDaemon(const std::string& socket_path,
                                               const std::vector<std::string>& spawn_args) {
  return harness::OpenDaemon(socket_path, spawn_args, kClientId);
}

double MicrosecondsSince(Clock::time_point start);

// The p-th percentile (0 to 100) of `samples`, nearest rank; 0 for no samples.
double Percentile(std::vector<double> samples, double p);
double Median(std::vector<double> samples);
double Max(const std::vector<double>& samples);
double Mean(const std::vector<double>& samples);  // 0 for no samples

// A bench folder `name` under `dir` (created if needed) that the bench creates and removes itself (RemoveQuietly);
// one that already exists is refused, never touched.
absl::StatusOr<std::filesystem::path> FreshPath(const std::string& dir, const std::string& name);

// Whether `program` is an executable in a folder of $PATH.
bool OnPath(const std::string& program);
// Runs a program (args[0], found on $PATH) with its stdout and stderr into `log`; returns its exit status.
absl::StatusOr<int> RunProgram(const std::vector<std::string>& args, const std::filesystem::path& log);

// Checks one loaded chunk's bytes; the default is the KV byte pattern (CheckChunkPattern).
using ChunkCheck = std::function<absl::Status(std::span<const std::byte> bytes, uint32_t chunk)>;

// One I/O-only load of `chunks` chunks into options.region (a region is required; its window is zeroed first),
// timed from Start to Done; every chunk is then checked (against its pattern, or by `check`) and the load
// released. Returns the seconds.
absl::StatusOr<double> TimedIoOnlyLoad(Client& client, const LoadOptions& options, uint32_t chunks,
                                       uint64_t chunk_bytes, const ChunkCheck& check = nullptr);

// Gigabytes (1e9 bytes) per second.
double GigabytesPerSecond(uint64_t bytes, double seconds);

// User plus system CPU seconds of process `pid` so far (/proc/<pid>/stat): a daemon's own cost, whatever its
// callers measure.
absl::StatusOr<double> ProcessCpuSeconds(pid_t pid);

// Writes back dirty pages, then drops the page cache, dentries and inodes (needs root; false without). The disk
// tier and fio both use O_DIRECT, so the data itself bypasses the cache either way; what the drop makes cold is
// metadata.
bool DropPageCache();

// What caked logged of its disk tier's start-up ("recovered N chunks (B bytes) in X ms"): the chunks and the
// seconds, or nullopt.
std::optional<std::pair<uint64_t, double>> LoggedDiskRecovery(const std::string& log);

}  // namespace cake::bench
