// ChildProcess: the one fork/exec the tests and benches use; exit statuses, signals, output, no zombies.
#include "testing/child_process.h"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace cake {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("child process: exit status and output", "[testing]") {
  const std::string out = "/tmp/cake-child-" + std::to_string(getpid()) + ".log";
  auto done = RunToCompletion({"sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 3"}, out);
  REQUIRE(done.ok());
  CHECK(*done == 3);
  const std::string text = Slurp(out);
  CHECK(text.find("to-stdout") != std::string::npos);
  CHECK(text.find("to-stderr") != std::string::npos);
  std::remove(out.c_str());
}

TEST_CASE("child process: a program that cannot run exits 127", "[testing]") {
  auto done = RunToCompletion({"/nonexistent/program"}, "/dev/null");
  REQUIRE(done.ok());
  CHECK(*done == 127);
  CHECK_FALSE(ChildProcess::Start({{}, "", SIGTERM}).ok());
  CHECK_FALSE(ChildProcess::Start({{"true"}, "/nonexistent/dir/out.log", SIGTERM}).ok());
}

TEST_CASE("child process: signalled, polled, and reaped exactly once", "[testing]") {
  auto child = ChildProcess::Start({{"sleep", "30"}, "", SIGKILL});
  REQUIRE(child.ok());
  const pid_t pid = child->pid();
  CHECK(child->running());
  CHECK_FALSE(child->Poll().has_value());
  CHECK(child->Signal(SIGTERM) == 128 + SIGTERM);
  CHECK_FALSE(child->running());
  CHECK(child->Signal(SIGKILL) == 128 + SIGTERM);  // idempotent: the status it had
  CHECK(waitpid(pid, nullptr, WNOHANG) < 0);       // already reaped: no zombie left
}

TEST_CASE("child process: the owner's end stops it, moves hand it over", "[testing]") {
  pid_t pid = -1;
  {
    auto child = ChildProcess::Start({{"sleep", "30"}, "", SIGKILL});
    REQUIRE(child.ok());
    ChildProcess moved = std::move(*child);
    CHECK_FALSE(child->running());
    pid = moved.pid();
    CHECK(kill(pid, 0) == 0);
  }
  CHECK(kill(pid, 0) != 0);  // stopped and reaped by the destructor
  auto quick = ChildProcess::Start({{"true"}, "", SIGTERM});
  REQUIRE(quick.ok());
  std::optional<int> status;
  for (int i = 0; i < 500 && !status; ++i) {
    status = quick->Poll();
    if (!status) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(status == 0);
}

}  // namespace cake
