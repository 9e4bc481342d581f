#include "testing/spawned_daemon.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
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
  // SIGTERM when the starting thread ends (a killed bench or test leaves no daemon behind), so the daemon still
  // removes its socket and regions.
  CAKE_ASSIGN_OR_RETURN(auto child, ChildProcess::Start({args, d.run_dir_ + "/caked.log", SIGTERM}));
  d.child_ = std::move(child);
  const auto deadline = std::chrono::steady_clock::now() + start_timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (d.child_.Poll().has_value()) {
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
    child_ = std::move(other.child_);  // stops the daemon this one held
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

int SpawnedDaemon::Stop() { return child_.Signal(SIGTERM); }
void SpawnedDaemon::Kill() { child_.Signal(SIGKILL); }

std::string SpawnedDaemon::SiblingCakedPath() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return (self.parent_path() / "caked").string();
}

}  // namespace cake
