#include "server/edge/health_service.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/edge/tcp_listener.h"
#include "server/edge/unix_listener.h"
#include "spdlog/spdlog.h"

namespace cake {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

std::string GatePeerOfCall(std::string_view grpc_peer, const UnixListener* unix_connections) {
  if (grpc_peer.rfind("fd:", 0) == 0) {
    if (unix_connections != nullptr) {
      if (std::optional<UnixPeer> peer = unix_connections->PeerOf(grpc_peer)) return absl::StrCat("uid ", peer->uid);
    }
    return "unix peer unknown";
  }
  // "ipv4:10.0.0.7:41234", "ipv6:[::1]:41234" (or with the brackets percent-encoded): the address, no port.
  std::string_view address = grpc_peer.substr(grpc_peer.find(':') + 1);
  if (const size_t port = address.rfind(':'); port != std::string_view::npos) address = address.substr(0, port);
  for (auto [open, close] : {std::pair<std::string_view, std::string_view>{"[", "]"}, {"%5B", "%5D"}}) {
    if (address.size() >= open.size() + close.size() && address.substr(0, open.size()) == open &&
        address.substr(address.size() - close.size()) == close) {
      address = address.substr(open.size(), address.size() - open.size() - close.size());
    }
  }
  return NetworkPeerKey(address);
}

// One Watch stream. The service tells it the newest status (Notify) and, at a stop, to end (End), from any
// thread; it writes one message at a time, always the newest status it was told, and finishes once no write is in
// flight. It lives until gRPC is done with it (OnDone) and the service no longer holds it: the service takes a
// reference while it tells it something outside its own lock.
class HealthService::WatchReactor final : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  WatchReactor(HealthService& service, std::string peer, std::string name)
      : service_(service), peer_(std::move(peer)), name_(std::move(name)) {}

  const std::string& peer() const { return peer_; }
  const std::string& name() const { return name_; }
  void Ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // `generation` orders what the service said: an older word arriving late changes nothing.
  void Notify(ServingStatus status, uint64_t generation) {
    bool write = false;
    {
      MutexLock lock(&mu_);
      if (generation <= latest_generation_) return;
      latest_generation_ = generation;
      latest_ = status;
      write = StartNextWriteLocked();
    }
    if (write) StartWrite(&response_);
  }

  // Finishes with `status` once the write in flight (if any) is done. The first End wins.
  void End(grpc::Status status) {
    {
      MutexLock lock(&mu_);
      if (end_.has_value()) return;
      end_ = status;
      if (writing_) return;  // OnWriteDone finishes
      finished_ = true;
    }
    Finish(std::move(status));
  }

  void OnWriteDone(bool ok) override {
    bool write = false;
    std::optional<grpc::Status> finish;
    {
      MutexLock lock(&mu_);
      writing_ = false;
      if (!ok && !end_.has_value()) end_ = grpc::Status::CANCELLED;  // the stream broke: nothing more gets through
      if (end_.has_value()) {
        if (!finished_) finish = end_;
        finished_ = true;
      } else {
        write = StartNextWriteLocked();
      }
    }
    if (write) StartWrite(&response_);
    if (finish.has_value()) Finish(std::move(*finish));
  }

  // The client went away (or the server cancelled the call): every RPC is still finished.
  void OnCancel() override { End(grpc::Status::CANCELLED); }

  void OnDone() override {
    service_.Forget(this);
    Unref();
  }

 private:
  // Whether to write the newest status now: nothing in flight, not ending, and the client has not been told it.
  bool StartNextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || end_.has_value() || latest_ == sent_) return false;
    writing_ = true;
    sent_ = latest_;
    response_.set_status(*sent_);
    return true;
  }

  HealthService& service_;
  const std::string peer_;
  const std::string name_;
  std::atomic<int> refs_{1};  // gRPC's, dropped in OnDone
  Mutex mu_;
  uint64_t latest_generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<ServingStatus> latest_ ABSL_GUARDED_BY(mu_);
  std::optional<ServingStatus> sent_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  HealthCheckResponse response_;  // written only by whoever set writing_, read by gRPC until OnWriteDone
};

HealthService::HealthService(Limits limits, PeerOfCall peer_of_call, std::vector<std::string> services)
    : limits_(limits), peer_of_call_(std::move(peer_of_call)) {
  MutexLock lock(&mu_);
  statuses_[""] = HealthCheckResponse::SERVING;
  for (std::string& service : services) statuses_[std::move(service)] = HealthCheckResponse::SERVING;
}

HealthService::ServingStatus HealthService::StatusLocked(const std::string& service) const {
  auto it = statuses_.find(service);
  return it == statuses_.end() ? HealthCheckResponse::SERVICE_UNKNOWN : it->second;
}

void HealthService::SetServing(bool serving) {
  Publish(serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING, /*shut_down=*/false);
}

void HealthService::Shutdown() { Publish(HealthCheckResponse::NOT_SERVING, /*shut_down=*/true); }

void HealthService::Publish(ServingStatus status, bool shut_down) {
  struct Told {
    WatchReactor* watch;
    ServingStatus status;
  };
  std::vector<Told> told;
  uint64_t generation = 0;
  {
    MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = shut_down;
    for (auto& [name, current] : statuses_) current = status;
    generation = ++generation_;
    told.reserve(watches_.size());
    for (WatchReactor* watch : watches_) {
      watch->Ref();  // Forget may run meanwhile; the reference keeps the reactor until this is done with it
      told.push_back({watch, StatusLocked(watch->name())});
    }
  }
  // Outside the lock: a reactor's own calls into gRPC must never wait on the service.
  for (const Told& t : told) {
    t.watch->Notify(t.status, generation);
    if (shut_down) t.watch->End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the daemon is stopping"));
    t.watch->Unref();
  }
  if (shut_down && !told.empty()) spdlog::info("health: {} Watch streams ended (the daemon is stopping)", told.size());
}

void HealthService::Forget(WatchReactor* watch) {
  MutexLock lock(&mu_);
  if (watches_.erase(watch) == 0) return;  // refused: it never counted
  if (auto it = watches_per_peer_.find(watch->peer()); it != watches_per_peer_.end() && --it->second == 0) {
    watches_per_peer_.erase(it);
  }
}

uint32_t HealthService::watches_open() const {
  MutexLock lock(&mu_);
  return static_cast<uint32_t>(watches_.size());
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* context, const HealthCheckRequest* request,
                                               HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  ServingStatus status;
  {
    MutexLock lock(&mu_);
    status = StatusLocked(request->service());
  }
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    // The standard: an unknown name is NOT_FOUND for Check (SERVICE_UNKNOWN is Watch's word).
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service"));
    return reactor;
  }
  response->set_status(status);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(grpc::CallbackServerContext* context,
                                                                    const HealthCheckRequest* request) {
  auto* watch = new WatchReactor(*this, peer_of_call_(*context), request->service());
  std::optional<grpc::Status> refusal;
  ServingStatus status = HealthCheckResponse::UNKNOWN;
  uint64_t generation = 0;
  {
    MutexLock lock(&mu_);
    if (shut_down_) {
      refusal = grpc::Status(grpc::StatusCode::UNAVAILABLE, "the daemon is stopping");
    } else if (watches_.size() >= limits_.max_watches) {
      refusal = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                             absl::StrCat("the daemon serves server.max_health_watches (", limits_.max_watches,
                                          ") health Watch streams already; use Check, or retry later"));
    } else if (uint32_t& mine = watches_per_peer_[watch->peer()]; mine >= limits_.max_watches_per_peer) {
      refusal = grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat(watch->peer(), " holds server.max_health_watches_per_peer (", limits_.max_watches_per_peer,
                       ") health Watch streams already; end one, or use Check"));
    } else {
      ++mine;
      watches_.insert(watch);
      status = StatusLocked(watch->name());
      generation = generation_;
    }
    if (auto it = watches_per_peer_.find(watch->peer()); it != watches_per_peer_.end() && it->second == 0) {
      watches_per_peer_.erase(it);
    }
  }
  if (refusal.has_value()) {
    if (refusal->error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      watches_refused_.fetch_add(1, std::memory_order_relaxed);
    }
    watch->End(std::move(*refusal));
    return watch;
  }
  watch->Notify(status, generation);
  return watch;
}

}  // namespace cake
