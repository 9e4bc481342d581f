// Socket discovery against a squatter (issue 31, row 4): a client follows this user's fallback socket only when its
// folder passes the daemon's rule (base/socket_folder.h), and otherwise prefers the system daemon. Folders are made
// in scratch parents shaped like /tmp (mode 1777) or /run (0755), never in the real /tmp/cake-<uid> or /run/cake.
// The cases that need another user (chown, cakectl run as uid 65534) need root, as the suite runs.
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_format.h"
#include "base/socket_folder.h"
#include "base/unique_fd.h"
#include "client/client.h"
#include "fixture.h"

namespace cake::testing {
namespace {

namespace fs = std::filesystem;

constexpr uid_t kNobody = 65534;

// A scratch folder with the given mode: 01777 stands for /tmp (anyone may create entries; the sticky bit keeps each
// user's own), 0755 for /run (only its owner creates entries).
class ScratchParent {
 public:
  explicit ScratchParent(mode_t mode) {
    char pattern[] = "/tmp/cake-discovery-XXXXXX";  // short: socket paths stay far below 107 bytes
    REQUIRE(mkdtemp(pattern) != nullptr);
    path_ = pattern;
    REQUIRE(chmod(path_.c_str(), mode) == 0);
  }
  ~ScratchParent() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  ScratchParent(const ScratchParent&) = delete;
  ScratchParent& operator=(const ScratchParent&) = delete;

  std::string operator/(std::string_view name) const { return path_ + "/" + std::string(name); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void MakeFolder(const std::string& path, mode_t mode) {
  REQUIRE(mkdir(path.c_str(), mode) == 0);
  REQUIRE(chmod(path.c_str(), mode) == 0);  // mkdir's mode passes through the umask
}

// A unix socket bound at `path` (and listening when asked): what a daemon, or a squatter posing as one, leaves.
UniqueFd BindSocket(const std::string& path, bool listening) {
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(fd.valid());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  REQUIRE(path.size() < sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, path.data(), path.size());
  REQUIRE(bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0);
  if (listening) REQUIRE(listen(fd.get(), 16) == 0);
  return fd;
}

// Whether a client connected to this listening socket (the connection waits in the backlog: nobody accepts).
bool SomeoneConnected(const UniqueFd& listener) {
  pollfd p{listener.get(), POLLIN, 0};
  return poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

bool RunningAsRoot() {
  if (geteuid() == 0) return true;
  WARN("not root: the cases with another user's folder need chown and are not run");
  return false;
}

bool Contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string MessageOf(const absl::Status& status) { return std::string(status.message()); }

// A /tmp-like parent holding this user's fallback folder (cake-own) and a /run-like one holding the system daemon's
// socket, as DefaultSocketCandidates() would name them.
struct Machine {
  ScratchParent tmp{01777};
  ScratchParent run{0755};
  std::string own_folder = tmp / "cake-own";
  DaemonSocketCandidates candidates{own_folder + "/caked.sock", run / "caked.sock"};

  UniqueFd StartSystemDaemon() { return BindSocket(candidates.system, false); }
};

TEST_CASE("socket discovery: this user's own socket in its own closed folder is used", "[socket-discovery]") {
  const mode_t mode = GENERATE(0700, 0750, 0755);  // others may read the folder: that only shows the socket's name
  Machine machine;
  UniqueFd system = machine.StartSystemDaemon();
  MakeFolder(machine.own_folder, mode);
  UniqueFd own = BindSocket(machine.candidates.own, false);
  auto choice = ChooseDaemonSocket(machine.candidates);
  REQUIRE(choice.ok());
  CHECK(choice->path == machine.candidates.own);
  CHECK(choice->skipped.empty());
}

TEST_CASE("socket discovery: without a socket of its own the client takes the system daemon's", "[socket-discovery]") {
  Machine machine;
  UniqueFd system = machine.StartSystemDaemon();
  SECTION("no folder") {}
  SECTION("a folder but no socket") { MakeFolder(machine.own_folder, 0700); }
  auto choice = ChooseDaemonSocket(machine.candidates);
  REQUIRE(choice.ok());
  CHECK(choice->path == machine.candidates.system);
  CHECK(choice->skipped.empty());  // nothing refused: there was simply nothing there
}

TEST_CASE("socket discovery: a fallback folder owned by another user is skipped for the system daemon",
          "[socket-discovery]") {
  if (!RunningAsRoot()) return;
  Machine machine;
  UniqueFd system = machine.StartSystemDaemon();
  MakeFolder(machine.own_folder, 0700);
  UniqueFd squatter = BindSocket(machine.candidates.own, false);
  REQUIRE(chown(machine.own_folder.c_str(), kNobody, kNobody) == 0);
  auto choice = ChooseDaemonSocket(machine.candidates);
  REQUIRE(choice.ok());
  CHECK(choice->path == machine.candidates.system);
  REQUIRE(choice->skipped.size() == 1);
  CHECK(Contains(choice->skipped[0], machine.own_folder + " belongs to another user (uid 65534)"));
  CHECK(Contains(choice->skipped[0], "CAKE_SOCKET"));  // what to do
}

TEST_CASE("socket discovery: a fallback folder other users can write to is skipped for the system daemon",
          "[socket-discovery]") {
  const mode_t mode = GENERATE(0770, 0702, 0777, 01777);
  Machine machine;
  UniqueFd system = machine.StartSystemDaemon();
  MakeFolder(machine.own_folder, mode);
  UniqueFd own = BindSocket(machine.candidates.own, false);
  auto choice = ChooseDaemonSocket(machine.candidates);
  REQUIRE(choice.ok());
  CHECK(choice->path == machine.candidates.system);
  REQUIRE(choice->skipped.size() == 1);
  CHECK(Contains(choice->skipped[0], "is open to other users"));
  CHECK(Contains(choice->skipped[0], absl::StrFormat("(mode %04o)", mode)));
}

TEST_CASE("socket discovery: a fallback folder that is a symbolic link is skipped for the system daemon",
          "[socket-discovery]") {
  Machine machine;
  UniqueFd system = machine.StartSystemDaemon();
  // The link leads to a folder that would pass on its own: the link itself is what another user could have made.
  const std::string target = machine.tmp / "elsewhere";
  MakeFolder(target, 0700);
  UniqueFd behind_link = BindSocket(target + "/caked.sock", false);
  REQUIRE(symlink(target.c_str(), machine.own_folder.c_str()) == 0);
  auto choice = ChooseDaemonSocket(machine.candidates);
  REQUIRE(choice.ok());
  CHECK(choice->path == machine.candidates.system);
  REQUIRE(choice->skipped.size() == 1);
  CHECK(Contains(choice->skipped[0], machine.own_folder + " is a symbolic link (to " + target + ")"));
}

TEST_CASE("socket discovery: a fallback that is not a socket is skipped for the system daemon", "[socket-discovery]") {
  Machine machine;
  UniqueFd system = machine.StartSystemDaemon();
  MakeFolder(machine.own_folder, 0700);
  std::string expected;
  SECTION("a regular file") {
    std::ofstream(machine.candidates.own) << "not a daemon";
    expected = "is a regular file, not a unix socket";
  }
  SECTION("a symbolic link to a socket") {
    const std::string real = machine.own_folder + "/real.sock";
    UniqueFd socket = BindSocket(real, false);
    REQUIRE(symlink(real.c_str(), machine.candidates.own.c_str()) == 0);
    expected = "is a symbolic link, not a unix socket";
  }
  SECTION("a folder") {
    MakeFolder(machine.candidates.own, 0700);
    expected = "is a folder, not a unix socket";
  }
  auto choice = ChooseDaemonSocket(machine.candidates);
  REQUIRE(choice.ok());
  CHECK(choice->path == machine.candidates.system);
  REQUIRE(choice->skipped.size() == 1);
  CHECK(Contains(choice->skipped[0], machine.candidates.own + " " + expected));
}

TEST_CASE("socket discovery: with nothing usable the error names each candidate and why", "[socket-discovery]") {
  Machine machine;
  SECTION("a refused fallback and no system daemon: FAILED_PRECONDITION, at once") {
    MakeFolder(machine.own_folder, 0777);
    UniqueFd own = BindSocket(machine.candidates.own, false);
    auto choice = ChooseDaemonSocket(machine.candidates);
    REQUIRE(absl::IsFailedPrecondition(choice.status()));
    const std::string message = MessageOf(choice.status());
    INFO(message);
    CHECK(Contains(message, machine.candidates.own + ": the socket folder " + machine.own_folder +
                                " is open to other users (mode 0777)"));
    CHECK(Contains(message, machine.candidates.system + ": no socket there"));
  }
  SECTION("a refused system socket") {
    std::ofstream(machine.candidates.system) << "not a daemon";
    auto choice = ChooseDaemonSocket(machine.candidates);
    REQUIRE(absl::IsFailedPrecondition(choice.status()));
    INFO(MessageOf(choice.status()));
    CHECK(Contains(MessageOf(choice.status()),
                   machine.candidates.own + ": the socket folder " + machine.own_folder + " does not exist"));
    CHECK(Contains(MessageOf(choice.status()), machine.candidates.system + " is a regular file, not a unix socket"));
  }
  SECTION("nothing there at all: UNAVAILABLE, the daemon may yet start") {
    auto choice = ChooseDaemonSocket(machine.candidates);
    REQUIRE(absl::IsUnavailable(choice.status()));
    INFO(MessageOf(choice.status()));
    CHECK(Contains(MessageOf(choice.status()), "no daemon answers"));
    CHECK(Contains(MessageOf(choice.status()), machine.candidates.own));
    CHECK(Contains(MessageOf(choice.status()), machine.candidates.system));
  }
}

TEST_CASE("socket folder rule: the daemon's rule, checked without changing anything", "[socket-discovery]") {
  ScratchParent tmp(01777);
  ScratchParent run(0755);
  const std::string remedy = "remove it or choose another server.run_dir";
  SECTION("missing: NOT_FOUND") {
    CHECK(absl::IsNotFound(CheckSocketFolder(tmp / "absent", remedy)));
    CHECK(absl::IsNotFound(CheckSocketFile(tmp / "absent.sock", remedy)));
  }
  SECTION("this user's closed folder passes, with or without a trailing slash") {
    MakeFolder(tmp / "mine", 0700);
    CHECK(CheckSocketFolder(tmp / "mine", remedy).ok());
    CHECK(CheckSocketFolder(tmp / "mine/", remedy).ok());
  }
  SECTION("outside a world-writable parent the group may write, every user only with the sticky bit") {
    MakeFolder(run / "cake", 0775);
    CHECK(CheckSocketFolder(run / "cake", remedy).ok());
    MakeFolder(run / "sticky", 01777);
    CHECK(CheckSocketFolder(run / "sticky", remedy).ok());
    MakeFolder(run / "open", 0777);  // any user who reaches it could replace the socket
    CHECK(absl::IsFailedPrecondition(CheckSocketFolder(run / "open", remedy)));
  }
  SECTION("a refusal names the folder, the problem and the remedy") {
    MakeFolder(tmp / "open", 0777);
    const absl::Status refused = CheckSocketFolder(tmp / "open", remedy);
    REQUIRE(absl::IsFailedPrecondition(refused));
    CHECK(MessageOf(refused) == "the socket folder " + (tmp / "open") +
                                    " is open to other users (mode 0777), who could replace the socket in it; " +
                                    remedy);
  }
  SECTION("a file where the folder should be") {
    std::ofstream(tmp / "file") << "x";
    CHECK(absl::IsFailedPrecondition(CheckSocketFolder(tmp / "file", remedy)));
  }
  if (!RunningAsRoot()) return;
  SECTION("another user's folder is refused in a world-writable parent and elsewhere") {
    for (const std::string& folder : {tmp / "theirs", run / "theirs"}) {
      MakeFolder(folder, 0700);
      REQUIRE(chown(folder.c_str(), kNobody, kNobody) == 0);
      const absl::Status refused = CheckSocketFolder(folder, remedy);
      REQUIRE(absl::IsFailedPrecondition(refused));
      CHECK(Contains(MessageOf(refused), folder + " belongs to another user (uid 65534)"));
    }
  }
}

// cakectl itself, run as another user (uid 65534) whose fallback folder ($XDG_RUNTIME_DIR/cake, in a /tmp-like
// parent) was made first by someone else (root here): it must not connect there, whether or not a system daemon runs.
TEST_CASE("socket discovery: cakectl run as another user never connects to a squatted fallback socket",
          "[socket-discovery]") {
  if (!RunningAsRoot()) return;
  if (std::system("command -v setpriv >/dev/null 2>&1") != 0) {
    WARN("setpriv (util-linux) is missing: cannot run cakectl as another user");
    return;
  }
  ScratchParent runtime_dir(01777);
  const std::string folder = runtime_dir / "cake";
  const std::string command = "env -u CAKE_SOCKET XDG_RUNTIME_DIR=" + runtime_dir.path() +
                              " setpriv --reuid=65534 --regid=65534 --clear-groups " + CAKE_CAKECTL_PATH + " ping";
  SECTION("a folder the user does not own: refused, named, not connected to") {
    MakeFolder(folder, 0755);
    UniqueFd squatter = BindSocket(folder + "/caked.sock", true);
    REQUIRE(chmod((folder + "/caked.sock").c_str(), 0777) == 0);  // a squatter lets anyone connect
    const CommandResult result = Run(command);
    INFO(result.output);
    CHECK_FALSE(SomeoneConnected(squatter));
    CHECK(Contains(result.output, "the socket folder " + folder + " belongs to another user (uid 0)"));
  }
  SECTION("the user's own closed folder: connected to") {
    MakeFolder(folder, 0700);
    UniqueFd own = BindSocket(folder + "/caked.sock", true);
    REQUIRE(chown(folder.c_str(), kNobody, kNobody) == 0);
    REQUIRE(chown((folder + "/caked.sock").c_str(), kNobody, kNobody) == 0);
    const CommandResult result = Run(command);  // no gRPC server behind it: exit 3 after Connect's wait
    INFO(result.output);
    CHECK(SomeoneConnected(own));
    CHECK(result.exit_code == 3);
  }
}

}  // namespace
}  // namespace cake::testing
