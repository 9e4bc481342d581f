// Which tier holds a chunk: shared by the daemon, the client library and the wire (cake.v1.TierKind). Its own
// header so that engines, which only name tiers, do not include the tier stack.
#pragma once

#include <cstddef>
#include <iterator>
#include <optional>
#include <string_view>

#include "base/enum_names.h"

namespace cake {

// Values match cake.v1.TierKind on the wire.
enum class TierKind : int { kNone = 0, kDram = 1, kDisk = 2, kRemote = 3 };
inline constexpr size_t kTierKinds = 4;  // for tables indexed by TierKind

// "dram", "disk", "remote" or "none": the names of config tables, flags, counters and admin calls.
inline constexpr EnumName<TierKind> kTierKindNames[] = {
    {TierKind::kNone, "none"}, {TierKind::kDram, "dram"}, {TierKind::kDisk, "disk"}, {TierKind::kRemote, "remote"}};
static_assert(std::size(kTierKindNames) == kTierKinds);
constexpr const char* TierKindName(TierKind kind) { return NameIn(kTierKindNames, kind, "none"); }
constexpr std::optional<TierKind> ParseTierKind(std::string_view name) { return ValueIn(kTierKindNames, name); }

}  // namespace cake
