#include "server/load/load_stream.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "scheduler/read_judge.h"
#include "server/load/load_plan.h"
#include "spdlog/spdlog.h"

namespace cake {

namespace {

// Counts the load against the daemon's caps (limits.max_concurrent_loads, ..._per_principal, ..._per_client:
// RESOURCE_EXHAUSTED naming the full one); returns its ticket in state.loads. A stopping daemon, an operator's
// release of its region or a revoking reload ends the stream itself (LoadStream::Cancel, with the reason) rather
// than cancel its RPC; cakectl loads asks it to Describe itself. Through a weak reference: safe whenever they
// run, even after the stream is gone.
absl::StatusOr<uint64_t> AdmitLoad(DaemonState& state, const LoadRequest& request, const Caller& caller,
                                   std::weak_ptr<LoadStream> stream) {
  const DaemonConfig& config = state.config;
  LoadOwner owner{request.fairness_key, request.client_id,      request.region ? request.region->region_id : "",
                  caller.peer,          caller.principal->name, request.ns.spec().tenant};
  absl::StatusOr<uint64_t> ticket = state.loads.TryAdd(
      LoadCaps{config.max_concurrent_loads, config.max_concurrent_loads_per_principal,
               config.max_concurrent_loads_per_client},
      std::move(owner),
      [stream](const absl::Status& why) {
        if (auto live = stream.lock()) live->Cancel(why);
      },
      [stream]() -> std::optional<LoadSummary> {
        auto live = stream.lock();
        return live ? live->Describe() : std::nullopt;
      });
  // Before its lookup: what a prefetch copied or is copying counts as used, what it queued the load reads itself.
  if (ticket.ok()) state.prefetcher.LoadStarted(request.keys);
  return ticket;
}

}  // namespace

LoadStream::LoadStream(DaemonState& state, Timers& timers, absl::StatusOr<Caller> caller, IdentifyAgain identify_again,
                       std::string peer)
    : state_(state),
      timers_(timers),
      who_{std::move(caller), std::move(identify_again), std::move(peer)},
      idle_(timers),
      tally_(state) {}

bool LoadStream::Open(LoadStreamSink* sink) {
  {
    MutexLock lock(&abort_mu_);
    abortable_ = sink;
  }
  Event event(this);
  sink_ = sink;
  // A caller the daemon refused is ended at Start (StartLocked); one it knows holds a place until then.
  if (who_.caller.ok()) {
    auto slot = state_.unstarted_streams.Take(FairnessKey(*who_.caller));
    if (!slot.ok()) {
      FinishLocked(slot.status());
      return false;
    }
    unstarted_.emplace(std::move(*slot));
  }
  WatchIdleLocked();
  return true;
}

bool LoadStream::OnRequest(const v1::LoadRequest& request) {
  bool read_more = true;
  {
    Event event(this);
    idle_.Activity();
    absl::Status status;
    switch (request.msg_case()) {
      case v1::LoadRequest::kStart:
        status = phase_ != Phase::kAwaitStart ? absl::InvalidArgumentError("Start was sent twice on one Load stream")
                                              : StartLocked(request.start());
        break;
      case v1::LoadRequest::kProgress:
        status = phase_ == Phase::kAwaitStart ? absl::FailedPreconditionError("Progress before Start: send Start first")
                                              : ProgressLocked(request.progress().computed_through());
        break;
      case v1::LoadRequest::kRelease:
        FinishLocked(absl::OkStatus());
        break;
      case v1::LoadRequest::MSG_NOT_SET:
        status = absl::InvalidArgumentError("a LoadRequest carried none of start, progress, release");
        break;
    }
    if (!status.ok()) {
      Bump(state_.counters.invalid_requests);
      FailLocked(status);
    }
    read_more = !finish_;
  }
  return read_more;
}

void LoadStream::OnWriteDone(bool ok) {
  Event event(this);
  outbox_.WriteDone();
  if (inline_) inline_->WriteDone();
  ok ? idle_.Activity() : FinishLocked(absl::CancelledError("the client stopped reading the Load stream"));
  IssueReadsLocked();
}

void LoadStream::Cancel(const absl::Status& why) {
  Event event(this);
  if (!finish_) Bump(state_.counters.loads_cancelled);
  FinishLocked(why);
}

void LoadStream::RpcDone() {
  {
    MutexLock lock(&abort_mu_);
    abortable_ = nullptr;
  }
  MutexLock lock(&mu_);
  sink_ = nullptr;
  LearnComputeLocked();
  // Every path that ends a stream removes its ticket first; this is the net under a future one that forgets, so a
  // load slot can never leak.
  if (ticket_ != 0) state_.loads.Remove(std::exchange(ticket_, 0));
}

std::optional<LoadSummary> LoadStream::Describe() {
  MutexLock lock(&mu_);
  if (finish_ || !request_) return std::nullopt;
  LoadSummary out;
  out.load_id = absl::StrCat("load-", ticket_);
  out.principal = who_.caller->principal->name;
  out.client_id = request_->client_id;
  out.tenant = request_->ns.spec().tenant;
  out.model = request_->ns.spec().model_id;
  out.strategy = plan_.decision.strategy;
  out.phase = phase_ == Phase::kMet ? LoadPhase::kMet : cursor_ ? LoadPhase::kLoading : LoadPhase::kLookingUp;
  out.total_chunks = static_cast<uint32_t>(request_->keys.size());
  out.cached_chunks = cursor_ ? cursor_->cached_chunks() : 0;
  out.loaded_chunks = static_cast<uint32_t>(tally_.chunks_read());
  out.computed_through = cursor_ ? cursor_->computed_through() : engine_.reported_through;
  out.inline_bytes = request_->inline_bytes();
  out.age_s = tally_.SecondsSinceStart(timers_.Now());
  return out;
}

// Checks the request, admits the load and, once the tiers say how much of the prompt is cached, plans it. A lookup
// that needs Redis finishes on a network-call thread: a frozen remote delays this load, never a gRPC thread.
absl::Status LoadStream::StartLocked(const v1::LoadStart& start) {
  unstarted_.reset();
  CAKE_RETURN_IF_ERROR(who_.caller.status());  // not an engine of this daemon: nothing of the request is read
  CAKE_ASSIGN_OR_RETURN(LoadRequest request, ParseLoadStart(start, *who_.caller, who_.identify_again, state_));
  // Admitted before any tier is asked: a caller past its caps costs the daemon no lookup. Ended from outside
  // through a weak reference, safe whenever it runs, even after the RPC is gone.
  CAKE_ASSIGN_OR_RETURN(ticket_, AdmitLoad(state_, request, *who_.caller, weak_from_this()));
  request_ = std::move(request);
  if (request_->inline_bytes()) {
    inline_.emplace(state_.inline_budget, request_->fairness_key, request_->chunk_bytes(), request_->window);
  }
  outbox_ = LoadOutbox(request_->accept_loaded_batch);
  const TimePoint now = timers_.Now();
  tally_.Started(now, request_->ns.spec().tenant, request_->ns.spec().model_id);
  engine_.reported_through = request_->computed_through;
  engine_.last_progress_at = now;
  phase_ = Phase::kLookingUp;
  WatchIdleLocked();  // the load's own timeout from now; the stream's watch retires

  auto lookup = std::make_shared<TierManager::PrefixLookup>(state_.tiers.LookupPrefixInMemory(request_->keys));
  if (lookup->needs_network() &&
      state_.remote_calls.TrySubmit([self = shared_from_this(), lookup] { self->LookedUpOverNetwork(*lookup); })) {
    return absl::OkStatus();
  }
  // All in memory, or too many calls already wait on the network: the cached prefix ends where memory's does.
  if (lookup->needs_network()) Bump(state_.counters.lookups_network_skipped);
  return PlanLocked(lookup->Prefix());
}

// On a network-call thread: the rest of Start, unless the load ended while the lookup waited.
void LoadStream::LookedUpOverNetwork(TierManager::PrefixLookup& lookup) {
  state_.tiers.FinishLookupOverNetwork(lookup);
  Event event(this);
  if (phase_ != Phase::kLookingUp || finish_) return;
  if (auto s = PlanLocked(lookup.Prefix()); !s.ok()) {
    Bump(state_.counters.invalid_requests);
    FailLocked(s);
  }
}

// Reserves the load's window of the region, plans the split for the cached prefix's `tiers`, issues the first reads.
absl::Status LoadStream::PlanLocked(std::vector<TierKind> tiers) {
  const LoadRequest& request = *request_;
  const uint64_t chunk_bytes = request.chunk_bytes();
  const uint32_t cached = static_cast<uint32_t>(tiers.size());
  CAKE_ASSIGN_OR_RETURN(LoadLanding landing, ReserveLanding(state_.regions, request, cached));
  lease_ = std::move(landing.lease);
  reads_.landing = landing.landing;
  const uint32_t window_first = reads_.window_first = landing.window_first;
  // Chunks the engine holds are not loaded, as if it had reported them computed before the first read.
  const uint32_t lowest = std::max(window_first, std::min(engine_.reported_through, cached));
  reads_.lowest_to_load = lowest;

  plan_ =
      PlanLoad(PlanRequestFor(request, tiers, lowest, state_.tier_speeds, state_.compute_models.Get(request.ns.id())));
  const Strategy strategy = plan_.decision.strategy;
  reads_.tiers = std::move(tiers);
  const auto fit = state_.tiers.FitForPromotion(reads_.tiers, lowest, chunk_bytes);
  if (fit == TierManager::PromotionFit::kTooLarge) Bump(state_.counters.loads_not_promoted);
  reads_.promote = strategy != Strategy::kComputeOnly && fit == TierManager::PromotionFit::kFits;
  // Compute-only loads nothing: the cursor starts with nothing loadable, so the split is final at once.
  cursor_.emplace(LoadCursor::Options{cached, strategy == Strategy::kComputeOnly ? cached : lowest, request.window,
                                      strategy == Strategy::kCake, reads_.tiers});  // a window per tier
  io_group_ = state_.local_reads.NewGroup();
  network_io_group_ = state_.remote_reads().NewGroup();
  phase_ = Phase::kLoading;
  UpdateRemainingLocked();
  tally_.Planned(strategy, timers_.Now());
  outbox_.Push(PlanMessage(absl::StrCat("load-", ticket_), request, reads_.tiers, window_first, plan_.decision));
  spdlog::debug("load-{}: {} chunks, {} cached, lowest loadable {}, window {}, {}, {}", ticket_, request.keys.size(),
                cached, lowest, request.window, request.region ? "region" : "inline", StrategyName(strategy));
  IssueReadsLocked();
  CheckMeetingLocked();
  return absl::OkStatus();
}

absl::Status LoadStream::ProgressLocked(uint32_t computed_through) {
  CAKE_RETURN_IF_ERROR(request_->CheckComputedThrough(computed_through));
  // Every advance is a measured span of the engine's compute, for the next loads' plans; not under I/O-only,
  // where the engine was told to wait and what it reports is not its compute speed.
  const TimePoint now = timers_.Now();
  const bool io_only =
      phase_ == Phase::kLookingUp ? request_->io_only_requested : plan_.decision.strategy == Strategy::kIoOnly;
  if (computed_through > engine_.reported_through && !io_only) {
    engine_.observed.Observe(engine_.reported_through, computed_through,
                             std::chrono::duration<double>(now - engine_.last_progress_at).count());
    engine_.reported_through = computed_through;
    engine_.last_progress_at = now;
  }
  if (phase_ != Phase::kLoading) return absl::OkStatus();
  cursor_->OnProgress(computed_through);
  UpdateRemainingLocked();
  CheckMeetingLocked();
  IssueReadsLocked();  // a read turned down for this engine's speed may be worth it now
  return absl::OkStatus();
}

void LoadStream::IssueReadsLocked() {
  if (phase_ != Phase::kLoading || finish_) return;
  for (;;) {
    // An inline load's bytes wait in the daemon until the client reads them: its window and the daemon's inline
    // budget bound them (InlineWindow). Without room, the read waits for some to come back.
    if (inline_) {
      const InlineWindow::Room room = inline_->Reserve([weak = weak_from_this()] {
        if (auto self = weak.lock()) self->OnInlineRoom();
      });
      if (room == InlineWindow::Room::kQueuedForBudget) Bump(state_.counters.inline_reads_waited);
      if (room != InlineWindow::Room::kYes) return;
    }
    std::optional<uint32_t> chunk = cursor_->NextRead([this](uint32_t c, uint32_t queued) {
      mu_.AssertHeld();  // NextRead calls back at once, on this thread, under this lock
      return ReadBeatsEngineLocked(c, queued);
    });
    if (!chunk) return;
    tally_.ReadIssued(timers_.Now());
    const uint32_t c = *chunk;
    // A networked tier's reads have threads of their own: a frozen Redis must not hold the threads that DRAM and
    // disk reads need (this load's and every other's).
    const bool networked = reads_.tiers[c] == TierKind::kRemote;
    if ((networked ? state_.remote_reads() : state_.local_reads)
            .TrySubmit(networked ? network_io_group_ : io_group_,
                       [self = shared_from_this(), c] { self->ReadChunk(c); })) {
      ++reads_outstanding_;
      if (inline_) inline_->ReadIssued();
    } else {
      spdlog::warn("load-{}: the I/O queue is full; chunk {} will be computed", ticket_, c);
      cursor_->OnReadDone(c, false);
    }
  }
}

// Under Cake, whether a read of `chunk` issued now, behind `queued` reads of its tier, would land before the engine
// computes the chunk itself (JudgeRead). When a read is turned down with nothing in flight, a timer asks again at
// the point the engine counts as stalled, so a load whose engine stops reporting still moves.
bool LoadStream::ReadBeatsEngineLocked(uint32_t chunk, uint32_t queued) {
  ReadJudgeInput in;
  in.cake = plan_.decision.strategy == Strategy::kCake;
  in.chunk = chunk;
  in.queued = queued;
  in.planned_meeting = plan_.decision.meeting_chunk.value_or(0);
  in.engine_through = std::max(engine_.reported_through, cursor_->computed_through());
  in.load_chunk_s =
      state_.tier_speeds.SecondsPerByte(reads_.tiers[chunk]) * static_cast<double>(request_->chunk_bytes());
  in.since_progress_s = std::chrono::duration<double>(timers_.Now() - engine_.last_progress_at).count();
  in.reads_in_flight = cursor_->in_flight() > 0;
  const ReadVerdict verdict = JudgeRead(in, plan_.compute);
  if (verdict.recheck_after_s) ArmRecheckLocked(*verdict.recheck_after_s);
  return verdict.issue;
}

// On an I/O thread, without the lock: reads one chunk into its place, reports it and hands its promotion to the
// promotion thread to take the next read; the read retires (the window stays held) once the promotion is done.
void LoadStream::ReadChunk(uint32_t chunk) {
  ChunkLanding::Landed landed;
  if (cancelled_.load(std::memory_order_relaxed)) {
    landed.status = absl::CancelledError("");
  } else {
    landed = reads_.landing->Land(state_.tiers, reads_.tiers[chunk], request_->keys[chunk], chunk, reads_.promote);
  }
  {
    Event event(this);
    const bool live = phase_ == Phase::kLoading && !finish_;
    if (inline_) inline_->ReadDone(chunk, live && landed.status.ok(), live ? std::move(landed.inline_bytes) : "");
    if (live) ChunkReadLocked(chunk, landed.status);
  }
  if (landed.promote_later &&
      state_.tiers.PromoteLater(
          request_->keys[chunk], landed.bytes(),
          [self = shared_from_this(), staging = std::move(landed.staging)] { self->ReadRetired(); },
          reads_.tiers[chunk], reads_.landing->stored_format())) {
    return;
  }
  ReadRetired();
}

void LoadStream::ReadRetired() {
  Event event(this);
  --reads_outstanding_;
}

void LoadStream::ChunkReadLocked(uint32_t chunk, const absl::Status& status) {
  const TimePoint now = timers_.Now();
  tally_.ReadDone(status, now);
  if (!status.ok())
    spdlog::warn("load-{}: chunk {} could not be read ({}); the engine computes it", ticket_, chunk, status.ToString());
  for (uint32_t loaded : cursor_->OnReadDone(chunk, status.ok())) {
    outbox_.Push(LoadedMessage(loaded, request_->chunk_bytes(), inline_ ? inline_->TakeForMessage(loaded) : "",
                               reads_.landing->OffsetOf(loaded)));
    tally_.ChunkLanded(request_->chunk_bytes(), now);
  }
  UpdateRemainingLocked();
  CheckMeetingLocked();
  IssueReadsLocked();
}

// What the arbiter's shortest-remaining-first policy ranks this load by, and what holds prefetch copies back:
// chunks it still has to read (none once it met or ended).
void LoadStream::UpdateRemainingLocked() {
  const uint32_t floor = std::max(cursor_->computed_through(), reads_.lowest_to_load), low = cursor_->loaded_low();
  const uint32_t left = phase_ == Phase::kLoading && !finish_ && low > floor ? low - floor : 0;
  io_group_->SetRemaining(left);
  network_io_group_->SetRemaining(left);
}

void LoadStream::CheckMeetingLocked() {
  if (phase_ != Phase::kLoading) return;
  const std::optional<uint32_t> meeting = cursor_->Meeting();
  if (!meeting) return;
  phase_ = Phase::kMet;
  UpdateRemainingLocked();
  if (inline_) inline_->DropWaiting();
  outbox_.Push(DoneMessage(*cursor_, *meeting));
  tally_.Met(*cursor_, *meeting, request_->keys.size(), request_->chunk_bytes(),
             plan_.single_tier ? std::optional(reads_.tiers.back()) : std::nullopt, timers_.Now());
  spdlog::debug("load-{}: met at chunk {} of {} ({} failed, {} wasted reads) after {:.3f} s", ticket_, *meeting,
                cursor_->cached_chunks(), cursor_->failed(), cursor_->wasted_reads(),
                tally_.SecondsSinceStart(timers_.Now()));
}

// Before Start, loader.start_timeout_ms (a minute): the Python client retires a stream it opened ahead well before
// that, so the daemon does not end one under a Start on its way. Then the load's own.
Duration LoadStream::IdleTimeoutLocked() const {
  return std::chrono::milliseconds(phase_ == Phase::kAwaitStart ? state_.config.load_start_timeout_ms
                                                                : state_.config.load_idle_timeout_ms);
}

// Ends the load once its client has been silent for the timeout: no message from it and none of ours read.
void LoadStream::WatchIdleLocked() {
  idle_.Restart(IdleTimeoutLocked(), [weak = weak_from_this()](uint64_t generation) {
    if (auto self = weak.lock()) self->CheckIdle(generation);
  });
}

void LoadStream::CheckIdle(uint64_t generation) {
  bool abort_write = false;
  {
    MutexLock lock(&mu_);
    const Duration timeout = IdleTimeoutLocked();
    if (finish_) return;
    // Idle means the client owes something. A load waiting on the daemon (a networked tier's lookup, reads in
    // flight, the inline budget others hold) with none of its messages unread owes nothing: its silence is the
    // daemon's, and ending it would punish the client for the daemon's own queue.
    if (DaemonOwesLocked()) idle_.Activity();
    if (idle_.Check(generation, timeout) != IdleWatch::Verdict::kExpired) return;
    if (phase_ != Phase::kAwaitStart) {  // else a stream opened ahead of a load that never came
      Bump(state_.counters.loads_idle_ended);
      spdlog::info("load-{}: its client was silent for {} ms; the load is ended", ticket_,
                   timeout / std::chrono::milliseconds(1));
    }
    FinishLocked(SilentClientError(phase_ == Phase::kAwaitStart, timeout));
    abort_write = outbox_.writing();
  }
  if (abort_write) {
    MutexLock lock(&abort_mu_);
    if (abortable_ != nullptr) abortable_->AbortRpc();
  }
  Pump();
}

bool LoadStream::DaemonOwesLocked() const {
  if (outbox_.writing()) return false;  // a message of ours waits to be read: the client owes reading it
  return phase_ == Phase::kLookingUp || reads_outstanding_ > 0 || (inline_ && inline_->waiting_for_budget());
}

// Calls IssueReadsLocked again in `seconds` (once: a re-check already armed stays as it is).
void LoadStream::ArmRecheckLocked(double seconds) {
  if (recheck_armed_ || phase_ != Phase::kLoading) return;
  recheck_armed_ = true;
  const auto delay = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(std::max(seconds, 0.0)));
  timers_.At(timers_.Now() + delay, [weak = weak_from_this()] {
    auto self = weak.lock();
    if (!self) return;
    Event event(self.get());
    self->recheck_armed_ = false;
    self->IssueReadsLocked();
  });
}

// Room in the inline budget came back: try the reads that waited for it.
void LoadStream::OnInlineRoom() {
  Event event(this);
  if (inline_) inline_->RoomCameBack();
  IssueReadsLocked();
}

// Once per load, when it ends, before its final status goes out: the engine's next load is planned with it.
void LoadStream::LearnComputeLocked() {
  if (!request_ || engine_.learned) return;
  engine_.learned = true;
  state_.compute_models.Learn(request_->ns.id(), engine_.observed);
}

void LoadStream::FailLocked(const absl::Status& status) {
  spdlog::info("load stream from {} rejected: {}", who_.peer, status.ToString());
  FinishLocked(status);
}

// Ends the stream with `status` once the write in progress (if any) is done; later events change nothing.
void LoadStream::FinishLocked(const absl::Status& status) {
  if (finish_) return;
  LearnComputeLocked();
  finish_ = status;
  unstarted_.reset();
  if (cursor_) UpdateRemainingLocked();
  cancelled_.store(true, std::memory_order_relaxed);
  outbox_.Clear();
  if (inline_) inline_->Drop();
}

// Makes the next sink call, if one is due. Called without the lock after every event.
void LoadStream::Pump() {
  // The budget lent for chunks that are gone goes back first; never under mu_, since giving back wakes other
  // loads, which take their own locks.
  uint64_t spare_bytes = 0;
  const InlineWindow* window = nullptr;
  LoadStreamSink* sink = nullptr;
  const v1::LoadResponse* to_write = nullptr;
  std::optional<absl::Status> to_end;
  RegionRegistry::WindowLease ended_lease;  // freed after the lock is dropped, before the client hears the end
  {
    MutexLock lock(&mu_);
    if (inline_) {
      spare_bytes = inline_->TakeSpareBytes();
      window = &*inline_;
    }
    if (phase_ == Phase::kEnded || sink_ == nullptr || outbox_.writing()) {
      sink = nullptr;
    } else if (finish_) {
      // The window is free for the engine's next load the moment it hears the stream end, so every read that
      // could still land in it must have drained first.
      if (reads_outstanding_ == 0) {
        ended_lease = std::move(lease_);
        // No longer a live load by the time the client hears the end, so a Status it sends next agrees.
        if (ticket_ != 0) state_.loads.Remove(std::exchange(ticket_, 0));
        phase_ = Phase::kEnded;
        to_end = *finish_;
        sink = sink_;
      }
    } else if ((to_write = outbox_.StartWrite()) != nullptr) {
      if (inline_ && to_write->has_loaded() && !to_write->loaded().data().empty()) inline_->WriteStarted();
      sink = sink_;
    }
  }
  if (spare_bytes > 0) window->GiveBack(spare_bytes);
  if (sink == nullptr) return;
  // The sink stays alive: the RPC cannot end before End, and nothing else writes while the outbox writes.
  if (to_write != nullptr) return sink->Write(to_write);
  { RegionRegistry::WindowLease ended = std::move(ended_lease); }
  sink->End(*to_end);
}

}  // namespace cake
