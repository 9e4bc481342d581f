#include "server/edge/access.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/enum_names.h"

namespace cake {
namespace {

std::string Sha256(std::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(digest), length);
}

constexpr EnumName<Role> kRoles[] = {{Role::kEngine, "engine"}, {Role::kMonitor, "monitor"}, {Role::kAdmin, "admin"}};

uint32_t RoleBits(const std::vector<std::string>& roles) {
  uint32_t bits = 0;
  for (const std::string& name : roles) {
    const std::optional<Role> role = ValueIn(kRoles, name);
    if (!role) continue;
    bits |= static_cast<uint32_t>(*role);
    if (*role == Role::kAdmin) bits |= static_cast<uint32_t>(Role::kMonitor);  // an admin may watch too
  }
  return bits;
}

std::string_view RoleName(Role role) { return NameIn(kRoles, role, "?"); }

}  // namespace

absl::StatusOr<AccessPolicy> AccessPolicy::FromConfig(const DaemonConfig& config) {
  AccessPolicy policy;
  policy.single_tenant_ = config.principals.empty();
  const uint32_t all_roles = RoleBits({"engine", "monitor", "admin"});
  policy.principals_.push_back(Principal{"local", {""}, true, all_roles});
  policy.local_index_ = 0;
  policy.principals_.push_back(Principal{"operator", {}, false, RoleBits({"admin"})});
  policy.operator_index_ = 1;
  for (const PrincipalConfig& p : config.principals) {
    if (p.name == "local" || p.name == "operator") {
      return absl::InvalidArgumentError(
          absl::StrCat("principal name \"", p.name, "\" is reserved (the daemon's implicit principals)"));
    }
    const size_t index = policy.principals_.size();
    Principal principal{p.name, {}, false, RoleBits(p.roles)};
    for (const std::string& tenant : p.tenants) {
      if (tenant == "*")
        principal.any_tenant = true;
      else
        principal.tenants.push_back(tenant);
    }
    if (principal.tenants.empty()) principal.tenants.push_back("");  // "*" alone: the default tenant is ""
    policy.principals_.push_back(std::move(principal));
    std::vector<uid_t> uids(p.unix_uids.begin(), p.unix_uids.end());
    for (const std::string& user : p.unix_users) {
      const struct passwd* entry = ::getpwnam(user.c_str());
      if (entry == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("principal \"", p.name, "\": unix user \"", user, "\" does not exist on this machine"));
      }
      uids.push_back(entry->pw_uid);
    }
    for (uid_t uid : uids) {
      if (!policy.by_uid_.emplace(uid, index).second) {
        return absl::InvalidArgumentError(absl::StrCat("uid ", uid, " is named by two principals (",
                                                       policy.principals_[policy.by_uid_[uid]].name, ", ", p.name,
                                                       ")"));
      }
    }
    for (const std::string& identity : p.tls_identities) {
      if (!policy.by_certificate_identity_.emplace(identity, index).second) {
        return absl::InvalidArgumentError(absl::StrCat("TLS identity \"", identity, "\" is named by two principals"));
      }
    }
    if (!p.token_file.empty()) {
      auto token = ReadSecretFile(p.token_file, absl::StrCat("the token file of principal \"", p.name, "\""));
      if (!token.ok()) return token.status();
      if (token->size() < 16) {
        return absl::InvalidArgumentError(absl::StrCat("the token of principal \"", p.name,
                                                       "\" is shorter than 16 bytes: use a random one "
                                                       "(openssl rand -hex 32)"));
      }
      policy.token_digests_.emplace_back(Sha256(*token), index);
    }
  }
  return policy;
}

std::string AccessPolicy::Describe() const {
  if (single_tenant_) {
    return "access: no [[access.principal]] configured: single-user mode, every process that can open the socket "
           "may do everything, in any tenant it names";
  }
  std::vector<std::string> names;
  for (size_t i = 2; i < principals_.size(); ++i) names.push_back(principals_[i].name);
  return absl::StrCat("access: ", names.size(), " principal(s) (", absl::StrJoin(names, ", "),
                      "); root and the daemon's user administer; every other caller is refused");
}

absl::StatusOr<Caller> AccessPolicy::Identify(const PeerFacts& peer) const {
  Caller caller;
  if (peer.transport == PeerFacts::Transport::kUnix) {
    if (!peer.uid.has_value()) {
      return absl::PermissionDeniedError("the daemon does not know this connection's peer; reconnect");
    }
    caller.unix_socket = true;
    caller.uid = *peer.uid;
    if (single_tenant_) {
      caller.principal = &principals_[local_index_];
    } else if (auto it = by_uid_.find(*peer.uid); it != by_uid_.end()) {
      caller.principal = &principals_[it->second];
    } else if (*peer.uid == 0 || *peer.uid == ::geteuid()) {
      caller.principal = &principals_[operator_index_];
    } else {
      return absl::PermissionDeniedError(absl::StrCat("uid ", *peer.uid,
                                                      " is not a principal of this daemon: the operator must name it "
                                                      "in an [[access.principal]] (unix_uids or unix_users)"));
    }
    return caller;
  }
  // TCP: a verified client certificate naming a principal, else a bearer token.
  for (const std::string& identity : peer.certificate_identities) {
    if (auto it = by_certificate_identity_.find(identity); it != by_certificate_identity_.end()) {
      caller.principal = &principals_[it->second];
      return caller;
    }
  }
  if (peer.bearer_token.has_value()) {
    const std::string digest = Sha256(*peer.bearer_token);
    const Principal* match = nullptr;
    // Every digest is compared, in constant time: how long a refusal takes says nothing about the tokens.
    for (const auto& [known, index] : token_digests_) {
      if (CRYPTO_memcmp(known.data(), digest.data(), digest.size()) == 0) match = &principals_[index];
    }
    if (match != nullptr) {
      caller.principal = match;
      return caller;
    }
    return absl::UnauthenticatedError("the bearer token is not one this daemon knows");
  }
  if (!peer.certificate_identities.empty()) {
    return absl::PermissionDeniedError(absl::StrCat("the client certificate (", peer.certificate_identities.front(),
                                                    ") is not a principal of this daemon: the operator must name "
                                                    "it in tls_identities"));
  }
  return absl::UnauthenticatedError(
      "a TCP call must present a client certificate or an \"authorization: Bearer <token>\" header");
}

absl::Status AccessPolicy::Require(const Caller& caller, Role role, std::string_view what) {
  if (caller.principal->Has(role)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(std::string(what), " needs the ", std::string(RoleName(role)),
                                                  " role, which principal \"", caller.principal->name,
                                                  "\" does not have"));
}

absl::StatusOr<std::string> AccessPolicy::Tenant(const Caller& caller, const std::string& requested) {
  const Principal& p = *caller.principal;
  if (requested.empty()) {
    if (p.tenants.empty()) {
      return absl::PermissionDeniedError(absl::StrCat("principal \"", p.name, "\" may use no tenant"));
    }
    return p.tenants.front();
  }
  if (p.any_tenant || std::find(p.tenants.begin(), p.tenants.end(), requested) != p.tenants.end()) return requested;
  return absl::PermissionDeniedError(absl::StrCat("principal \"", p.name, "\" may not use tenant \"", requested,
                                                  "\"; its tenants: ", absl::StrJoin(p.tenants, ", ")));
}

bool AccessPolicy::NamesUid(uid_t uid) const {
  return single_tenant_ || by_uid_.contains(uid) || uid == 0 || uid == ::geteuid();
}

}  // namespace cake
