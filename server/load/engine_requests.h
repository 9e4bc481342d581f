// An engine's requests that carry a prompt, checked: a Load's Start and a Store, every field bounded against the
// daemon's limits and the caller's rights and turned into what the load stream or the Store's copies work with.
// Nothing here holds a resource but a Store's region (admission and a load's window come later).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cake/v1/kv.pb.h"
#include "keys/namespace.h"
#include "server/core/daemon_state.h"
#include "server/load/chunk_landing.h"

namespace cake {

struct LoadRequest {
  explicit LoadRequest(Namespace checked) : ns(std::move(checked)) {}

  Namespace ns;
  std::vector<ChunkKey> keys;  // one per full chunk of the prompt
  std::string client_id;
  // Where the chunks land: a window of one of the caller's regions, or none (inline: in the messages).
  struct RegionWindow {
    RegionOwner owner;
    std::string region_id;
    uint64_t offset = 0;
    uint64_t bytes = 0;  // the window's size: the rest of the region when the request said 0
  };
  std::optional<RegionWindow> region;
  bool accept_loaded_batch = false;  // the client takes ChunksLoaded (region loads only)
  uint32_t window = 0;               // reads in flight (the daemon's default when the request said 0)
  bool io_only_requested = false;
  double hint_first_chunk_s = 0;
  double hint_growth_s = 0;
  uint32_t computed_through = 0;  // chunks the engine holds already: never read
  // Whom admission and the inline budget count the load against: the principal, or in single-user mode the
  // caller's uid ("uid N"), so one local user cannot hold every slot.
  std::string fairness_key;

  uint64_t chunk_bytes() const { return ns.chunk_bytes(); }
  bool inline_bytes() const { return !region.has_value(); }
  // What an engine may say it computed through (at Start, and in each Progress): the full chunks, and one past
  // them, since the engine may count a partial tail chunk. INVALID_ARGUMENT beyond.
  absl::Status CheckComputedThrough(uint32_t computed_through) const;
};

// Whom the daemon's shared pools (load slots, inline bytes, unstarted streams) count a caller against: its
// principal, or in single-user mode its uid ("uid N"), so one local user cannot hold every slot.
std::string FairnessKey(const Caller& caller);

// INVALID_ARGUMENT (or OUT_OF_RANGE, PERMISSION_DENIED, FAILED_PRECONDITION, NOT_FOUND for a region) naming the
// field and the limit, for a Start the daemon will not serve; UNAVAILABLE while it drains. `identify_again` says
// who the caller is now, asked when the access policy was reloaded since `caller` was established.
absl::StatusOr<LoadRequest> ParseLoadStart(const v1::LoadStart& start, const Caller& caller,
                                           const std::function<absl::StatusOr<Caller>()>& identify_again,
                                           DaemonState& state);

// A Store, checked: chunks [first, first + count) of the prompt's keys, in `region` at region_offset or inline in
// the request.
struct StoreRequestChecked {
  std::vector<ChunkKey> keys;
  uint64_t first = 0;
  uint64_t count = 0;
  uint64_t chunk_bytes = 0;
  std::shared_ptr<Region> region;  // null: inline_chunks
  LossyFormat format;              // how the slower tiers store them
};
// INVALID_ARGUMENT or OUT_OF_RANGE naming the field; the region's own errors (NOT_FOUND, FAILED_PRECONDITION).
absl::StatusOr<StoreRequestChecked> ParseStore(const v1::StoreRequest& request, const Caller& caller,
                                               DaemonState& state);

// Where a load of `cached` chunks lands: inline, or a lease on the part of its region window that fits them (from
// the tail: the engine computes the rest). Offsets in the region count from `window_first`.
struct LoadLanding {
  ChunkLanding landing;
  RegionRegistry::WindowLease lease;
  uint32_t window_first = 0;
};
absl::StatusOr<LoadLanding> ReserveLanding(RegionRegistry& regions, const LoadRequest& request, uint32_t cached);

// What a client silent for `timeout` is told: before its Start (loader.start_timeout_ms) or during its load
// (loader.idle_timeout_ms). DEADLINE_EXCEEDED.
absl::Status SilentClientError(bool before_start, std::chrono::nanoseconds timeout);

}  // namespace cake
