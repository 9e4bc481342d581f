// Socket discovery (DefaultSocketCandidates, ChooseDaemonSocket, DefaultSocketPath, on base/socket_folder.h's rule)
// against tests/golden/socket_choice.toml: the rows the Python client is checked against too
// (python/tests/test_golden_rules.py), so the rule cannot change in one language alone. Each [[choice]] row's layout
// is built in a scratch folder of its own; rows with another user's entries, or judged as another user, need root
// (chown, seteuid) and are skipped otherwise, with a warning.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "client/client.h"

namespace cake {
namespace {

constexpr uid_t kOtherOwner = 65534;   // an entry's owner "other"
constexpr uid_t kOtherViewer = 40000;  // viewer "other": neither root nor any entry's owner

toml::table Golden() { return toml::parse_file(CAKE_SOURCE_DIR "/tests/golden/socket_choice.toml"); }

std::string Text(const toml::table& row, const char* key) { return row[key].value_or(std::string()); }

std::vector<std::string> Texts(const toml::table& row, const char* key) {
  std::vector<std::string> out;
  if (const toml::array* a = row[key].as_array()) {
    for (const toml::node& n : *a) out.push_back(n.value_or(std::string()));
  }
  return out;
}

// Sets (or, with nullopt, unsets) an environment variable for the scope, and puts back what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::optional<std::string>& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Runs the scope as another effective uid (root only); root's comes back at its end, whatever happened.
class ScopedEffectiveUid {
 public:
  explicit ScopedEffectiveUid(uid_t uid) { REQUIRE(seteuid(uid) == 0); }
  ~ScopedEffectiveUid() { (void)seteuid(0); }
  ScopedEffectiveUid(const ScopedEffectiveUid&) = delete;
  ScopedEffectiveUid& operator=(const ScopedEffectiveUid&) = delete;
};

// A scratch folder (mode 0755: a viewer of another uid may look in), removed with all it holds.
class Scratch {
 public:
  Scratch() {
    char pattern[] = "/tmp/cake-golden-XXXXXX";  // short: socket paths stay far below 107 bytes
    REQUIRE(mkdtemp(pattern) != nullptr);
    path_ = pattern;
    REQUIRE(chmod(path_.c_str(), 0755) == 0);
  }
  ~Scratch() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);  // removes symbolic links, never what they lead to
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  std::string operator/(const std::string& relative) const { return path_ + "/" + relative; }

 private:
  std::string path_;
};

void BindSocket(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  REQUIRE(path.size() < sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int bound = bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  close(fd);  // the socket file stays
  REQUIRE(bound == 0);
}

// The row's entries, in order (socket_choice.toml says what each kind is).
void BuildLayout(const Scratch& root, const toml::table& row) {
  const toml::array* entries = row["entry"].as_array();
  REQUIRE(entries != nullptr);
  for (const toml::node& node : *entries) {
    const toml::table& entry = *node.as_table();
    const std::string path = root / Text(entry, "path");
    const std::string kind = Text(entry, "kind");
    const mode_t mode = static_cast<mode_t>(entry["mode"].value_or(int64_t{0}));
    if (kind == "folder") {
      REQUIRE(mkdir(path.c_str(), 0700) == 0);
      REQUIRE(chmod(path.c_str(), mode) == 0);  // mkdir's mode passes through the umask
    } else if (kind == "file") {
      std::ofstream(path).close();
      REQUIRE(chmod(path.c_str(), mode) == 0);
    } else if (kind == "socket") {
      BindSocket(path);
    } else if (kind == "symlink") {
      REQUIRE(symlink((root / Text(entry, "target")).c_str(), path.c_str()) == 0);
    } else {
      FAIL("unknown entry kind " << kind);
    }
    if (entry["owner"].value_or(std::string("self")) == "other") {
      REQUIRE(lchown(path.c_str(), kOtherOwner, kOtherOwner) == 0);
    }
  }
}

bool NeedsRoot(const toml::table& row) {
  if (row["viewer"].value_or(std::string("self")) != "self") return true;
  if (const toml::array* entries = row["entry"].as_array()) {
    for (const toml::node& node : *entries) {
      if ((*node.as_table())["owner"].value_or(std::string("self")) != "self") return true;
    }
  }
  return false;
}

bool Contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("socket choice: every [[candidates]] row of tests/golden/socket_choice.toml", "[client][golden]") {
  const toml::table file = Golden();
  const toml::array* rows = file["candidates"].as_array();
  REQUIRE(rows != nullptr);
  REQUIRE(rows->size() >= 4);
  for (const toml::node& node : *rows) {
    const toml::table& row = *node.as_table();
    INFO(Text(row, "name"));
    const uid_t euid = static_cast<uid_t>(row["euid"].value_or(int64_t{0}));
    if (euid != geteuid() && geteuid() != 0) {
      WARN("not root: a row of another uid needs seteuid and is not run: " << Text(row, "name"));
      continue;
    }
    const std::optional<std::string> xdg = row["xdg"].value<std::string>();
    ScopedEnv environment("XDG_RUNTIME_DIR", xdg);
    DaemonSocketCandidates candidates;
    if (euid == geteuid()) {
      candidates = DefaultSocketCandidates();
    } else {
      ScopedEffectiveUid as(euid);
      candidates = DefaultSocketCandidates();
    }
    CHECK(candidates.own == Text(row, "own"));
    CHECK(candidates.system == Text(row, "system"));
  }
}

TEST_CASE("socket choice: every [[choice]] row of tests/golden/socket_choice.toml", "[client][golden]") {
  const toml::table file = Golden();
  const toml::array* rows = file["choice"].as_array();
  REQUIRE(rows != nullptr);
  REQUIRE(rows->size() >= 20);
  for (const toml::node& node : *rows) {
    const toml::table& row = *node.as_table();
    INFO(Text(row, "name"));
    if (NeedsRoot(row) && geteuid() != 0) {
      WARN("not root: another user's entries, or another viewer, need root; not run: " << Text(row, "name"));
      continue;
    }
    Scratch root;
    BuildLayout(root, row);
    DaemonSocketCandidates candidates;
    candidates.own = Text(row, "own").empty() ? std::string() : root / Text(row, "own");
    candidates.system = root / Text(row, "system");
    std::optional<absl::StatusOr<DaemonSocketChoice>> choice;
    if (row["viewer"].value_or(std::string("self")) == "other") {
      ScopedEffectiveUid as(kOtherViewer);
      choice = ChooseDaemonSocket(candidates);
    } else {
      choice = ChooseDaemonSocket(candidates);
    }
    const std::vector<std::string> refused = Texts(row, "refused");
    if (const std::string expected = Text(row, "choice"); !expected.empty()) {
      REQUIRE(choice->ok());
      CHECK((*choice)->path == (expected == "own" ? candidates.own : candidates.system));
      REQUIRE((*choice)->skipped.size() == refused.size());
      for (size_t i = 0; i < refused.size(); ++i) {
        INFO((*choice)->skipped[i]);
        CHECK(Contains((*choice)->skipped[i], refused[i]));
      }
      continue;
    }
    const std::string error = Text(row, "error");
    REQUIRE_FALSE(choice->ok());
    const std::string message(choice->status().message());
    INFO(message);
    if (error == "unavailable") {
      CHECK(absl::IsUnavailable(choice->status()));
      CHECK(refused.empty());
    } else {
      CHECK(error == "failed_precondition");
      CHECK(absl::IsFailedPrecondition(choice->status()));
      CHECK_FALSE(refused.empty());
    }
    // The message names each candidate not used, in order; each refused one with the row's reason.
    size_t from = 0;
    for (const std::string& reason : refused) {
      const size_t at = message.find(reason, from);
      CHECK(at != std::string::npos);
      if (at != std::string::npos) from = at + reason.size();
    }
  }
}

TEST_CASE("socket choice: every [[explicit]] row of tests/golden/socket_choice.toml", "[client][golden]") {
  const toml::table file = Golden();
  const toml::array* rows = file["explicit"].as_array();
  REQUIRE(rows != nullptr);
  REQUIRE(rows->size() >= 2);
  std::string unset;
  {
    ScopedEnv environment("CAKE_SOCKET", std::nullopt);
    unset = DefaultSocketPath();
  }
  for (const toml::node& node : *rows) {
    const toml::table& row = *node.as_table();
    INFO(Text(row, "name"));
    ScopedEnv environment("CAKE_SOCKET", Text(row, "cake_socket"));
    CHECK(DefaultSocketPath() == row["path"].value_or(unset));
  }
}

}  // namespace cake
