#include "testing/redis_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "spdlog/spdlog.h"
#include "storage/redis/redis_cluster_client.h"

namespace cake {
namespace {

using namespace std::chrono_literals;

constexpr char kLoopback[] = "127.0.0.1";
// How often start-up and convergence waits poll: short next to a server's start-up or a gossip round.
constexpr auto kPollInterval = 20ms;
// A port picked as free can be taken by someone else before redis-server binds it; a new one is tried.
constexpr int kStartAttempts = 5;
// Covers a slow MIGRATE (its own timeout is 5 s) on a busy machine.
constexpr auto kCommandTimeout = 10s;
constexpr auto kClusterStartTimeout = 20s;
constexpr auto kSlotAgreementTimeout = 10s;

struct ReplyDeleter {
  void operator()(redisReply* reply) const { freeReplyObject(reply); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

struct ContextDeleter {
  void operator()(redisContext* context) const { redisFree(context); }
};
using ContextPtr = std::unique_ptr<redisContext, ContextDeleter>;

timeval ToTimeval(std::chrono::microseconds d) {
  return timeval{static_cast<time_t>(d.count() / 1000000), static_cast<suseconds_t>(d.count() % 1000000)};
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Sends one command on an open connection. Error replies become statuses carrying Redis's message verbatim, so
// callers can read a MOVED or ASK redirect out of them.
absl::StatusOr<ReplyPtr> Execute(redisContext* context, const std::vector<std::string>& argv) {
  std::vector<const char*> args;
  std::vector<size_t> lengths;
  for (const auto& arg : argv) {
    args.push_back(arg.data());
    lengths.push_back(arg.size());
  }
  ReplyPtr reply(
      static_cast<redisReply*>(redisCommandArgv(context, static_cast<int>(args.size()), args.data(), lengths.data())));
  if (reply == nullptr) {
    return absl::UnavailableError(absl::StrCat("redis ", argv.empty() ? "" : argv[0], " failed: ", context->errstr));
  }
  if (reply->type == REDIS_REPLY_ERROR) return absl::UnknownError(std::string(reply->str, reply->len));
  return reply;
}

// A short-lived connection to `server`, authenticated when it has a password.
absl::StatusOr<ContextPtr> Connect(const RedisServer& server, std::chrono::milliseconds connect_timeout) {
  ContextPtr context(redisConnectWithTimeout(kLoopback, server.port(), ToTimeval(connect_timeout)));
  if (context == nullptr) return absl::ResourceExhaustedError("cannot allocate a hiredis context");
  if (context->err != 0) {
    return absl::UnavailableError(absl::StrCat("cannot connect to ", server.address(), ": ", context->errstr));
  }
  redisSetTimeout(context.get(), ToTimeval(kCommandTimeout));
  if (!server.password().empty()) {
    CAKE_RETURN_IF_ERROR(Execute(context.get(), {"AUTH", server.password()}).status());
  }
  return context;
}

absl::StatusOr<ReplyPtr> RunCommand(const RedisServer& server, const std::vector<std::string>& argv,
                                    std::chrono::milliseconds connect_timeout = 1s) {
  CAKE_ASSIGN_OR_RETURN(auto context, Connect(server, connect_timeout));
  return Execute(context.get(), argv);
}

std::string ReplyText(const redisReply& reply) {
  switch (reply.type) {
    case REDIS_REPLY_INTEGER:
      return absl::StrCat(reply.integer);
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR:
      return std::string(reply.str, reply.len);
    default:
      return "";
  }
}

// Arrays become their leaves one per line, depth-first.
void RenderReply(const redisReply& reply, std::vector<std::string>& lines) {
  if (reply.type == REDIS_REPLY_ARRAY) {
    for (size_t i = 0; i < reply.elements; ++i) RenderReply(*reply.element[i], lines);
  } else {
    lines.push_back(ReplyText(reply));
  }
}

// Distinct ports free on loopback right now: all are bound at once (so none repeats) and released together.
absl::StatusOr<std::vector<int>> PickFreePorts(int count) {
  std::vector<int> fds;
  std::vector<int> ports;
  absl::Status status;
  for (int i = 0; i < count && status.ok(); ++i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      status = absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
      break;
    }
    fds.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      status = absl::InternalError(absl::StrCat("cannot pick a free loopback port: ", strerror(errno)));
      break;
    }
    ports.push_back(ntohs(addr.sin_port));
  }
  for (int fd : fds) close(fd);
  if (!status.ok()) return status;
  return ports;
}

absl::StatusOr<std::string> MakeTempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "cake-redis-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", pattern, ": ", strerror(errno)));
  }
  return pattern;
}

// The value of `field` in INFO's text ("role:master" gives "master"); empty when it is not there.
std::string InfoField(const std::string& info, const std::string& field) {
  const std::string prefix = field + ":";
  size_t at = 0;
  while (at < info.size()) {
    const size_t end = std::min(info.find_first_of("\r\n", at), info.size());
    if (info.compare(at, prefix.size(), prefix) == 0) return info.substr(at + prefix.size(), end - at - prefix.size());
    at = end + 1;
  }
  return "";
}

// Polls `check` until it is OK; DEADLINE_EXCEEDED with its last complaint when `timeout` runs out first.
absl::Status WaitUntilOk(const std::function<absl::Status()>& check, std::chrono::milliseconds timeout,
                         const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    absl::Status status = check();
    if (status.ok()) return status;
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, " not reached within ", timeout.count(), " ms: ", status.message()));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// RedisServer

absl::StatusOr<RedisServer> RedisServer::Start() { return Start(Options()); }

absl::StatusOr<RedisServer> RedisServer::Start(const Options& options) {
  absl::Status last;
  for (int attempt = 1; attempt <= kStartAttempts; ++attempt) {
    auto server = StartOnce(options);
    if (server.ok()) return server;
    last = server.status();
    // Only a lost race for the port is worth another try; anything else would fail the same way again.
    if (!absl::IsUnavailable(last) || !absl::StrContains(last.message(), "Address already in use")) return last;
    spdlog::warn("redis-server lost its port to someone else (attempt {} of {}); retrying on another port", attempt,
                 kStartAttempts);
  }
  return last;
}

absl::StatusOr<RedisServer> RedisServer::StartOnce(const Options& options) {
  CAKE_ASSIGN_OR_RETURN(auto ports, PickFreePorts(options.cluster ? 2 : 1));
  CAKE_ASSIGN_OR_RETURN(auto dir, MakeTempDir());

  RedisServer server;
  server.dir_ = dir;
  server.port_ = ports[0];
  server.password_ = options.password;

  std::vector<std::string> args = {"redis-server",
                                   "--port",
                                   absl::StrCat(server.port_),
                                   "--bind",
                                   kLoopback,
                                   "--dir",
                                   server.dir_,
                                   "--save",
                                   "",
                                   "--appendonly",
                                   "no",
                                   "--logfile",
                                   server.dir_ + "/redis.log",
                                   "--daemonize",
                                   "no"};
  if (options.cluster) {
    // The bus port is chosen explicitly (rather than Redis's port + 10000, which can pass 65535 or be taken)
    // and the announced address is fixed, so no node has to learn its own address from gossip. A cache cluster
    // keeps serving the slots it has when a master dies (full coverage off), as docs/operations.md advises. A
    // replica's sync starts at once (Redis 7 waits 5 s by default for more replicas to share a diskless sync).
    server.cluster_bus_port_ = ports[1];
    args.insert(args.end(), {"--cluster-enabled", "yes", "--cluster-config-file", server.dir_ + "/nodes.conf",
                             "--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no",
                             "--cluster-port", absl::StrCat(server.cluster_bus_port_), "--cluster-announce-ip",
                             kLoopback, "--repl-diskless-sync-delay", "0"});
  }
  if (!options.password.empty()) args.insert(args.end(), {"--requirepass", options.password});
  args.insert(args.end(), options.extra_args.begin(), options.extra_args.end());

  const std::string stdout_path = server.dir_ + "/stdout.log";
  // Killed with the thread that started it, so a crashed test leaves no server behind.
  CAKE_ASSIGN_OR_RETURN(auto child, ChildProcess::Start({args, stdout_path, SIGKILL}));
  server.child_ = std::move(child);

  const auto deadline = std::chrono::steady_clock::now() + options.start_timeout;
  while (true) {
    if (std::optional<int> exited = server.child_.Poll()) {
      std::string why = *exited == 127 ? " (is redis-server on PATH?)" : "";
      return absl::UnavailableError(absl::StrCat("redis-server exited with status ", *exited, " during start-up", why,
                                                 "; its output:\n", ReadFile(stdout_path), "\nits log:\n",
                                                 server.log()));
    }
    if (RunCommand(server, {"PING"}, 200ms).ok()) return server;
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("redis-server on port ", server.port_,
                                                      " did not answer PING within ", options.start_timeout.count(),
                                                      " s; its log:\n", server.log()));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

RedisServer::RedisServer(RedisServer&& other) noexcept { *this = std::move(other); }

RedisServer& RedisServer::operator=(RedisServer&& other) noexcept {
  if (this != &other) {
    Release();
    child_ = std::move(other.child_);
    port_ = other.port_;
    cluster_bus_port_ = other.cluster_bus_port_;
    dir_ = std::exchange(other.dir_, "");
    password_ = other.password_;
  }
  return *this;
}

RedisServer::~RedisServer() { Release(); }

void RedisServer::Release() {
  Stop();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    dir_.clear();
  }
}

std::string RedisServer::address() const { return absl::StrCat(kLoopback, ":", port_); }

std::string RedisServer::log() const { return ReadFile(dir_ + "/redis.log"); }

int RedisServer::Stop() {
  // A server a test froze (SIGSTOP) and left frozen, say by failing first, would never act on SIGTERM.
  if (child_.running()) kill(child_.pid(), SIGCONT);
  return child_.Signal(SIGTERM);
}

void RedisServer::Kill() { child_.Signal(SIGKILL); }

absl::StatusOr<std::string> RedisServer::Command(const std::vector<std::string>& argv) const {
  if (argv.empty()) return absl::InvalidArgumentError("no command");
  if (!child_.running())
    return absl::FailedPreconditionError(absl::StrCat("redis-server ", address(), " is not running"));
  CAKE_ASSIGN_OR_RETURN(auto reply, RunCommand(*this, argv));
  if (reply->type == REDIS_REPLY_NIL) return absl::NotFoundError(absl::StrCat(argv[0], ": nil reply"));
  std::vector<std::string> lines;
  RenderReply(*reply, lines);
  return absl::StrJoin(lines, "\n");
}

// ---------------------------------------------------------------------------------------------------------------
// RedisCluster

absl::StatusOr<RedisCluster> RedisCluster::Start(int masters, int replicas_per_master) {
  if (masters < 1 || masters > kSlots) return absl::InvalidArgumentError(absl::StrCat("masters = ", masters));
  if (replicas_per_master < 0 || replicas_per_master > 4) {
    return absl::InvalidArgumentError(absl::StrCat("replicas_per_master = ", replicas_per_master));
  }
  RedisCluster cluster;
  cluster.masters_ = masters;
  cluster.replicas_per_master_ = replicas_per_master;
  RedisServer::Options options;
  options.cluster = true;
  const int nodes = masters * (1 + replicas_per_master);
  for (int i = 0; i < nodes; ++i) {
    CAKE_ASSIGN_OR_RETURN(auto server, RedisServer::Start(options));
    cluster.nodes_.push_back(std::move(server));
  }
  for (auto& node : cluster.nodes_) {
    CAKE_ASSIGN_OR_RETURN(auto id, node.Command({"CLUSTER", "MYID"}));
    cluster.node_ids_.push_back(id);
  }

  // Each node takes an even share of the slots and a distinct config epoch before it meets the others (the
  // epoch can only be set while a node knows nobody), so no epoch collision has to be resolved by gossip. This is
  // what `redis-cli --cluster create` does, without its one-second polls.
  for (int i = 0; i < masters; ++i) {
    const int first = static_cast<int>(int64_t{kSlots} * i / masters);
    const int last = static_cast<int>(int64_t{kSlots} * (i + 1) / masters) - 1;
    RedisServer& node = cluster.nodes_[i];
    for (const auto& command :
         std::vector<std::vector<std::string>>{{"CLUSTER", "ADDSLOTSRANGE", absl::StrCat(first), absl::StrCat(last)},
                                               {"CLUSTER", "SET-CONFIG-EPOCH", absl::StrCat(i + 1)}}) {
      auto reply = node.Command(command);
      if (!reply.ok()) {
        return absl::Status(reply.status().code(),
                            absl::StrCat("node ", node.address(), " ", command[1], ": ", reply.status().message()));
      }
    }
  }
  for (int i = 1; i < nodes; ++i) {
    const RedisServer& node = cluster.nodes_[i];
    auto met = cluster.nodes_[0].Command(
        {"CLUSTER", "MEET", node.host(), absl::StrCat(node.port()), absl::StrCat(node.cluster_bus_port())});
    if (!met.ok()) return met.status();
  }

  // A replica can only follow a master it has heard of by gossip: REPLICATE is retried until it has.
  for (int m = 0; m < masters; ++m) {
    for (size_t r : cluster.ReplicasOf(m)) {
      CAKE_RETURN_IF_ERROR(WaitUntilOk(
          [&] {
            return cluster.nodes_[r].Command({"CLUSTER", "REPLICATE", cluster.node_ids_[m]}).status();
          },
          kClusterStartTimeout, absl::StrCat("node ", r, " replicating node ", m)));
    }
  }

  CAKE_RETURN_IF_ERROR(WaitUntilOk([&] { return cluster.CheckConverged(/*require_state_ok=*/true); },
                                   kClusterStartTimeout, "cluster_state:ok and one slot map on every node"));
  // The first sync: until it is done a replica holds nothing and could not be promoted (a test that fails a
  // master over right after Start would lose the slots' keys, or see no election at all).
  for (size_t r = masters; r < cluster.nodes_.size(); ++r) {
    CAKE_RETURN_IF_ERROR(WaitUntilOk(
        [&]() -> absl::Status {
          CAKE_ASSIGN_OR_RETURN(auto info, cluster.nodes_[r].Command({"INFO", "replication"}));
          if (absl::StrContains(info, "master_link_status:up")) return absl::OkStatus();
          return absl::UnavailableError(absl::StrCat("node ", r, "'s link to its master is not up"));
        },
        kClusterStartTimeout, absl::StrCat("replica ", r, " in sync")));
  }
  return cluster;
}

std::vector<size_t> RedisCluster::ReplicasOf(size_t master) const {
  std::vector<size_t> out;
  if (master >= static_cast<size_t>(masters_)) return out;
  for (int k = 0; k < replicas_per_master_; ++k) {
    out.push_back(static_cast<size_t>(masters_) + master * replicas_per_master_ + k);
  }
  return out;
}

absl::StatusOr<std::string> RedisCluster::Role(size_t i) const {
  if (i >= nodes_.size()) return absl::InvalidArgumentError(absl::StrCat("node ", i));
  CAKE_ASSIGN_OR_RETURN(auto info, nodes_[i].Command({"INFO", "replication"}));
  return InfoField(info, "role");
}

absl::Status RedisCluster::WaitForReplicas(size_t master, std::chrono::milliseconds timeout) const {
  if (master >= nodes_.size()) return absl::InvalidArgumentError(absl::StrCat("node ", master));
  return WaitUntilOk(
      [&]() -> absl::Status {
        CAKE_ASSIGN_OR_RETURN(auto info, nodes_[master].Command({"INFO", "replication"}));
        const std::string offset = InfoField(info, "master_repl_offset");
        for (size_t r : ReplicasOf(master)) {
          if (nodes_[r].pid() <= 0) continue;
          CAKE_ASSIGN_OR_RETURN(auto replica, nodes_[r].Command({"INFO", "replication"}));
          const std::string acked = InfoField(replica, "slave_repl_offset");
          if (acked.empty() || acked != offset) {
            return absl::UnavailableError(
                absl::StrCat("replica ", r, " is at offset ", acked, ", its master at ", offset));
          }
        }
        return absl::OkStatus();
      },
      timeout, absl::StrCat("the replicas of node ", master, " in step"));
}

absl::Status RedisCluster::Failover(size_t replica, std::chrono::milliseconds timeout) {
  if (replica >= nodes_.size()) return absl::InvalidArgumentError(absl::StrCat("node ", replica));
  CAKE_RETURN_IF_ERROR(nodes_[replica].Command({"CLUSTER", "FAILOVER"}).status());
  return WaitUntilMaster(replica, timeout);
}

absl::Status RedisCluster::WaitUntilMaster(size_t node, std::chrono::milliseconds timeout) const {
  if (node >= nodes_.size()) return absl::InvalidArgumentError(absl::StrCat("node ", node));
  return WaitUntilOk(
      [&]() -> absl::Status {
        CAKE_ASSIGN_OR_RETURN(auto role, Role(node));
        if (role != "master") return absl::UnavailableError(absl::StrCat("node ", node, " is still a ", role));
        // The new master owns slots in every live node's map (a master promoted with none would be odd, and the
        // others learn of the promotion by gossip).
        CAKE_RETURN_IF_ERROR(CheckConverged(/*require_state_ok=*/false));
        CAKE_ASSIGN_OR_RETURN(auto owners, SlotOwnersSeenBy(node));
        if (std::find(owners.begin(), owners.end(), static_cast<int>(node)) == owners.end()) {
          return absl::UnavailableError(absl::StrCat("node ", node, " is a master of no slot yet"));
        }
        return absl::OkStatus();
      },
      timeout, absl::StrCat("node ", node, " promoted and known as master by every node"));
}

std::vector<std::string> RedisCluster::addresses() const {
  std::vector<std::string> result;
  for (const auto& node : nodes_) result.push_back(node.address());
  return result;
}

int RedisCluster::KeySlot(std::string_view key) { return RedisKeySlot(key); }

absl::StatusOr<std::vector<int>> RedisCluster::SlotOwnersSeenBy(size_t node) const {
  CAKE_ASSIGN_OR_RETURN(auto reply, RunCommand(nodes_[node], {"CLUSTER", "SLOTS"}));
  std::vector<int> owners(kSlots, -1);
  const redisReply& ranges = *reply;
  if (ranges.type != REDIS_REPLY_ARRAY) return absl::InternalError("CLUSTER SLOTS did not return an array");
  // Each range is [first slot, last slot, [ip, port, node id, ...] of the master, replicas...].
  for (size_t r = 0; r < ranges.elements; ++r) {
    const redisReply& range = *ranges.element[r];
    if (range.type != REDIS_REPLY_ARRAY || range.elements < 3 || range.element[2]->type != REDIS_REPLY_ARRAY ||
        range.element[2]->elements < 3) {
      return absl::InternalError("unexpected CLUSTER SLOTS entry");
    }
    const std::string master_id = ReplyText(*range.element[2]->element[2]);
    int owner = -1;
    for (size_t i = 0; i < node_ids_.size(); ++i) {
      if (node_ids_[i] == master_id) owner = static_cast<int>(i);
    }
    const long long first = range.element[0]->integer;
    const long long last = range.element[1]->integer;
    for (long long slot = std::max(0LL, first); slot <= last && slot < kSlots; ++slot) owners[slot] = owner;
  }
  return owners;
}

absl::Status RedisCluster::CheckConverged(bool require_state_ok) const {
  std::optional<std::vector<int>> agreed;
  size_t agreed_by = 0;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].pid() <= 0) continue;  // a stopped or killed node has no say
    if (require_state_ok) {
      CAKE_ASSIGN_OR_RETURN(auto info, nodes_[i].Command({"CLUSTER", "INFO"}));
      if (!absl::StrContains(info, "cluster_state:ok")) {
        return absl::UnavailableError(absl::StrCat("node ", i, " does not report cluster_state:ok"));
      }
    }
    CAKE_ASSIGN_OR_RETURN(auto owners, SlotOwnersSeenBy(i));
    for (int slot = 0; slot < kSlots; ++slot) {
      if (owners[slot] < 0) {
        return absl::UnavailableError(absl::StrCat("node ", i, " knows no owner for slot ", slot));
      }
      if (agreed && (*agreed)[slot] != owners[slot]) {
        return absl::UnavailableError(absl::StrCat("node ", i, " sees node ", owners[slot], " owning slot ", slot,
                                                   ", node ", agreed_by, " sees node ", (*agreed)[slot]));
      }
    }
    if (!agreed) {
      agreed = std::move(owners);
      agreed_by = i;
    }
  }
  if (!agreed) return absl::FailedPreconditionError("no cluster node is running");
  return absl::OkStatus();
}

absl::StatusOr<int> RedisCluster::NodeForSlot(int slot) const {
  if (slot < 0 || slot >= kSlots) return absl::InvalidArgumentError(absl::StrCat("slot ", slot));
  std::optional<int> owner;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].pid() <= 0) continue;
    CAKE_ASSIGN_OR_RETURN(auto owners, SlotOwnersSeenBy(i));
    const int seen = owners[slot];
    if (seen < 0) return absl::FailedPreconditionError(absl::StrCat("node ", i, " knows no owner for slot ", slot));
    if (owner && *owner != seen) {
      return absl::FailedPreconditionError(
          absl::StrCat("nodes disagree on the owner of slot ", slot, ": ", *owner, " and ", seen));
    }
    owner = seen;
  }
  if (!owner) return absl::FailedPreconditionError("no cluster node is running");
  return *owner;
}

absl::Status RedisCluster::CheckMigrationArgs(int slot, size_t from, size_t to) const {
  if (slot < 0 || slot >= kSlots) return absl::InvalidArgumentError(absl::StrCat("slot ", slot));
  if (from >= nodes_.size() || to >= nodes_.size() || from == to) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot move from node ", from, " to node ", to, " of ", nodes_.size()));
  }
  if (nodes_[from].pid() <= 0 || nodes_[to].pid() <= 0) {
    return absl::FailedPreconditionError(absl::StrCat("node ", from, " or node ", to, " is not running"));
  }
  return absl::OkStatus();
}

absl::Status RedisCluster::BeginSlotMigration(int slot, size_t from, size_t to) {
  CAKE_RETURN_IF_ERROR(CheckMigrationArgs(slot, from, to));
  // The target imports first, so that once the source starts redirecting (ASK) the target accepts the requests.
  CAKE_RETURN_IF_ERROR(
      nodes_[to].Command({"CLUSTER", "SETSLOT", absl::StrCat(slot), "IMPORTING", node_ids_[from]}).status());
  auto migrating = nodes_[from].Command({"CLUSTER", "SETSLOT", absl::StrCat(slot), "MIGRATING", node_ids_[to]});
  return migrating.status();
}

absl::Status RedisCluster::MigrateKeys(int slot, size_t from, size_t to, const std::vector<std::string>& keys) {
  CAKE_RETURN_IF_ERROR(CheckMigrationArgs(slot, from, to));
  if (keys.empty()) return absl::OkStatus();
  for (const auto& key : keys) {
    if (KeySlot(key) != slot) {
      return absl::InvalidArgumentError(
          absl::StrCat("key of ", key.size(), " bytes is in slot ", KeySlot(key), ", not ", slot));
    }
  }
  const RedisServer& target = nodes_[to];
  std::vector<std::string> argv = {"MIGRATE", target.host(), absl::StrCat(target.port()), "", "0", "5000"};
  if (!target.password().empty()) argv.insert(argv.end(), {"AUTH", target.password()});
  argv.push_back("KEYS");
  argv.insert(argv.end(), keys.begin(), keys.end());
  // OK, or NOKEY when none of them existed any more: both leave the keys off the source.
  return nodes_[from].Command(argv).status();
}

absl::Status RedisCluster::MigrateAllKeys(int slot, size_t from, size_t to) {
  CAKE_RETURN_IF_ERROR(CheckMigrationArgs(slot, from, to));
  while (true) {
    CAKE_ASSIGN_OR_RETURN(auto reply,
                          RunCommand(nodes_[from], {"CLUSTER", "GETKEYSINSLOT", absl::StrCat(slot), "1000"}));
    if (reply->type != REDIS_REPLY_ARRAY) return absl::InternalError("CLUSTER GETKEYSINSLOT returned no array");
    if (reply->elements == 0) return absl::OkStatus();
    std::vector<std::string> keys;
    for (size_t i = 0; i < reply->elements; ++i) keys.push_back(ReplyText(*reply->element[i]));
    CAKE_RETURN_IF_ERROR(MigrateKeys(slot, from, to, keys));
  }
}

absl::Status RedisCluster::FinishSlotMigration(int slot, size_t from, size_t to) {
  CAKE_RETURN_IF_ERROR(CheckMigrationArgs(slot, from, to));
  // Target first (it bumps its config epoch, so its claim wins in gossip), then the source, then the others, as
  // the Redis cluster specification orders it; telling every node directly saves waiting for gossip.
  std::vector<size_t> order = {to, from};
  for (size_t i = 0; i < nodes_.size(); ++i) {
    // Replicas refuse SETSLOT; they take their master's map.
    if (i != to && i != from && nodes_[i].pid() > 0 && Role(i).value_or("") == "master") order.push_back(i);
  }
  for (size_t i : order) {
    auto assigned = nodes_[i].Command({"CLUSTER", "SETSLOT", absl::StrCat(slot), "NODE", node_ids_[to]});
    if (!assigned.ok()) {
      return absl::Status(assigned.status().code(), absl::StrCat("CLUSTER SETSLOT ", slot, " NODE on node ", i, ": ",
                                                                 assigned.status().message()));
    }
  }
  return WaitUntilOk(
      [&]() -> absl::Status {
        CAKE_RETURN_IF_ERROR(CheckConverged(/*require_state_ok=*/false));
        CAKE_ASSIGN_OR_RETURN(auto owner, NodeForSlot(slot));
        if (owner != static_cast<int>(to)) {
          return absl::UnavailableError(absl::StrCat("slot ", slot, " is still owned by node ", owner));
        }
        return absl::OkStatus();
      },
      kSlotAgreementTimeout, absl::StrCat("agreement on the new owner of slot ", slot));
}

absl::Status RedisCluster::MoveSlot(int slot, size_t from, size_t to) {
  CAKE_RETURN_IF_ERROR(BeginSlotMigration(slot, from, to));
  CAKE_RETURN_IF_ERROR(MigrateAllKeys(slot, from, to));
  return FinishSlotMigration(slot, from, to);
}

}  // namespace cake
