// A test decorator around any IoEngine: shortens reads, answers with EINTR, zero, EIO or too many bytes, or
// holds reads until released, so the disk tier's real completion handling is exercised on both backends.
#pragma once

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "storage/io/io_engine.h"

namespace cake::testing {

enum class IoFault {
  kNone,
  kShort,      // the kernel is asked for fewer bytes (half, rounded down to `short_granularity`): a real short read
  kInterrupt,  // completes with -EINTR without reading
  kZero,       // completes with 0 (end of file) without reading
  kError,      // completes with -EIO without reading
  kTooLong,    // claims one byte more than asked, without reading
  kHold,       // Submit blocks until Release(): keeps a read in flight for as long as a test needs
};

// Shared by every engine one factory makes (a tier makes one per concurrent reader); tests flip it at will.
class IoFaultControl {
 public:
  void Set(IoFault fault, size_t short_granularity = 4096) {
    std::lock_guard lock(mu_);
    fault_ = fault;
    granularity_ = short_granularity;
  }
  IoFault fault() const {
    std::lock_guard lock(mu_);
    return fault_;
  }
  size_t granularity() const {
    std::lock_guard lock(mu_);
    return granularity_;
  }
  int injected() const {
    std::lock_guard lock(mu_);
    return injected_;
  }
  void CountInjected() {
    std::lock_guard lock(mu_);
    ++injected_;
  }
  // kHold: blocks the calling reader until Release; WaitUntilHeld lets the test know a reader is inside.
  void Hold() {
    std::unique_lock lock(mu_);
    ++held_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return released_; });
  }
  void WaitUntilHeld() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return held_ > 0; });
  }
  void Release() {
    std::lock_guard lock(mu_);
    released_ = true;
    fault_ = IoFault::kNone;
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  IoFault fault_ = IoFault::kNone;
  size_t granularity_ = 4096;
  int injected_ = 0;
  int held_ = 0;
  bool released_ = false;
};

class FaultyIoEngine final : public IoEngine {
 public:
  FaultyIoEngine(std::unique_ptr<IoEngine> inner, std::shared_ptr<IoFaultControl> control)
      : inner_(std::move(inner)), control_(std::move(control)) {}

  std::string_view name() const override { return inner_->name(); }
  uint32_t depth() const override { return inner_->depth(); }
  bool broken() const override { return inner_->broken(); }

  absl::Status Submit(std::span<const IoRequest> requests) override {
    const IoFault fault = control_->fault();
    if (fault == IoFault::kHold) control_->Hold();
    std::vector<IoRequest> forward;
    for (IoRequest r : requests) {
      switch (fault) {
        case IoFault::kShort: {
          const size_t g = control_->granularity();
          const uint32_t shorter = static_cast<uint32_t>(r.length / 2 / g * g);
          if (shorter > 0 && shorter < r.length) {
            r.length = shorter;
            control_->CountInjected();
          }
          forward.push_back(r);
          break;
        }
        case IoFault::kInterrupt:
          Synthesize(r.tag, -EINTR);
          break;
        case IoFault::kZero:
          Synthesize(r.tag, 0);
          break;
        case IoFault::kError:
          Synthesize(r.tag, -EIO);
          break;
        case IoFault::kTooLong:
          Synthesize(r.tag, int64_t{r.length} + 1);
          break;
        case IoFault::kNone:
        case IoFault::kHold:
          forward.push_back(r);
          break;
      }
    }
    if (forward.empty()) return absl::OkStatus();
    return inner_->Submit(forward);
  }

  absl::StatusOr<IoCompletion> Wait() override {
    if (!synthetic_.empty()) {
      IoCompletion c = synthetic_.front();
      synthetic_.pop_front();
      return c;
    }
    return inner_->Wait();
  }

 private:
  void Synthesize(uint64_t tag, int64_t result) {
    synthetic_.push_back(IoCompletion{tag, result});
    control_->CountInjected();
  }

  std::unique_ptr<IoEngine> inner_;
  std::shared_ptr<IoFaultControl> control_;
  std::deque<IoCompletion> synthetic_;
};

// A factory for DiskTier::Options::engine_factory: real engines wrapped in the decorator. With fail_uring,
// io_uring behaves as in a container whose seccomp profile blocks it.
inline IoEngineFactory FaultyEngineFactory(std::shared_ptr<IoFaultControl> control, bool fail_uring = false) {
  return [control, fail_uring](IoBackend backend, uint32_t depth) -> absl::StatusOr<std::unique_ptr<IoEngine>> {
    if (fail_uring && backend == IoBackend::kUring) {
      return absl::UnavailableError("io_uring_queue_init failed: Operation not permitted (simulated seccomp)");
    }
    absl::StatusOr<std::unique_ptr<IoEngine>> inner = MakeIoEngine(backend, depth);
    if (!inner.ok()) return inner.status();
    return std::unique_ptr<IoEngine>(std::make_unique<FaultyIoEngine>(std::move(inner).value(), control));
  };
}

}  // namespace cake::testing
