// The Load stream's state machine. gRPC callbacks and I/O completions both drive it; one mutex guards the state,
// and gRPC operations (StartWrite, Finish) are issued outside it, one write at a time, never after Finish.
#include "server/load_stream.h"

#include <deque>
#include <optional>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_backend.h"
#include "grpcpp/alarm.h"
#include "scheduler/load_cursor.h"
#include "scheduler/planner.h"
#include "server/requests.h"
#include "spdlog/spdlog.h"
#include "storage/status_macros.h"

namespace cake {
namespace {

using Clock = std::chrono::steady_clock;

class LoadSession;

class LoadReactor final : public grpc::ServerBidiReactor<v1::LoadRequest, v1::LoadResponse> {
 public:
  LoadReactor(grpc::CallbackServerContext* context, DaemonState& state);

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
  LoadSession(LoadReactor* reactor, grpc::CallbackServerContext* context, DaemonState& state)
      : reactor_(reactor), context_(context), state_(state) {}

  // The window lease ends with the session, once no read can still land in it.
  ~LoadSession() = default;

  // Returns whether the reactor should read the next message.
  bool OnRequest(const v1::LoadRequest& request) {
    bool read_more = true;
    {
      std::lock_guard lock(mu_);
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
      std::lock_guard lock(mu_);
      FinishLocked(absl::OkStatus());
    }
    Pump();
  }

  void OnWriteDone(bool ok) {
    {
      std::lock_guard lock(mu_);
      writing_ = false;
      if (!ok) FinishLocked(absl::CancelledError("the client stopped reading the Load stream"));
      IssueReadsLocked();
    }
    Pump();
  }

  // The client cancelled, or the daemon is stopping: the engine computes whatever was not loaded.
  void Cancel(const absl::Status& why) {
    {
      std::lock_guard lock(mu_);
      if (!finishing_) Bump(state_.counters.loads_cancelled);
      FinishLocked(why);
    }
    Pump();
  }

  void OnDone() {
    std::lock_guard lock(mu_);
    reactor_ = nullptr;
    LearnComputeLocked();
    // A finished RPC no longer counts as a live load, even while its last reads drain.
    if (ticket_ != 0) state_.loads.Remove(std::exchange(ticket_, 0));
  }

 private:
  enum class Phase { kAwaitStart, kLoading, kMet };

  absl::Status StartLocked(const v1::LoadStart& start) {
    const DaemonConfig& config = state_.config;
    CAKE_RETURN_IF_ERROR(CheckClientId(start.client_id()));
    auto ns = ParseNamespace(start.namespace_(), config);
    if (!ns.ok()) return ns.status();
    auto keys = PromptKeys(*ns, start.prompt(), config);
    if (!keys.ok()) return keys.status();
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
    if (start.computed_through() > keys->size() + 1) {
      return absl::InvalidArgumentError(absl::StrCat("computed_through ", start.computed_through(),
                                                     " exceeds the prompt's ", keys->size(), " full chunks"));
    }
    keys_ = std::move(*keys);
    chunk_bytes_ = ns->chunk_bytes();
    tiers_ = state_.tiers.LookupPrefix(keys_);
    const uint32_t cached = static_cast<uint32_t>(tiers_.size());

    uint32_t lowest_loadable = 0;
    inline_ = start.region_id().empty();
    if (inline_) {
      if (start.region_offset() != 0 || start.region_bytes() != 0) {
        return absl::InvalidArgumentError("region_offset and region_bytes need a region_id");
      }
      if (chunk_bytes_ > config.max_message_bytes - 4096) {
        return absl::InvalidArgumentError(absl::StrCat("inline loads carry one chunk per message; a chunk of ",
                                                       chunk_bytes_, " bytes exceeds server.max_message_bytes"));
      }
    } else {
      auto region_size = state_.regions.Size(start.client_id(), start.region_id());
      if (!region_size.ok()) return region_size.status();
      if (start.region_offset() > *region_size) {
        return absl::OutOfRangeError(absl::StrCat("region_offset ", start.region_offset(), " is past the end of the ",
                                                  *region_size, "-byte region"));
      }
      const uint64_t available = *region_size - start.region_offset();
      if (start.region_bytes() > available) {
        return absl::OutOfRangeError(absl::StrCat("region window [", start.region_offset(), ", +", start.region_bytes(),
                                                  ") runs past the end of the ", *region_size, "-byte region"));
      }
      const uint64_t window_bytes = start.region_bytes() == 0 ? available : start.region_bytes();
      // Too small a window loads what fits, from the tail: the engine computes the rest.
      const uint64_t fit = std::min<uint64_t>(cached, window_bytes / chunk_bytes_);
      lowest_loadable = cached - static_cast<uint32_t>(fit);
      auto lease =
          state_.regions.ReserveWindow(start.client_id(), start.region_id(), start.region_offset(), fit * chunk_bytes_);
      if (!lease.ok()) return lease.status();
      lease_ = std::move(*lease);
      region_ = lease_.region();
      base_offset_ = start.region_offset();
    }
    // A stopping daemon ends the stream itself (CANCELLED) rather than cancel the context: the weak reference
    // is safe whenever it runs, even after the RPC is gone.
    ticket_ = state_.loads.TryAdd(config.max_concurrent_loads, [weak = weak_from_this()] {
      if (auto self = weak.lock())
        self->Cancel(absl::CancelledError("the daemon is stopping; compute the rest of the prompt"));
    });
    if (ticket_ == 0) {
      return absl::ResourceExhaustedError(absl::StrCat("the daemon is running limits.max_concurrent_loads (",
                                                       config.max_concurrent_loads, ") loads; retry shortly"));
    }
    // Region offsets stay relative to what the window fits; chunks the engine holds are not loaded, as if it had
    // reported them computed before the first read.
    lowest_loadable_ = lowest_loadable;
    lowest_loadable = std::max(lowest_loadable, std::min(start.computed_through(), cached));
    lowest_to_load_ = lowest_loadable;
    reported_through_ = start.computed_through();
    window_ = start.window() == 0 ? config.load_window : start.window();
    phase_ = Phase::kLoading;
    started_ = Clock::now();
    last_progress_at_ = started_;
    ns_id_ = ns->id();
    Bump(state_.counters.loads_started);

    // The plan: the engine's hint when it sends one (it knows how busy it is now), else what this namespace's
    // engine was seen to cost in earlier loads; against the tier's measured speed.
    ComputeModel compute;
    compute.Seed(start.compute_first_chunk_s(), start.compute_growth_s());
    if (!compute.known()) compute = state_.compute_models.Get(ns_id_);
    PlanInput input;
    input.cached_chunks = cached;
    input.lowest_loadable = lowest_loadable;
    input.load_chunk_s = LoadSecondsPerChunk(cached, lowest_loadable);
    if (input.load_chunk_s > 0 && !single_tier_) {
      // Chunks in several tiers are read at once: each tier's share at its own speed, not an average per chunk
      // (hot prefix chunks in DRAM and the tail on disk, say: only the disk chunks take time).
      std::vector<uint8_t> chunk_class;
      std::vector<double> class_chunk_s(256, 0.0);
      for (TierKind kind : tiers_) {
        chunk_class.push_back(static_cast<uint8_t>(kind));
        class_chunk_s[static_cast<uint8_t>(kind)] =
            state_.tiers.LoadSecondsPerByte(kind) * static_cast<double>(chunk_bytes_);
      }
      input.load_suffix_s = LoadSuffixSeconds(chunk_class, class_chunk_s, lowest_loadable);
    }
    input.io_only_requested = start.mode() == v1::LoadStart::MODE_IO_ONLY;
    const PlanDecision decision = Decide(input, compute);
    plan_compute_ = compute;
    planned_meeting_ = decision.meeting_chunk.value_or(0);
    strategy_ = decision.strategy;
    // Compute-only loads nothing: the cursor starts with nothing loadable, so the split is final at once.
    std::vector<uint8_t> chunk_tier(tiers_.size());
    for (size_t i = 0; i < tiers_.size(); ++i) chunk_tier[i] = static_cast<uint8_t>(tiers_[i]);
    cursor_.emplace(LoadCursor::Options{cached, strategy_ == Strategy::kComputeOnly ? cached : lowest_loadable, window_,
                                        strategy_ == Strategy::kCake, std::move(chunk_tier)});
    io_group_ = state_.pool.NewGroup();
    UpdateRemainingLocked();
    Bump(strategy_ == Strategy::kCake     ? state_.counters.loads_cake
         : strategy_ == Strategy::kIoOnly ? state_.counters.loads_io_only
                                          : state_.counters.loads_compute_only);

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

  // The load's cost per chunk, for the planner: tiers are read in parallel, so the load takes as long as its
  // slowest tier's share, spread over the chunks. An unmeasured DRAM tier counts as free (a copy in memory); any
  // other unmeasured tier makes the cost unknown (0). Also notes whether one tier holds every chunk to load, since
  // only such loads measure a tier's speed.
  double LoadSecondsPerChunk(uint32_t cached, uint32_t lowest_loadable) {
    if (cached <= lowest_loadable) return 0;
    absl::flat_hash_map<TierKind, uint32_t> per_tier;
    for (uint32_t c = lowest_loadable; c < cached; ++c) ++per_tier[tiers_[c]];
    single_tier_ = per_tier.size() == 1;
    double slowest = 0;
    for (const auto& [kind, count] : per_tier) {
      const double seconds_per_byte = state_.tiers.LoadSecondsPerByte(kind);
      if (seconds_per_byte <= 0 && kind != TierKind::kDram) return 0;
      slowest = std::max(slowest, seconds_per_byte * static_cast<double>(chunk_bytes_) * count);
    }
    return slowest / (cached - lowest_loadable);
  }

  // A load from slower tiers larger than half the DRAM tier would only churn it: each promotion would evict an
  // earlier one of the same load (and whatever else was hot). Such loads are not promoted.
  bool ShouldPromote(uint32_t cached, uint32_t lowest_loadable) const {
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

  absl::Status ProgressLocked(uint32_t computed_through) {
    if (computed_through > keys_.size() + 1) {
      // One past the full chunks is allowed: the engine may count a partial tail chunk.
      return absl::InvalidArgumentError(
          absl::StrCat("computed_through ", computed_through, " exceeds the prompt's ", keys_.size(), " full chunks"));
    }
    // Every advance is a measured span of the engine's compute, for the next loads' plans; not under I/O-only,
    // where the engine was told to wait and what it reports is not its compute speed.
    const Clock::time_point now = Clock::now();
    if (computed_through > reported_through_ && phase_ != Phase::kAwaitStart && strategy_ != Strategy::kIoOnly) {
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

  void IssueReadsLocked() {
    if (phase_ != Phase::kLoading || finishing_) return;
    for (;;) {
      // Inline bytes wait in the outbox until the client reads them: count them against the window so a slow
      // client holds at most `window` chunks of daemon memory.
      if (inline_ && cursor_->in_flight() + outbox_.size() >= window_) return;
      std::optional<uint32_t> chunk =
          cursor_->NextRead([this](uint32_t c, uint32_t queued) { return ReadBeatsEngineLocked(c, queued); });
      if (!chunk) return;
      if (!first_read_) first_read_ = Clock::now();
      auto self = shared_from_this();
      const uint32_t c = *chunk;
      const bool submitted = state_.pool.TrySubmit(io_group_, [self, c] { self->ReadChunk(c); });
      if (submitted) ++reads_outstanding_;
      if (!submitted) {
        spdlog::warn("{}: the I/O queue is full; chunk {} will be computed", load_id_, c);
        cursor_->OnReadDone(c, false);
      }
    }
  }

  // Under Cake, whether a read of `chunk` issued now, behind `queued` reads of its tier, would land before the
  // engine computes the chunk itself. One that would not is wasted I/O and worse: the load cannot end while it is
  // in flight (it writes into the engine's pages), so it delays the engine's Release by up to a chunk's load time.
  // Judged from the compute model the plan used and the engine's last Progress; an engine more than two chunks'
  // time behind that model has stalled or slowed, and every read is worth issuing again. When a read is turned
  // down with nothing in flight, a timer asks again at that point, so a load whose engine stalls still moves
  // (Progress asks again too).
  bool ReadBeatsEngineLocked(uint32_t chunk, uint32_t queued) {
    if (strategy_ != Strategy::kCake || !plan_compute_.known()) return true;
    // The engine stops at the planned meeting and waits for the loads: it never computes the chunks above it.
    if (chunk >= planned_meeting_) return true;
    const double load_s = state_.tiers.LoadSecondsPerByte(tiers_[chunk]) * static_cast<double>(chunk_bytes_);
    if (load_s <= 0) return true;
    const uint32_t from = std::max(reported_through_, cursor_->computed_through());
    if (chunk < from) return false;
    const Clock::time_point now = Clock::now();
    const double since_progress = std::chrono::duration<double>(now - last_progress_at_).count();
    const double stalled_after_s = 2 * plan_compute_.RangeSeconds(from, from + 1);
    if (since_progress > stalled_after_s) return true;
    const double engine_done_s = plan_compute_.RangeSeconds(from, chunk + 1);
    const double read_done_s = since_progress + (queued + 1) * load_s;
    if (read_done_s <= engine_done_s) return true;
    if (cursor_->in_flight() == 0) ArmRecheckLocked(stalled_after_s - since_progress + 1e-3);
    return false;
  }

  // Calls IssueReadsLocked again in `seconds` (once: a re-check already armed stays as it is). Each re-check gets
  // an alarm of its own, kept until the load ends: one may be armed from inside another's callback, where setting
  // that same alarm again would replace the callback that is running.
  void ArmRecheckLocked(double seconds) {
    if (recheck_armed_ || phase_ != Phase::kLoading) return;
    recheck_armed_ = true;
    rechecks_.push_back(std::make_unique<grpc::Alarm>());
    const auto delay = std::chrono::duration_cast<std::chrono::system_clock::duration>(
        std::chrono::duration<double>(std::max(seconds, 0.0)));
    rechecks_.back()->Set(std::chrono::system_clock::now() + delay, [weak = weak_from_this()](bool fired) {
      auto self = weak.lock();
      if (!self) return;
      {
        std::lock_guard lock(self->mu_);
        self->recheck_armed_ = false;
        if (fired) self->IssueReadsLocked();
      }
      self->Pump();
    });
  }

  // A DRAM chunk's own bytes, for a copy straight to a device region (a capped tier paces the lending as it
  // would a read); nullptr when the chunk is elsewhere or was evicted.
  std::shared_ptr<const std::span<const std::byte>> LendFromDram(uint32_t chunk) const {
    if (tiers_[chunk] != TierKind::kDram) return nullptr;
    return state_.tiers.Lend(TierKind::kDram, keys_[chunk]);
  }

  // Runs on an I/O thread, without the lock: reads one chunk straight into its place.
  void ReadChunk(uint32_t chunk) {
    if (cancelled_.load(std::memory_order_relaxed)) return ChunkRead(chunk, absl::CancelledError(""), {}, {}, {});
    std::string inline_bytes;
    std::shared_ptr<StagingBuffer> staging;  // lives until its promotion is done
    std::span<std::byte> landed;             // where the bytes are once read, for promotion into DRAM
    absl::Status status;
    if (inline_) {
      inline_bytes.resize(chunk_bytes_);
      landed = std::span(reinterpret_cast<std::byte*>(inline_bytes.data()), chunk_bytes_);
      status = state_.tiers.Read(tiers_[chunk], keys_[chunk], landed);
    } else if (std::byte* base = region_->host_data(); base != nullptr) {
      landed = std::span(base + OffsetOf(chunk), chunk_bytes_);
      status = state_.tiers.Read(tiers_[chunk], keys_[chunk], landed);
    } else if (auto lent = LendFromDram(chunk); lent != nullptr) {
      // Device memory, chunk in DRAM: one DMA from the (page-locked) arena, no host copy.
      status = region_->CopyIn(OffsetOf(chunk), *lent);
    } else {
      // Device memory: the tier reads into pinned host memory, and one DMA takes it to the device.
      auto buffer = StagingBuffer::Allocate(chunk_bytes_);
      if (buffer.ok()) {
        staging = std::make_shared<StagingBuffer>(std::move(*buffer));
        landed = staging->bytes();
        status = state_.tiers.Read(tiers_[chunk], keys_[chunk], landed);
        if (status.ok()) status = region_->CopyIn(OffsetOf(chunk), landed);
      } else {
        status = buffer.status();
      }
    }
    const bool promote = status.ok() && promote_ && tiers_[chunk] != TierKind::kDram;
    // Inline bytes move into the message: their promotion copy is made here, first.
    if (promote && inline_) state_.tiers.Promote(keys_[chunk], landed, tiers_[chunk]);
    ChunkRead(chunk, status, std::move(inline_bytes), promote && !inline_ ? landed : std::span<std::byte>(),
              std::move(staging));
  }

  // Reports the read; then hands its promotion to the promotion thread, so this I/O thread can take the next
  // read. The read retires (and the window stays held) until the promotion has copied the bytes.
  void ChunkRead(uint32_t chunk, const absl::Status& status, std::string inline_bytes,
                 std::span<const std::byte> promote_from, std::shared_ptr<StagingBuffer> staging) {
    {
      std::lock_guard lock(mu_);
      if (phase_ == Phase::kLoading && !finishing_) ChunkReadLocked(chunk, status, std::move(inline_bytes));
    }
    Pump();
    if (!promote_from.empty() &&
        state_.tiers.PromoteLater(
            keys_[chunk], promote_from,
            [self = shared_from_this(), staging = std::move(staging)] { self->ReadRetired(); }, tiers_[chunk])) {
      return;
    }
    ReadRetired();
  }

  void ReadRetired() {
    {
      std::lock_guard lock(mu_);
      --reads_outstanding_;
    }
    Pump();
  }

  void ChunkReadLocked(uint32_t chunk, const absl::Status& status, std::string inline_bytes) {
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
      } else {
        msg->set_region_offset(OffsetOf(loaded));
      }
      outbox_.push_back(std::move(response));
      Bump(state_.counters.load_chunks_loaded);
      Bump(state_.counters.load_bytes_loaded, chunk_bytes_);
    }
    UpdateRemainingLocked();
    CheckMeetingLocked();
    IssueReadsLocked();
  }

  // What the arbiter's shortest-remaining-first policy ranks this load by: chunks it still has to read.
  void UpdateRemainingLocked() {
    const uint32_t floor = std::max(cursor_->computed_through(), lowest_to_load_);
    const uint32_t low = cursor_->loaded_low();
    io_group_->SetRemaining(low > floor ? low - floor : 0);
  }

  void CheckMeetingLocked() {
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
    if (first_read_ && chunks_read_ > 0 && single_tier_) {
      const double seconds = std::chrono::duration<double>(last_read_ - *first_read_).count();
      state_.tiers.RecordLoadThroughput(tiers_.back(), chunks_read_ * chunk_bytes_, seconds);
    }
    spdlog::debug("{}: met at chunk {} of {} ({} loaded, {} failed, {} wasted reads) after {:.3f} ms", load_id_,
                  *meeting, cursor_->cached_chunks(), cursor_->cached_chunks() - *meeting, cursor_->failed(),
                  cursor_->wasted_reads(), std::chrono::duration<double, std::milli>(Clock::now() - started_).count());
  }

  uint64_t OffsetOf(uint32_t chunk) const { return base_offset_ + uint64_t{chunk - lowest_loadable_} * chunk_bytes_; }

  void FailLocked(const absl::Status& status) {
    spdlog::info("load stream from {} rejected: {}", context_->peer(), status.ToString());
    FinishLocked(status);
  }

  // Ends the stream with `status` once the write in progress (if any) is done; later events change nothing.
  // Once per load, when it ends: before the stream's final status goes out, so the engine's next load is planned
  // with what this one taught.
  void LearnComputeLocked() {
    if (phase_ == Phase::kAwaitStart || learned_) return;
    learned_ = true;
    state_.compute_models.Learn(ns_id_, observed_compute_);
  }

  void FinishLocked(const absl::Status& status) {
    if (finishing_) return;
    LearnComputeLocked();
    finishing_ = true;
    finish_status_ = status;
    cancelled_.store(true, std::memory_order_relaxed);
    outbox_.clear();
    pending_inline_.clear();
  }

  // Issues the next gRPC operation, if one is due. Called without the lock after every event.
  void Pump() {
    LoadReactor* reactor = nullptr;
    v1::LoadResponse* to_write = nullptr;
    std::optional<grpc::Status> to_finish;
    RegionRegistry::WindowLease ended_lease;  // freed after the lock is dropped
    {
      std::lock_guard lock(mu_);
      if (finished_ || reactor_ == nullptr || writing_) return;
      if (finishing_) {
        // The window is free for the engine's next load the moment it hears the stream end, so every read
        // that could still land in it must have drained first.
        if (reads_outstanding_ > 0) return;
        ended_lease = std::move(lease_);
        finished_ = true;
        to_finish = ToGrpcStatus(finish_status_);
      } else if (!outbox_.empty()) {
        writing_ = true;
        current_ = std::move(outbox_.front());
        outbox_.pop_front();
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

  LoadReactor* reactor_;
  grpc::CallbackServerContext* const context_;
  DaemonState& state_;

  std::mutex mu_;
  std::atomic<bool> cancelled_{false};
  Phase phase_ = Phase::kAwaitStart;
  std::string load_id_ = "load";
  uint64_t ticket_ = 0;
  std::vector<ChunkKey> keys_;
  std::vector<TierKind> tiers_;
  uint64_t chunk_bytes_ = 0;
  uint32_t lowest_loadable_ = 0;  // the region window's first chunk: offsets count from it
  uint32_t lowest_to_load_ = 0;   // the same, or higher where the engine holds the chunks below
  uint32_t window_ = 1;
  bool inline_ = false;
  bool promote_ = false;      // copy what is read from slower tiers into DRAM
  bool single_tier_ = false;  // one tier holds every chunk this load reads: it measures that tier's speed
  Strategy strategy_ = Strategy::kCake;
  ChunkKey ns_id_;
  ComputeModel observed_compute_;  // this load's Progress spans
  ComputeModel plan_compute_;      // what the plan assumed the engine costs (hint or history)
  uint32_t planned_meeting_ = 0;   // where the plan told the engine to stop and wait (0: no prediction)
  // Ask the judge again when it turned a read down with nothing in flight (the last one may be pending).
  std::vector<std::unique_ptr<grpc::Alarm>> rechecks_;
  bool recheck_armed_ = false;
  bool learned_ = false;           // observed_compute_ handed to state_.compute_models
  uint32_t reported_through_ = 0;
  Clock::time_point last_progress_at_;
  RegionRegistry::WindowLease lease_;
  std::shared_ptr<Region> region_;
  uint64_t base_offset_ = 0;
  std::optional<LoadCursor> cursor_;
  std::shared_ptr<IoGroup> io_group_;  // this load's place in the I/O arbiter
  absl::flat_hash_map<uint32_t, std::string> pending_inline_;
  Clock::time_point started_;
  std::optional<Clock::time_point> first_read_;
  Clock::time_point last_read_;
  uint64_t chunks_read_ = 0;

  std::deque<v1::LoadResponse> outbox_;
  v1::LoadResponse current_;
  bool writing_ = false;
  uint32_t reads_outstanding_ = 0;  // submitted to the I/O pool, or being promoted from the window, not yet back
  bool finishing_ = false;
  bool finished_ = false;
  absl::Status finish_status_;
};

LoadReactor::LoadReactor(grpc::CallbackServerContext* context, DaemonState& state)
    : session_(std::make_shared<LoadSession>(this, context, state)) {
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
void LoadReactor::OnCancel() { session_->Cancel(absl::CancelledError("load cancelled")); }

void LoadReactor::OnDone() {
  session_->OnDone();
  delete this;
}

}  // namespace

grpc::ServerBidiReactor<v1::LoadRequest, v1::LoadResponse>* NewLoadStream(grpc::CallbackServerContext* context,
                                                                          DaemonState& state) {
  return new LoadReactor(context, state);
}

}  // namespace cake
