#include "testing/child_process.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace cake {

absl::StatusOr<ChildProcess> ChildProcess::Start(const Options& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("ChildProcess needs a program");
  // Everything the child needs is prepared before fork: between fork and exec only async-signal-safe calls are
  // allowed, since another thread may have held the allocator's lock at the fork.
  std::vector<std::string> args = options.argv;
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  int output_fd = -1;
  if (!options.output_path.empty()) {
    output_fd = open(options.output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (output_fd < 0) {
      return absl::InternalError(absl::StrCat("open ", options.output_path, ": ", std::strerror(errno)));
    }
  }
  const pid_t parent = getpid();
  const int death_signal = options.parent_death_signal;
  // Signals stay blocked across the fork: one sent to the child before it execs (a test that stops it at once)
  // would otherwise run the parent's handlers there (Catch's, say, which allocate: a deadlock in a forked
  // child). The child resets every handler, then unblocks; a pending signal then acts by default.
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  const pid_t pid = fork();
  if (pid != 0) pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0) {
    const int err = errno;
    if (output_fd >= 0) close(output_fd);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(err)));
  }
  if (pid == 0) {
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &default_action, nullptr);
    // If the parent is already gone, the death signal would never come.
    prctl(PR_SET_PDEATHSIG, death_signal);
    if (getppid() != parent) _exit(126);
    if (output_fd >= 0) {
      dup2(output_fd, STDOUT_FILENO);
      dup2(output_fd, STDERR_FILENO);
    }
    // The child must not inherit the parent's other descriptors (a listening socket would outlive the parent's
    // close) nor the signals a parent blocks to wait on them.
    close_range(3, ~0U, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  if (output_fd >= 0) close(output_fd);
  ChildProcess child;
  child.pid_ = pid;
  return child;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept { *this = std::move(other); }

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    Signal(SIGTERM);
    pid_ = std::exchange(other.pid_, -1);
    exit_status_ = other.exit_status_;
  }
  return *this;
}

ChildProcess::~ChildProcess() { Signal(SIGTERM); }

void ChildProcess::Reaped(int wait_status) {
  pid_ = -1;
  exit_status_ = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
}

std::optional<int> ChildProcess::Poll() {
  if (pid_ <= 0) return exit_status_;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) != pid_) return std::nullopt;
  Reaped(status);
  return exit_status_;
}

int ChildProcess::Signal(int sig) {
  if (pid_ <= 0) return exit_status_;
  kill(pid_, sig);
  return Wait();
}

int ChildProcess::Wait() {
  if (pid_ <= 0) return exit_status_;
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0) {
    if (errno != EINTR) {  // not our child any more (cannot happen unless someone else reaped it)
      pid_ = -1;
      return exit_status_;
    }
  }
  Reaped(status);
  return exit_status_;
}

absl::StatusOr<int> RunToCompletion(const std::vector<std::string>& argv, const std::string& output_path) {
  CAKE_ASSIGN_OR_RETURN(auto child, ChildProcess::Start({argv, output_path, SIGTERM}));
  return child.Wait();
}

}  // namespace cake
