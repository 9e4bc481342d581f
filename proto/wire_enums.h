// The internal enums whose values are the wire's (cake.v1): tied here once, at compile time, and converted only
// through ToWire and the *FromWire functions, so a value added on one side alone fails the build instead of being
// cast into something else. (LoadPhase, a daemon type, is tied in server/core/load_tracker.h.)
#pragma once

#include "base/strategy.h"
#include "cake/v1/kv.pb.h"
#include "keys/namespace.h"
#include "keys/tier_kind.h"

namespace cake {

static_assert(static_cast<int>(TierKind::kNone) == v1::TIER_NONE &&
              static_cast<int>(TierKind::kDram) == v1::TIER_DRAM &&
              static_cast<int>(TierKind::kDisk) == v1::TIER_DISK &&
              static_cast<int>(TierKind::kRemote) == v1::TIER_REMOTE && v1::TierKind_MAX == v1::TIER_REMOTE);
static_assert(static_cast<int>(Strategy::kCake) == v1::LoadPlan::STRATEGY_CAKE &&
              static_cast<int>(Strategy::kIoOnly) == v1::LoadPlan::STRATEGY_IO_ONLY &&
              static_cast<int>(Strategy::kComputeOnly) == v1::LoadPlan::STRATEGY_COMPUTE_ONLY &&
              v1::LoadPlan::Strategy_MAX == v1::LoadPlan::STRATEGY_COMPUTE_ONLY);
static_assert(static_cast<int>(DType::kFp32) == v1::DTYPE_FP32 && static_cast<int>(DType::kFp16) == v1::DTYPE_FP16 &&
              static_cast<int>(DType::kBf16) == v1::DTYPE_BF16 && static_cast<int>(DType::kFp8) == v1::DTYPE_FP8 &&
              static_cast<int>(DType::kInt8) == v1::DTYPE_INT8 && v1::DType_MAX == v1::DTYPE_INT8);
static_assert(static_cast<int>(StoredPrecision::kExact) == v1::STORED_PRECISION_EXACT &&
              static_cast<int>(StoredPrecision::kInt8) == v1::STORED_PRECISION_INT8 &&
              static_cast<int>(StoredPrecision::kInt4) == v1::STORED_PRECISION_INT4 &&
              v1::StoredPrecision_MAX == v1::STORED_PRECISION_INT4);

constexpr v1::TierKind ToWire(TierKind kind) { return static_cast<v1::TierKind>(kind); }
constexpr v1::LoadPlan::Strategy ToWire(Strategy strategy) { return static_cast<v1::LoadPlan::Strategy>(strategy); }
constexpr v1::DType ToWire(DType dtype) { return static_cast<v1::DType>(dtype); }
constexpr v1::StoredPrecision ToWire(StoredPrecision precision) { return static_cast<v1::StoredPrecision>(precision); }

// From a message's field (a repeated enum field is a list of ints). A number this build does not know stays that
// number: each reader bounds it where it matters (the daemon's request checks, the client's plan checks).
constexpr TierKind TierKindFromWire(int wire) { return static_cast<TierKind>(wire); }
constexpr Strategy StrategyFromWire(int wire) { return static_cast<Strategy>(wire); }
constexpr DType DTypeFromWire(int wire) { return static_cast<DType>(wire); }
constexpr StoredPrecision StoredPrecisionFromWire(int wire) { return static_cast<StoredPrecision>(wire); }

}  // namespace cake
