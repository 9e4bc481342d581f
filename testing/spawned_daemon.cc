#include "testing/spawned_daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/client.h"

namespace cake {

absl::StatusOr<SpawnedDaemon> SpawnedDaemon::Start(const std::string& caked_path,
                                                   const std::vector<std::string>& extra_args,
                                                   std::chrono::seconds start_timeout) {
  if (access(caked_path.c_str(), X_OK) != 0)
    return absl::NotFoundError(absl::StrCat("no executable caked at ", caked_path));
  char tmpl[] = "/tmp/cake-run-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp failed");
  SpawnedDaemon d;
  d.run_dir_ = tmpl;
  d.socket_path_ = d.run_dir_ + "/caked.sock";
  std::vector<std::string> args = {caked_path, "--run-dir", d.run_dir_};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  for (size_t i = 0; i + 1 < extra_args.size(); ++i) {
    if (extra_args[i] == "--socket") d.socket_path_ = extra_args[i + 1];  // an explicit socket wins
  }
  const std::string log_path = d.run_dir_ + "/caked.log";
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    // Stop with the thread that started us (a killed bench or test leaves no daemon behind); SIGTERM, so the daemon
    // still removes its socket and regions. If the parent is already gone, the signal would never come.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(126);
    int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    // The child must not inherit blocked signals from a parent that waits on them.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  d.pid_ = pid;
  const auto deadline = std::chrono::steady_clock::now() + start_timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      d.pid_ = -1;
      return absl::UnavailableError(absl::StrCat("caked exited during start-up:\n", d.log()));
    }
    if (access(d.socket_path_.c_str(), F_OK) == 0) {
      auto client = Client::Connect({d.socket_path_, "spawner"});
      if (client.ok() && (*client)->Ping().ok()) return d;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("caked did not answer within ", start_timeout.count(), " s:\n", d.log()));
}

SpawnedDaemon::SpawnedDaemon(SpawnedDaemon&& other) noexcept { *this = std::move(other); }

SpawnedDaemon& SpawnedDaemon::operator=(SpawnedDaemon&& other) noexcept {
  if (this != &other) {
    pid_ = std::exchange(other.pid_, -1);
    exit_status_ = other.exit_status_;
    run_dir_ = std::exchange(other.run_dir_, "");
    socket_path_ = std::exchange(other.socket_path_, "");
  }
  return *this;
}

SpawnedDaemon::~SpawnedDaemon() {
  Stop();
  if (!run_dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(run_dir_, ec);
  }
}

std::string SpawnedDaemon::log() const {
  std::ifstream in(run_dir_ + "/caked.log");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int SpawnedDaemon::Signal(int sig) {
  if (pid_ <= 0) return exit_status_;
  kill(pid_, sig);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return exit_status_;
}

int SpawnedDaemon::Stop() { return Signal(SIGTERM); }
void SpawnedDaemon::Kill() { Signal(SIGKILL); }

std::string SpawnedDaemon::SiblingCakedPath() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return (self.parent_path() / "caked").string();
}

}  // namespace cake
