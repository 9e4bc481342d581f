// IoPool: tasks run on its threads, a full queue refuses work instead of growing, and shutdown drains the queue.
#include "scheduler/io_pool.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <latch>
#include <mutex>
#include <set>
#include <thread>

namespace cake {
namespace {

using namespace std::chrono_literals;

// A gate the test opens; tasks wait on it so the workers stay busy for as long as the test needs.
class Gate {
 public:
  void Wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return open_; });
  }
  void Open() {
    {
      std::lock_guard lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

bool Eventually(const std::function<bool()>& pred) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(200us);
  }
  return true;
}

}  // namespace

TEST_CASE("io pool: submitted tasks run on the pool's threads", "[io_pool]") {
  std::atomic<int> ran{0};
  std::mutex mu;
  std::set<std::thread::id> ids;
  {
    IoPool pool(2, 100);
    for (int i = 0; i < 50; ++i) {
      REQUIRE(pool.TrySubmit([&] {
        ran++;
        std::lock_guard lock(mu);
        ids.insert(std::this_thread::get_id());
      }));
    }
    CHECK(Eventually([&] { return ran == 50; }));
    CHECK(pool.queued() == 0);
  }
  CHECK(ran == 50);
  CHECK_FALSE(ids.contains(std::this_thread::get_id()));
  CHECK(ids.size() <= 2);
}

TEST_CASE("io pool: a full queue refuses submissions", "[io_pool]") {
  Gate gate;
  std::latch workers_busy(2);
  std::atomic<int> ran{0};
  {
    IoPool pool(2, 3);
    // Occupy both workers first, so the queue's contents are exactly what the test puts there next.
    for (int i = 0; i < 2; ++i) {
      REQUIRE(pool.TrySubmit([&] {
        workers_busy.count_down();
        gate.Wait();
        ran++;
      }));
    }
    workers_busy.wait();
    CHECK(pool.queued() == 0);
    for (int i = 0; i < 3; ++i) CHECK(pool.TrySubmit([&] { ran++; }));
    CHECK(pool.queued() == 3);
    CHECK_FALSE(pool.TrySubmit([&] { ran += 1000; }));
    CHECK(pool.queued() == 3);

    gate.Open();
    CHECK(Eventually([&] { return ran == 5; }));
    // Room again once the queue drains.
    CHECK(pool.TrySubmit([&] { ran++; }));
    CHECK(Eventually([&] { return ran == 6; }));
  }
  CHECK(ran == 6);
}

TEST_CASE("io pool: an idle task starts only while no other task is queued or running", "[io_pool]") {
  Gate gate;
  std::latch load_running(1);
  std::atomic<int> idle_ran{0};
  std::atomic<bool> load_done{false};
  {
    IoPool pool(4, 10);  // threads to spare: only the rule keeps the idle task waiting
    auto group = pool.NewGroup();
    REQUIRE(pool.TrySubmit(group, [&] {
      load_running.count_down();
      gate.Wait();
      load_done = true;
    }));
    load_running.wait();
    // A load's read runs: the idle task waits, however many threads are free.
    REQUIRE(pool.TrySubmitIdle([&] {
      CHECK(load_done);
      idle_ran++;
    }));
    std::this_thread::sleep_for(50ms);
    CHECK(idle_ran == 0);
    gate.Open();
    CHECK(Eventually([&] { return idle_ran == 1; }));

    // While an idle task runs, a load's read submitted meanwhile starts on a free thread at once.
    Gate idle_gate;
    std::latch idle_running(1);
    REQUIRE(pool.TrySubmitIdle([&] {
      idle_running.count_down();
      idle_gate.Wait();
    }));
    idle_running.wait();
    std::atomic<bool> read_ran{false};
    REQUIRE(pool.TrySubmit(group, [&] { read_ran = true; }));
    CHECK(Eventually([&] { return read_ran.load(); }));
    idle_gate.Open();
  }
}

TEST_CASE("io pool: an idle task waits while a load has chunks left to read, though none is queued", "[io_pool]") {
  std::atomic<int> idle_ran{0};
  IoPool pool(2, 10);
  auto load = pool.NewGroup();
  load->SetRemaining(3);  // between two of its reads: nothing queued, nothing running, still reading
  REQUIRE(pool.TrySubmitIdle([&] { idle_ran++; }));
  std::this_thread::sleep_for(50ms);
  CHECK(idle_ran == 0);
  load->SetRemaining(0);  // its last read landed: the idle task starts without anything else to wake the pool
  CHECK(Eventually([&] { return idle_ran == 1; }));

  auto other = pool.NewGroup();
  other->SetRemaining(5);
  REQUIRE(pool.TrySubmitIdle([&] { idle_ran++; }));
  std::this_thread::sleep_for(50ms);
  CHECK(idle_ran == 1);
  other.reset();  // a load that ends (cancelled) holds nothing back either
  CHECK(Eventually([&] { return idle_ran == 2; }));
}

TEST_CASE("io pool: the destructor runs what is queued before joining", "[io_pool]") {
  Gate gate;
  std::latch worker_busy(1);
  std::atomic<int> ran{0};
  std::thread opener;
  {
    IoPool pool(1, 10);
    REQUIRE(pool.TrySubmit([&] {
      worker_busy.count_down();
      gate.Wait();
      ran++;
    }));
    worker_busy.wait();
    for (int i = 0; i < 5; ++i) REQUIRE(pool.TrySubmit([&] { ran++; }));
    CHECK(pool.queued() == 5);
    // Open the gate only once the destructor is under way, so the queued tasks are still queued when it starts.
    opener = std::thread([&] {
      std::this_thread::sleep_for(20ms);
      gate.Open();
    });
  }
  opener.join();
  CHECK(ran == 6);
}

}  // namespace cake

namespace cake {
namespace {

// Holds a one-thread pool's worker on a gate while tasks queue up, then records the order they run in.
class ServeRecorder {
 public:
  explicit ServeRecorder(IoPool& pool) {
    REQUIRE(pool.TrySubmit([this] {
      blocked_ = true;
      gate_.Wait();
    }));
    REQUIRE(Eventually([this] { return blocked_.load(); }));
  }
  std::function<void()> Task(std::string name) {
    return [this, name] {
      std::lock_guard lock(mu_);
      order_.push_back(name);
    };
  }
  // Lets the worker go and waits until `count` recorded tasks ran.
  std::vector<std::string> Release(size_t count) {
    gate_.Open();
    REQUIRE(Eventually([&] {
      std::lock_guard lock(mu_);
      return order_.size() == count;
    }));
    std::lock_guard lock(mu_);
    return order_;
  }

 private:
  Gate gate_;
  std::atomic<bool> blocked_{false};
  std::mutex mu_;
  std::vector<std::string> order_;
};

// One worker held busy by a gate while tasks of three loads queue up; then the order in which the worker takes
// them is the arbiter's.
std::vector<std::string> ServeOrder(ArbiterPolicy policy) {
  IoPool pool(1, 64, policy);
  ServeRecorder recorder(pool);
  auto big = pool.NewGroup();     // started first, 9 chunks left
  auto small = pool.NewGroup();   // started second, 1 chunk left
  auto medium = pool.NewGroup();  // started third, 4 chunks left
  big->SetRemaining(9);
  small->SetRemaining(1);
  medium->SetRemaining(4);
  for (int i = 0; i < 2; ++i) {
    REQUIRE(pool.TrySubmit(big, recorder.Task("big")));
    REQUIRE(pool.TrySubmit(medium, recorder.Task("medium")));
    REQUIRE(pool.TrySubmit(small, recorder.Task("small")));
  }
  REQUIRE(pool.TrySubmit(recorder.Task("rpc")));  // ungrouped work: before every load's reads
  return recorder.Release(7);
}

}  // namespace

TEST_CASE("io pool arbiter: each policy serves the loads' queued reads in its order", "[io_pool][arbiter]") {
  using V = std::vector<std::string>;
  CHECK(ServeOrder(ArbiterPolicy::kFifo) == V{"rpc", "big", "big", "small", "small", "medium", "medium"});
  CHECK(ServeOrder(ArbiterPolicy::kShortestRemaining) == V{"rpc", "small", "small", "medium", "medium", "big", "big"});
  // Round robin: each load in turn, the one served least recently first (never served: by arrival).
  CHECK(ServeOrder(ArbiterPolicy::kFairShare) == V{"rpc", "big", "small", "medium", "big", "small", "medium"});
}

TEST_CASE("io pool arbiter: shortest remaining first still serves a read that waited past the limit",
          "[io_pool][arbiter]") {
  IoPool pool(1, 64, ArbiterPolicy::kShortestRemaining, std::chrono::milliseconds(20));
  ServeRecorder recorder(pool);
  auto big = pool.NewGroup();
  auto small = pool.NewGroup();
  big->SetRemaining(100);
  small->SetRemaining(1);
  REQUIRE(pool.TrySubmit(big, recorder.Task("big")));
  std::this_thread::sleep_for(30ms);  // the big load's read is now past the 20 ms limit
  REQUIRE(pool.TrySubmit(small, recorder.Task("small")));
  REQUIRE(pool.TrySubmit(small, recorder.Task("small")));
  CHECK(recorder.Release(3) == std::vector<std::string>{"big", "small", "small"});
}

TEST_CASE("io pool arbiter: policy names", "[io_pool][arbiter]") {
  for (ArbiterPolicy p : {ArbiterPolicy::kFifo, ArbiterPolicy::kFairShare, ArbiterPolicy::kShortestRemaining}) {
    CHECK(ParseArbiterPolicy(ArbiterPolicyName(p)) == p);
  }
  CHECK(!ParseArbiterPolicy("lifo"));
}

}  // namespace cake
