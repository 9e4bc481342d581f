// The judge on a fake clock: the time since the engine's last Progress is an argument, so each case sets it.
#include "scheduler/read_judge.h"

#include <catch2/catch.hpp>

using namespace cake;

namespace {

// An engine that takes 10 ms per chunk, flat.
ComputeModel TenMsPerChunk() {
  ComputeModel m;
  m.Seed(0.010, 0);
  return m;
}

// Chunk 10 of a Cake load planned to meet at 20; the engine reported chunks [0, 4) computed; reads take 5 ms.
ReadJudgeInput Input() {
  ReadJudgeInput in;
  in.cake = true;
  in.chunk = 10;
  in.queued = 0;
  in.planned_meeting = 20;
  in.engine_through = 4;
  in.load_chunk_s = 0.005;
  in.since_progress_s = 0;
  in.reads_in_flight = true;
  return in;
}

}  // namespace

TEST_CASE("judge: a read that lands before the engine reaches its chunk goes out", "[judge]") {
  // The engine needs 70 ms to finish chunk 10 ([4, 11)); the read lands after 5 ms.
  const ReadVerdict v = JudgeRead(Input(), TenMsPerChunk());
  CHECK(v.issue);
  CHECK_FALSE(v.recheck_after_s);
}

TEST_CASE("judge: a read queued behind others is turned down once it would land after the engine", "[judge]") {
  ReadJudgeInput in = Input();
  in.queued = 12;  // lands after 13 x 5 = 65 ms, just before the engine is done with chunk 10 at 70 ms
  CHECK(JudgeRead(in, TenMsPerChunk()).issue);
  in.queued = 14;  // 75 ms: the engine computes it first
  const ReadVerdict v = JudgeRead(in, TenMsPerChunk());
  CHECK_FALSE(v.issue);
  CHECK_FALSE(v.recheck_after_s);  // reads in flight: their completions ask again
}

TEST_CASE("judge: time since the last Progress counts against the read", "[judge]") {
  ReadJudgeInput in = Input();
  in.chunk = 5;  // the engine is done with [4, 6) 20 ms after its Progress
  in.since_progress_s = 0.014;
  CHECK(JudgeRead(in, TenMsPerChunk()).issue);  // lands at 19 ms
  in.since_progress_s = 0.016;
  CHECK_FALSE(JudgeRead(in, TenMsPerChunk()).issue);  // would land at 21 ms
}

TEST_CASE("judge: an engine two chunks' time behind its model has stalled, and every read goes out", "[judge]") {
  ReadJudgeInput in = Input();
  in.chunk = 5;
  in.since_progress_s = 0.0199;  // not yet: 2 x 10 ms
  CHECK_FALSE(JudgeRead(in, TenMsPerChunk()).issue);
  in.since_progress_s = 0.0201;
  CHECK(JudgeRead(in, TenMsPerChunk()).issue);
}

TEST_CASE("judge: a read turned down with nothing in flight asks again when the engine would count as stalled",
          "[judge]") {
  ReadJudgeInput in = Input();
  in.chunk = 5;
  in.since_progress_s = 0.016;
  in.reads_in_flight = false;
  const ReadVerdict v = JudgeRead(in, TenMsPerChunk());
  CHECK_FALSE(v.issue);
  REQUIRE(v.recheck_after_s);
  CHECK(*v.recheck_after_s == Approx(0.020 - 0.016 + 0.001));
  // On the fake clock, at that time the same read is judged again and goes out.
  in.since_progress_s += *v.recheck_after_s;
  CHECK(JudgeRead(in, TenMsPerChunk()).issue);
}

TEST_CASE("judge: chunks the engine has computed are never read", "[judge]") {
  ReadJudgeInput in = Input();
  in.chunk = 3;
  in.reads_in_flight = false;
  const ReadVerdict v = JudgeRead(in, TenMsPerChunk());
  CHECK_FALSE(v.issue);
  CHECK_FALSE(v.recheck_after_s);  // nothing will change for this chunk
}

TEST_CASE("judge: without a basis to judge on, every read goes out", "[judge]") {
  ReadJudgeInput in = Input();
  in.queued = 100;  // hopeless if the judge judged
  CHECK_FALSE(JudgeRead(in, TenMsPerChunk()).issue);

  SECTION("not a Cake load") {
    in.cake = false;
    CHECK(JudgeRead(in, TenMsPerChunk()).issue);
  }
  SECTION("no compute model: neither a hint nor an earlier load") { CHECK(JudgeRead(in, ComputeModel()).issue); }
  SECTION("the tier's speed is not measured yet") {
    in.load_chunk_s = 0;
    CHECK(JudgeRead(in, TenMsPerChunk()).issue);
  }
  SECTION("at or above the planned meeting: the engine waits there and never computes these") {
    in.chunk = 20;
    CHECK(JudgeRead(in, TenMsPerChunk()).issue);
  }
  SECTION("no predicted meeting at all") {
    in.planned_meeting = 0;
    CHECK(JudgeRead(in, TenMsPerChunk()).issue);
  }
}
