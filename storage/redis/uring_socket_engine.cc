// The sockets' io_uring engine: sends and receives of every connection of a call on one ring, submitted together
// with the wait for the next completion (one system call per completion, none per operation).
#include <cerrno>
#include <climits>
#include <cstring>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "storage/io/uring_ring.h"
#include "storage/redis/socket_engine.h"

namespace cake {
namespace {

using SteadyClock = std::chrono::steady_clock;

// The user data of a cancellation's own completion, which nobody waits for.
constexpr uint64_t kCancelTag = ~uint64_t{0};

class UringSocketEngine final : public SocketEngine {
 public:
  explicit UringSocketEngine(UringRing ring) : ring_(std::move(ring)) {}

  // Operations left in flight (only by a broken engine or a caller that gave up) point into buffers freed
  // after the engine: cancel them and wait, boundedly, before the ring goes.
  ~UringSocketEngine() override {
    if (in_flight_.empty()) return;
    for (const auto& [tag, unused] : in_flight_) Cancel(tag);
    const auto deadline = SteadyClock::now() + std::chrono::seconds(2);
    while (!in_flight_.empty() && !broken_) {
      auto got = Wait(deadline);
      if (!got.ok() || !got->has_value()) break;
    }
  }

  std::string_view name() const override { return "io_uring"; }
  bool broken() const override { return broken_; }

  absl::Status Submit(const SocketOp& op) override {
    if (broken_) return absl::UnavailableError("io_uring socket engine is broken");
    io_uring_sqe* sqe = NextSqe();
    if (sqe == nullptr) return absl::UnavailableError("io_uring submission queue stays full");
    msghdr& msg = in_flight_[op.tag];
    if (op.kind == SocketOp::Kind::kSend) {
      msg = {};
      msg.msg_iov = const_cast<iovec*>(op.iov);
      msg.msg_iovlen = op.iov_count;
      io_uring_prep_sendmsg(sqe, op.fd, &msg, MSG_NOSIGNAL);
    } else {
      io_uring_prep_recv(sqe, op.fd, op.buffer, op.length, 0);
    }
    io_uring_sqe_set_data64(sqe, op.tag);
    return absl::OkStatus();
  }

  void Cancel(uint64_t tag) override {
    if (broken_ || !in_flight_.contains(tag)) return;
    io_uring_sqe* sqe = NextSqe();
    if (sqe == nullptr) return;  // broken now; Wait says so
    io_uring_prep_cancel64(sqe, tag, 0);
    io_uring_sqe_set_data64(sqe, kCancelTag);
  }

  absl::StatusOr<std::optional<SocketCompletion>> Wait(SteadyClock::time_point deadline) override {
    if (broken_) return absl::UnavailableError("io_uring socket engine is broken");
    while (true) {
      const auto left = std::max(deadline - SteadyClock::now(), SteadyClock::duration::zero());
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      __kernel_timespec timeout{ns / 1'000'000'000, ns % 1'000'000'000};
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_submit_and_wait_timeout(ring_.get(), &cqe, 1, &timeout, nullptr);
      if (rc == -ETIME) return std::nullopt;
      if (rc == -EINTR || (rc >= 0 && cqe == nullptr)) continue;
      if (rc < 0) {
        broken_ = true;
        return absl::UnavailableError(absl::StrCat("io_uring_submit_and_wait_timeout failed: ", std::strerror(-rc)));
      }
      const uint64_t tag = io_uring_cqe_get_data64(cqe);
      const int64_t result = cqe->res;
      io_uring_cqe_seen(ring_.get(), cqe);
      if (tag == kCancelTag) continue;
      in_flight_.erase(tag);
      return SocketCompletion{tag, result};
    }
  }

 private:
  // A free submission entry, submitting what is queued when the queue is full.
  io_uring_sqe* NextSqe() {
    io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
    if (sqe == nullptr && io_uring_submit(ring_.get()) >= 0) sqe = io_uring_get_sqe(ring_.get());
    if (sqe == nullptr) broken_ = true;
    return sqe;
  }

  UringRing ring_;
  // The operations submitted and not yet completed; a send's msghdr lives here until its completion.
  std::unordered_map<uint64_t, msghdr> in_flight_;
  bool broken_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SocketEngine>> MakeUringSocketEngine(uint32_t entries) {
  CAKE_ASSIGN_OR_RETURN(UringRing ring, UringRing::Create(entries));
  // IORING_OP_SENDMSG and IORING_OP_ASYNC_CANCEL arrived in Linux 5.5, IORING_OP_RECV in 5.6; the timeout passed
  // with the wait (IORING_FEAT_EXT_ARG) in 5.11.
  if (!ring.Supports({IORING_OP_SENDMSG, IORING_OP_RECV, IORING_OP_ASYNC_CANCEL}) ||
      (ring.get()->features & IORING_FEAT_EXT_ARG) == 0) {
    return absl::UnavailableError("this kernel's io_uring lacks socket operations or timed waits (needs Linux 5.11)");
  }
  return std::make_unique<UringSocketEngine>(std::move(ring));
}

}  // namespace cake
