// UringRing: owns one initialised io_uring. Included only by the io_uring engines (disk reads, sockets), the
// files that include liburing.
#pragma once

#include <liburing.h>

#include <cstring>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace cake {

// io_uring_queue_exit runs exactly once. The ring lives on the heap so moving the owner never moves the struct
// liburing initialised.
class UringRing {
 public:
  static absl::StatusOr<UringRing> Create(uint32_t entries) {
    auto ring = std::make_unique<io_uring>();
    const int rc = io_uring_queue_init(entries, ring.get(), 0);
    if (rc < 0) {
      return absl::UnavailableError(absl::StrCat("io_uring_queue_init(", entries, ") failed: ", std::strerror(-rc)));
    }
    return UringRing(std::move(ring));
  }
  UringRing(UringRing&&) noexcept = default;
  UringRing& operator=(UringRing&&) = delete;
  UringRing(const UringRing&) = delete;
  UringRing& operator=(const UringRing&) = delete;
  ~UringRing() {
    if (ring_) io_uring_queue_exit(ring_.get());
  }

  io_uring* get() { return ring_.get(); }

  // True when the kernel's io_uring knows every one of these operations.
  bool Supports(std::initializer_list<int> opcodes) {
    io_uring_probe* probe = io_uring_get_probe_ring(ring_.get());
    if (probe == nullptr) return false;
    bool all = true;
    for (int op : opcodes) all = all && io_uring_opcode_supported(probe, op);
    io_uring_free_probe(probe);
    return all;
  }

 private:
  explicit UringRing(std::unique_ptr<io_uring> ring) : ring_(std::move(ring)) {}
  std::unique_ptr<io_uring> ring_;
};

}  // namespace cake
