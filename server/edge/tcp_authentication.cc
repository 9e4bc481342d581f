#include "server/edge/tcp_authentication.h"

#include <string>
#include <string_view>

#include "grpc/grpc_security_constants.h"
#include "grpcpp/server_context.h"
#include "server/edge/requests.h"

namespace cake {

PeerFacts TcpPeerFacts(const grpc::AuthContext* auth,
                       const std::multimap<grpc::string_ref, grpc::string_ref>& headers) {
  PeerFacts facts;
  bool tls = false;
  if (auth != nullptr) {
    for (const grpc::string_ref& type : auth->FindPropertyValues(GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME)) {
      // "tls" from the TLS credentials the listener uses; "ssl" from gRPC's older SSL credentials.
      const std::string_view security(type.data(), type.size());
      tls |= security == "tls" || security == GRPC_SSL_TRANSPORT_SECURITY_TYPE;
    }
    if (tls) {
      for (const char* property : {GRPC_X509_SAN_PROPERTY_NAME, GRPC_X509_CN_PROPERTY_NAME}) {
        for (const grpc::string_ref& value : auth->FindPropertyValues(property)) {
          facts.certificate_identities.emplace_back(value.data(), value.size());
        }
      }
    }
  }
  facts.transport = tls ? PeerFacts::Transport::kTls : PeerFacts::Transport::kPlaintextLoopback;
  if (auto it = headers.find("authorization"); it != headers.end()) {
    constexpr std::string_view kBearer = "Bearer ";
    const std::string_view value(it->second.data(), it->second.size());
    if (value.substr(0, kBearer.size()) == kBearer) facts.bearer_token = std::string(value.substr(kBearer.size()));
  }
  return facts;
}

grpc::Status TcpCallGate::Process(const InputMetadata& headers, grpc::AuthContext* context, OutputMetadata*,
                                  OutputMetadata*) {
  // Every call, health and reflection included: gRPC reads a message whole (up to server.max_message_bytes)
  // before any handler could judge its size, so a call let through here unidentified could make the daemon hold
  // that much per stream for a stranger. Probes without credentials use the unix socket (cakectl health) or the
  // metrics endpoint.
  return ToGrpcStatus(policy_()->Identify(TcpPeerFacts(context, headers)).status());
}

namespace {
class IdentifiedConnectionMarker final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit IdentifiedConnectionMarker(ConnectionGate* gate) : gate_(gate) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    if (grpc::ServerContextBase* context = info->server_context(); context != nullptr)
      gate_->Identified(context->peer());
    return nullptr;
  }

 private:
  ConnectionGate* const gate_;
};
}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewIdentifiedConnectionMarker(
    ConnectionGate* gate) {
  return std::make_unique<IdentifiedConnectionMarker>(gate);
}

}  // namespace cake
