#include "server/core/callers.h"

#include "grpcpp/security/auth_context.h"
#include "server/edge/requests.h"
#include "server/edge/tcp_authentication.h"
#include "server/edge/unix_listener.h"

namespace cake {

absl::Status CheckRegionsReachable(const Caller& caller) {
  if (caller.unix_socket) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "regions are shared memory on the daemon's machine; over TCP, load and store with inline bytes (no region_id)");
}

absl::StatusOr<Caller> IdentifyCaller(const grpc::CallbackServerContext& context, const DaemonState& state) {
  std::shared_ptr<const AccessPolicy> policy = state.access();
  auto identified = [&](const PeerFacts& facts) -> absl::StatusOr<Caller> {
    auto caller = policy->Identify(facts);
    if (caller.ok()) {
      caller->policy = policy;
      caller->peer = facts;
    }
    return caller;
  };
  PeerFacts facts;
  const std::string peer = context.peer();
  if (peer.rfind("fd:", 0) == 0) {
    facts.transport = PeerFacts::Transport::kUnix;
    if (state.facts().unix_connections != nullptr) {
      if (auto unix_peer = state.facts().unix_connections->PeerOf(peer)) facts.uid = unix_peer->uid;
    }
    return identified(facts);
  }
  return identified(TcpPeerFacts(context.auth_context().get(), context.client_metadata()));
}

absl::StatusOr<Namespace> CallerNamespace(const Caller& caller, const v1::Namespace& proto,
                                          const DaemonConfig& config) {
  auto tenant = AccessPolicy::Tenant(caller, proto.tenant());
  if (!tenant.ok()) return tenant.status();
  return ParseNamespace(proto, config, *tenant);
}

}  // namespace cake
