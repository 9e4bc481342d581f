// InlineWindow: what one inline load holds in the daemon's memory, against its window and the daemon's budget.
#include "server/load/inline_window.h"

#include <catch2/catch.hpp>

namespace cake {

using Room = InlineWindow::Room;

TEST_CASE("inline window: a read takes a chunk's worth of the budget, and spare goes back as chunks leave",
          "[inline_window]") {
  InlineBudget budget(10 * 4096);
  {
    InlineWindow window(budget, "engine", 4096, 2);
    auto never = [] { FAIL("no wait expected"); };
    REQUIRE(window.Reserve(never) == Room::kYes);
    window.ReadIssued();
    REQUIRE(window.Reserve(never) == Room::kYes);
    window.ReadIssued();
    CHECK(window.Reserve(never) == Room::kWindowFull);  // two reads out: the window is full
    CHECK(budget.held() == 2 * 4096);
    window.ReadDone(5, true, std::string(4096, 'x'));
    window.ReadDone(4, false, "");  // a failed read holds nothing
    CHECK(window.live_chunks() == 1);
    CHECK(window.TakeSpareBytes() == 4096);  // the failed read's share
    window.GiveBack(4096);
    CHECK(budget.held() == 4096);
    CHECK(window.TakeForMessage(5).size() == 4096);  // queued for the client: still held
    CHECK(window.TakeSpareBytes() == 0);
    window.WriteStarted();
    CHECK(window.live_chunks() == 1);  // being written
    window.WriteDone();
    CHECK(window.live_chunks() == 0);
    window.GiveBack(window.TakeSpareBytes());
    CHECK(budget.held() == 0);
    REQUIRE(window.Reserve(never) == Room::kYes);  // held again, then the window ends
    CHECK(budget.held() == 4096);
  }
  CHECK(budget.held() == 0);  // what it held went back with it
}

TEST_CASE("inline window: chunks read below one still being read hold the window", "[inline_window]") {
  InlineBudget budget(16 * 4096);
  InlineWindow window(budget, "engine", 4096, 2);
  auto never = [] { FAIL("no wait expected"); };
  REQUIRE(window.Reserve(never) == Room::kYes);
  window.ReadIssued();  // chunk 15: slow
  REQUIRE(window.Reserve(never) == Room::kYes);
  window.ReadIssued();                                // chunk 14
  window.ReadDone(14, true, std::string(4096, 'x'));  // lands first: waits for 15 above it
  CHECK(window.Reserve(never) == Room::kWindowFull);  // not a third chunk while 15 is out
  window.ReadDone(15, true, std::string(4096, 'y'));
  CHECK(window.TakeForMessage(15).size() == 4096);
  CHECK(window.TakeForMessage(14).size() == 4096);
  CHECK(window.Reserve(never) == Room::kWindowFull);  // both queued for the client
  window.WriteStarted();
  window.WriteDone();
  CHECK(window.Reserve(never) == Room::kYes);
}

TEST_CASE("inline window: without room in the budget, a read waits for some to come back", "[inline_window]") {
  InlineBudget budget(4096);
  InlineWindow first(budget, "a", 4096, 4);
  InlineWindow second(budget, "b", 4096, 4);
  int woken = 0;
  REQUIRE(first.Reserve([] {}) == Room::kYes);
  first.ReadIssued();
  CHECK(second.Reserve([&] { ++woken; }) == Room::kQueuedForBudget);
  CHECK(second.Reserve([&] { ++woken; }) == Room::kStillQueued);  // one wait at a time
  first.ReadDone(0, false, "");
  first.GiveBack(first.TakeSpareBytes());
  CHECK(woken == 1);
  second.RoomCameBack();
  CHECK(second.Reserve([&] { ++woken; }) == Room::kYes);
}

TEST_CASE("inline window: when the load ends, what waited to be sent is dropped", "[inline_window]") {
  InlineBudget budget(8 * 4096);
  InlineWindow window(budget, "engine", 4096, 4);
  for (uint32_t c = 0; c < 3; ++c) {
    REQUIRE(window.Reserve([] {}) == Room::kYes);
    window.ReadIssued();
  }
  window.ReadDone(2, true, "a");
  window.ReadDone(1, true, "b");
  window.TakeForMessage(2);
  window.DropWaiting();              // the split is final: chunk 1 is below the meeting
  CHECK(window.live_chunks() == 2);  // one read out, one queued
  window.Drop();
  CHECK(window.live_chunks() == 1);
  CHECK(window.TakeSpareBytes() == 2 * 4096);
}

}  // namespace cake
