#include "server/load/load_reactor.h"

#include "server/core/callers.h"
#include "server/edge/requests.h"
#include "server/load/load_stream.h"

namespace cake {
namespace {

class LoadReactor final : public grpc::ServerBidiReactor<v1::LoadRequest, v1::LoadResponse>, public LoadStreamSink {
 public:
  LoadReactor(grpc::CallbackServerContext* context, DaemonState& state, absl::StatusOr<Caller> caller)
      : context_(context) {
    if (!caller.ok()) {
      // A caller the daemon refuses is told so at once: its stream must hold nothing while waiting for a Start.
      Finish(ToGrpcStatus(caller.status()));
      return;
    }
    // Asked again only inside OnRequest, that is inside a read callback, while the context is alive.
    auto identify_again = [context, &state] { return IdentifyCaller(*context, state); };
    // Not make_shared: a timer's weak reference would keep the whole object's memory (one allocation with the
    // count) until the timer fires, up to loader.start_timeout_ms after a cancelled stream ended.
    stream_ = std::shared_ptr<LoadStream>(
        new LoadStream(state, state.timers, std::move(caller), identify_again, context->peer()));
    if (stream_->Open(this)) StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client half-closed (released) or cancelled the stream.
      if (context_->IsCancelled()) return stream_->Cancel(absl::CancelledError("load cancelled"));
      v1::LoadRequest release;
      release.mutable_release();
      stream_->OnRequest(release);
      return;
    }
    if (stream_->OnRequest(request_)) StartRead(&request_);
  }
  void OnWriteDone(bool ok) override { stream_->OnWriteDone(ok); }
  void OnCancel() override {
    if (stream_ != nullptr) stream_->Cancel(absl::CancelledError("load cancelled"));
  }
  void OnDone() override {
    if (stream_ != nullptr) stream_->RpcDone();
    delete this;
  }

  void Write(const v1::LoadResponse* message) override { StartWrite(message); }
  void End(const absl::Status& status) override { Finish(ToGrpcStatus(status)); }
  void AbortRpc() override { context_->TryCancel(); }

 private:
  grpc::CallbackServerContext* const context_;
  v1::LoadRequest request_;
  std::shared_ptr<LoadStream> stream_;
};

}  // namespace

grpc::ServerBidiReactor<v1::LoadRequest, v1::LoadResponse>* NewLoadStream(grpc::CallbackServerContext* context,
                                                                          DaemonState& state,
                                                                          absl::StatusOr<Caller> caller) {
  return new LoadReactor(context, state, std::move(caller));
}

}  // namespace cake
