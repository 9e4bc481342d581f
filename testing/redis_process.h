// Real redis-server processes on loopback, for the remote-tier tests and cake-bench remote: a private standalone
// server (RedisServer), or a small cluster of them (RedisCluster) with the slot-migration steps a test needs to
// read in the middle of one. Every server lives in its own temporary folder and dies with its owner.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "testing/child_process.h"

namespace cake {

// A private redis-server on a free loopback port, in a fresh temporary folder, without persistence
// (--save "" --appendonly no). Start waits until it answers PING; destruction stops it (SIGTERM, then waitpid) and
// removes the folder.
//
// The child is started with PR_SET_PDEATHSIG(SIGKILL), so a crashed test or bench does not leave servers
// behind. The kernel sends that signal when the *thread* that started the server exits, so start servers from a
// thread that outlives them (the main thread, normally).
class RedisServer {
 public:
  struct Options {
    bool cluster = false;                 // --cluster-enabled yes, its nodes.conf in the folder, node timeout 2 s
    std::string password;                 // --requirepass when not empty; Command() authenticates with it
    std::vector<std::string> extra_args;  // appended to the command line, e.g. {"--maxmemory", "64mb"}
    std::chrono::seconds start_timeout{10};
  };

  // Runs "redis-server" from PATH. A port taken by someone else between choosing and binding it is retried
  // with another port. UNAVAILABLE (with the server's log) when the server exits during start-up,
  // DEADLINE_EXCEEDED when it does not answer PING within start_timeout.
  static absl::StatusOr<RedisServer> Start(const Options& options);
  // With default Options (an overload: GCC cannot take a nested struct's default member initializers in a
  // default argument inside the enclosing class).
  static absl::StatusOr<RedisServer> Start();

  RedisServer(RedisServer&& other) noexcept;
  RedisServer& operator=(RedisServer&& other) noexcept;
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;
  ~RedisServer();  // Stop(), then removes the folder

  int port() const { return port_; }
  int cluster_bus_port() const { return cluster_bus_port_; }  // 0 unless Options::cluster
  std::string host() const { return "127.0.0.1"; }
  std::string address() const;                // "127.0.0.1:<port>"
  pid_t pid() const { return child_.pid(); }  // -1 once stopped or killed
  const std::string& dir() const { return dir_; }
  const std::string& password() const { return password_; }
  // The server's log file (<dir>/redis.log); what it wrote to stdout/stderr before opening it is in
  // <dir>/stdout.log.
  std::string log() const;

  // SIGTERM and wait; returns the exit status (or 128 + signal). Idempotent: later calls return the same status.
  int Stop();
  // SIGKILL and wait: a crashed node.
  void Kill();

  // Runs one command over a short-lived connection (authenticated when the server has a password) and renders
  // the reply as text: a status, string or integer as its text, an array as its elements one per line (nested
  // arrays flattened depth-first, nil elements as empty lines). A nil reply (GET of a missing key) is NOT_FOUND;
  // an error reply is UNKNOWN with Redis's message ("MOVED 866 127.0.0.1:40001"); a failed connection is
  // UNAVAILABLE. Arguments are binary-safe.
  absl::StatusOr<std::string> Command(const std::vector<std::string>& argv) const;

 private:
  RedisServer() = default;
  static absl::StatusOr<RedisServer> StartOnce(const Options& options);
  void Release();  // Stop(), then removes the folder

  ChildProcess child_;
  int port_ = 0;
  int cluster_bus_port_ = 0;
  std::string dir_;
  std::string password_;
};

// `masters` cluster-enabled RedisServers, each owning an even share of the 16384 slots, and
// `replicas_per_master` replicas of each (CLUSTER REPLICATE), so a test can fail a master over. Nodes
// [0, masters) are the masters as started; the replicas follow, master m's at masters + m * replicas_per_master
// onwards (ReplicasOf). Start returns once every node reports cluster_state:ok, every node's CLUSTER SLOTS names the
// same owner for every slot, and every replica reports master_link_status:up (its first sync done).
class RedisCluster {
 public:
  static constexpr int kSlots = 16384;

  static absl::StatusOr<RedisCluster> Start(int masters = 3, int replicas_per_master = 0);

  RedisCluster(RedisCluster&&) noexcept = default;
  RedisCluster& operator=(RedisCluster&&) noexcept = default;

  size_t size() const { return nodes_.size(); }
  RedisServer& node(size_t i) { return nodes_[i]; }
  const RedisServer& node(size_t i) const { return nodes_[i]; }
  std::vector<std::string> addresses() const;                  // "127.0.0.1:port" of every node, in node order
  std::string NodeId(size_t i) const { return node_ids_[i]; }  // CLUSTER MYID, read at start
  int masters() const { return masters_; }                     // as started; a failover does not change it
  // The nodes started as replicas of node `master` (index below masters()); empty for any other node. Roles change
  // with a failover: this is the topology as started, Role says what a node is now.
  std::vector<size_t> ReplicasOf(size_t master) const;
  // "master" or "slave", from the node's INFO replication (UNAVAILABLE for a node that does not answer).
  absl::StatusOr<std::string> Role(size_t i) const;

  // Waits until every live replica of `master` (as started) has taken all the master's writes so far: the
  // replica's acknowledged offset has reached the master's replication offset. For a test that kills a master and
  // expects its replica to hold what was written.
  absl::Status WaitForReplicas(size_t master, std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;
  // CLUSTER FAILOVER on `replica` (a manual failover: the master stops writes until the replica has caught up,
  // then they swap roles), then waits until the replica is a master and every live node agrees on the slot map.
  absl::Status Failover(size_t replica, std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // Waits until `node` reports role master and every live node names the same owner for every slot: after its
  // master was killed, the replica's own election (node timeout 2 s, then the election) promotes it.
  absl::Status WaitUntilMaster(size_t node, std::chrono::milliseconds timeout = std::chrono::seconds(15)) const;

  // The index of the node that owns `slot`, as every live node sees it. FAILED_PRECONDITION when the nodes
  // disagree (between the SETSLOT NODE calls of a migration that is being finished by hand).
  absl::StatusOr<int> NodeForSlot(int slot) const;

  // CRC16-XMODEM of the key, or of its hash tag (the text between the first '{' and the next '}', when not
  // empty), mod 16384: the slot Redis puts the key in.
  static int KeySlot(std::string_view key);

  // A slot migration in steps, so a test can read in the middle of one and see ASK redirects.
  // Marks the slot IMPORTING on `to` and MIGRATING on `from`.
  absl::Status BeginSlotMigration(int slot, size_t from, size_t to);
  // MIGRATEs the named keys (any that exist) from `from` to `to`.
  absl::Status MigrateKeys(int slot, size_t from, size_t to, const std::vector<std::string>& keys);
  // MIGRATEs what is left in the slot on `from`, until it holds none.
  absl::Status MigrateAllKeys(int slot, size_t from, size_t to);
  // Assigns the slot to `to` on every node (CLUSTER SETSLOT NODE), then waits until all nodes agree.
  absl::Status FinishSlotMigration(int slot, size_t from, size_t to);
  // Begin + MigrateAllKeys + Finish.
  absl::Status MoveSlot(int slot, size_t from, size_t to);

 private:
  RedisCluster() = default;
  absl::Status CheckMigrationArgs(int slot, size_t from, size_t to) const;
  // Each node's owner of every slot (index into nodes_, -1 for none or an unknown node), from its CLUSTER SLOTS.
  absl::StatusOr<std::vector<int>> SlotOwnersSeenBy(size_t node) const;
  // OK once all live nodes name the same owner for every slot (and, with require_state_ok, each reports
  // cluster_state:ok); otherwise a status saying what is not there yet.
  absl::Status CheckConverged(bool require_state_ok) const;

  std::vector<RedisServer> nodes_;
  std::vector<std::string> node_ids_;
  int masters_ = 0;
  int replicas_per_master_ = 0;
};

}  // namespace cake
