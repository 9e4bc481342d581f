// AccessPolicy: callers mapped to principals by what the daemon saw (uid, certificate, token), roles, tenants.
#include "server/edge/access.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>

namespace cake {
namespace {

PeerFacts UnixPeerWithUid(uid_t uid) {
  PeerFacts facts;
  facts.transport = PeerFacts::Transport::kUnix;
  facts.uid = uid;
  return facts;
}

PeerFacts TlsPeer(std::vector<std::string> identities, std::optional<std::string> token = std::nullopt) {
  PeerFacts facts;
  facts.transport = PeerFacts::Transport::kTls;
  facts.certificate_identities = std::move(identities);
  facts.bearer_token = std::move(token);
  return facts;
}

// A token file of the test's own, owner-only.
class TokenFile {
 public:
  explicit TokenFile(const std::string& token, mode_t mode = 0600) {
    char path[] = "/tmp/cake-token-test-XXXXXX";
    const int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    close(fd);
    path_ = path;
    std::ofstream(path_) << token << "\n";
    REQUIRE(chmod(path_.c_str(), mode) == 0);
  }
  ~TokenFile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

constexpr uid_t kEngineUid = 61001;
constexpr uid_t kStrangerUid = 61009;

}  // namespace

TEST_CASE("access: an unconfigured daemon is one user's, who may do everything", "[access]") {
  auto policy = AccessPolicy::FromConfig(DefaultConfig());
  REQUIRE(policy.ok());
  CHECK(policy->single_tenant());
  CHECK_THAT(policy->Describe(), Catch::Contains("single-user mode"));
  auto caller = policy->Identify(UnixPeerWithUid(kStrangerUid));
  REQUIRE(caller.ok());
  for (Role role : {Role::kEngine, Role::kMonitor, Role::kAdmin}) CHECK(AccessPolicy::Require(*caller, role, "x").ok());
  // The tenant is whatever the request names, as before principals existed.
  CHECK(*AccessPolicy::Tenant(*caller, "") == "");
  CHECK(*AccessPolicy::Tenant(*caller, "anyone") == "anyone");
  CHECK(caller->unix_socket);
  CHECK(caller->uid == kStrangerUid);
  // A unix connection the daemon did not record (no uid) is refused even so.
  CHECK(policy->Identify(PeerFacts{}).status().code() == absl::StatusCode::kPermissionDenied);
}

TEST_CASE("access: principals by uid, certificate and token, with roles and tenants", "[access]") {
  TokenFile token("a-long-random-token-for-principal-b");
  DaemonConfig config = DefaultConfig();
  config.principals.push_back(
      PrincipalConfig{"engine-a", {kEngineUid}, {}, {"spiffe://t/a"}, "", {"a", "a2"}, {"engine"}});
  config.principals.push_back(PrincipalConfig{"engine-b", {}, {}, {}, token.path(), {"b"}, {"engine", "monitor"}});
  config.principals.push_back(PrincipalConfig{"ops", {}, {"root"}, {}, "", {}, {"admin"}});
  auto policy = AccessPolicy::FromConfig(config);
  REQUIRE(policy.ok());
  CHECK_FALSE(policy->single_tenant());

  auto a = policy->Identify(UnixPeerWithUid(kEngineUid));
  REQUIRE(a.ok());
  CHECK(a->principal->name == "engine-a");
  CHECK(AccessPolicy::Require(*a, Role::kEngine, "Lookup").ok());
  absl::Status denied = AccessPolicy::Require(*a, Role::kAdmin, "Evict");
  CHECK(denied.code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(denied.message()), Catch::Contains("Evict needs the admin role"));
  CHECK(AccessPolicy::Require(*a, Role::kMonitor, "Stats").code() == absl::StatusCode::kPermissionDenied);
  CHECK(*AccessPolicy::Tenant(*a, "") == "a");  // the first tenant is the default
  CHECK(*AccessPolicy::Tenant(*a, "a2") == "a2");
  auto other = AccessPolicy::Tenant(*a, "b");
  CHECK(other.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(other.status().message()), Catch::Contains("may not use tenant \"b\""));

  // The same principal over TLS, by its certificate's SAN: no regions there.
  auto a_tls = policy->Identify(TlsPeer({"engine-a-host", "spiffe://t/a"}));
  REQUIRE(a_tls.ok());
  CHECK(a_tls->principal->name == "engine-a");
  CHECK_FALSE(a_tls->unix_socket);

  auto b = policy->Identify(TlsPeer({}, "a-long-random-token-for-principal-b"));
  REQUIRE(b.ok());
  CHECK(b->principal->name == "engine-b");
  CHECK(AccessPolicy::Require(*b, Role::kMonitor, "Status").ok());
  CHECK(policy->Identify(TlsPeer({}, "a-long-random-token-for-principal-x")).status().code() ==
        absl::StatusCode::kUnauthenticated);
  CHECK(policy->Identify(TlsPeer({})).status().code() == absl::StatusCode::kUnauthenticated);
  auto unknown_certificate = policy->Identify(TlsPeer({"spiffe://t/intruder"}));
  CHECK(unknown_certificate.status().code() == absl::StatusCode::kPermissionDenied);

  // Root was named (ops): it gets that principal, admin (and so monitor) but not engine.
  auto root = policy->Identify(UnixPeerWithUid(0));
  REQUIRE(root.ok());
  CHECK(root->principal->name == "ops");
  CHECK(AccessPolicy::Require(*root, Role::kMonitor, "Status").ok());
  CHECK(AccessPolicy::Require(*root, Role::kEngine, "Load").code() == absl::StatusCode::kPermissionDenied);

  auto stranger = policy->Identify(UnixPeerWithUid(kStrangerUid));
  CHECK(stranger.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(stranger.status().message()), Catch::Contains("uid 61009 is not a principal"));
}

TEST_CASE("access: the daemon's own user administers unless named", "[access]") {
  DaemonConfig config = DefaultConfig();
  config.principals.push_back(PrincipalConfig{"engine-a", {kEngineUid}, {}, {}, "", {"a"}, {"engine"}});
  auto policy = AccessPolicy::FromConfig(config);
  REQUIRE(policy.ok());
  auto self = policy->Identify(UnixPeerWithUid(geteuid()));
  REQUIRE(self.ok());
  CHECK(self->principal->name == "operator");
  CHECK(AccessPolicy::Require(*self, Role::kAdmin, "Evict").ok());
  CHECK(AccessPolicy::Require(*self, Role::kEngine, "Store").code() == absl::StatusCode::kPermissionDenied);
}

TEST_CASE("access: configuration mistakes stop start-up", "[access]") {
  auto refused = [](PrincipalConfig p) {
    DaemonConfig config = DefaultConfig();
    config.principals.push_back(std::move(p));
    return AccessPolicy::FromConfig(config).status();
  };
  CHECK_THAT(std::string(refused({"local", {1}, {}, {}, "", {"a"}, {"engine"}}).message()),
             Catch::Contains("reserved"));
  CHECK_THAT(std::string(refused({"p", {}, {"no-such-user-here"}, {}, "", {"a"}, {"engine"}}).message()),
             Catch::Contains("does not exist"));
  TokenFile readable("a-long-random-token-readable-by-all", 0644);
  CHECK(refused({"p", {}, {}, {}, readable.path(), {"a"}, {"engine"}}).code() == absl::StatusCode::kFailedPrecondition);
  TokenFile short_token("short");
  CHECK_THAT(std::string(refused({"p", {}, {}, {}, short_token.path(), {"a"}, {"engine"}}).message()),
             Catch::Contains("shorter than 16 bytes"));
  DaemonConfig twice = DefaultConfig();
  twice.principals.push_back(PrincipalConfig{"p", {7}, {}, {}, "", {"a"}, {"engine"}});
  twice.principals.push_back(PrincipalConfig{"q", {7}, {}, {}, "", {"b"}, {"engine"}});
  CHECK_THAT(std::string(AccessPolicy::FromConfig(twice).status().message()), Catch::Contains("named by two"));
}

TEST_CASE("access: NamesUid is what the socket admits at accept", "[access]") {
  auto single = AccessPolicy::FromConfig(DefaultConfig());
  REQUIRE(single.ok());
  CHECK(single->NamesUid(kStrangerUid));  // single-user mode: every local user
  DaemonConfig config = DefaultConfig();
  config.principals.push_back(PrincipalConfig{"engine-a", {kEngineUid}, {}, {}, "", {"a"}, {"engine"}});
  auto policy = AccessPolicy::FromConfig(config);
  REQUIRE(policy.ok());
  for (uid_t uid : {kEngineUid, uid_t{0}, ::geteuid(), kStrangerUid}) {
    INFO("uid " << uid);
    CHECK(policy->NamesUid(uid) == policy->Identify(UnixPeerWithUid(uid)).ok());
  }
  CHECK_FALSE(policy->NamesUid(kStrangerUid));
}

}  // namespace cake
