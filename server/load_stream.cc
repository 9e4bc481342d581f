// The Load stream's state machine. gRPC callbacks and I/O completions both drive it; one mutex guards the state,
// and gRPC operations (StartWrite, Finish) are issued outside it, one write at a time, never after Finish.
#include "server/load_stream.h"

#include <deque>
#include <exception>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "cuda/cuda_backend.h"
#include "grpcpp/alarm.h"
#include "scheduler/load_cursor.h"
#include "scheduler/planner.h"
#include "scheduler/read_judge.h"
#include "server/chunk_landing.h"
#include "server/requests.h"
#include "server/services.h"
#include "spdlog/spdlog.h"

namespace cake {
namespace {

using Clock = std::chrono::steady_clock;

// Landed chunks sent in one LoadResponse.loaded_batch at most (about 20 bytes each: a message stays small).
constexpr int kMaxLoadedBatch = 1024;

class LoadSession;

class LoadReactor final : public grpc::ServerBidiReactor<v1::LoadRequest, v1::LoadResponse> {
 public:
  LoadReactor(grpc::CallbackServerContext* context, DaemonState& state, absl::StatusOr<Caller> caller);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  v1::LoadRequest request_;
  std::shared_ptr<LoadSession> session_;
};

class LoadSession : public std::enable_shared_from_this<LoadSession> {
 public:
  LoadSession(LoadReactor* reactor, grpc::CallbackServerContext* context, DaemonState& state,
              absl::StatusOr<Caller> caller)
      : reactor_(reactor), context_(context), state_(state), caller_(std::move(caller)) {}

  // The window lease ends with the session, once no read can still land in it.
  ~LoadSession() {
    if (inline_held_chunks_ > 0) state_.inline_budget.Give(inline_held_chunks_ * chunk_bytes_, fairness_key_);
  }

  // From the stream's first moment: a client that opens it and sends no Start (the Python client keeps one stream
  // open ahead of its next load; a hostile one may open thousands) is held to loader.start_timeout_ms.
  void WatchIdle() {
    MutexLock lock(&mu_);
    last_client_activity_ = Clock::now();
    ArmIdleWatchLocked(IdleTimeoutLocked());
  }

  // Before Start, loader.start_timeout_ms (a minute): the Python client retires a stream it opened ahead after
  // 20 s (python/cake/load.py), so the daemon does not end one under a Start on its way. Then the load's own.
  std::chrono::milliseconds IdleTimeoutLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::chrono::milliseconds(phase_ == Phase::kAwaitStart ? state_.config.load_start_timeout_ms
                                                                  : state_.config.load_idle_timeout_ms);
  }

  // Returns whether the reactor should read the next message.
  bool OnRequest(const v1::LoadRequest& request) {
    bool read_more = true;
    {
      MutexLock lock(&mu_);
      last_client_activity_ = Clock::now();
      switch (request.msg_case()) {
        case v1::LoadRequest::kStart:
          if (phase_ != Phase::kAwaitStart) {
            FailLocked(absl::InvalidArgumentError("Start was sent twice on one Load stream"));
          } else if (auto s = StartLocked(request.start()); !s.ok()) {
            Bump(state_.counters.invalid_requests);
            FailLocked(s);
          }
          break;
        case v1::LoadRequest::kProgress:
          if (phase_ == Phase::kAwaitStart) {
            FailLocked(absl::FailedPreconditionError("Progress before Start: send Start first"));
          } else if (auto s = ProgressLocked(request.progress().computed_through()); !s.ok()) {
            Bump(state_.counters.invalid_requests);
            FailLocked(s);
          }
          break;
        case v1::LoadRequest::kRelease:
          FinishLocked(absl::OkStatus());
          break;
        case v1::LoadRequest::MSG_NOT_SET:
          FailLocked(absl::InvalidArgumentError("a LoadRequest carried none of start, progress, release"));
          break;
      }
      read_more = !finishing_;
    }
    Pump();
    return read_more;
  }

  // The client half-closed (everything is released, as after Release) or cancelled the stream.
  void OnClientClosed() {
    if (context_->IsCancelled()) return Cancel(absl::CancelledError("load cancelled"));
    {
      MutexLock lock(&mu_);
      FinishLocked(absl::OkStatus());
    }
    Pump();
  }

  void OnWriteDone(bool ok) {
    {
      MutexLock lock(&mu_);
      writing_ = false;
      writing_inline_chunk_ = false;
      if (ok) last_client_activity_ = Clock::now();
      if (!ok) FinishLocked(absl::CancelledError("the client stopped reading the Load stream"));
      IssueReadsLocked();
    }
    Pump();
  }

  // The client cancelled, or the daemon is stopping: the engine computes whatever was not loaded.
  void Cancel(const absl::Status& why) {
    {
      MutexLock lock(&mu_);
      if (!finishing_) Bump(state_.counters.loads_cancelled);
      FinishLocked(why);
    }
    Pump();
  }

  // For cakectl loads; nullopt once the load is ending.
  std::optional<LoadSummary> Describe() {
    MutexLock lock(&mu_);
    if (finishing_ || !cursor_) return std::nullopt;
    LoadSummary out;
    out.load_id = load_id_;
    out.principal = caller_.ok() && caller_->principal != nullptr ? caller_->principal->name : "";
    out.client_id = client_id_;
    out.tenant = tenant_;
    out.model = model_;
    out.strategy = strategy_ == Strategy::kCake ? "cake" : strategy_ == Strategy::kIoOnly ? "io_only" : "compute_only";
    out.phase = phase_ == Phase::kMet ? "met" : "loading";
    out.total_chunks = static_cast<uint32_t>(keys_.size());
    out.cached_chunks = cursor_->cached_chunks();
    out.loaded_chunks = static_cast<uint32_t>(chunks_read_);
    out.computed_through = cursor_->computed_through();
    out.inline_bytes = inline_;
    out.age_s = SecondsSinceStartLocked();
    return out;
  }

  void OnDone() {
    {
      MutexLock lock(&context_mu_);
      rpc_done_ = true;  // the context goes with the reactor
    }
    MutexLock lock(&mu_);
    reactor_ = nullptr;
    LearnComputeLocked();
    if (ticket_ != 0) state_.loads.Remove(std::exchange(ticket_, 0));  // ended without Finish (never, today)
  }

 private:
  // kLookingUp: Start was accepted and a networked tier is still being asked how much of the prompt it holds.
  enum class Phase { kAwaitStart, kLookingUp, kLoading, kMet };

  // Checks the request and, once the tiers have said how much of the prompt is cached, plans the load. The
  // in-memory tiers answer here; a lookup that needs a networked tier (Redis) finishes on a network-call thread,
  // so a slow or frozen remote delays this load and never a gRPC thread.
  absl::Status StartLocked(const v1::LoadStart& start) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const DaemonConfig& config = state_.config;
    CAKE_RETURN_IF_ERROR(caller_.status());  // not an engine of this daemon: nothing of the request is read
    // The policy may have been reloaded (SIGHUP) since the stream opened: a principal revoked since starts nothing.
    if (caller_->policy != state_.access()) {
      auto now = IdentifyCaller(*context_, state_);
      if (!now.ok()) return now.status();
      CAKE_RETURN_IF_ERROR(AccessPolicy::Require(*now, Role::kEngine, "Load"));
      if (now->principal->name != caller_->principal->name) {
        return absl::PermissionDeniedError("the daemon's access policy changed since this stream opened; open another");
      }
    }
    if (state_.draining) {
      return absl::UnavailableError("the daemon is draining and takes no new loads; compute, or try another daemon");
    }
    CAKE_RETURN_IF_ERROR(CheckClientId(start.client_id()));
    CAKE_ASSIGN_OR_RETURN(const Namespace ns, CallerNamespace(*caller_, start.namespace_(), config));
    CAKE_ASSIGN_OR_RETURN(std::vector<ChunkKey> keys, PromptKeys(ns, start.prompt(), config));
    if (start.window() > config.max_load_window) {
      return absl::InvalidArgumentError(
          absl::StrCat("window ", start.window(), " exceeds loader.max_window (", config.max_load_window, ")"));
    }
    if (start.mode() != v1::LoadStart::MODE_CAKE && start.mode() != v1::LoadStart::MODE_IO_ONLY) {
      return absl::InvalidArgumentError(absl::StrCat("unknown load mode ", static_cast<int>(start.mode())));
    }
    if (start.compute_first_chunk_s() < 0 || start.compute_growth_s() < 0) {
      return absl::InvalidArgumentError("compute hints must not be negative");
    }
    if (start.computed_through() > keys.size() + 1) {
      return absl::InvalidArgumentError(absl::StrCat("computed_through ", start.computed_through(),
                                                     " exceeds the prompt's ", keys.size(), " full chunks"));
    }
    chunk_bytes_ = ns.chunk_bytes();
    inline_ = start.region_id().empty();
    batch_loaded_ = start.accept_loaded_batch() && !inline_;
    if (inline_) {
      if (start.region_offset() != 0 || start.region_bytes() != 0) {
        return absl::InvalidArgumentError("region_offset and region_bytes need a region_id");
      }
      if (chunk_bytes_ > config.max_message_bytes - 4096) {
        return absl::InvalidArgumentError(absl::StrCat("inline loads carry one chunk per message; a chunk of ",
                                                       chunk_bytes_, " bytes exceeds server.max_message_bytes"));
      }
    } else {
      CAKE_RETURN_IF_ERROR(CheckRegionsReachable(*caller_));
      const RegionOwner owner(caller_->principal->name, start.client_id());
      CAKE_ASSIGN_OR_RETURN(const uint64_t region_size, state_.regions.Size(owner, start.region_id()));
      if (start.region_offset() > region_size) {
        return absl::OutOfRangeError(absl::StrCat("region_offset ", start.region_offset(), " is past the end of the ",
                                                  region_size, "-byte region"));
      }
      const uint64_t available = region_size - start.region_offset();
      if (start.region_bytes() > available) {
        return absl::OutOfRangeError(absl::StrCat("region window [", start.region_offset(), ", +", start.region_bytes(),
                                                  ") runs past the end of the ", region_size, "-byte region"));
      }
      region_ask_ = {owner, start.region_id(), start.region_offset(),
                     start.region_bytes() == 0 ? available : start.region_bytes()};
    }
    keys_ = std::move(keys);
    ns_id_ = ns.id();
    metrics_ = &state_.load_metrics.For(ns.spec().tenant, ns.spec().model_id);
    tenant_ = ns.spec().tenant;
    model_ = ns.spec().model_id;
    client_id_ = start.client_id();
    reported_through_ = start.computed_through();
    window_ = start.window() == 0 ? config.load_window : start.window();
    io_only_requested_ = start.mode() == v1::LoadStart::MODE_IO_ONLY;
    hint_first_chunk_s_ = start.compute_first_chunk_s();
    hint_growth_s_ = start.compute_growth_s();
    // Admitted here, before any tier is asked: a caller past its caps costs the daemon no lookup.
    fairness_key_ = caller_->policy->single_tenant() && caller_->unix_socket ? absl::StrCat("uid ", caller_->uid)
                                                                             : caller_->principal->name;
    LoadOwner owner{fairness_key_, client_id_, inline_ ? std::string() : region_ask_.region_id, caller_->peer,
                    caller_->principal->name};
    // A stopping daemon, an operator's release of the region or a revoking reload ends the stream itself (with
    // the reason) rather than cancel the context: the weak reference is safe whenever it runs, even after the RPC
    // is gone.
    CAKE_ASSIGN_OR_RETURN(
        ticket_, state_.loads.TryAdd(
                     LoadCaps{config.max_concurrent_loads, config.max_concurrent_loads_per_principal,
                              config.max_concurrent_loads_per_client},
                     std::move(owner),
                     [weak = weak_from_this()](const absl::Status& why) {
                       if (auto self = weak.lock()) self->Cancel(why);
                     },
                     [weak = weak_from_this()]() -> std::optional<LoadSummary> {
                       auto self = weak.lock();
                       return self ? self->Describe() : std::nullopt;
                     }));
    started_ = Clock::now();
    last_progress_at_ = started_;
    phase_ = Phase::kLookingUp;
    ArmIdleWatchLocked(IdleTimeoutLocked());  // the load's own timeout from now; the stream's watch retires

    auto lookup = std::make_shared<TierManager::PrefixLookup>(state_.tiers.LookupPrefixInMemory(keys_));
    if (lookup->needs_network() &&
        state_.network_calls.TrySubmit([self = shared_from_this(), lookup] { self->LookedUpOverNetwork(*lookup); })) {
      return absl::OkStatus();
    }
    // All in memory, or too many calls already wait on the network: the cached prefix ends where memory's does.
    if (lookup->needs_network()) Bump(state_.counters.lookups_network_skipped);
    return PlanLocked(lookup->Prefix());
  }

  // On a network-call thread: the rest of Start, unless the load ended while the lookup waited.
  void LookedUpOverNetwork(TierManager::PrefixLookup& lookup) {
    state_.tiers.FinishLookupOverNetwork(lookup);
    {
      MutexLock lock(&mu_);
      if (phase_ != Phase::kLookingUp || finishing_) return;
      if (auto s = PlanLocked(lookup.Prefix()); !s.ok()) {
        Bump(state_.counters.invalid_requests);
        FailLocked(s);
      }
    }
    Pump();
  }

  // Reserves the (admitted) load's window of the region and plans the split for the `tiers` that hold the cached
  // prefix; sends the Plan and issues the first reads.
  absl::Status PlanLocked(std::vector<TierKind> tiers) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    tiers_ = std::move(tiers);
    const uint32_t cached = static_cast<uint32_t>(tiers_.size());
    uint32_t lowest_loadable = 0;
    if (!inline_) {
      // Too small a window loads what fits, from the tail: the engine computes the rest.
      const uint64_t fit = std::min<uint64_t>(cached, region_ask_.window_bytes / chunk_bytes_);
      lowest_loadable = cached - static_cast<uint32_t>(fit);
      CAKE_ASSIGN_OR_RETURN(lease_, state_.regions.ReserveWindow(region_ask_.owner, region_ask_.region_id,
                                                                 region_ask_.offset, fit * chunk_bytes_));
    }
    // Region offsets stay relative to what the window fits; chunks the engine holds are not loaded, as if it had
    // reported them computed before the first read.
    lowest_loadable_ = lowest_loadable;
    landing_ = inline_ ? ChunkLanding::Inline(chunk_bytes_)
                       : ChunkLanding::InRegion(lease_.region(), region_ask_.offset, lowest_loadable_, chunk_bytes_);
    lowest_loadable = std::max(lowest_loadable, std::min(reported_through_, cached));
    lowest_to_load_ = lowest_loadable;
    phase_ = Phase::kLoading;
    Bump(state_.counters.loads_started);

    // The plan: the engine's hint when it sends one (it knows how busy it is now), else what this namespace's
    // engine was seen to cost in earlier loads; against the tiers' measured speeds, each chunk at its own tier's.
    ComputeModel compute;
    compute.Seed(hint_first_chunk_s_, hint_growth_s_);
    if (!compute.known()) compute = state_.compute_models.Get(ns_id_);
    std::vector<uint8_t> chunk_tier(tiers_.size());
    std::vector<double> tier_chunk_s(256, 0.0);
    for (size_t i = 0; i < tiers_.size(); ++i) {
      chunk_tier[i] = static_cast<uint8_t>(tiers_[i]);
      tier_chunk_s[chunk_tier[i]] = state_.tiers.LoadSecondsPerByte(tiers_[i]) * static_cast<double>(chunk_bytes_);
    }
    LoadCosts costs =
        EstimateLoadCosts(chunk_tier, tier_chunk_s, lowest_loadable, static_cast<uint8_t>(TierKind::kDram));
    single_tier_ = costs.single_tier;
    PlanInput input;
    input.cached_chunks = cached;
    input.lowest_loadable = lowest_loadable;
    input.load_chunk_s = costs.load_chunk_s;
    input.load_suffix_s = std::move(costs.load_suffix_s);
    input.io_only_requested = io_only_requested_;
    const PlanDecision decision = Decide(input, compute);
    plan_compute_ = compute;
    planned_meeting_ = decision.meeting_chunk.value_or(0);
    strategy_ = decision.strategy;
    // Compute-only loads nothing: the cursor starts with nothing loadable, so the split is final at once.
    cursor_.emplace(LoadCursor::Options{cached, strategy_ == Strategy::kComputeOnly ? cached : lowest_loadable, window_,
                                        strategy_ == Strategy::kCake, std::move(chunk_tier)});
    io_group_ = state_.pool.NewGroup();
    network_io_group_ = state_.network_reads.NewGroup();
    UpdateRemainingLocked();
    Bump(strategy_ == Strategy::kCake     ? state_.counters.loads_cake
         : strategy_ == Strategy::kIoOnly ? state_.counters.loads_io_only
                                          : state_.counters.loads_compute_only);
    Bump(strategy_ == Strategy::kCake     ? metrics_->loads_cake
         : strategy_ == Strategy::kIoOnly ? metrics_->loads_io_only
                                          : metrics_->loads_compute_only);
    state_.load_metrics.plan_seconds.Observe(SecondsSinceStartLocked());

    v1::LoadResponse response;
    v1::LoadPlan* plan = response.mutable_plan();
    load_id_ = absl::StrCat("load-", ticket_);
    promote_ = strategy_ != Strategy::kComputeOnly && ShouldPromote(cached, lowest_loadable);
    plan->set_load_id(load_id_);
    plan->set_total_chunks(static_cast<uint32_t>(keys_.size()));
    plan->set_cached_chunks(cached);
    for (TierKind kind : tiers_) plan->add_chunk_tiers(static_cast<v1::TierKind>(kind));
    // What the window fits, not raised by computed_through: clients place chunks by it.
    plan->set_lowest_loadable(lowest_loadable_);
    plan->set_chunk_bytes(chunk_bytes_);
    plan->set_strategy(static_cast<v1::LoadPlan::Strategy>(strategy_));
    if (decision.meeting_chunk) plan->set_predicted_meeting_chunk(*decision.meeting_chunk);
    if (decision.cake_s) plan->set_predicted_cake_s(*decision.cake_s);
    if (decision.compute_only_s) plan->set_predicted_compute_only_s(*decision.compute_only_s);
    if (decision.io_only_s) plan->set_predicted_io_only_s(*decision.io_only_s);
    outbox_.push_back(std::move(response));
    spdlog::debug("{}: {} chunks, {} cached, lowest loadable {}, window {}, {}, {}", load_id_, keys_.size(), cached,
                  lowest_loadable, window_, inline_ ? "inline" : "region", StrategyName(strategy_));
    IssueReadsLocked();
    CheckMeetingLocked();
    return absl::OkStatus();
  }

  // A load from slower tiers larger than half the DRAM tier would only churn it: each promotion would evict an
  // earlier one of the same load (and whatever else was hot). Such loads are not promoted.
  bool ShouldPromote(uint32_t cached, uint32_t lowest_loadable) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Tier* dram = state_.tiers.tier(TierKind::kDram);
    if (dram == nullptr) return false;
    uint64_t slower_bytes = 0;
    for (uint32_t c = lowest_loadable; c < cached; ++c) {
      if (tiers_[c] != TierKind::kDram) slower_bytes += chunk_bytes_;
    }
    if (slower_bytes == 0) return false;
    if (slower_bytes > dram->Usage().capacity_bytes / 2) {
      Bump(state_.counters.loads_not_promoted);
      spdlog::debug("{}: {} bytes from slower tiers exceed half the DRAM tier; not promoted", load_id_, slower_bytes);
      return false;
    }
    return true;
  }

  absl::Status ProgressLocked(uint32_t computed_through) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (computed_through > keys_.size() + 1) {
      // One past the full chunks is allowed: the engine may count a partial tail chunk.
      return absl::InvalidArgumentError(
          absl::StrCat("computed_through ", computed_through, " exceeds the prompt's ", keys_.size(), " full chunks"));
    }
    // Every advance is a measured span of the engine's compute, for the next loads' plans; not under I/O-only,
    // where the engine was told to wait and what it reports is not its compute speed.
    const Clock::time_point now = Clock::now();
    const bool io_only = phase_ == Phase::kLookingUp ? io_only_requested_ : strategy_ == Strategy::kIoOnly;
    if (computed_through > reported_through_ && phase_ != Phase::kAwaitStart && !io_only) {
      observed_compute_.Observe(reported_through_, computed_through,
                                std::chrono::duration<double>(now - last_progress_at_).count());
      reported_through_ = computed_through;
      last_progress_at_ = now;
    }
    if (phase_ != Phase::kLoading) return absl::OkStatus();
    cursor_->OnProgress(computed_through);
    UpdateRemainingLocked();
    CheckMeetingLocked();
    IssueReadsLocked();  // a read turned down for this engine's speed may be worth it now
    return absl::OkStatus();
  }

  void IssueReadsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (phase_ != Phase::kLoading || finishing_) return;
    for (;;) {
      // Inline bytes wait in the outbox until the client reads them: count them against the window so a slow
      // client holds at most `window` chunks of daemon memory, and against the daemon's inline budget (taken
      // before the read, so the bytes are counted from the moment they exist), so all of them together hold at
      // most loader.max_inline_bytes. Without room, the read waits for some to come back.
      if (inline_ && cursor_->in_flight() + outbox_.size() >= window_) return;
      if (inline_ && inline_held_chunks_ <= InlineChunksLiveLocked()) {
        if (waiting_inline_room_) return;
        if (!state_.inline_budget.TakeOrWait(
                chunk_bytes_,
                [weak = weak_from_this()] {
                  if (auto self = weak.lock()) self->OnInlineRoom();
                },
                fairness_key_)) {
          waiting_inline_room_ = true;
          Bump(state_.counters.inline_reads_waited);
          return;
        }
        ++inline_held_chunks_;
      }
      std::optional<uint32_t> chunk =
          cursor_->NextRead([this](uint32_t c, uint32_t queued) {
        mu_.AssertHeld();  // NextRead calls back at once, on this thread, under this lock
        return ReadBeatsEngineLocked(c, queued);
      });
      if (!chunk) return;
      if (!first_read_) first_read_ = Clock::now();
      auto self = shared_from_this();
      const uint32_t c = *chunk;
      // A networked tier's reads have threads of their own: a frozen Redis must not hold the threads that DRAM
      // and disk reads need (this load's and every other's).
      const bool networked = tiers_[c] == TierKind::kRemote;
      const bool submitted = (networked ? state_.network_reads : state_.pool)
                                 .TrySubmit(networked ? network_io_group_ : io_group_, [self, c] { self->ReadChunk(c); });
      if (submitted) ++reads_outstanding_;
      if (submitted && inline_) ++inline_reads_in_flight_;
      if (!submitted) {
        spdlog::warn("{}: the I/O queue is full; chunk {} will be computed", load_id_, c);
        cursor_->OnReadDone(c, false);
      }
    }
  }

  // Under Cake, whether a read of `chunk` issued now, behind `queued` reads of its tier, would land before the
  // engine computes the chunk itself (JudgeRead). When a read is turned down with nothing in flight, a timer asks
  // again at the point the engine counts as stalled, so a load whose engine stops reporting still moves
  // (Progress asks again too).
  bool ReadBeatsEngineLocked(uint32_t chunk, uint32_t queued) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ReadJudgeInput in;
    in.cake = strategy_ == Strategy::kCake;
    in.chunk = chunk;
    in.queued = queued;
    in.planned_meeting = planned_meeting_;
    in.engine_through = std::max(reported_through_, cursor_->computed_through());
    in.load_chunk_s = state_.tiers.LoadSecondsPerByte(tiers_[chunk]) * static_cast<double>(chunk_bytes_);
    in.since_progress_s = std::chrono::duration<double>(Clock::now() - last_progress_at_).count();
    in.reads_in_flight = cursor_->in_flight() > 0;
    const ReadVerdict verdict = JudgeRead(in, plan_compute_);
    if (verdict.recheck_after_s) ArmRecheckLocked(*verdict.recheck_after_s);
    return verdict.issue;
  }

  // Before arming a new alarm: every older one but the newest is dropped (destroying an alarm cancels it, and its
  // callback, called with fired=false, does nothing). The newest may be the one whose callback is arming the next,
  // so it stays until the one after; a long load holds two alarms of each kind, not one per timer it ever set.
  static void KeepOnlyNewestAlarm(std::vector<std::unique_ptr<grpc::Alarm>>& alarms) {
    if (alarms.size() > 1) alarms.erase(alarms.begin(), alarms.end() - 1);
  }

  // Ends the load once its client has been silent for loader.idle_timeout_ms: no message from it and none of
  // ours read. Checked when the timeout could first have passed, then again at each later point it could.
  // Each call starts a new watch; an alarm of an older one does nothing when it fires.
  void ArmIdleWatchLocked(std::chrono::nanoseconds after) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++idle_watch_;
    RearmIdleWatchLocked(after);
  }
  void RearmIdleWatchLocked(std::chrono::nanoseconds after) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // A new alarm each time: one may be armed from inside another's callback (see ArmRecheckLocked).
    KeepOnlyNewestAlarm(idle_alarms_);
    idle_alarms_.push_back(std::make_unique<grpc::Alarm>());
    idle_alarms_.back()->Set(std::chrono::system_clock::now() +
                                 std::chrono::duration_cast<std::chrono::system_clock::duration>(after),
                             [weak = weak_from_this(), watch = idle_watch_](bool fired) {
                               if (auto self = weak.lock(); self && fired) self->CheckIdle(watch);
                             });
  }

  void CheckIdle(uint64_t watch) {
    bool cancel_write = false;
    {
      MutexLock lock(&mu_);
      if (finishing_ || watch != idle_watch_) return;
      const auto timeout = IdleTimeoutLocked();
      const auto idle = Clock::now() - last_client_activity_;
      if (idle < timeout) return RearmIdleWatchLocked(timeout - idle);
      if (phase_ == Phase::kAwaitStart) {
        // A stream opened ahead of a load that never came: nothing to tell anyone but the client.
        FinishLocked(absl::DeadlineExceededError(absl::StrCat(
            "no Start within ", timeout.count(), " ms of opening the Load stream (loader.start_timeout_ms)")));
      } else {
        Bump(state_.counters.loads_idle_ended);
        spdlog::info("{}: its client was silent for {} ms; the load is ended", load_id_, timeout.count());
        FinishLocked(absl::DeadlineExceededError(
            absl::StrCat("the load was ended after ", timeout.count(),
                         " ms without a message from the client or a read of ours (loader.idle_timeout_ms); "
                         "compute the rest of the prompt")));
      }
      // A write the client never reads would hold the stream open: cancel it, so the stream can end.
      cancel_write = writing_;
    }
    if (cancel_write) {
      // The RPC may end meanwhile (the write completes, the stream finishes): its context is used only while
      // OnDone has not run.
      MutexLock lock(&context_mu_);
      if (!rpc_done_) context_->TryCancel();
    }
    Pump();
  }

  // Calls IssueReadsLocked again in `seconds` (once: a re-check already armed stays as it is). Each re-check gets
  // a new alarm: one may be armed from inside another's callback, where setting that same alarm again would
  // replace the callback that is running.
  void ArmRecheckLocked(double seconds) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (recheck_armed_ || phase_ != Phase::kLoading) return;
    recheck_armed_ = true;
    KeepOnlyNewestAlarm(rechecks_);
    rechecks_.push_back(std::make_unique<grpc::Alarm>());
    const auto delay = std::chrono::duration_cast<std::chrono::system_clock::duration>(
        std::chrono::duration<double>(std::max(seconds, 0.0)));
    rechecks_.back()->Set(std::chrono::system_clock::now() + delay, [weak = weak_from_this()](bool fired) {
      auto self = weak.lock();
      if (!self) return;
      {
        MutexLock lock(&self->mu_);
        self->recheck_armed_ = false;
        if (fired) self->IssueReadsLocked();
      }
      self->Pump();
    });
  }

  // Runs on an I/O thread, without the lock: reads one chunk straight into its place.
  void ReadChunk(uint32_t chunk) {
    if (cancelled_.load(std::memory_order_relaxed)) {
      ChunkLanding::Landed cancelled;
      cancelled.status = absl::CancelledError("");
      return ChunkRead(chunk, std::move(cancelled), false);
    }
    ChunkLanding::Landed landed;
    try {
      landed = landing_->Land(state_.tiers, tiers_[chunk], keys_[chunk], chunk);
    } catch (const std::exception& e) {
      // Out of memory or descriptors: the chunk is one the engine computes, like any failed read.
      landed = ChunkLanding::Landed();
      landed.status = absl::ResourceExhaustedError(absl::StrCat("reading the chunk threw: ", e.what()));
    }
    const bool promote =
        landed.status.ok() && promote_ && tiers_[chunk] != TierKind::kDram && !landed.bytes().empty();
    // Inline bytes move into the message: their promotion copy is made here, first.
    if (promote && inline_) state_.tiers.Promote(keys_[chunk], landed.bytes(), tiers_[chunk]);
    ChunkRead(chunk, std::move(landed), promote && !inline_);
  }

  // Reports the read; then hands its promotion to the promotion thread, so this I/O thread can take the next
  // read. The read retires (and the window stays held) until the promotion has copied the bytes.
  void ChunkRead(uint32_t chunk, ChunkLanding::Landed landed, bool promote_later) {
    {
      MutexLock lock(&mu_);
      if (inline_) --inline_reads_in_flight_;
      if (phase_ == Phase::kLoading && !finishing_) {
        ChunkReadLocked(chunk, landed.status, std::move(landed.inline_bytes));
      }
    }
    Pump();
    if (promote_later &&
        state_.tiers.PromoteLater(
            keys_[chunk], landed.bytes(),
            [self = shared_from_this(), staging = std::move(landed.staging)] { self->ReadRetired(); },
            tiers_[chunk])) {
      return;
    }
    ReadRetired();
  }

  void ReadRetired() {
    {
      MutexLock lock(&mu_);
      --reads_outstanding_;
    }
    Pump();
  }

  void ChunkReadLocked(uint32_t chunk, const absl::Status& status, std::string inline_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    last_read_ = Clock::now();
    if (!status.ok()) {
      Bump(state_.counters.load_chunk_read_failures);
      spdlog::warn("{}: chunk {} could not be read ({}); the engine computes it", load_id_, chunk, status.ToString());
    } else {
      ++chunks_read_;
      if (inline_) pending_inline_[chunk] = std::move(inline_bytes);
    }
    for (uint32_t loaded : cursor_->OnReadDone(chunk, status.ok())) {
      v1::LoadResponse response;
      v1::ChunkLoaded* msg = response.mutable_loaded();
      msg->set_chunk(loaded);
      msg->set_bytes(chunk_bytes_);
      if (inline_) {
        auto it = pending_inline_.find(loaded);
        msg->set_data(std::move(it->second));
        pending_inline_.erase(it);
        ++outbox_inline_chunks_;
      } else {
        msg->set_region_offset(landing_->OffsetOf(loaded));
      }
      outbox_.push_back(std::move(response));
      if (!first_chunk_landed_) {
        first_chunk_landed_ = true;
        state_.load_metrics.first_chunk_seconds.Observe(SecondsSinceStartLocked());
      }
      Bump(state_.counters.load_chunks_loaded);
      Bump(state_.counters.load_bytes_loaded, chunk_bytes_);
    }
    UpdateRemainingLocked();
    CheckMeetingLocked();
    IssueReadsLocked();
  }

  // What the arbiter's shortest-remaining-first policy ranks this load by: chunks it still has to read.
  void UpdateRemainingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint32_t floor = std::max(cursor_->computed_through(), lowest_to_load_);
    const uint32_t low = cursor_->loaded_low();
    io_group_->SetRemaining(low > floor ? low - floor : 0);
    network_io_group_->SetRemaining(low > floor ? low - floor : 0);
  }

  void CheckMeetingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (phase_ != Phase::kLoading) return;
    std::optional<uint32_t> meeting = cursor_->Meeting();
    if (!meeting) return;
    phase_ = Phase::kMet;
    pending_inline_.clear();
    v1::LoadResponse response;
    v1::LoadDone* done = response.mutable_done();
    done->set_meeting_chunk(*meeting);
    done->set_loaded_chunks(cursor_->cached_chunks() - *meeting);
    done->set_failed_chunks(cursor_->failed());
    outbox_.push_back(std::move(response));
    Bump(state_.counters.loads_finished);
    Bump(state_.counters.load_chunks_computed, *meeting);
    const uint32_t cached = cursor_->cached_chunks();
    metrics_->duration_seconds.Observe(SecondsSinceStartLocked());
    if (cached > 0) metrics_->loaded_share.Observe(static_cast<double>(cached - *meeting) / cached);
    Bump(metrics_->chunks_loaded, cached - *meeting);
    Bump(metrics_->chunks_computed, *meeting);
    Bump(metrics_->chunks_failed, cursor_->failed());
    Bump(metrics_->chunks_uncached, keys_.size() - cached);
    if (first_read_ && chunks_read_ > 0 && single_tier_) {
      const double seconds = std::chrono::duration<double>(last_read_ - *first_read_).count();
      state_.tiers.RecordLoadThroughput(tiers_.back(), chunks_read_ * chunk_bytes_, seconds);
    }
    spdlog::debug("{}: met at chunk {} of {} ({} loaded, {} failed, {} wasted reads) after {:.3f} ms", load_id_,
                  *meeting, cursor_->cached_chunks(), cursor_->cached_chunks() - *meeting, cursor_->failed(),
                  cursor_->wasted_reads(), std::chrono::duration<double, std::milli>(Clock::now() - started_).count());
  }

  double SecondsSinceStartLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::chrono::duration<double>(Clock::now() - started_).count();
  }

  void FailLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    spdlog::info("load stream from {} rejected: {}", context_->peer(), status.ToString());
    FinishLocked(status);
  }

  // Ends the stream with `status` once the write in progress (if any) is done; later events change nothing.
  // Once per load, when it ends: before the stream's final status goes out, so the engine's next load is planned
  // with what this one taught.
  void LearnComputeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (phase_ == Phase::kAwaitStart || learned_) return;
    learned_ = true;
    state_.compute_models.Learn(ns_id_, observed_compute_);
  }

  void FinishLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finishing_) return;
    LearnComputeLocked();
    finishing_ = true;
    finish_status_ = status;
    cancelled_.store(true, std::memory_order_relaxed);
    outbox_.clear();
    outbox_inline_chunks_ = 0;
    pending_inline_.clear();
  }

  // Chunks of this inline load in the daemon's memory: being read, read and waiting for the ones above them, in
  // the outbox, or being written.
  uint64_t InlineChunksLiveLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return inline_reads_in_flight_ + pending_inline_.size() + outbox_inline_chunks_ + (writing_inline_chunk_ ? 1 : 0);
  }

  // Room in the inline budget came back: try the reads that waited for it.
  void OnInlineRoom() {
    {
      MutexLock lock(&mu_);
      waiting_inline_room_ = false;
      IssueReadsLocked();
    }
    Pump();
  }

  // Issues the next gRPC operation, if one is due. Called without the lock after every event.
  void Pump() {
    // What the budget lent for chunks that are gone (written, failed, dropped) goes back first; never under mu_,
    // since giving back wakes other loads, which take their own locks.
    uint64_t spare_bytes = 0;
    std::string holder;
    {
      MutexLock lock(&mu_);
      if (const uint64_t live = InlineChunksLiveLocked(); inline_held_chunks_ > live) {
        spare_bytes = (inline_held_chunks_ - live) * chunk_bytes_;
        inline_held_chunks_ = live;
        holder = fairness_key_;
      }
    }
    if (spare_bytes > 0) state_.inline_budget.Give(spare_bytes, holder);
    LoadReactor* reactor = nullptr;
    v1::LoadResponse* to_write = nullptr;
    std::optional<grpc::Status> to_finish;
    RegionRegistry::WindowLease ended_lease;  // freed after the lock is dropped
    {
      MutexLock lock(&mu_);
      if (finished_ || reactor_ == nullptr || writing_) return;
      if (finishing_) {
        // The window is free for the engine's next load the moment it hears the stream end, so every read
        // that could still land in it must have drained first.
        if (reads_outstanding_ > 0) return;
        ended_lease = std::move(lease_);
        // No longer a live load by the time the client hears the end, so a Status it sends next agrees.
        if (ticket_ != 0) state_.loads.Remove(std::exchange(ticket_, 0));
        finished_ = true;
        to_finish = ToGrpcStatus(finish_status_);
      } else if (!outbox_.empty()) {
        writing_ = true;
        current_ = std::move(outbox_.front());
        outbox_.pop_front();
        if (current_.has_loaded() && !current_.loaded().data().empty()) {
          --outbox_inline_chunks_;
          writing_inline_chunk_ = true;
        } else if (batch_loaded_ && current_.has_loaded() && !outbox_.empty() && outbox_.front().has_loaded()) {
          // Chunks landed while the last write was out: one message for all of them (the client's per-message
          // cost, not the daemon's, is what limits small chunks). Only consecutive ones: a Done stays behind them.
          v1::LoadResponse batch;
          v1::ChunksLoaded* chunks = batch.mutable_loaded_batch();
          chunks->add_chunks()->Swap(current_.mutable_loaded());
          while (!outbox_.empty() && outbox_.front().has_loaded() && chunks->chunks_size() < kMaxLoadedBatch) {
            chunks->add_chunks()->Swap(outbox_.front().mutable_loaded());
            outbox_.pop_front();
          }
          current_ = std::move(batch);
        }
        to_write = &current_;
      } else {
        return;
      }
      reactor = reactor_;
    }
    // The reactor stays alive: OnDone cannot run before Finish, and nothing else writes while writing_ is set.
    if (to_write != nullptr) {
      reactor->StartWrite(to_write);
    } else {
      { RegionRegistry::WindowLease ended = std::move(ended_lease); }  // before the client can hear the end
      reactor->Finish(*to_finish);
    }
  }

  LoadReactor* reactor_ ABSL_GUARDED_BY(mu_);
  grpc::CallbackServerContext* const context_;
  DaemonState& state_;
  const absl::StatusOr<Caller> caller_;

  Mutex mu_;
  std::atomic<bool> cancelled_{false};
  // Guards the use of context_ from outside gRPC's own callbacks (the idle watch), which may race the RPC's end.
  // Never held with mu_: a cancel may call back into the session.
  Mutex context_mu_;
  bool rpc_done_ ABSL_GUARDED_BY(context_mu_) = false;

  // Fixed under the lock once the plan is made, before the first read is submitted (the submission orders it
  // before the reads), and only read after that, by I/O threads without the lock.
  std::vector<ChunkKey> keys_;
  std::vector<TierKind> tiers_;
  uint64_t chunk_bytes_ = 0;
  bool inline_ = false;
  bool batch_loaded_ = false;  // the client set accept_loaded_batch (and the load is not inline)
  bool promote_ = false;                 // copy what is read from slower tiers into DRAM
  std::optional<ChunkLanding> landing_;

  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kAwaitStart;
  std::string load_id_ ABSL_GUARDED_BY(mu_) = "load";
  uint64_t ticket_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t lowest_loadable_ ABSL_GUARDED_BY(mu_) = 0;  // the region window's first chunk: offsets count from it
  uint32_t lowest_to_load_ ABSL_GUARDED_BY(mu_) = 0;   // the same, or higher where the engine holds the chunks below
  uint32_t window_ ABSL_GUARDED_BY(mu_) = 1;
  // One tier holds every chunk this load reads: it measures that tier's speed.
  bool single_tier_ ABSL_GUARDED_BY(mu_) = false;
  Strategy strategy_ ABSL_GUARDED_BY(mu_) = Strategy::kCake;
  ChunkKey ns_id_ ABSL_GUARDED_BY(mu_);
  ComputeModel observed_compute_ ABSL_GUARDED_BY(mu_);  // this load's Progress spans
  ComputeModel plan_compute_ ABSL_GUARDED_BY(mu_);      // what the plan assumed the engine costs (hint or history)
  // Where the plan told the engine to stop and wait (0: no prediction).
  uint32_t planned_meeting_ ABSL_GUARDED_BY(mu_) = 0;
  // Ask the judge again when it turned a read down with nothing in flight (the last one may be pending).
  std::vector<std::unique_ptr<grpc::Alarm>> rechecks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<grpc::Alarm>> idle_alarms_ ABSL_GUARDED_BY(mu_);
  uint64_t idle_watch_ ABSL_GUARDED_BY(mu_) = 0;  // the current idle watch (ArmIdleWatchLocked)
  // Whom admission and the inline budget count this load against (LoadOwner::fairness_key); set at Start.
  std::string fairness_key_ ABSL_GUARDED_BY(mu_);
  Clock::time_point last_client_activity_ ABSL_GUARDED_BY(mu_);
  bool recheck_armed_ ABSL_GUARDED_BY(mu_) = false;
  bool learned_ ABSL_GUARDED_BY(mu_) = false;  // observed_compute_ handed to state_.compute_models
  uint32_t reported_through_ ABSL_GUARDED_BY(mu_) = 0;
  Clock::time_point last_progress_at_ ABSL_GUARDED_BY(mu_);
  RegionRegistry::WindowLease lease_ ABSL_GUARDED_BY(mu_);
  // What Start asked of its region, kept for the window's reservation once the lookup is done.
  struct RegionAsk {
    RegionOwner owner;
    std::string region_id;
    uint64_t offset = 0;
    uint64_t window_bytes = 0;
  };
  RegionAsk region_ask_ ABSL_GUARDED_BY(mu_);
  bool io_only_requested_ ABSL_GUARDED_BY(mu_) = false;
  double hint_first_chunk_s_ ABSL_GUARDED_BY(mu_) = 0;
  double hint_growth_s_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<LoadCursor> cursor_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<IoGroup> io_group_ ABSL_GUARDED_BY(mu_);  // this load's place in the I/O arbiter
  std::shared_ptr<IoGroup> network_io_group_ ABSL_GUARDED_BY(mu_);  // ... and in the networked tiers' one
  absl::flat_hash_map<uint32_t, std::string> pending_inline_ ABSL_GUARDED_BY(mu_);
  // The inline budget: chunks' worth taken from state_.inline_budget, and what they are for (InlineChunksLive).
  uint64_t inline_held_chunks_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t inline_reads_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t outbox_inline_chunks_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_inline_chunk_ ABSL_GUARDED_BY(mu_) = false;
  bool waiting_inline_room_ ABSL_GUARDED_BY(mu_) = false;  // queued in the budget for a callback
  Clock::time_point started_ ABSL_GUARDED_BY(mu_);
  std::optional<Clock::time_point> first_read_ ABSL_GUARDED_BY(mu_);
  Clock::time_point last_read_ ABSL_GUARDED_BY(mu_);
  uint64_t chunks_read_ ABSL_GUARDED_BY(mu_) = 0;
  bool first_chunk_landed_ ABSL_GUARDED_BY(mu_) = false;
  LoadMetrics::Series* metrics_ ABSL_GUARDED_BY(mu_) = nullptr;  // this load's (tenant, model); set at Start
  std::string tenant_ ABSL_GUARDED_BY(mu_);
  std::string model_ ABSL_GUARDED_BY(mu_);
  std::string client_id_ ABSL_GUARDED_BY(mu_);

  std::deque<v1::LoadResponse> outbox_ ABSL_GUARDED_BY(mu_);
  v1::LoadResponse current_ ABSL_GUARDED_BY(mu_);  // the write in progress: gRPC reads it while writing_ is set
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  // Submitted to the I/O pool, or being promoted from the window, not yet back.
  uint32_t reads_outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status finish_status_ ABSL_GUARDED_BY(mu_);
};

LoadReactor::LoadReactor(grpc::CallbackServerContext* context, DaemonState& state, absl::StatusOr<Caller> caller) {
  if (!caller.ok()) {
    // A caller the daemon refuses is told so at once: its stream must hold nothing while waiting for a Start.
    Finish(ToGrpcStatus(caller.status()));
    return;
  }
  session_ = std::make_shared<LoadSession>(this, context, state, std::move(caller));
  session_->WatchIdle();
  StartRead(&request_);
}

void LoadReactor::OnReadDone(bool ok) {
  if (!ok) {
    session_->OnClientClosed();
    return;
  }
  if (session_->OnRequest(request_)) StartRead(&request_);
}

void LoadReactor::OnWriteDone(bool ok) { session_->OnWriteDone(ok); }
void LoadReactor::OnCancel() {
  if (session_ != nullptr) session_->Cancel(absl::CancelledError("load cancelled"));
}

void LoadReactor::OnDone() {
  if (session_ != nullptr) session_->OnDone();
  delete this;
}

}  // namespace

grpc::ServerBidiReactor<v1::LoadRequest, v1::LoadResponse>* NewLoadStream(grpc::CallbackServerContext* context,
                                                                          DaemonState& state,
                                                                          absl::StatusOr<Caller> caller) {
  return new LoadReactor(context, state, std::move(caller));
}

}  // namespace cake
