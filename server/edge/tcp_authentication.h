// Who a call on the TCP listener comes from: the transport's word (a verified client certificate) and the call's
// own headers (a bearer token). And the check gRPC runs on a TCP call's headers, before it reads the call's message,
// so that a caller no principal answers to is refused without the daemon ever buffering its request.
#pragma once

#include <functional>
#include <map>
#include <memory>

#include "grpcpp/security/auth_context.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "grpcpp/support/server_interceptor.h"
#include "grpcpp/support/string_ref.h"
#include "server/edge/access.h"
#include "server/edge/connection_gate.h"

namespace cake {

// What the transport and the headers say about a TCP call's peer: TLS with the certificate's SANs and CN when
// `auth` says the connection is TLS (else plaintext, loopback only), and the "authorization: Bearer" token.
PeerFacts TcpPeerFacts(const grpc::AuthContext* auth, const std::multimap<grpc::string_ref, grpc::string_ref>& headers);

// Set on the TCP listener's credentials, TLS or local (ServerCredentials::SetAuthMetadataProcessor; gRPC's
// insecure credentials take none): runs on every call's headers, on gRPC's own thread (it never blocks), before
// gRPC asks the transport for the call's message. A call the current policy does not identify is refused there,
// with the status Identify gives (UNAUTHENTICATED, PERMISSION_DENIED); HTTP/2 flow control then bounds what of its
// body was buffered, and gRPC drops that at once.
// Health and reflection calls too (on TCP only: the socket's peers are known by uid at accept). Handlers still
// identify every call themselves (IdentifyCaller): this only refuses early what they would refuse late.
class TcpCallGate final : public grpc::AuthMetadataProcessor {
 public:
  using CurrentPolicy = std::function<std::shared_ptr<const AccessPolicy>()>;
  explicit TcpCallGate(CurrentPolicy policy) : policy_(std::move(policy)) {}

  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& headers, grpc::AuthContext* context, OutputMetadata* consumed,
                       OutputMetadata* response) override;

 private:
  const CurrentPolicy policy_;
};

// Tells `gate` of every call that reaches the server: on TCP each has named a principal (TcpCallGate refused the
// rest on their headers, before any interceptor runs), so its connection is no longer a stranger. Intercepts
// nothing itself.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewIdentifiedConnectionMarker(
    ConnectionGate* gate);

}  // namespace cake
