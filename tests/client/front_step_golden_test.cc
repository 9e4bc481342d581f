// The engine's front-step rule, NextFrontStep, against tests/golden/front_steps.toml: the rows the Python client's
// next_front_step is checked against too (python/tests/test_golden_rules.py), so the rule cannot change in one
// language alone.
#include <toml++/toml.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "client/client.h"

namespace cake {
namespace {

using Clock = std::chrono::steady_clock;

// Every row's times are ms on one clock; its zero is an hour into steady_clock's epoch, so no offset is negative.
const Clock::time_point kZero = Clock::time_point{} + std::chrono::hours(1);

Clock::time_point At(double ms) {
  return kZero + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
}

double Ms(Clock::time_point t) { return std::chrono::duration<double, std::milli>(t - kZero).count(); }

std::optional<uint32_t> OptionalChunk(const toml::table& row, const char* key) {
  if (std::optional<int64_t> v = row[key].value<int64_t>()) return static_cast<uint32_t>(*v);
  return std::nullopt;
}

// A number written either way in the file (0.5, or 1 for 1.0).
std::optional<double> OptionalNumber(const toml::table& row, const char* key) {
  if (std::optional<double> v = row[key].value<double>()) return v;
  return std::nullopt;
}

Strategy StrategyOf(const std::string& name) {
  if (name == "io_only") return Strategy::kIoOnly;
  if (name == "compute_only") return Strategy::kComputeOnly;
  REQUIRE(name == "cake");
  return Strategy::kCake;
}

const char* ActionName(FrontStep::Action action) {
  switch (action) {
    case FrontStep::Action::kCompute:
      return "compute";
    case FrontStep::Action::kWait:
      return "wait";
    case FrontStep::Action::kStop:
      return "stop";
  }
  return "?";
}

}  // namespace

TEST_CASE("front steps: every row of tests/golden/front_steps.toml", "[client][golden]") {
  const toml::table file = toml::parse_file(CAKE_SOURCE_DIR "/tests/golden/front_steps.toml");
  const toml::array* rows = file["step"].as_array();
  REQUIRE(rows != nullptr);
  REQUIRE(rows->size() >= 40);
  for (const toml::node& node : *rows) {
    const toml::table& row = *node.as_table();
    INFO(row["name"].value_or(std::string()));
    LoadPlan plan;
    plan.load_id = "golden";
    plan.cached_chunks = static_cast<uint32_t>(row["cached"].value_or(int64_t{0}));
    plan.total_chunks = OptionalChunk(row, "total").value_or(plan.cached_chunks);
    plan.lowest_loadable = OptionalChunk(row, "lowest").value_or(0);
    plan.chunk_bytes = 4096;
    plan.strategy = StrategyOf(row["strategy"].value_or(std::string("cake")));
    plan.predicted_meeting_chunk = OptionalChunk(row, "meeting");
    plan.predicted_cake_s = OptionalNumber(row, "cake_s");

    FrontStepExtras extras;
    extras.stream_ended = row["ended"].value_or(false);
    extras.compute_s = OptionalNumber(row, "compute_s");
    extras.resident_in_s = OptionalNumber(row, "resident_in_s");
    extras.paced_wait_given = row["paced_wait_given"].value_or(false);

    const FrontStep step =
        NextFrontStep(plan, At(OptionalNumber(row, "started_ms").value_or(0)),
                      static_cast<uint32_t>(row["next"].value_or(int64_t{0})),
                      OptionalChunk(row, "loaded_low").value_or(plan.cached_chunks), OptionalChunk(row, "done"),
                      At(OptionalNumber(row, "now_ms").value_or(0)), extras);
    const std::string expected = row["action"].value_or(std::string());
    CHECK(ActionName(step.action) == expected);
    if (expected == "wait") {
      const std::optional<double> until = OptionalNumber(row, "until_ms");
      REQUIRE(until.has_value());
      CHECK(Ms(step.until) == Approx(*until).margin(1e-3));  // to a microsecond
      CHECK(step.compute_through == 0);
    } else {
      CHECK(step.compute_through == OptionalChunk(row, "compute_through").value_or(0));
    }
  }
}

}  // namespace cake
