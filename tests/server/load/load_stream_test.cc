// The Load stream's state machine without gRPC: a test sink stands in for the reactor, timers run on a fake clock,
// and the chunks are real, read from a real DRAM tier on the daemon's real I/O threads.
#include "server/load/load_stream.h"

#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "server/edge/requests.h"
#include "storage/dram_tier.h"

namespace cake {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kChunkTokens = 16;
constexpr uint64_t kChunkBytes = 4096;  // 1 layer, 1 head, head_dim 64, bf16: 256 bytes a token

// What the reactor would be: records every message and the end, and lets the test finish writes when it chooses
// (a client reading at its own pace).
class TestSink final : public LoadStreamSink {
 public:
  void Write(const v1::LoadResponse* message) override {
    std::lock_guard lock(mu_);
    CHECK_FALSE(writing_);  // one write at a time
    CHECK_FALSE(ended_);    // never after End
    writing_ = true;
    messages_.push_back(*message);
    changed_.notify_all();
  }
  void End(const absl::Status& status) override {
    std::lock_guard lock(mu_);
    CHECK_FALSE(writing_);  // only once every write is done
    CHECK_FALSE(ended_);
    ended_ = status;
    changed_.notify_all();
  }
  void AbortRpc() override {
    std::lock_guard lock(mu_);
    ++aborts_;
    changed_.notify_all();
  }

  // The message being written, once there is one (the write then counts as done for the sink; the test tells the
  // stream); nullopt once the stream ended, or after 10 s (real time: the reads run on real threads).
  std::optional<v1::LoadResponse> NextWrite() {
    std::unique_lock lock(mu_);
    changed_.wait_for(lock, 10s, [&] { return writing_ || ended_.has_value(); });
    if (!writing_) return std::nullopt;
    writing_ = false;
    return messages_.back();
  }
  // The end, once it came (waiting up to 10 s).
  std::optional<absl::Status> WaitEnded() {
    std::unique_lock lock(mu_);
    changed_.wait_for(lock, 10s, [&] { return ended_.has_value(); });
    return ended_;
  }
  bool writing() {
    std::lock_guard lock(mu_);
    return writing_;
  }
  std::optional<absl::Status> ended() {
    std::lock_guard lock(mu_);
    return ended_;
  }
  int aborts() {
    std::lock_guard lock(mu_);
    return aborts_;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<v1::LoadResponse> messages_;
  bool writing_ = false;
  std::optional<absl::Status> ended_;
  int aborts_ = 0;
};

DaemonConfig TestConfig() {
  DaemonConfig config;
  config.load_start_timeout_ms = 5000;
  config.load_idle_timeout_ms = 2000;
  config.io_threads = 2;
  return config;
}

struct Harness {
  explicit Harness(DaemonConfig c = TestConfig())
      : config(c), policy(*AccessPolicy::FromConfig(config)), state(config, policy), timers(clock) {
    state.tiers.AddTier(TierKind::kDram, std::make_unique<DramTier>(64 << 20));
    PeerFacts peer;
    peer.uid = getuid();
    caller = state.access()->Identify(peer);
    REQUIRE(caller.ok());
    caller->policy = state.access();  // as IdentifyCaller sets it
    caller->peer = peer;
  }

  std::shared_ptr<LoadStream> Open() {
    auto stream = std::make_shared<LoadStream>(
        state, timers, caller, [this] { return caller; }, "test");
    stream->Open(&sink);
    return stream;
  }

  v1::Namespace Ns() const {
    v1::Namespace ns;
    ns.set_model_id("test-model");
    ns.set_num_layers(1);
    ns.set_num_kv_heads(1);
    ns.set_head_dim(64);
    ns.set_dtype(v1::DTYPE_BF16);
    ns.set_chunk_tokens(kChunkTokens);
    return ns;
  }

  // A prompt of `chunks` full chunks whose first `cached` are in the DRAM tier, each filled with its index.
  v1::LoadRequest Start(uint32_t chunks, uint32_t cached) {
    v1::LoadRequest request;
    v1::LoadStart* start = request.mutable_start();
    start->set_client_id("engine");
    *start->mutable_namespace_() = Ns();
    for (uint32_t t = 0; t < chunks * kChunkTokens; ++t) start->mutable_prompt()->add_tokens(1000 + t);
    auto ns = ParseNamespace(start->namespace_(), config, "");
    REQUIRE(ns.ok());
    REQUIRE(ns->chunk_bytes() == kChunkBytes);
    auto keys = PromptKeys(*ns, start->prompt(), config);
    REQUIRE(keys.ok());
    for (uint32_t c = 0; c < cached; ++c) {
      std::vector<std::byte> bytes(kChunkBytes, static_cast<std::byte>(c));
      REQUIRE(state.tiers.Write((*keys)[c], bytes).ok());
    }
    return request;
  }

  // Reads like a client: finishes each write as it comes, until `last` holds for one or the stream ends.
  std::vector<v1::LoadResponse> ReadUntil(LoadStream& stream,
                                          const std::function<bool(const v1::LoadResponse&)>& last) {
    std::vector<v1::LoadResponse> taken;
    while (auto message = sink.NextWrite()) {
      taken.push_back(*message);
      stream.OnWriteDone(true);
      if (last(*message)) break;
    }
    return taken;
  }

  DaemonConfig config;
  AccessPolicy policy;
  DaemonState state;
  FakeClock clock;
  ManualTimers timers;
  absl::StatusOr<Caller> caller;
  TestSink sink;
};

bool IsDone(const v1::LoadResponse& m) { return m.has_done(); }

v1::LoadRequest Progress(uint32_t computed_through) {
  v1::LoadRequest request;
  request.mutable_progress()->set_computed_through(computed_through);
  return request;
}

v1::LoadRequest Release() {
  v1::LoadRequest request;
  request.mutable_release();
  return request;
}

}  // namespace

TEST_CASE("load stream: Start, Plan, the cached chunks land highest first, Done, Release", "[load_stream]") {
  Harness h;
  auto stream = h.Open();
  REQUIRE(stream->OnRequest(h.Start(8, 6)));
  const std::vector<v1::LoadResponse> messages = h.ReadUntil(*stream, IsDone);
  REQUIRE(messages.size() == 8);  // the plan, six chunks, Done
  REQUIRE(messages.front().has_plan());
  const v1::LoadPlan& plan = messages.front().plan();
  CHECK(plan.total_chunks() == 8);
  CHECK(plan.cached_chunks() == 6);
  CHECK(plan.chunk_bytes() == kChunkBytes);
  CHECK(plan.strategy() == v1::LoadPlan::STRATEGY_CAKE);  // no speeds known yet: Cake, which adapts
  uint32_t expected = 6;
  for (size_t i = 1; i + 1 < messages.size(); ++i) {
    REQUIRE(messages[i].has_loaded());
    CHECK(messages[i].loaded().chunk() == --expected);
    // Inline: the chunk's own bytes, as stored.
    const std::string& data = messages[i].loaded().data();
    REQUIRE(data.size() == kChunkBytes);
    CHECK(data[0] == static_cast<char>(expected));
    CHECK(data[kChunkBytes - 1] == static_cast<char>(expected));
  }
  REQUIRE(messages.back().has_done());
  CHECK(messages.back().done().meeting_chunk() == 0);  // the engine computed nothing: everything was loaded
  CHECK(messages.back().done().loaded_chunks() == 6);
  CHECK(h.state.loads.active() == 1);  // until Release
  CHECK_FALSE(stream->OnRequest(Release()));
  const auto end = h.sink.WaitEnded();
  REQUIRE(end);
  CHECK(end->ok());
  CHECK(h.state.loads.active() == 0);
  CHECK(h.state.inline_budget.held() == 0);  // every chunk's bytes went back
}

TEST_CASE("load stream: the engine's progress meets the loads, and chunks it holds are never read", "[load_stream]") {
  Harness h;
  auto stream = h.Open();
  v1::LoadRequest start = h.Start(8, 8);
  start.mutable_start()->set_computed_through(8);  // the engine holds everything already
  REQUIRE(stream->OnRequest(start));
  const std::vector<v1::LoadResponse> messages = h.ReadUntil(*stream, IsDone);
  REQUIRE(messages.size() == 2);  // the plan and Done: nothing to load
  CHECK(messages.back().done().meeting_chunk() == 8);
  CHECK(messages.back().done().loaded_chunks() == 0);
  CHECK_FALSE(stream->OnRequest(Release()));
  REQUIRE(h.sink.WaitEnded());
  CHECK(h.sink.ended()->ok());
}

TEST_CASE("load stream: bad messages end the stream with a status a person can act on", "[load_stream]") {
  Harness h;
  auto stream = h.Open();
  SECTION("Progress before Start") {
    CHECK_FALSE(stream->OnRequest(Progress(1)));
    const auto end = h.sink.WaitEnded();
    REQUIRE(end);
    CHECK(end->code() == absl::StatusCode::kFailedPrecondition);
    CHECK(end->message().find("send Start first") != std::string_view::npos);
  }
  SECTION("Start twice") {
    REQUIRE(stream->OnRequest(h.Start(4, 4)));
    CHECK_FALSE(stream->OnRequest(h.Start(4, 4)));
    h.ReadUntil(*stream, [](const v1::LoadResponse&) { return false; });
    REQUIRE(h.sink.ended());
    CHECK(h.sink.ended()->code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("Progress past the prompt") {
    REQUIRE(stream->OnRequest(h.Start(4, 4)));
    CHECK_FALSE(stream->OnRequest(Progress(6)));  // 4 full chunks, one partial allowed
    h.ReadUntil(*stream, [](const v1::LoadResponse&) { return false; });
    REQUIRE(h.sink.ended());
    CHECK(h.sink.ended()->code() == absl::StatusCode::kInvalidArgument);
    CHECK(h.sink.ended()->message().find("exceeds the prompt's 4 full chunks") != std::string_view::npos);
  }
  SECTION("a window over loader.max_window") {
    v1::LoadRequest start = h.Start(4, 4);
    start.mutable_start()->set_window(h.config.max_load_window + 1);
    CHECK_FALSE(stream->OnRequest(start));
    const auto end = h.sink.WaitEnded();
    REQUIRE(end);
    CHECK(end->code() == absl::StatusCode::kInvalidArgument);
    CHECK(end->message().find("loader.max_window") != std::string_view::npos);
  }
  CHECK(h.state.loads.active() == 0);
}

TEST_CASE("load stream: a stream that sends no Start ends after loader.start_timeout_ms", "[load_stream]") {
  Harness h;
  auto stream = h.Open();
  h.timers.Advance(4999ms);
  CHECK_FALSE(h.sink.ended());
  h.timers.Advance(2ms);
  REQUIRE(h.sink.ended());
  CHECK(h.sink.ended()->code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(h.sink.ended()->message().find("loader.start_timeout_ms") != std::string_view::npos);
}

TEST_CASE("load stream: a client silent for loader.idle_timeout_ms is ended, its unread write aborted",
          "[load_stream]") {
  Harness h;
  auto stream = h.Open();
  REQUIRE(stream->OnRequest(h.Start(8, 8)));
  // The client never finishes the Plan's write: the stream holds it, and every chunk waits behind it.
  REQUIRE(h.sink.NextWrite());
  h.timers.Advance(1000ms);
  stream->OnRequest(Progress(0));  // a message resets the watch
  h.timers.Advance(1500ms);
  CHECK_FALSE(h.sink.ended());
  CHECK(h.sink.aborts() == 0);
  h.timers.Advance(600ms);  // 2.1 s since its last message
  CHECK(h.sink.aborts() == 1);
  CHECK_FALSE(h.sink.ended());  // the write in progress must fail first (gRPC fails it after AbortRpc)
  stream->OnWriteDone(false);
  const auto end = h.sink.WaitEnded();
  REQUIRE(end);
  CHECK(end->code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(end->message().find("loader.idle_timeout_ms") != std::string_view::npos);
  CHECK(h.state.counters.loads_idle_ended == 1);
  CHECK(h.state.loads.active() == 0);
}

TEST_CASE("load stream: a load waiting on the daemon's inline budget is not ended as silent", "[load_stream]") {
  // Issue 46, item 4: another load that never reads (but keeps its stream alive) holds the whole inline budget; a
  // client that reads every message at once then has nothing to read and nothing to say. It is the daemon that
  // owes it chunks, so the idle watch must not end it.
  DaemonConfig config = TestConfig();
  config.max_inline_bytes = 2 * kChunkBytes;
  config.max_inline_bytes_per_principal = 2 * kChunkBytes;
  Harness h(config);
  TestSink hog_sink;
  auto hog = std::make_shared<LoadStream>(
      h.state, h.timers, h.caller, [&h] { return h.caller; }, "hog");
  hog->Open(&hog_sink);
  v1::LoadRequest hog_start = h.Start(16, 16);
  hog_start.mutable_start()->set_window(2);
  REQUIRE(hog->OnRequest(hog_start));
  REQUIRE(hog_sink.NextWrite());  // its plan stays unread: the chunks it read hold the budget
  // It holds all it may: its first chunk (the rest of the budget is kept for principals holding none, and the
  // reader below is the same principal).
  for (int i = 0; i < 200 && h.state.inline_budget.held() < kChunkBytes; ++i) std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(50ms);
  REQUIRE(h.state.inline_budget.held() == kChunkBytes);

  auto reader = h.Open();
  REQUIRE(reader->OnRequest(h.Start(16, 16)));
  REQUIRE(h.sink.NextWrite());  // the plan, read at once
  reader->OnWriteDone(true);
  for (int step = 0; step < 3; ++step) {  // 3 s: past the 2 s idle timeout
    h.timers.Advance(1000ms);
    hog->OnRequest(Progress(0));  // the hog stays alive as the audit's did
  }
  CHECK_FALSE(h.sink.ended());
  CHECK(h.state.counters.loads_idle_ended == 0);

  hog->Cancel(absl::CancelledError("the hog went away"));
  hog->OnWriteDone(true);
  REQUIRE(hog_sink.WaitEnded());
  hog->RpcDone();  // its chunks' budget comes back: the reader's reads go on
  const std::vector<v1::LoadResponse> rest = h.ReadUntil(*reader, IsDone);
  REQUIRE_FALSE(rest.empty());
  CHECK(rest.back().done().loaded_chunks() == 16);
  CHECK_FALSE(reader->OnRequest(Release()));
  REQUIRE(h.sink.WaitEnded());
  CHECK(h.sink.WaitEnded()->ok());
}

TEST_CASE("load stream: cancelled mid-load, it ends with the reason once its reads are back", "[load_stream]") {
  Harness h;
  auto stream = h.Open();
  REQUIRE(stream->OnRequest(h.Start(16, 16)));
  REQUIRE(h.sink.NextWrite());  // the plan, not yet read by the client
  stream->Cancel(absl::CancelledError("an operator released the region"));
  CHECK_FALSE(h.sink.ended());  // a write is still out
  stream->OnWriteDone(true);
  const auto end = h.sink.WaitEnded();
  REQUIRE(end);
  CHECK(end->code() == absl::StatusCode::kCancelled);
  CHECK(end->message() == "an operator released the region");
  CHECK(h.state.counters.loads_cancelled == 1);
  CHECK(h.state.loads.active() == 0);
  stream->RpcDone();
  CHECK(h.state.inline_budget.held() == 0);
}

TEST_CASE("load stream: an inline load holds at most its window of chunks while its client does not read",
          "[load_stream]") {
  Harness h;
  auto stream = h.Open();
  v1::LoadRequest start = h.Start(16, 16);
  start.mutable_start()->set_window(2);
  REQUIRE(stream->OnRequest(start));
  REQUIRE(h.sink.NextWrite());  // the plan stays unread: the chunks queue behind it
  // Give the I/O threads time to read whatever the window allows.
  for (int i = 0; i < 50 && h.state.inline_budget.held() < 2 * kChunkBytes; ++i) std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(50ms);
  CHECK(h.state.inline_budget.held() <= 2 * kChunkBytes);
  auto summary = h.state.loads.List();
  REQUIRE(summary.size() == 1);
  CHECK(summary[0].strategy == Strategy::kCake);
  CHECK(summary[0].phase == LoadPhase::kLoading);
  CHECK(summary[0].loaded_chunks <= 2);
  CHECK(summary[0].inline_bytes);
  stream->OnWriteDone(true);
  const std::vector<v1::LoadResponse> rest = h.ReadUntil(*stream, IsDone);
  REQUIRE_FALSE(rest.empty());
  CHECK(rest.back().done().loaded_chunks() == 16);
  CHECK_FALSE(stream->OnRequest(Release()));
  REQUIRE(h.sink.WaitEnded());
  CHECK(h.state.inline_budget.held() == 0);
}

TEST_CASE("load stream: after the load ends, timers that fire change nothing", "[load_stream]") {
  Harness h;
  auto stream = h.Open();
  REQUIRE(stream->OnRequest(h.Start(4, 4)));
  h.ReadUntil(*stream, IsDone);
  CHECK_FALSE(stream->OnRequest(Release()));
  REQUIRE(h.sink.WaitEnded());
  stream->RpcDone();
  h.timers.Advance(10s);  // the idle watch's callback runs against an ended stream
  CHECK(h.sink.aborts() == 0);
  stream.reset();
  h.timers.Advance(10s);  // and against one that is gone
}

}  // namespace cake

namespace cake {

TEST_CASE("load stream: a load whose split is final holds back no prefetch copy while its stream is open",
          "[load_stream][prefetch]") {
  Harness h;
  // The engine computes a chunk in a microsecond and DRAM is measured at 10 s a chunk: the plan is compute-only,
  // its split final at once, with every cached chunk above the engine's progress.
  h.state.tier_speeds.Record(TierKind::kDram, kChunkBytes, 10.0);
  auto stream = h.Open();
  v1::LoadRequest start = h.Start(8, 8);
  start.mutable_start()->set_compute_first_chunk_s(1e-6);
  REQUIRE(stream->OnRequest(start));
  const std::vector<v1::LoadResponse> messages = h.ReadUntil(*stream, IsDone);
  REQUIRE(messages.front().has_plan());
  CHECK(messages.front().plan().strategy() == v1::LoadPlan::STRATEGY_COMPUTE_ONLY);
  // The stream is still open (no Release yet): an idle task, a prefetch copy, starts all the same.
  std::atomic<bool> copied{false};
  REQUIRE(h.state.local_reads.TrySubmitIdle([&] { copied = true; }));
  for (int i = 0; i < 500 && !copied; ++i) std::this_thread::sleep_for(10ms);
  CHECK(copied);
  CHECK_FALSE(stream->OnRequest(Release()));
  REQUIRE(h.sink.WaitEnded());
}

TEST_CASE(
    "load stream: a principal's Load streams without a Start past its share end at once, and a cancelled one "
    "gives its place back at once",
    "[load_stream]") {
  // Issue 46, item 8: at 4054af8 every stream opened ahead cost about 19 KB until loader.start_timeout_ms, with no
  // cap but the connections' (about 0.6 GB per uid), and a cancelled one kept its memory until its timer fired.
  DaemonConfig config = TestConfig();
  config.max_unstarted_streams = 64;
  config.max_unstarted_streams_per_principal = 2;
  Harness h(config);
  std::vector<std::unique_ptr<TestSink>> sinks;
  std::vector<std::shared_ptr<LoadStream>> streams;
  auto open = [&] {
    sinks.push_back(std::make_unique<TestSink>());
    auto stream = std::shared_ptr<LoadStream>(new LoadStream(
        h.state, h.timers, h.caller, [&h] { return h.caller; }, "t"));
    const bool reading = stream->Open(sinks.back().get());
    streams.push_back(stream);
    return reading;
  };
  CHECK(open());
  CHECK(open());
  CHECK(h.state.unstarted_streams.open() == 2);
  CHECK_FALSE(open());  // past the principal's share: ended at once
  const auto refused = sinks.back()->ended();
  REQUIRE(refused.has_value());
  CHECK(refused->code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(refused->message()), Catch::Contains("loader.max_unstarted_streams_per_principal (2)"));
  // A cancelled stream gives its place back at once, not when its start timer fires; so does a started one.
  streams[0]->Cancel(absl::CancelledError("load cancelled"));
  CHECK(h.state.unstarted_streams.open() == 1);
  CHECK(open());
  REQUIRE(streams[1]->OnRequest(h.Start(16, 16)));
  CHECK(h.state.unstarted_streams.open() == 1);
  CHECK(open());
  CHECK(h.state.unstarted_streams.open() == 2);
  for (auto& stream : streams) stream->Cancel(absl::CancelledError("done"));
  CHECK(h.state.unstarted_streams.open() == 0);
}

}  // namespace cake
