// One Cake load from the engine's side: the front-step rule every C++ engine follows, and the Load stream's client
// end, which checks each daemon message against the plan and the region before the engine may trust it.
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "client/grpc_load_session.h"
#include "client/wire.h"
#include "grpcpp/grpcpp.h"
#include "proto/wire_enums.h"

namespace cake {

FrontStep NextFrontStep(const LoadPlan& plan, std::chrono::steady_clock::time_point started, uint32_t next_chunk,
                        uint32_t loaded_low, std::optional<uint32_t> done_meeting,
                        std::chrono::steady_clock::time_point now, const FrontStepExtras& extras) {
  using Action = FrontStep::Action;
  // cake/load.py's WAIT_SLACK_FRACTION, WAIT_SLACK_S, PACE_WAIT_FACTOR and PACE_WAIT_SLACK_S.
  constexpr double kSlackFraction = 0.2, kSlackSeconds = 1e-3, kPaceFactor = 1.5, kPaceSlackSeconds = 2e-3;
  const auto after = [](std::chrono::steady_clock::time_point from, double seconds) {
    return from +
           std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
  };
  const uint32_t limit = plan.strategy == Strategy::kIoOnly ? plan.lowest_loadable : plan.cached_chunks;
  if (next_chunk >= limit) return {Action::kStop, {}, 0};
  if (done_meeting) {
    if (next_chunk >= *done_meeting) return {Action::kStop, {}, 0};
    return {Action::kCompute, {}, std::min(*done_meeting, limit)};
  }
  if (next_chunk >= loaded_low && next_chunk < plan.cached_chunks) return {Action::kStop, {}, 0};
  if (plan.strategy != Strategy::kCake || extras.stream_ended) return {Action::kCompute, {}, limit};
  if (extras.compute_s) {
    if (!extras.resident_in_s || *extras.resident_in_s > *extras.compute_s || extras.paced_wait_given) {
      return {Action::kCompute, {}, next_chunk + 1};
    }
    return {Action::kWait, after(now, *extras.resident_in_s * kPaceFactor + kPaceSlackSeconds), 0};
  }
  if (plan.predicted_meeting_chunk && plan.predicted_cake_s) {
    const uint32_t meeting = *plan.predicted_meeting_chunk;
    if (next_chunk < meeting) return {Action::kCompute, {}, std::min(meeting, limit)};
    const auto until = after(started, *plan.predicted_cake_s * (1 + kSlackFraction) + kSlackSeconds);
    if (now < until) return {Action::kWait, until, 0};
  }
  return {Action::kCompute, {}, limit};
}

namespace {

class GrpcLoadSession final : public LoadSession {
 public:
  // Opens the stream with `start` as its first message. The stream's headers go out with it (corked): one message
  // on the wire instead of two, and the daemon starts reading chunks that much sooner; the reader thread starts
  // after the write, off the request's path.
  GrpcLoadSession(v1::KvService::Stub* stub, const LoadOptions& options, const v1::LoadRequest& start)
      : region_(options.region), inline_(options.region == nullptr) {
    context_.set_initial_metadata_corked(true);
    stream_ = stub->Load(&context_);
    // A failed write means the stream already ended; WaitPlan then reports it and Release gives the status.
    Send(start);
    reader_ = std::thread([this] { ReadLoop(); });
  }

  ~GrpcLoadSession() override {
    if (!finished_) {
      context_.TryCancel();
      if (reader_.joinable()) reader_.join();
      stream_->Finish();
    }
    if (reader_.joinable()) reader_.join();
  }

  bool Send(const v1::LoadRequest& request) {
    MutexLock lock(&write_mu_);
    return stream_->Write(request);
  }

  absl::StatusOr<LoadPlan> WaitPlan() override {
    MutexLock lock(&mu_);
    cv_.Wait(&mu_, [&] {
      mu_.AssertHeld();
      return plan_.has_value() || ended_;
    });
    if (plan_) return *plan_;
    return Ended();
  }

  absl::Status ReportProgress(uint32_t computed_through) override {
    v1::LoadRequest request;
    request.mutable_progress()->set_computed_through(computed_through);
    if (!Send(request)) return absl::UnavailableError("the Load stream is closed");
    return absl::OkStatus();
  }

  absl::StatusOr<FrontStep> NextStep(uint32_t next_chunk) override {
    CAKE_ASSIGN_OR_RETURN(const LoadPlan plan, WaitPlan());
    std::optional<uint32_t> meeting;
    uint32_t loaded_low = 0;
    bool ended = false;
    {
      MutexLock lock(&mu_);
      if (done_) meeting = done_->meeting_chunk;
      loaded_low = loaded_low_;
      ended = ended_;
    }
    // A stream that ended without Done lands nothing more: the rule never waits for it (waiting would only spin
    // until the deadline).
    FrontStepExtras extras;
    extras.stream_ended = ended;
    return NextFrontStep(plan, started_, next_chunk, loaded_low, meeting, std::chrono::steady_clock::now(), extras);
  }

  bool IsResident(uint32_t chunk) const override {
    MutexLock lock(&mu_);
    return plan_.has_value() && chunk >= loaded_low_ && chunk < plan_->cached_chunks;
  }

  uint32_t LoadedLow() const override {
    MutexLock lock(&mu_);
    return plan_ ? std::min(loaded_low_, plan_->cached_chunks) : 0;
  }

  uint64_t RegionOffset(uint32_t chunk) const override {
    MutexLock lock(&mu_);
    auto it = region_offsets_.find(chunk);
    return it == region_offsets_.end() ? 0 : it->second;
  }

  std::string_view InlineChunk(uint32_t chunk) const override {
    MutexLock lock(&mu_);
    auto it = inline_chunks_.find(chunk);
    return it == inline_chunks_.end() ? std::string_view() : std::string_view(it->second);
  }

  absl::StatusOr<LoadDone> WaitDone() override {
    MutexLock lock(&mu_);
    cv_.Wait(&mu_, [&] {
      mu_.AssertHeld();
      return done_.has_value() || ended_;
    });
    if (done_) return *done_;
    return Ended();
  }

  bool WaitResident(uint32_t chunk) override {
    return WaitResidentUntil(chunk, std::chrono::steady_clock::time_point::max());
  }

  bool WaitResidentUntil(uint32_t chunk, std::chrono::steady_clock::time_point deadline) override {
    MutexLock lock(&mu_);
    auto settled = [&] {
      mu_.AssertHeld();
      return done_.has_value() || ended_ || (plan_ && chunk >= loaded_low_ && chunk < plan_->cached_chunks);
    };
    if (deadline == std::chrono::steady_clock::time_point::max()) {
      cv_.Wait(&mu_, settled);
    } else {
      cv_.WaitUntil(&mu_, deadline, settled);
    }
    return plan_ && chunk >= loaded_low_ && chunk < plan_->cached_chunks;
  }

  absl::Status Release() override {
    if (finished_) return final_status_;
    v1::LoadRequest request;
    request.mutable_release();
    Send(request);
    {
      MutexLock lock(&write_mu_);
      stream_->WritesDone();
    }
    if (reader_.joinable()) reader_.join();
    finished_ = true;
    final_status_ = FromGrpc(stream_->Finish());
    MutexLock lock(&mu_);
    if (!broken_.ok()) final_status_ = broken_;
    return final_status_;
  }

 private:
  void ReadLoop() {
    v1::LoadResponse response;
    while (stream_->Read(&response)) {
      MutexLock lock(&mu_);
      if (absl::Status taken = TakeLocked(response); !taken.ok()) {
        // The daemon broke the protocol: nothing more from it is believed. The load ends (the engine computes
        // what was not loaded) and Release reports why.
        broken_ = absl::DataLossError(absl::StrCat("the daemon broke the Load protocol: ", taken.message()));
        context_.TryCancel();
        break;
      }
      cv_.SignalAll();
    }
    MutexLock lock(&mu_);
    ended_ = true;
    cv_.SignalAll();
  }

  // Checks one message against the plan and what came before (the checks cake/load.py makes), then records it.
  absl::Status TakeLocked(v1::LoadResponse& response) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    switch (response.msg_case()) {
      case v1::LoadResponse::kPlan: {
        if (plan_) return absl::DataLossError("a second Plan");
        const v1::LoadPlan& p = response.plan();
        if (!(p.lowest_loadable() <= p.cached_chunks() && p.cached_chunks() <= p.total_chunks()) ||
            p.chunk_tiers_size() != static_cast<int>(p.cached_chunks()) ||
            (p.cached_chunks() > 0 && p.chunk_bytes() == 0)) {
          return absl::DataLossError(absl::StrCat("a Plan of ", p.cached_chunks(), " cached chunks of ",
                                                  p.total_chunks(), ", lowest loadable ", p.lowest_loadable()));
        }
        LoadPlan plan;
        plan.load_id = p.load_id();
        plan.total_chunks = p.total_chunks();
        plan.cached_chunks = p.cached_chunks();
        plan.lowest_loadable = p.lowest_loadable();
        plan.chunk_bytes = p.chunk_bytes();
        if (p.has_predicted_meeting_chunk()) plan.predicted_meeting_chunk = p.predicted_meeting_chunk();
        plan.strategy = StrategyFromWire(p.strategy());
        if (p.has_predicted_cake_s()) plan.predicted_cake_s = p.predicted_cake_s();
        if (p.has_predicted_compute_only_s()) plan.predicted_compute_only_s = p.predicted_compute_only_s();
        if (p.has_predicted_io_only_s()) plan.predicted_io_only_s = p.predicted_io_only_s();
        for (int t : p.chunk_tiers()) plan.tiers.push_back(TierKindFromWire(t));
        loaded_low_ = plan.cached_chunks;
        plan_ = std::move(plan);
        return absl::OkStatus();
      }
      case v1::LoadResponse::kLoaded:
        return TakeLoadedLocked(*response.mutable_loaded());
      case v1::LoadResponse::kLoadedBatch:
        if (inline_) return absl::DataLossError("a batch of landed chunks on an inline load");
        for (v1::ChunkLoaded& chunk : *response.mutable_loaded_batch()->mutable_chunks()) {
          CAKE_RETURN_IF_ERROR(TakeLoadedLocked(chunk));
        }
        return absl::OkStatus();
      case v1::LoadResponse::kDone: {
        const v1::LoadDone& d = response.done();
        if (!plan_ || done_) return absl::DataLossError("Done before a Plan, or twice");
        // [meeting, H) must all have been reported loaded: the engine is about to use them.
        if (d.meeting_chunk() > plan_->cached_chunks || d.meeting_chunk() < loaded_low_) {
          return absl::DataLossError(
              absl::StrCat("Done at chunk ", d.meeting_chunk(), " with chunks loaded only from ", loaded_low_));
        }
        done_ = LoadDone{d.meeting_chunk(), d.loaded_chunks(), d.failed_chunks()};
        return absl::OkStatus();
      }
      case v1::LoadResponse::MSG_NOT_SET:
        break;
    }
    return absl::DataLossError("a LoadResponse with no message set");
  }

  absl::Status TakeLoadedLocked(v1::ChunkLoaded& loaded) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint32_t chunk = loaded.chunk();
    if (!plan_ || done_) return absl::DataLossError(absl::StrCat("chunk ", chunk, " before the Plan or after Done"));
    // Chunks land highest first, each extending the contiguous loaded suffix down by one.
    if (chunk < plan_->lowest_loadable || chunk >= plan_->cached_chunks || chunk >= loaded_low_) {
      return absl::DataLossError(absl::StrCat("chunk ", chunk, " outside [", plan_->lowest_loadable, ", ",
                                              std::min(loaded_low_, plan_->cached_chunks), ") or twice"));
    }
    if (inline_) {
      if (loaded.data().size() != plan_->chunk_bytes) {
        return absl::DataLossError(
            absl::StrCat("inline chunk ", chunk, " of ", loaded.data().size(), " bytes, not ", plan_->chunk_bytes));
      }
      inline_chunks_[chunk] = std::move(*loaded.mutable_data());
    } else {
      if (loaded.bytes() != plan_->chunk_bytes || loaded.region_offset() > region_->size() ||
          region_->size() - loaded.region_offset() < loaded.bytes()) {
        return absl::DataLossError(absl::StrCat("chunk ", chunk, " at ", loaded.region_offset(), " (+", loaded.bytes(),
                                                " bytes) is outside the ", region_->size(), "-byte region"));
      }
      region_offsets_[chunk] = loaded.region_offset();
    }
    loaded_low_ = chunk;
    return absl::OkStatus();
  }

  // The stream ended before what the caller waited for: finish it to learn why.
  absl::Status Ended() {
    return absl::UnavailableError("the Load stream ended early; Release() returns the daemon's status");
  }

  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::LoadRequest, v1::LoadResponse>> stream_;
  const MappedRegion* region_;
  const bool inline_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  Mutex write_mu_;  // one write at a time: the engine's Progress and Release
  mutable Mutex mu_;
  CondVar cv_;
  std::optional<LoadPlan> plan_ ABSL_GUARDED_BY(mu_);
  std::optional<LoadDone> done_ ABSL_GUARDED_BY(mu_);
  uint32_t loaded_low_ ABSL_GUARDED_BY(mu_) = UINT32_MAX;
  std::map<uint32_t, std::string> inline_chunks_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, uint64_t> region_offsets_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);  // set when the daemon broke the protocol: what Release returns
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ = false;
  absl::Status final_status_;
  std::thread reader_;
};

}  // namespace

std::unique_ptr<LoadSession> OpenGrpcLoadSession(v1::KvService::Stub* stub, const LoadOptions& options,
                                                 const v1::LoadRequest& start) {
  return std::make_unique<GrpcLoadSession>(stub, options, start);
}

}  // namespace cake
