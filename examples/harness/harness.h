// What cake-demo and the benches share to drive a real caked: reaching a daemon (a running one or a private one
// started from next to the executable), timing that keeps a simulated GPU on schedule, the JSON report, synthetic
// prompts, the KV byte pattern that lets a program check the bytes it loaded, and scratch folders. One library
// (cake_harness), so neither program copies the other's helpers.
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

namespace cake::harness {

using Clock = std::chrono::steady_clock;

// A connected client, and the private daemon it talks to when the program started one.
struct DaemonTarget {
  std::optional<SpawnedDaemon> spawned;  // declared first, so the client goes before the daemon stops
  std::unique_ptr<Client> client;
  std::string socket_path;
};

// Connects to `socket_path` as `client_id`, or, when it is empty, starts caked from next to this executable with
// `spawn_args` and connects to that.
absl::StatusOr<DaemonTarget> OpenDaemon(const std::string& socket_path, const std::vector<std::string>& spawn_args,
                                        const std::string& client_id);

// Polls the daemon's counter `name` (cakectl stats) until it reaches `at_least`, e.g. tier_disk_chunks while the
// write-back runs. DEADLINE_EXCEEDED when the counter stays unchanged for `stall_timeout` (a slow disk that
// keeps moving is waited for).
absl::Status WaitForCounter(Client& client, const std::string& name, uint64_t at_least,
                            std::chrono::milliseconds stall_timeout);

double SecondsSince(Clock::time_point start);

// Sleeps until `deadline` to within a few microseconds: the kernel sleep undershoots by a margin and a spin
// covers the rest, since timer slack and scheduling on a busy machine overshoot by far more than a chunk's
// precision needs.
void PreciseSleepUntil(Clock::time_point deadline);

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

// Removes `path` and everything under it, ignoring errors (nothing when `path` is empty).
void RemoveQuietly(const std::filesystem::path& path);

// A private folder under /tmp for a program's files (a caked config, a disk tier, a tool's output), removed with
// everything in it when the object goes.
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

// A file's whole content; empty when it cannot be read.
std::string ReadWholeFile(const std::filesystem::path& path);

}  // namespace cake::harness
