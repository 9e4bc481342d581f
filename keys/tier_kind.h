// Which tier holds a chunk: shared by the daemon, the client library and the wire (cake.v1.TierKind). Its own
// header so that engines, which only name tiers, do not include the tier stack.
#pragma once

#include <cstddef>

namespace cake {

// Values match cake.v1.TierKind on the wire.
enum class TierKind : int { kNone = 0, kDram = 1, kDisk = 2, kRemote = 3 };
inline constexpr size_t kTierKinds = 4;  // for tables indexed by TierKind

// "dram", "disk", "remote" or "none": the names of config tables, flags, counters and admin calls.
constexpr const char* TierKindName(TierKind kind) {
  switch (kind) {
    case TierKind::kDram:
      return "dram";
    case TierKind::kDisk:
      return "disk";
    case TierKind::kRemote:
      return "remote";
    case TierKind::kNone:
      break;
  }
  return "none";
}

}  // namespace cake
