// Load streams open without a Start yet. The Python client keeps one open ahead of its next load, so a stream may
// wait up to loader.start_timeout_ms for its Start; each costs the daemon gRPC's call state (about 19 KB), so
// a principal that opens them by the thousand is stopped here: at most loader.max_unstarted_streams in all and
// loader.max_unstarted_streams_per_principal each, with the last eighth kept for principals holding few
// (SharedPool). A stream past them ends at once with RESOURCE_EXHAUSTED naming the key.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/mutex.h"

namespace cake {

class UnstartedStreams {
 public:
  UnstartedStreams(uint32_t total, uint32_t per_principal) : total_(total), per_principal_(per_principal) {}

  // One stream's place, given back when it goes (its Start came, or it ended).
  class Slot {
   public:
    Slot(UnstartedStreams* owner, std::string holder) : owner_(owner), holder_(std::move(holder)) {}
    Slot(Slot&& other) noexcept : owner_(std::exchange(other.owner_, nullptr)), holder_(std::move(other.holder_)) {}
    Slot& operator=(Slot&&) = delete;
    ~Slot() {
      if (owner_ != nullptr) owner_->Give(holder_);
    }

   private:
    UnstartedStreams* owner_;
    std::string holder_;
  };

  // A place for a stream of `holder` (a principal's fairness key), or RESOURCE_EXHAUSTED naming the cap.
  absl::StatusOr<Slot> Take(const std::string& holder);
  uint32_t open() const;

 private:
  void Give(const std::string& holder);

  const uint32_t total_;
  const uint32_t per_principal_;
  mutable Mutex mu_;
  uint32_t open_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, uint32_t> by_holder_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cake
