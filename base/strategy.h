// How the daemon serves one load: the one strategy enum the planner, the daemon, the C++ client and the admin
// calls share (values match cake.v1.LoadPlan.Strategy on the wire), with the one spelling of each that logs,
// Stats, /metrics, cakectl and the Python client use.
#pragma once

#include <optional>
#include <string_view>

#include "base/enum_names.h"

namespace cake {

// kCake: the engine computes forward until a chunk is resident while the daemon loads backward. kIoOnly: the
// engine computes only below lowest_loadable and waits for the loads. kComputeOnly: the engine computes everything.
enum class Strategy : int { kCake = 0, kIoOnly = 1, kComputeOnly = 2 };

inline constexpr EnumName<Strategy> kStrategies[] = {
    {Strategy::kCake, "cake"}, {Strategy::kIoOnly, "io_only"}, {Strategy::kComputeOnly, "compute_only"}};

constexpr const char* StrategyName(Strategy strategy) { return NameIn(kStrategies, strategy, "unknown"); }
constexpr std::optional<Strategy> ParseStrategy(std::string_view name) { return ValueIn(kStrategies, name); }

}  // namespace cake
