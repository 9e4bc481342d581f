// The order in which concurrent loads' reads are served: chosen in the config, parsed once at start-up.
#pragma once

#include <optional>
#include <string_view>

#include "base/enum_names.h"

namespace cake {

enum class ArbiterPolicy {
  kFifo,               // the load that started first is served first
  kFairShare,          // round robin: the load served least recently goes next
  kShortestRemaining,  // the load with the fewest chunks left to read goes next (ties: the older one), unless
                       // a load's oldest queued read has waited longer than the starvation limit: then that one
};
inline constexpr EnumName<ArbiterPolicy> kArbiterPolicies[] = {
    {ArbiterPolicy::kFifo, "fifo"}, {ArbiterPolicy::kFairShare, "fair"}, {ArbiterPolicy::kShortestRemaining, "srf"}};
constexpr std::optional<ArbiterPolicy> ParseArbiterPolicy(std::string_view name) {
  return ValueIn(kArbiterPolicies, name);
}
constexpr const char* ArbiterPolicyName(ArbiterPolicy policy) { return NameIn(kArbiterPolicies, policy, "unknown"); }

}  // namespace cake
