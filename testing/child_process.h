// One child process for the tests and benches: fork and exec with its output in a file, dying with the thread
// that started it, stopped by a signal and always waited for (PID 1 on these machines does not reap orphans).
// The only fork/exec in the project outside the daemon.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cake {

class ChildProcess {
 public:
  struct Options {
    std::vector<std::string> argv;  // argv[0] is looked up on PATH when it has no slash
    std::string output_path;        // stdout and stderr go here (truncated); empty: inherited
    // Sent to the child when the thread that started it ends (a crashed test leaves nothing behind): SIGTERM lets
    // a daemon clean up, SIGKILL is for servers that need no goodbye.
    int parent_death_signal = SIGTERM;
  };

  // INTERNAL when the output file cannot be opened or fork fails. A program that cannot be executed exits 127.
  static absl::StatusOr<ChildProcess> Start(const Options& options);

  ChildProcess() = default;  // no process
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();  // Signal(SIGTERM)

  pid_t pid() const { return pid_; }  // -1 once it has exited and been reaped
  bool running() const { return pid_ > 0; }
  // Without blocking: the exit status (or 128 + signal) once the child has exited, reaping it; nullopt while it
  // runs.
  std::optional<int> Poll();
  // Sends `sig` and waits for the child to exit; returns its exit status (or 128 + signal). Idempotent: once
  // it has exited, returns the status it had.
  int Signal(int sig);
  // Waits for the child to exit by itself.
  int Wait();

 private:
  void Reaped(int wait_status);

  pid_t pid_ = -1;
  int exit_status_ = -1;
};

// Runs a program to its end, its output in `output_path`; returns its exit status (127: it could not run).
absl::StatusOr<int> RunToCompletion(const std::vector<std::string>& argv, const std::string& output_path);

}  // namespace cake
