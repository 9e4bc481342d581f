// Block reads for the disk tier: one narrow engine interface (io_uring or pread, chosen at run time) and the
// one driver, ReadSegments, that splits reads, keeps the queue full and handles every completion outcome.
// Keeping the outcome handling in the driver, above the engines, is what lets a test decorator around an
// engine inject short reads, interrupts and errors and exercise the real resubmission code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/io/io_backend.h"

namespace cake {

// The largest single read the driver asks for: big enough to stream at NVMe speed, small enough that a
// queue of them spreads one chunk over several device queues.
inline constexpr size_t kMaxIoBytes = size_t{1} << 20;

struct IoRequest {
  int fd = -1;
  uint64_t offset = 0;
  std::byte* buffer = nullptr;
  uint32_t length = 0;
  uint64_t tag = 0;  // handed back in the completion
};

struct IoCompletion {
  uint64_t tag = 0;
  // What read(2) would say: bytes read (possibly fewer than asked, possibly 0 at end of file) or -errno.
  int64_t result = 0;
};

// Owned by one thread at a time; not thread-safe. At most depth() requests may be in flight.
class IoEngine {
 public:
  virtual ~IoEngine() = default;
  virtual std::string_view name() const = 0;
  virtual uint32_t depth() const = 0;
  // Starts the requests. An error means the engine itself failed (not one read): see broken().
  virtual absl::Status Submit(std::span<const IoRequest> requests) = 0;
  // Blocks until one submitted request completes.
  virtual absl::StatusOr<IoCompletion> Wait() = 0;
  // True once Submit or Wait failed: requests may be left in flight, so the engine must not be reused.
  virtual bool broken() const { return false; }
};

// Makes one engine of a concrete backend (kUring or kPread). kUring fails with UNAVAILABLE and the reason
// when the kernel refuses a ring (old kernel, seccomp, io_uring disabled by sysctl, memlock limit).
absl::StatusOr<std::unique_ptr<IoEngine>> MakeIoEngine(IoBackend backend, uint32_t depth);
absl::StatusOr<std::unique_ptr<IoEngine>> MakeUringEngine(uint32_t depth);
std::unique_ptr<IoEngine> MakePreadEngine(uint32_t depth);

using IoEngineFactory = std::function<absl::StatusOr<std::unique_ptr<IoEngine>>(IoBackend, uint32_t depth)>;

struct ReadSegment {
  uint64_t offset = 0;
  std::span<std::byte> buffer;
};

// Fills every segment from fd exactly, in pieces of at most kMaxIoBytes with up to engine.depth() in flight.
// Short reads are resubmitted for the rest, EINTR/EAGAIN retried (boundedly), and nothing returns while a
// request is still in flight on the caller's buffers (unless the engine broke). UNAVAILABLE: an I/O error
// (with strerror) or a broken engine. DATA_LOSS: the file ended early.
absl::Status ReadSegments(IoEngine& engine, int fd, std::span<const ReadSegment> segments);

}  // namespace cake
