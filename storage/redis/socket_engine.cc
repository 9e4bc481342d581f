// RunExchanges, the poll(2) engine, and the per-thread engine.
#include "storage/redis/socket_engine.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"

namespace cake {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Consecutive EINTR/EAGAIN answers tolerated for one operation before the exchange is given up as failed.
constexpr int kMaxRetriesWithoutProgress = 64;
// sendmsg(2) takes at most IOV_MAX pieces; a longer request goes in several sends.
constexpr size_t kMaxIovPerSend = IOV_MAX;

// poll(2) says which operation can move, then the system call itself runs without blocking: completions reach
// the driver as io_uring would report them.
class PollSocketEngine final : public SocketEngine {
 public:
  std::string_view name() const override { return "poll"; }

  absl::Status Submit(const SocketOp& op) override {
    pending_.push_back(op);
    return absl::OkStatus();
  }

  void Cancel(uint64_t tag) override {
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      if (it->tag == tag) {
        pending_.erase(it);
        ready_.push_back({tag, -ECANCELED});
        return;
      }
    }
  }

  absl::StatusOr<std::optional<SocketCompletion>> Wait(SteadyClock::time_point deadline) override {
    while (ready_.empty()) {
      if (pending_.empty()) return absl::InternalError("poll socket engine: Wait with nothing submitted");
      std::vector<pollfd> fds(pending_.size());
      for (size_t i = 0; i < pending_.size(); ++i) {
        fds[i] = {pending_[i].fd, static_cast<short>(pending_[i].kind == SocketOp::Kind::kSend ? POLLOUT : POLLIN), 0};
      }
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - SteadyClock::now());
      const int rc = poll(fds.data(), fds.size(), static_cast<int>(std::clamp<int64_t>(left.count(), 0, INT_MAX)));
      if (rc < 0 && errno != EINTR) {
        broken_ = true;
        return absl::UnavailableError(absl::StrCat("poll failed: ", std::strerror(errno)));
      }
      if (rc == 0 && SteadyClock::now() >= deadline) return std::nullopt;
      std::vector<SocketOp> still;
      for (size_t i = 0; i < pending_.size(); ++i) {
        if (rc <= 0 || fds[i].revents == 0 || !Perform(pending_[i])) still.push_back(pending_[i]);
      }
      pending_ = std::move(still);
    }
    const SocketCompletion c = ready_.front();
    ready_.pop_front();
    return c;
  }

  bool broken() const override { return broken_; }

 private:
  // Runs op without blocking; false when it would block (it stays pending).
  bool Perform(const SocketOp& op) {
    ssize_t r;
    if (op.kind == SocketOp::Kind::kSend) {
      msghdr msg{};
      msg.msg_iov = const_cast<iovec*>(op.iov);
      msg.msg_iovlen = op.iov_count;
      r = sendmsg(op.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    } else {
      r = recv(op.fd, op.buffer, op.length, MSG_DONTWAIT);
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    ready_.push_back({op.tag, r < 0 ? -int64_t{errno} : int64_t{r}});
    return true;
  }

  std::vector<SocketOp> pending_;
  std::deque<SocketCompletion> ready_;
  bool broken_ = false;
};

// What RunExchanges keeps for one exchange.
struct ExchangeProgress {
  size_t next_iov = 0;  // the first piece of the request not sent in full
  bool sending = false, receiving = false, finished = false;
  int retries = 0;
  SteadyClock::time_point last_progress;
};

uint64_t SendTag(size_t i) { return uint64_t{i} * 2; }
uint64_t RecvTag(size_t i) { return uint64_t{i} * 2 + 1; }

}  // namespace

std::unique_ptr<SocketEngine> MakePollSocketEngine() { return std::make_unique<PollSocketEngine>(); }

SocketEngine& ThisThreadSocketEngine(bool use_uring) {
  struct Held {
    std::unique_ptr<SocketEngine> engine;
    bool asked_for_uring = false;
  };
  thread_local Held held;
  if (held.engine != nullptr && !held.engine->broken() && held.asked_for_uring == use_uring) return *held.engine;
  held.engine.reset();
  held.asked_for_uring = use_uring;
  if (use_uring) {
    auto uring = MakeUringSocketEngine(256);
    if (uring.ok()) {
      held.engine = std::move(*uring);
    } else {
      static std::atomic<bool> said{false};
      if (!said.exchange(true)) {
        spdlog::warn("redis client: no io_uring for sockets ({}); poll(2) drives Redis connections instead",
                     std::string(uring.status().message()));
      }
    }
  }
  if (held.engine == nullptr) held.engine = MakePollSocketEngine();
  return *held.engine;
}

void RunExchanges(SocketEngine& engine, std::span<SocketExchange> exchanges, std::chrono::milliseconds idle_timeout) {
  std::vector<ExchangeProgress> progress(exchanges.size());
  size_t in_flight = 0;

  auto finish = [&](size_t i, absl::Status status) {
    ExchangeProgress& p = progress[i];
    if (p.finished) return;
    p.finished = true;
    exchanges[i].status = std::move(status);
    if (p.sending) engine.Cancel(SendTag(i));
    if (p.receiving) engine.Cancel(RecvTag(i));
  };
  auto submit = [&](size_t i, const SocketOp& op, bool& flag) {
    if (absl::Status s = engine.Submit(op); !s.ok()) return finish(i, absl::UnavailableError(s.message()));
    flag = true;
    ++in_flight;
  };
  auto send_more = [&](size_t i) {
    SocketExchange& ex = exchanges[i];
    ExchangeProgress& p = progress[i];
    SocketOp op;
    op.kind = SocketOp::Kind::kSend;
    op.fd = ex.fd;
    op.iov = ex.request.data() + p.next_iov;
    op.iov_count = std::min(ex.request.size() - p.next_iov, kMaxIovPerSend);
    op.tag = SendTag(i);
    submit(i, op, p.sending);
  };
  auto receive_more = [&](size_t i) {
    const std::span<std::byte> target = exchanges[i].parser->ReadTarget();
    SocketOp op;
    op.kind = SocketOp::Kind::kRecv;
    op.fd = exchanges[i].fd;
    op.buffer = target.data();
    op.length = target.size();
    op.tag = RecvTag(i);
    submit(i, op, progress[i].receiving);
  };
  // Pieces sent in full are passed; a piece sent in part is trimmed to what is left of it.
  auto advance = [&](size_t i, size_t sent) {
    std::vector<iovec>& request = exchanges[i].request;
    size_t& next = progress[i].next_iov;
    while (next < request.size() && sent >= request[next].iov_len) sent -= request[next++].iov_len;
    if (next < request.size()) {
      request[next].iov_base = static_cast<char*>(request[next].iov_base) + sent;
      request[next].iov_len -= sent;
    }
  };
  auto done_with = [&](size_t i) {
    const ExchangeProgress& p = progress[i];
    return !p.sending && !p.receiving && p.next_iov == exchanges[i].request.size() &&
           exchanges[i].parser->awaited() == 0;
  };

  const auto start = SteadyClock::now();
  for (size_t i = 0; i < exchanges.size(); ++i) {
    exchanges[i].status = absl::OkStatus();
    progress[i].last_progress = start;
    advance(i, 0);  // skips empty pieces
    if (done_with(i)) {
      progress[i].finished = true;
      continue;
    }
    if (progress[i].next_iov < exchanges[i].request.size()) send_more(i);
    if (!progress[i].finished && exchanges[i].parser->awaited() > 0) receive_more(i);
  }

  while (in_flight > 0) {
    auto deadline = SteadyClock::time_point::max();
    for (size_t i = 0; i < exchanges.size(); ++i) {
      if (!progress[i].finished) deadline = std::min(deadline, progress[i].last_progress + idle_timeout);
    }
    // Only cancelled operations are left: wait for them as long as it takes (their buffers are the caller's).
    if (deadline == SteadyClock::time_point::max()) deadline = SteadyClock::now() + idle_timeout;
    auto got = engine.Wait(deadline);
    if (!got.ok()) {
      for (size_t i = 0; i < exchanges.size(); ++i) {
        const std::string_view name = engine.name();
        finish(i, absl::UnavailableError(absl::StrCat(absl::string_view(name.data(), name.size()),
                                                      " engine failed: ", got.status().message())));
      }
      return;
    }
    const auto now = SteadyClock::now();
    if (!got->has_value()) {
      for (size_t i = 0; i < exchanges.size(); ++i) {
        if (!progress[i].finished && progress[i].last_progress + idle_timeout <= now) {
          finish(i, absl::DeadlineExceededError(absl::StrCat("no byte moved for ", idle_timeout.count(), " ms")));
        }
      }
      continue;
    }
    const SocketCompletion c = **got;
    const size_t i = c.tag / 2;
    const bool was_send = c.tag % 2 == 0;
    ExchangeProgress& p = progress[i];
    (was_send ? p.sending : p.receiving) = false;
    --in_flight;
    if (p.finished) continue;  // a cancelled operation, reaped
    if (c.result == -EINTR || c.result == -EAGAIN) {
      if (++p.retries > kMaxRetriesWithoutProgress) {
        finish(i, absl::UnavailableError(absl::StrCat("the socket kept answering ", std::strerror(-c.result))));
      } else if (was_send) {
        send_more(i);
      } else {
        receive_more(i);
      }
      continue;
    }
    if (c.result < 0) {
      finish(i, absl::UnavailableError(std::strerror(static_cast<int>(-c.result))));
      continue;
    }
    p.retries = 0;
    p.last_progress = now;
    if (was_send) {
      advance(i, static_cast<size_t>(c.result));
      if (p.next_iov < exchanges[i].request.size()) send_more(i);
    } else if (c.result == 0) {
      finish(i, absl::UnavailableError("Server closed the connection"));
      continue;
    } else if (absl::Status s = exchanges[i].parser->Received(static_cast<size_t>(c.result)); !s.ok()) {
      finish(i, std::move(s));
      continue;
    } else if (exchanges[i].parser->awaited() > 0) {
      receive_more(i);
    }
    if (!p.finished && done_with(i)) p.finished = true;
  }
  for (size_t i = 0; i < exchanges.size(); ++i) {
    if (!progress[i].finished) finish(i, absl::InternalError("exchange left unfinished"));
  }
}

}  // namespace cake
