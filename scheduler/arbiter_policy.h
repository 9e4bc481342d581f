// The order in which concurrent loads' reads are served: chosen in the config, parsed once at start-up.
#pragma once

#include <optional>
#include <string_view>

namespace cake {

enum class ArbiterPolicy {
  kFifo,               // the load that started first is served first
  kFairShare,          // round robin: the load served least recently goes next
  kShortestRemaining,  // the load with the fewest chunks left to read goes next (ties: the older one), unless
                       // a load's oldest queued read has waited longer than the starvation limit: then that one
};
std::optional<ArbiterPolicy> ParseArbiterPolicy(std::string_view name);  // "fifo", "fair", "srf"
const char* ArbiterPolicyName(ArbiterPolicy policy);

}  // namespace cake
