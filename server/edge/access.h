// Who is calling and what it may do. The daemon establishes the caller itself (the unix peer's uid from the
// kernel, a TCP client's certificate or bearer token) and never believes what a request says about it; the
// config maps each to a principal with tenants and roles. docs/security.md explains the model.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "server/config/config.h"

namespace cake {

enum class Role : uint32_t {
  kEngine = 1,   // regions, Lookup, Load, Store, in its tenants
  kMonitor = 2,  // Status, Stats
  kAdmin = 4,    // Evict, SetReadCap (and what a monitor may)
};

struct Principal {
  std::string name;
  std::vector<std::string> tenants;  // the first is the default for a request that names none
  bool any_tenant = false;           // "*": a request may name any tenant
  uint32_t roles = 0;

  bool Has(Role role) const { return (roles & static_cast<uint32_t>(role)) != 0; }
};

// What the transport knows about a call's peer, gathered by the server glue.
struct PeerFacts {
  enum class Transport { kUnix, kTls, kPlaintextLoopback };
  Transport transport = Transport::kUnix;
  std::optional<uid_t> uid;                         // unix: from SO_PEERCRED at accept
  std::vector<std::string> certificate_identities;  // TLS: the verified client certificate's SANs and CN
  std::optional<std::string> bearer_token;          // TCP: "authorization: Bearer <token>" metadata
};

class AccessPolicy;

// A call's established identity.
struct Caller {
  const Principal* principal = nullptr;        // never null for an identified caller; owned by `policy`
  std::shared_ptr<const AccessPolicy> policy;  // the policy that named it, kept alive while the call needs it
  bool unix_socket = false;                    // only unix callers can use regions (they map shared memory)
  uid_t uid = 0;                               // unix callers: whom their regions are shared with
  PeerFacts peer;                              // what identified it, to ask a reloaded policy again (LoadTracker)
};

class AccessPolicy {
 public:
  // Resolves unix_users to uids and reads token files (owner-only permissions). No principals in the config:
  // single-tenant mode, in which every unix peer is the one principal "local" with every role and any tenant.
  static absl::StatusOr<AccessPolicy> FromConfig(const DaemonConfig& config);

  bool single_tenant() const { return single_tenant_; }
  // One line for the start-up log: the mode, and what it means.
  std::string Describe() const;

  // The caller's principal, or PERMISSION_DENIED saying what the daemon saw and what the config must say
  // (UNAUTHENTICATED when a TCP call carries neither a mapped certificate nor a token).
  absl::StatusOr<Caller> Identify(const PeerFacts& peer) const;

  // PERMISSION_DENIED unless the caller holds `role`; `what` names the call in the message.
  static absl::Status Require(const Caller& caller, Role role, std::string_view what);
  // The tenant a request acts in: the one it names (which the principal must hold) or, when it names none, the
  // principal's first. PERMISSION_DENIED for a tenant the principal does not hold.
  static absl::StatusOr<std::string> Tenant(const Caller& caller, const std::string& requested);

  // Whether a unix peer with `uid` would be named by Identify (any uid in single-user mode; otherwise one a
  // principal names, root, or the daemon's own user). The socket closes a connection from any other uid at accept,
  // before gRPC reads a byte of it.
  bool NamesUid(uid_t uid) const;

 private:
  bool single_tenant_ = true;
  std::vector<Principal> principals_;  // never resized after FromConfig: callers keep pointers
  absl::flat_hash_map<uid_t, size_t> by_uid_;
  absl::flat_hash_map<std::string, size_t> by_certificate_identity_;
  std::vector<std::pair<std::string, size_t>> token_digests_;  // SHA-256 of each token, and its principal
  // Implicit principals: root and the daemon's own user may always administer (they could anyway: they can
  // read the daemon's memory), unless a principal names them.
  size_t operator_index_ = 0;
  size_t local_index_ = 0;
};

}  // namespace cake
