#include "server/systemd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "spdlog/pattern_formatter.h"
#include "spdlog/spdlog.h"

namespace cake {

void NotifySystemd(std::string_view state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || *path == '\0') return;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t len = std::strlen(path);
  if (len >= sizeof(addr.sun_path)) return;
  std::memcpy(addr.sun_path, path, len);
  if (addr.sun_path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  sendto(fd, state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&addr),
         static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len));
  close(fd);
}

std::optional<std::chrono::microseconds> SystemdWatchdogInterval() {
  const char* usec = std::getenv("WATCHDOG_USEC");
  if (usec == nullptr) return std::nullopt;
  if (const char* pid = std::getenv("WATCHDOG_PID"); pid != nullptr && std::atol(pid) != getpid()) return std::nullopt;
  const long long v = std::atoll(usec);
  if (v <= 0) return std::nullopt;
  return std::chrono::microseconds(v);
}

namespace {

// spdlog's level as the journal's priority prefix (sd-daemon(3)): trace and debug 7, info 6, warn 4, error 3,
// critical 2.
class JournalPriority final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    static constexpr std::string_view kPrefix[] = {"<7>", "<7>", "<6>", "<4>", "<3>", "<2>", ""};
    const std::string_view prefix = kPrefix[std::min<size_t>(static_cast<size_t>(msg.level), 6)];
    dest.append(prefix.data(), prefix.data() + prefix.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<JournalPriority>(); }
};

}  // namespace

void ConfigureLogFormat() {
  const char* journal = std::getenv("JOURNAL_STREAM");
  if (journal == nullptr || *journal == '\0') {
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ caked: %v");
    return;
  }
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<JournalPriority>('*').set_pattern("%*%v");
  spdlog::set_formatter(std::move(formatter));
}

}  // namespace cake
