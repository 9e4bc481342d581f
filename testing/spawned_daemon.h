// Starts a private caked as a child process on a temporary socket, and stops it (SIGTERM, then waits for it).
// Used by the integration tests, cake-bench and the demo, so each drives a real daemon.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "testing/child_process.h"

namespace cake {

class SpawnedDaemon {
 public:
  // Runs `caked_path` with --run-dir <fresh temporary folder> plus extra_args (which may name another
  // --socket), and waits until it answers Ping (DEADLINE_EXCEEDED after `start_timeout`: a daemon that
  // prefaults a large DRAM tier or rebuilds a large disk index takes longer). Its output goes to
  // <run dir>/caked.log.
  static absl::StatusOr<SpawnedDaemon> Start(const std::string& caked_path,
                                             const std::vector<std::string>& extra_args = {},
                                             std::chrono::seconds start_timeout = std::chrono::seconds(20));

  SpawnedDaemon(SpawnedDaemon&& other) noexcept;
  SpawnedDaemon& operator=(SpawnedDaemon&& other) noexcept;
  SpawnedDaemon(const SpawnedDaemon&) = delete;
  SpawnedDaemon& operator=(const SpawnedDaemon&) = delete;
  ~SpawnedDaemon();  // Stop(), then removes the run folder

  const std::string& socket_path() const { return socket_path_; }
  const std::string& run_dir() const { return run_dir_; }
  pid_t pid() const { return child_.pid(); }
  std::string log() const;

  // SIGTERM and wait; returns the exit status (or 128 + signal). Idempotent.
  int Stop();
  // SIGKILL and wait: a crash, for recovery tests.
  void Kill();

  // caked next to the running executable (build/bin), for tools that live there too.
  static std::string SiblingCakedPath();

 private:
  SpawnedDaemon() = default;

  ChildProcess child_;
  std::string run_dir_;
  std::string socket_path_;
};

}  // namespace cake
