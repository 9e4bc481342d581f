// InlineBudget: what all inline loads together may hold; a load without room is called back once room returns.
#include "server/core/inline_budget.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <thread>
#include <vector>

namespace cake {

TEST_CASE("inline budget: takes what fits, queues the rest, and wakes every waiter when bytes come back",
          "[inline-budget]") {
  InlineBudget budget(16);  // the last 2 bytes kept for holders holding none (SharedPool)
  int woken_a = 0, woken_b = 0;
  CHECK(budget.TakeOrWait(6, [] { FAIL("not queued"); }));
  CHECK(budget.TakeOrWait(8, [] { FAIL("not queued"); }));
  CHECK(budget.held() == 14);
  CHECK_FALSE(budget.TakeOrWait(1, [&] { ++woken_a; }));
  CHECK_FALSE(budget.TakeOrWait(5, [&] { ++woken_b; }));
  CHECK(budget.held() == 14);  // a refused take holds nothing

  budget.Give(8);
  CHECK(budget.held() == 6);
  CHECK(woken_a == 1);  // each waiter is called once, and tries again itself
  CHECK(woken_b == 1);
  budget.Give(6);
  CHECK(woken_a == 1);  // no longer waiting
  CHECK(budget.held() == 0);
  budget.Give(0);  // nothing
}

TEST_CASE("inline budget: a chunk larger than the whole budget goes when nothing else is held", "[inline-budget]") {
  InlineBudget budget(10);
  CHECK(budget.TakeOrWait(25, [] { FAIL("not queued"); }));  // no load may wait for ever
  bool woken = false;
  CHECK_FALSE(budget.TakeOrWait(1, [&] { woken = true; }));
  budget.Give(25);
  CHECK(woken);
}

TEST_CASE("inline budget: many threads taking and giving never pass the capacity", "[inline-budget]") {
  constexpr uint64_t kCapacity = 64;
  InlineBudget budget(kCapacity);
  std::atomic<bool> over{false};
  std::vector<std::thread> loads;
  for (int t = 0; t < 8; ++t) {
    loads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        std::atomic<bool> room{false};
        while (!budget.TakeOrWait(8, [&room] { room = true; })) {
          while (!room) std::this_thread::yield();
          room = false;
        }
        if (budget.held() > kCapacity) over = true;
        budget.Give(8);
      }
    });
  }
  for (auto& t : loads) t.join();
  CHECK_FALSE(over.load());
  CHECK(budget.held() == 0);
}

TEST_CASE("inline budget: one holder's share leaves room for the others, and its first chunk always goes",
          "[inline-budget]") {
  InlineBudget budget(10, 6);
  CHECK(budget.TakeOrWait(
      4, [] { FAIL("not queued"); }, "slow"));
  bool slow_woken = false;
  CHECK_FALSE(budget.TakeOrWait(
      4, [&] { slow_woken = true; }, "slow"));  // 8 > its 6
  CHECK(budget.held_by("slow") == 4);
  CHECK(budget.TakeOrWait(
      4, [] { FAIL("not queued"); }, "other"));  // the rest is the others'
  CHECK(budget.held() == 8);
  budget.Give(4, "other");
  CHECK(slow_woken);
  CHECK(budget.held_by("other") == 0);
  InlineBudget small_share(10, 2);
  CHECK(small_share.TakeOrWait(
      5, [] { FAIL("not queued"); }, "big-chunks"));  // larger than the share: alone, it goes
  budget.Give(4, "slow");
  CHECK(budget.held() == 0);
}

TEST_CASE("inline budget: two holders cannot take the whole budget: a third still gets bytes", "[inline-budget]") {
  // Issue 46, item 6: at 4054af8 two principals that read slowly held all of loader.max_inline_bytes between them
  // (each up to its three-quarter share), and every other principal's inline loads waited.
  InlineBudget budget(64, 48);
  CHECK(budget.TakeOrWait(
      48, [] { FAIL("not queued"); }, "a"));
  CHECK(budget.TakeOrWait(
      8, [] { FAIL("not queued"); }, "b"));
  bool b_woken = false;
  CHECK_FALSE(budget.TakeOrWait(
      8, [&] { b_woken = true; }, "b"));  // the last eighth is kept
  CHECK(budget.TakeOrWait(
      8, [] { FAIL("not queued"); }, "c"));  // for one that holds none
  CHECK(budget.held() == 64);
  budget.Give(8, "c");
  CHECK(b_woken);
}

}  // namespace cake
