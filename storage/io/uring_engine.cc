// The disk's io_uring engine.
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "storage/io/io_engine.h"
#include "storage/io/uring_ring.h"

namespace cake {
namespace {

class UringEngine final : public IoEngine {
 public:
  UringEngine(UringRing ring, uint32_t depth) : ring_(std::move(ring)), depth_(depth) {}

  // A broken engine may still have reads in flight into its caller's buffers, which are freed after the engine:
  // wait for what was submitted before tearing the ring down.
  ~UringEngine() override {
    while (in_flight_ > 0) {
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(ring_.get(), &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) break;
      io_uring_cqe_seen(ring_.get(), cqe);
      --in_flight_;
    }
  }

  std::string_view name() const override { return "io_uring"; }
  uint32_t depth() const override { return depth_; }
  bool broken() const override { return broken_; }

  absl::Status Submit(std::span<const IoRequest> requests) override {
    if (broken_) return absl::UnavailableError("io_uring engine is broken");
    if (in_flight_ + requests.size() > depth_) {
      return absl::InternalError(absl::StrCat("io_uring engine: ", in_flight_ + requests.size(),
                                              " requests in flight exceed the depth of ", depth_));
    }
    for (const IoRequest& r : requests) {
      // The ring has at least depth_ entries and we never exceed depth_ in flight, so an SQE is always free.
      io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
      if (sqe == nullptr) {
        broken_ = true;
        return absl::InternalError("io_uring submission queue full below its depth");
      }
      io_uring_prep_read(sqe, r.fd, r.buffer, r.length, r.offset);
      io_uring_sqe_set_data(sqe, reinterpret_cast<void*>(static_cast<uintptr_t>(r.tag)));
    }
    // io_uring_submit may take fewer than were queued (it stops early on some errors): the rest stay in the
    // submission queue and go with the next call.
    size_t left = requests.size();
    while (left > 0) {
      const int rc = io_uring_submit(ring_.get());
      if (rc == -EINTR) continue;
      if (rc <= 0) {
        broken_ = true;  // SQEs may still sit in the queue: nobody can tell which reads will run
        return absl::UnavailableError(
            absl::StrCat("io_uring_submit failed: ", rc == 0 ? "nothing submitted" : std::strerror(-rc)));
      }
      left -= std::min<size_t>(left, static_cast<size_t>(rc));
      in_flight_ += static_cast<size_t>(rc);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<IoCompletion> Wait() override {
    if (broken_) return absl::UnavailableError("io_uring engine is broken");
    io_uring_cqe* cqe = nullptr;
    int rc;
    do {
      rc = io_uring_wait_cqe(ring_.get(), &cqe);
    } while (rc == -EINTR);
    if (rc < 0) {
      broken_ = true;
      return absl::UnavailableError(absl::StrCat("io_uring_wait_cqe failed: ", std::strerror(-rc)));
    }
    IoCompletion c{static_cast<uint64_t>(reinterpret_cast<uintptr_t>(io_uring_cqe_get_data(cqe))), cqe->res};
    io_uring_cqe_seen(ring_.get(), cqe);
    --in_flight_;
    return c;
  }

 private:
  UringRing ring_;
  const uint32_t depth_;
  size_t in_flight_ = 0;
  bool broken_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<IoEngine>> MakeUringEngine(uint32_t depth) {
  CAKE_ASSIGN_OR_RETURN(UringRing ring, UringRing::Create(depth));
  // A ring is not enough: IORING_OP_READ arrived in Linux 5.6, and without it every read would fail later.
  if (!ring.Supports({IORING_OP_READ}))
    return absl::UnavailableError("this kernel's io_uring has no IORING_OP_READ (needs Linux 5.6)");
  return std::make_unique<UringEngine>(std::move(ring), depth);
}

}  // namespace cake
