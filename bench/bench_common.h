// What every cake-bench subcommand shares: reaching a daemon (a running one or a private one), timing,
// percentiles, the JSON report, synthetic prompts and the KV byte pattern that lets a bench check loaded bytes.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "testing/spawned_daemon.h"

namespace cake::bench {

using Clock = std::chrono::steady_clock;

// A connected client, and the private daemon it talks to when the bench started one.
struct DaemonTarget {
  std::optional<SpawnedDaemon> spawned;  // declared first, so the client goes before the daemon stops
  std::unique_ptr<Client> client;
  std::string socket_path;
};

// Connects to `socket_path`, or, when it is empty, starts caked from next to this executable with
// `spawn_args` and connects to that.
absl::StatusOr<DaemonTarget> OpenDaemon(const std::string& socket_path, const std::vector<std::string>& spawn_args);

// Polls the daemon's counter `name` (cakectl stats) until it reaches `at_least`, e.g. tier_disk_chunks while the
// write-back runs. DEADLINE_EXCEEDED when the counter stays unchanged for `stall_timeout` (a slow disk that
// keeps moving is waited for).
absl::Status WaitForCounter(Client& client, const std::string& name, uint64_t at_least,
                            std::chrono::milliseconds stall_timeout);

double SecondsSince(Clock::time_point start);
double MicrosecondsSince(Clock::time_point start);

// Sleeps until `deadline` to within a few microseconds: the kernel sleep undershoots by a margin and a spin
// covers the rest, since timer slack and scheduling on a busy machine overshoot by far more than a chunk's
// precision needs.
void PreciseSleepUntil(Clock::time_point deadline);

// The p-th percentile (0 to 100) of `samples`, nearest rank; 0 for no samples.
double Percentile(std::vector<double> samples, double p);
double Median(std::vector<double> samples);
double Max(const std::vector<double>& samples);

// A flat JSON object written in insertion order; values are numbers or strings.
class JsonReport {
 public:
  void Set(const std::string& key, double value);
  void Set(const std::string& key, const std::string& value);
  // A value that is already JSON text (an array of objects, say).
  void SetRaw(const std::string& key, std::string json);
  // The object as JSON text.
  std::string ToString() const;
  // Writes the object to `path` (nothing when `path` is empty).
  absl::Status WriteTo(const std::string& path) const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;  // key, encoded value
};

// A prompt of `count` pseudo-random token ids; different seeds give different prompts (and different keys).
std::vector<uint32_t> SyntheticPrompt(size_t count, uint32_t seed);
inline PromptRef TokensPrompt(std::span<const uint32_t> tokens) { return PromptRef{tokens, {}}; }

// The KV bytes of chunk `chunk`: every 8-byte word is a mix of the chunk index and the word's position, so a
// chunk landing at the wrong offset, a stale or a torn chunk all fail the check.
void FillChunkPattern(std::span<std::byte> dst, uint32_t chunk);
// OK when `bytes` hold chunk `chunk`'s pattern; DATA_LOSS naming the first differing byte otherwise.
absl::Status CheckChunkPattern(std::span<const std::byte> bytes, uint32_t chunk);

// A bench folder `name` under `dir` (created if needed) that the bench creates and removes itself; one that already
// exists is refused, never touched.
absl::StatusOr<std::filesystem::path> FreshPath(const std::string& dir, const std::string& name);
void RemoveQuietly(const std::filesystem::path& path);

// A private folder under /tmp for a bench's files (a caked config, a tool's output), removed with everything in it
// when the object goes.
class ScratchDir {
 public:
  static absl::StatusOr<ScratchDir> Create(const std::string& name);  // /tmp/<name>-XXXXXX
  ScratchDir(ScratchDir&& other) noexcept : path_(std::exchange(other.path_, {})) {}
  ScratchDir& operator=(ScratchDir&&) = delete;
  ~ScratchDir() { RemoveQuietly(path_); }

  const std::filesystem::path& path() const { return path_; }
  // Writes `text` into <folder>/<name> and returns that file's path.
  std::string WriteFile(const std::string& name, const std::string& text) const;

 private:
  explicit ScratchDir(std::filesystem::path path) : path_(std::move(path)) {}
  std::filesystem::path path_;
};

// Whether `program` is an executable in a folder of $PATH.
bool OnPath(const std::string& program);
// Runs a program (args[0], found on $PATH) with its stdout and stderr into `log`; returns its exit status.
absl::StatusOr<int> RunProgram(const std::vector<std::string>& args, const std::filesystem::path& log);
// A file's whole content; empty when it cannot be read.
std::string ReadWholeFile(const std::filesystem::path& path);

// One I/O-only load of `chunks` chunks into options.region (a region is required; its window is zeroed first),
// timed from Start to Done; every chunk is then checked against its pattern and the load released. Returns the
// seconds.
absl::StatusOr<double> TimedIoOnlyLoad(Client& client, const LoadOptions& options, uint32_t chunks,
                                       uint64_t chunk_bytes);

// Gigabytes (1e9 bytes) per second.
double GigabytesPerSecond(uint64_t bytes, double seconds);

}  // namespace cake::bench
