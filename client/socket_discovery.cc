// Socket discovery: which daemon a client talks to when nobody names one, by the daemon's own folder rule
// (base/socket_folder.h), so a socket another user could have planted is never used.
#include "client/socket_discovery.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/socket_folder.h"
#include "base/status_macros.h"
#include "client/client.h"

namespace cake {
namespace {

constexpr char kSystemSocket[] = "/run/cake/caked.sock";

constexpr std::string_view kOwnSocketRemedy =
    "not used, since whoever controls it could pose as your daemon and receive your prompts: have it removed (by "
    "its owner or root) before starting your caked, or point CAKE_SOCKET or --socket at your daemon's socket";
constexpr std::string_view kSystemSocketRemedy =
    "not used: ask the administrator to check caked.service, or point CAKE_SOCKET or --socket at your daemon's socket";

// This user's own daemon's socket: OK to use, NOT_FOUND (no daemon of this user there), or FAILED_PRECONDITION
// (refused by the folder rule, or not a socket). The rule is the daemon's own (base/socket_folder.h): a folder the
// daemon would refuse to serve in is one another user could have made.
absl::Status JudgeOwnSocket(const std::string& path) {
  CAKE_RETURN_IF_ERROR(CheckSocketFolder(std::filesystem::path(path).parent_path().string(), kOwnSocketRemedy));
  absl::Status file = CheckSocketFile(path, kOwnSocketRemedy);
  return absl::IsNotFound(file) ? absl::NotFoundError("no socket there") : file;
}

// The system daemon's socket: only that it is a socket. Its folder (/run/cake) belongs to the unit's user, not to
// this one, and only root can create entries in /run, so no other user can have put it there.
absl::Status JudgeSystemSocket(const std::string& path) {
  absl::Status file = CheckSocketFile(path, kSystemSocketRemedy);
  return absl::IsNotFound(file) ? absl::NotFoundError("no socket there") : file;
}

}  // namespace

DaemonSocketCandidates DefaultSocketCandidates() {
  DaemonSocketCandidates candidates;
  candidates.system = kSystemSocket;
  if (geteuid() == 0) return candidates;  // root's daemon is the system one
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && *xdg != '\0') {
    candidates.own = absl::StrCat(xdg, "/cake/caked.sock");
  } else {
    candidates.own = absl::StrCat("/tmp/cake-", geteuid(), "/caked.sock");
  }
  return candidates;
}

absl::StatusOr<DaemonSocketChoice> ChooseDaemonSocket(const DaemonSocketCandidates& candidates) {
  std::vector<std::string> reasons;  // every candidate not used, and why
  DaemonSocketChoice choice;
  // Whether a candidate is usable; records why not.
  auto usable = [&](const std::string& path, const absl::Status& verdict) {
    if (verdict.ok()) return true;
    std::string reason = absl::StrCat(path, ": ", verdict.message());
    if (!absl::IsNotFound(verdict)) choice.skipped.push_back(reason);
    reasons.push_back(std::move(reason));
    return false;
  };
  // This user's own daemon first (it wins over the system one), the system daemon when the own one is absent or
  // fails the rule.
  if (!candidates.own.empty() && usable(candidates.own, JudgeOwnSocket(candidates.own))) {
    choice.path = candidates.own;
    return choice;
  }
  if (!candidates.system.empty() && usable(candidates.system, JudgeSystemSocket(candidates.system))) {
    choice.path = candidates.system;
    return choice;
  }
  if (reasons.empty()) return absl::UnavailableError("no daemon answers: no socket to look for");
  if (!choice.skipped.empty()) {
    // Waiting will not help: someone has to remove or fix what was refused.
    return absl::FailedPreconditionError(absl::StrCat("no usable daemon socket. ", absl::StrJoin(reasons, ". "), "."));
  }
  return absl::UnavailableError(absl::StrCat("no daemon answers: ", absl::StrJoin(reasons, "; "),
                                             " (is caked running? or point CAKE_SOCKET or --socket at its socket)"));
}

std::string DefaultSocketPath() {
  // An explicit socket is the user's choice and is taken as given, unchecked, as ClientOptions::socket_path is.
  if (const char* explicit_path = std::getenv("CAKE_SOCKET"); explicit_path != nullptr && *explicit_path != '\0') {
    return explicit_path;
  }
  const DaemonSocketCandidates candidates = DefaultSocketCandidates();
  absl::StatusOr<DaemonSocketChoice> choice = ChooseDaemonSocket(candidates);
  if (choice.ok()) return choice->path;
  // Nothing there at all: where this user's daemon would listen, as before. A refused path is never handed out.
  if (absl::IsUnavailable(choice.status()) && !candidates.own.empty()) return candidates.own;
  return candidates.system;
}

// The socket when the options name none. $CAKE_SOCKET is the user's choice and taken as given. Otherwise the
// candidates by the folder rule; while no socket exists at all (a daemon starting alongside this engine), looks again
// until `deadline`, the same wait Connect gives a daemon that has not yet started listening.
absl::StatusOr<std::string> FindDaemonSocket(std::chrono::system_clock::time_point deadline) {
  if (const char* explicit_path = std::getenv("CAKE_SOCKET"); explicit_path != nullptr && *explicit_path != '\0') {
    return std::string(explicit_path);
  }
  for (;;) {
    absl::StatusOr<DaemonSocketChoice> choice = ChooseDaemonSocket(DefaultSocketCandidates());
    if (choice.ok()) return std::move(choice->path);
    if (!absl::IsUnavailable(choice.status()) || std::chrono::system_clock::now() >= deadline) return choice.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace cake
