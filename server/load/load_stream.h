// One Load stream: the server side of the Cake load protocol (Start / Plan / Progress / Loaded / Done / Release),
// as a state machine that the stream's messages, I/O completions and timers drive. It writes through a sink:
// the gRPC reactor (load_reactor.h), or a test's, which drives it on a fake clock without gRPC.
//
// One mutex guards the state. Sink calls are made outside it, one write at a time, never after End.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "base/mutex.h"
#include "base/timers.h"
#include "cake/v1/kv.pb.h"
#include "scheduler/io_pool.h"
#include "scheduler/load_cursor.h"
#include "scheduler/planner.h"
#include "server/core/daemon_state.h"
#include "server/load/chunk_landing.h"
#include "server/load/engine_requests.h"
#include "server/load/inline_window.h"
#include "server/load/load_outbox.h"
#include "server/load/load_tally.h"

namespace cake {

class LoadStreamSink {
 public:
  virtual ~LoadStreamSink() = default;
  // Sends one message; the stream hears OnWriteDone before it writes again. `message` stays valid until then.
  virtual void Write(const v1::LoadResponse* message) = 0;
  // Ends the stream with `status`: the last call, after every write is done.
  virtual void End(const absl::Status& status) = 0;
  // Fails the write in progress (a client that stopped reading would hold the stream open for ever).
  virtual void AbortRpc() = 0;
};

class LoadStream : public std::enable_shared_from_this<LoadStream> {
 public:
  // Who the caller is now: a reloaded access policy may have revoked or renamed it since the stream opened.
  using IdentifyAgain = std::function<absl::StatusOr<Caller>()>;

  // `caller`: who the daemon established the stream's client to be (an error ends the stream at Start). Owned by
  // a shared_ptr: reads, timers and the daemon's load list hold it (weakly, where it may be gone).
  LoadStream(DaemonState& state, Timers& timers, absl::StatusOr<Caller> caller, IdentifyAgain identify_again,
             std::string peer);

  // Writes go to `sink` from now until RpcDone. A client that opens a stream and sends no Start (the Python client
  // keeps one open ahead of its next load; a hostile one may open thousands) is held to loader.start_timeout_ms.
  // Returns whether to read requests: false when the stream was ended at once (past loader.max_unstarted_streams
  // or its per-principal share; the sink was told).
  bool Open(LoadStreamSink* sink);
  // Returns whether to read the next message. A client that half-closes the stream has released it, as Release.
  bool OnRequest(const v1::LoadRequest& request);
  void OnWriteDone(bool ok);
  // The client cancelled, the daemon is stopping, or an operator ended the load: the engine computes the rest.
  void Cancel(const absl::Status& why);
  // The sink is gone (the RPC ended).
  void RpcDone();
  // For cakectl loads; nullopt once the load is ending.
  std::optional<LoadSummary> Describe();

 private:
  // kLookingUp: Start was accepted and a networked tier is still being asked how much of the prompt it holds.
  // kEnded: the sink was told the end.
  enum class Phase { kAwaitStart, kLookingUp, kLoading, kMet, kEnded };

  // One event: holds the stream's lock for its scope, then makes whatever sink call the event made due (Pump),
  // without the lock.
  class ABSL_SCOPED_LOCKABLE Event {
   public:
    explicit Event(LoadStream* stream) ABSL_EXCLUSIVE_LOCK_FUNCTION(stream->mu_) : stream_(stream) {
      stream_->mu_.Lock();
    }
    ~Event() ABSL_UNLOCK_FUNCTION() {
      stream_->mu_.Unlock();
      stream_->Pump();
    }
    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;

   private:
    LoadStream* const stream_;
  };

  absl::Status StartLocked(const v1::LoadStart& start) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LookedUpOverNetwork(TierManager::PrefixLookup& lookup);
  absl::Status PlanLocked(std::vector<TierKind> tiers) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ProgressLocked(uint32_t computed_through) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void IssueReadsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ReadBeatsEngineLocked(uint32_t chunk, uint32_t queued) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReadChunk(uint32_t chunk);
  void ReadRetired();
  void ChunkReadLocked(uint32_t chunk, const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateRemainingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckMeetingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Duration IdleTimeoutLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WatchIdleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckIdle(uint64_t generation);
  // The load waits on the daemon, and the client has every message of ours: its silence is not idleness.
  bool DaemonOwesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ArmRecheckLocked(double seconds) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnInlineRoom();
  void LearnComputeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Pump();

  DaemonState& state_;
  Timers& timers_;
  struct Who {
    absl::StatusOr<Caller> caller;
    IdentifyAgain identify_again;
    std::string peer;  // for logs
  };
  const Who who_;

  Mutex mu_;
  LoadStreamSink* sink_ ABSL_GUARDED_BY(mu_) = nullptr;
  // AbortRpc may call back into the stream (gRPC's OnCancel), so it is called under this lock and never under mu_.
  Mutex abort_mu_;
  LoadStreamSink* abortable_ ABSL_GUARDED_BY(abort_mu_) = nullptr;
  std::atomic<bool> cancelled_{false};  // read by I/O threads: a read not yet started need not be

  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kAwaitStart;
  uint64_t ticket_ ABSL_GUARDED_BY(mu_) = 0;  // in state_.loads
  // Set under the lock at Start and when the plan is made, before the first read is submitted (the submission
  // orders them before the reads), and only read after that, by I/O threads without the lock.
  std::optional<LoadRequest> request_;
  struct Reads {
    std::vector<TierKind> tiers;  // of each cached chunk
    std::optional<ChunkLanding> landing;
    bool promote = false;         // copy what is read from slower tiers into DRAM
    uint32_t window_first = 0;    // the region window's first chunk: offsets count from it
    uint32_t lowest_to_load = 0;  // the same, or higher where the engine holds the chunks below
  } reads_;
  LoadPlanResult plan_ ABSL_GUARDED_BY(mu_);
  // What the engine told the daemon, and when.
  struct EngineReports {
    uint32_t reported_through = 0;
    TimePoint last_progress_at;
    ComputeModel observed;  // this load's Progress spans
    bool learned = false;   // `observed` handed to state_.compute_models
  } engine_ ABSL_GUARDED_BY(mu_);
  // Activity: any message from the client, a write of ours it read, or a watch that found the daemon owing.
  IdleWatch idle_ ABSL_GUARDED_BY(mu_);
  bool recheck_armed_ ABSL_GUARDED_BY(mu_) = false;  // the judge's re-check: one at a time
  RegionRegistry::WindowLease lease_ ABSL_GUARDED_BY(mu_);
  std::optional<LoadCursor> cursor_ ABSL_GUARDED_BY(mu_);
  // This load's place in the I/O arbiter, and in the networked tiers' one.
  std::shared_ptr<IoGroup> io_group_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<IoGroup> network_io_group_ ABSL_GUARDED_BY(mu_);
  std::optional<InlineWindow> inline_ ABSL_GUARDED_BY(mu_);  // inline loads only
  // Its place among the streams waiting for a Start, from Open until its Start or its end.
  std::optional<UnstartedStreams::Slot> unstarted_ ABSL_GUARDED_BY(mu_);
  LoadTally tally_ ABSL_GUARDED_BY(mu_);
  LoadOutbox outbox_ ABSL_GUARDED_BY(mu_);
  // Submitted to the I/O pool, or being promoted from the window, not yet back.
  uint32_t reads_outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<absl::Status> finish_ ABSL_GUARDED_BY(mu_);  // set once the stream is ending, with its status
};

}  // namespace cake
