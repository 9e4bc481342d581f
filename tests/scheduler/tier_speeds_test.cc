#include "scheduler/tier_speeds.h"

#include <catch2/catch.hpp>

namespace cake {

TEST_CASE("tier speeds: a moving average per tier, forgotten on demand", "[tier_speeds]") {
  TierSpeeds speeds;
  CHECK(speeds.SecondsPerByte(TierKind::kDram) == 0);

  speeds.Record(TierKind::kDram, 1000, 1.0);  // the first sample is taken as is
  CHECK(speeds.SecondsPerByte(TierKind::kDram) == Approx(1e-3));
  speeds.Record(TierKind::kDram, 1000, 2.0);  // 0.7 * old + 0.3 * new
  CHECK(speeds.SecondsPerByte(TierKind::kDram) == Approx(0.7e-3 + 0.3 * 2e-3));
  speeds.Record(TierKind::kDram, 1000, 2.0);
  CHECK(speeds.SecondsPerByte(TierKind::kDram) == Approx(0.7 * 1.3e-3 + 0.3 * 2e-3));

  // Samples that say nothing are ignored rather than dragging the average to 0 or infinity.
  const double before = speeds.SecondsPerByte(TierKind::kDram);
  speeds.Record(TierKind::kDram, 0, 1.0);
  speeds.Record(TierKind::kDram, 1000, 0);
  speeds.Record(TierKind::kDram, 1000, -1);
  CHECK(speeds.SecondsPerByte(TierKind::kDram) == before);

  // Tiers are measured separately.
  CHECK(speeds.SecondsPerByte(TierKind::kDisk) == 0);
  speeds.Record(TierKind::kRemote, 1000, 1.0);
  CHECK(speeds.SecondsPerByte(TierKind::kRemote) == Approx(1e-3));
  CHECK(speeds.SecondsPerByte(TierKind::kDram) == before);

  // A tier whose speed changed on purpose (a new read cap) is measured afresh.
  speeds.Forget(TierKind::kDram);
  CHECK(speeds.SecondsPerByte(TierKind::kDram) == 0);
  CHECK(speeds.SecondsPerByte(TierKind::kRemote) == Approx(1e-3));
  // A kind outside the table is not a crash.
  speeds.Record(static_cast<TierKind>(42), 1000, 1.0);
  CHECK(speeds.SecondsPerByte(static_cast<TierKind>(42)) == speeds.SecondsPerByte(TierKind::kNone));
}

}  // namespace cake
